//! The compute threads of the CPU backend: a fork-join pool in the style of llama.cpp's (threads that
//! spin briefly between operations), in place of rayon's work-stealing pool.
//!
//! Why: a decode step is some 300 short parallel loops (each matrix product, the attention, the norms),
//! separated by microseconds of serial work. Under rayon the whole forward pass was handed to a pool
//! thread, and an idle worker yielded and went to sleep between loops, so every loop began with a
//! futex wake-up: about 9% of single-stream decode was scheduler time and idle threads.
//!
//! How: [`Pool::scope`] runs its closure on the calling thread with the pool made current; inside it,
//! [`for_each`] publishes a loop of `n` tasks and the caller and the workers claim task indices from
//! one atomic word until none are left; the caller returns once every task has finished. Workers spin
//! for [`SPIN`] after their last task, then sleep on a condition variable until the next loop.
//!
//! Invariants:
//! - the loop's closure is only called for a claimed index of the current loop, and the caller does not
//!   return (nor publish another loop) before all `n` tasks have finished, so the closure outlives
//!   every call (the claim word carries a generation, so a stale claim cannot succeed);
//! - results never depend on which thread ran a task (each kernel's tasks write disjoint outputs with
//!   a fixed arithmetic), so the thread count changes speed only;
//! - a loop started from inside a task, or outside any scope, runs on the calling thread in order;
//! - a panic in a task is caught, the other tasks finish, and the panic resumes on the caller.

use std::any::Any;
use std::cell::{Cell, UnsafeCell};
use std::panic::{AssertUnwindSafe, catch_unwind, resume_unwind};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How long a worker keeps spinning for the next loop before it sleeps.
const SPIN: Duration = Duration::from_micros(200);

/// Bits of the claim word: `generation | n | next` (24 + 20 + 20).
const IDX_BITS: u32 = 20;
const IDX_MASK: u64 = (1 << IDX_BITS) - 1;
/// Most tasks in one published loop (larger loops are published in pieces).
const MAX_TASKS: usize = IDX_MASK as usize;

type Task = dyn Fn(usize) + Sync;

/// State shared by the caller and the workers.
struct Shared {
    /// `generation << 40 | n << 20 | next`: the current loop's size and its next unclaimed index.
    claim: AtomicU64,
    /// The current loop's closure; written only while no task can be claimed or is running.
    task: UnsafeCell<*const Task>,
    /// Tasks of the current loop not yet finished.
    remaining: AtomicUsize,
    /// The first panic of the current loop.
    panic: Mutex<Option<Box<dyn Any + Send>>>,
    /// One caller at a time publishes loops.
    publish: Mutex<()>,
    sleeping: AtomicUsize,
    sleep: Mutex<()>,
    wake: Condvar,
    shutdown: AtomicBool,
    /// Threads, the caller included (workers that could not be started are not counted).
    threads: AtomicUsize,
}

// SAFETY: `task` is written by the single publishing caller (under `publish`) only while no task is
// claimable or running, and read by a thread only after it claimed a task of that loop (the claim's
// acquire ordering makes the write visible); everything else is atomic or locked.
unsafe impl Sync for Shared {}
// SAFETY: the only field that is not `Send` is the raw `task` pointer, which owns nothing and points to
// a `Sync` closure (`Task` is `dyn Fn(usize) + Sync`) that any thread may call; it is only dereferenced
// under the protocol above, whichever thread holds the `Shared`.
unsafe impl Send for Shared {}

impl Shared {
    fn claimable(v: u64) -> bool {
        (v & IDX_MASK) < ((v >> IDX_BITS) & IDX_MASK)
    }

    /// Claims and runs tasks of the current loop until none is left; whether it ran any.
    fn work(&self) -> bool {
        let mut ran = false;
        let mut v = self.claim.load(Ordering::Acquire);
        while Self::claimable(v) {
            match self
                .claim
                .compare_exchange_weak(v, v + 1, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => {
                    // SAFETY: a task of this loop is claimed and unfinished, so the loop (and its
                    // closure) is alive and `task` is not being written.
                    let f = unsafe { &**self.task.get() };
                    if let Err(p) = catch_unwind(AssertUnwindSafe(|| f((v & IDX_MASK) as usize))) {
                        self.panic
                            .lock()
                            .unwrap_or_else(|e| e.into_inner())
                            .get_or_insert(p);
                    }
                    self.remaining.fetch_sub(1, Ordering::AcqRel);
                    ran = true;
                    v = self.claim.load(Ordering::Acquire);
                }
                Err(now) => v = now,
            }
        }
        ran
    }
}

/// A pool of `threads − 1` workers; the thread that calls [`for_each`] inside [`Pool::scope`] is the
/// last one.
pub(crate) struct Pool {
    shared: Arc<Shared>,
    workers: Vec<JoinHandle<()>>,
}

thread_local! {
    /// The pool of the innermost [`Pool::scope`] on this thread (null outside any).
    static CURRENT: Cell<*const Shared> = const { Cell::new(std::ptr::null()) };
    /// Set while this thread runs a task: loops started inside run in order on this thread.
    static IN_TASK: Cell<bool> = const { Cell::new(false) };
}

impl Pool {
    /// A pool of `threads` threads in all (0 = one per available core), workers named `mf-compute-N`.
    pub(crate) fn new(threads: usize) -> Self {
        let threads = match threads {
            0 => std::thread::available_parallelism().map_or(1, |n| n.get()),
            t => t,
        };
        let shared = Arc::new(Shared {
            claim: AtomicU64::new(0),
            task: UnsafeCell::new(std::ptr::null::<fn(usize)>() as *const Task),
            remaining: AtomicUsize::new(0),
            panic: Mutex::new(None),
            publish: Mutex::new(()),
            sleeping: AtomicUsize::new(0),
            sleep: Mutex::new(()),
            wake: Condvar::new(),
            shutdown: AtomicBool::new(false),
            threads: AtomicUsize::new(threads),
        });
        let workers = (1..threads)
            .filter_map(|i| {
                let s = Arc::clone(&shared);
                std::thread::Builder::new()
                    .name(format!("mf-compute-{i}"))
                    .spawn(move || worker(&s))
                    .ok()
            })
            .collect::<Vec<_>>();
        shared.threads.store(workers.len() + 1, Ordering::Relaxed);
        Self { shared, workers }
    }

    /// Threads in all, the caller included.
    pub(crate) fn threads(&self) -> usize {
        self.workers.len() + 1
    }

    /// Runs `f` on this thread with this pool current for [`for_each`].
    pub(crate) fn scope<R>(&self, f: impl FnOnce() -> R) -> R {
        struct Restore(*const Shared);
        impl Drop for Restore {
            fn drop(&mut self) {
                CURRENT.with(|c| c.set(self.0));
            }
        }
        let _restore = Restore(CURRENT.with(|c| c.replace(Arc::as_ptr(&self.shared))));
        f()
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        self.shared.shutdown.store(true, Ordering::SeqCst);
        {
            let _g = self.shared.sleep.lock().unwrap_or_else(|e| e.into_inner());
            self.shared.wake.notify_all();
        }
        for w in self.workers.drain(..) {
            let _ = w.join();
        }
    }
}

fn worker(s: &Shared) {
    IN_TASK.with(|t| t.set(true));
    let mut last = Instant::now();
    let mut spins = 0u32;
    loop {
        if s.work() {
            last = Instant::now();
            spins = 0;
            continue;
        }
        if s.shutdown.load(Ordering::Acquire) {
            return;
        }
        spins = spins.wrapping_add(1);
        if !spins.is_multiple_of(64) || last.elapsed() < SPIN {
            std::hint::spin_loop();
            continue;
        }
        // Sleep until the next loop (or shutdown). `sleeping` and `claim` are both SeqCst, so either
        // the publisher sees this worker asleep and notifies under the lock, or this check sees the
        // new loop.
        s.sleeping.fetch_add(1, Ordering::SeqCst);
        let mut g = s.sleep.lock().unwrap_or_else(|e| e.into_inner());
        while !Shared::claimable(s.claim.load(Ordering::SeqCst)) && !s.shutdown.load(Ordering::SeqCst) {
            g = s.wake.wait(g).unwrap_or_else(|e| e.into_inner());
        }
        drop(g);
        s.sleeping.fetch_sub(1, Ordering::SeqCst);
        last = Instant::now();
    }
}

/// Threads of the current pool (1 outside any scope or inside a task).
pub(crate) fn threads() -> usize {
    if IN_TASK.with(Cell::get) {
        return 1;
    }
    let p = CURRENT.with(Cell::get);
    if p.is_null() {
        1
    } else {
        // SAFETY: a current pool outlives its scope.
        unsafe { (*p).threads.load(Ordering::Relaxed) }
    }
}

/// Calls `f(i)` for `i in 0..n`, spread over the current pool's threads (in order on this thread when
/// there is no pool, one task, or this is already a task); returns when all calls have returned.
pub(crate) fn for_each(n: usize, f: impl Fn(usize) + Sync) {
    let p = CURRENT.with(Cell::get);
    if n <= 1 || p.is_null() || IN_TASK.with(Cell::get) {
        (0..n).for_each(f);
        return;
    }
    // SAFETY: a current pool outlives its scope.
    let s = unsafe { &*p };
    if s.threads.load(Ordering::Relaxed) <= 1 {
        (0..n).for_each(f);
        return;
    }
    let mut start = 0;
    while start < n {
        let len = (n - start).min(MAX_TASKS);
        publish(s, len, &|i| f(start + i));
        start += len;
    }
}

/// Runs one loop of `n ≤ MAX_TASKS` tasks on `s`.
fn publish(s: &Shared, n: usize, f: &(dyn Fn(usize) + Sync)) {
    let _one = s.publish.lock().unwrap_or_else(|e| e.into_inner());
    // SAFETY: the previous loop finished (every task claimed and returned) before its caller released
    // `publish`, so no thread reads `task` now; the lifetime is erased only for the duration of this
    // loop, which ends before this function returns.
    unsafe {
        *s.task.get() = std::mem::transmute::<*const (dyn Fn(usize) + Sync + '_), *const Task>(f);
    }
    s.remaining.store(n, Ordering::Relaxed);
    let generation = (s.claim.load(Ordering::Relaxed) >> (2 * IDX_BITS)) + 1;
    s.claim.store(
        (generation << (2 * IDX_BITS)) | ((n as u64) << IDX_BITS),
        Ordering::SeqCst,
    );
    if s.sleeping.load(Ordering::SeqCst) > 0 {
        let _g = s.sleep.lock().unwrap_or_else(|e| e.into_inner());
        s.wake.notify_all();
    }
    IN_TASK.with(|t| t.set(true));
    s.work();
    IN_TASK.with(|t| t.set(false));
    let mut spins = 0u32;
    while s.remaining.load(Ordering::Acquire) != 0 {
        spins = spins.wrapping_add(1);
        if spins < 1 << 16 {
            std::hint::spin_loop();
        } else {
            // A worker was descheduled in the middle of a task: let it run.
            std::thread::yield_now();
        }
    }
    if let Some(p) = s.panic.lock().unwrap_or_else(|e| e.into_inner()).take() {
        resume_unwind(p);
    }
}

/// Splits `data` into chunks of `chunk` elements (the last may be shorter) and calls `f(i, chunk_i)`
/// for each, at least `min_chunks` chunks per task (about 8 tasks per thread at most).
pub(crate) fn for_each_chunk<T: Send>(
    data: &mut [T],
    chunk: usize,
    min_chunks: usize,
    f: impl Fn(usize, &mut [T]) + Sync,
) {
    let chunk = chunk.max(1);
    let chunks = data.len().div_ceil(chunk);
    let per_task = min_chunks.max(chunks.div_ceil(8 * threads())).max(1);
    let (len, ptr) = (data.len(), SendPtr(data.as_mut_ptr()));
    for_each(chunks.div_ceil(per_task), |t| {
        let ptr = &ptr;
        for i in t * per_task..((t + 1) * per_task).min(chunks) {
            let (a, b) = (i * chunk, ((i + 1) * chunk).min(len));
            // SAFETY: chunk `i` is `a..b` of `data`, disjoint from every other chunk, and `data` is
            // borrowed mutably for the whole loop.
            f(i, unsafe { std::slice::from_raw_parts_mut(ptr.0.add(a), b - a) });
        }
    });
}

/// A raw pointer the tasks of one loop share (each uses a disjoint part).
struct SendPtr<T>(*mut T);
// SAFETY: only used for disjoint chunks of a slice borrowed for the loop (see `for_each_chunk`).
unsafe impl<T: Send> Sync for SendPtr<T> {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_index_runs_once_on_any_thread_count_and_nested_loops_run_in_order() {
        for threads in [1, 2, 3, 5] {
            let pool = Pool::new(threads);
            assert_eq!(pool.threads(), threads);
            for n in [0, 1, 2, 7, 1000] {
                let hits: Vec<AtomicUsize> = (0..n).map(|_| AtomicUsize::new(0)).collect();
                pool.scope(|| {
                    for_each(n, |i| {
                        hits[i].fetch_add(1, Ordering::Relaxed);
                        // A loop inside a task runs on this thread.
                        let inner = AtomicUsize::new(0);
                        for_each(3, |_| {
                            inner.fetch_add(1, Ordering::Relaxed);
                        });
                        assert_eq!(inner.load(Ordering::Relaxed), 3);
                    })
                });
                assert!(
                    hits.iter().all(|h| h.load(Ordering::Relaxed) == 1),
                    "{threads} threads, n {n}"
                );
            }
        }
    }

    #[test]
    fn chunks_cover_the_slice_once_and_loops_outside_a_scope_run_in_order() {
        let pool = Pool::new(3);
        for (len, chunk, min) in [(0, 4, 1), (10, 4, 1), (1000, 7, 3), (4096, 4096, 1)] {
            let mut data = vec![0usize; len];
            pool.scope(|| {
                for_each_chunk(&mut data, chunk, min, |i, c| {
                    for (j, v) in c.iter_mut().enumerate() {
                        *v += i * chunk + j + 1;
                    }
                })
            });
            assert!(data.iter().enumerate().all(|(i, &v)| v == i + 1), "{len} {chunk}");
        }
        let order = Mutex::new(Vec::new());
        for_each(5, |i| order.lock().unwrap().push(i));
        assert_eq!(*order.lock().unwrap(), vec![0, 1, 2, 3, 4]);
    }

    #[test]
    fn a_panicking_task_resumes_on_the_caller_after_the_others_finish() {
        let pool = Pool::new(2);
        let done = AtomicUsize::new(0);
        let r = catch_unwind(AssertUnwindSafe(|| {
            pool.scope(|| {
                for_each(64, |i| {
                    if i == 5 {
                        panic!("task 5");
                    }
                    done.fetch_add(1, Ordering::Relaxed);
                })
            })
        }));
        assert!(r.is_err());
        assert_eq!(done.load(Ordering::Relaxed), 63);
        // The pool still works, also after its workers went to sleep.
        std::thread::sleep(SPIN * 5);
        let sum = AtomicUsize::new(0);
        pool.scope(|| {
            for_each(100, |i| {
                sum.fetch_add(i, Ordering::Relaxed);
            })
        });
        assert_eq!(sum.load(Ordering::Relaxed), 4950);
    }
}
