/* The pod sandbox's process (the "pause" container): it holds the pod's namespaces open and does
 * nothing else. It reaps nothing (containers run in their own PID namespaces here) and exits on
 * SIGTERM or SIGINT, which is how the runtime stops a sandbox. Built static by e2e/scripts/node.sh. */
#include <signal.h>
#include <unistd.h>

static void stop(int sig) { (void)sig; _exit(0); }

int main(void) {
  signal(SIGTERM, stop);
  signal(SIGINT, stop);
  for (;;) pause();
}
