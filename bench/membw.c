/* Memory read bandwidth: OMP_NUM_THREADS threads sum a 1 GiB buffer of doubles, best of 5 passes.
   (-ffast-math lets the sum vectorize; without it the loop is add-latency bound, not memory bound)
   cc -O3 -march=native -ffast-math -fopenmp bench/membw.c -o membw && ./membw   (prints GB/s) */
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
int main(void) {
    size_t n = (size_t)1 << 27; /* 2^27 doubles = 1 GiB */
    double *a = malloc(n * sizeof(double));
    if (!a) return 1;
#pragma omp parallel for
    for (size_t i = 0; i < n; i++) a[i] = (double)(i & 7);
    double best = 0, sink = 0;
    for (int r = 0; r < 5; r++) {
        double t = omp_get_wtime(), s = 0;
#pragma omp parallel for reduction(+ : s)
        for (size_t i = 0; i < n; i++) s += a[i];
        t = omp_get_wtime() - t;
        sink += s;
        double gbs = n * sizeof(double) / t / 1e9;
        if (gbs > best) best = gbs;
    }
    printf("%.2f\n", best);
    fprintf(stderr, "(checksum %g)\n", sink);
    return 0;
}
