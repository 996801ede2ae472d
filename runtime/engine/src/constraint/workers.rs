//! The threads that compile grammars: a few dedicated threads with a stack sized for
//! [`super::MAX_COMPILE_DEPTH`], a bounded queue in front of them, and a time budget the caller waits.
//!
//! llguidance compiles by recursion. [`super::bounds`] refuses what could recurse past the depth limit;
//! these threads make sure what passes has the stack it needs ([`STACK_BYTES`], measured at the limit
//! with a margin: docs/api.md) and never runs on an async worker, whose stack is the runtime's default
//! and whose time belongs to every other request.
//!
//! Invariants: at most `threads` compilations run at once and at most `queue` wait, so a burst of
//! expensive constraints is refused at once ([`Submit::Busy`]) rather than absorbed; a caller that
//! stops waiting (its budget passed) leaves the job to finish (llguidance's fuel bounds it, and the
//! result lands in the grammar cache), and a job whose caller has gone is skipped before it starts.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc::{SyncSender, TrySendError, sync_channel};
use std::sync::{Arc, Mutex};

/// Stack of each compile thread. Measured with `examples/constraint_stack.rs` at
/// [`super::MAX_COMPILE_DEPTH`] (2,048 levels): the deepest case, a chain of 2,046 Lark rules, needed
/// 6.0 MiB in a release build and 6.4 MiB in a debug one (about 3.2 KiB a level); 16 MiB is that
/// doubled and rounded up. Only the pages a compilation touches are committed.
pub const STACK_BYTES: usize = 16 << 20;

thread_local! {
    static CAUGHT_PANICS: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Whether a panic on the current thread is caught and survived (a compile thread's): a panic hook
/// that records fatal reasons skips these.
pub fn panics_are_caught_here() -> bool {
    CAUGHT_PANICS.get()
}

/// A unit of work: runs on a compile thread unless its caller has gone.
pub struct Job {
    run: Box<dyn FnOnce() + Send>,
    /// Set by the caller that stops waiting; a job not started by then is skipped.
    abandoned: Arc<AtomicBool>,
    /// Set when the job starts.
    started: Arc<AtomicBool>,
}

/// Why a job was not queued.
#[derive(Debug, PartialEq, Eq)]
pub enum Submit {
    /// Every thread is busy and the queue is full.
    Busy,
    /// The threads are gone (a bug, or shutdown).
    Closed,
}

/// What a caller holds for a queued job.
pub struct Ticket {
    abandoned: Arc<AtomicBool>,
    started: Arc<AtomicBool>,
}

impl Ticket {
    /// Whether the job has started running.
    pub fn started(&self) -> bool {
        self.started.load(Ordering::Acquire)
    }

    /// The caller stops waiting: a job not yet started will not run.
    pub fn abandon(&self) {
        self.abandoned.store(true, Ordering::Release);
    }
}

/// The compile threads and their queue.
pub struct CompileThreads {
    tx: Mutex<SyncSender<Job>>,
    waiting: Arc<AtomicUsize>,
}

impl CompileThreads {
    /// Starts `threads` threads (at least one) behind a queue of `queue` jobs.
    pub fn start(threads: usize, queue: usize) -> std::io::Result<Self> {
        let (tx, rx) = sync_channel::<Job>(queue);
        let rx = Arc::new(Mutex::new(rx));
        let waiting = Arc::new(AtomicUsize::new(0));
        for i in 0..threads.max(1) {
            let rx = rx.clone();
            let waiting = waiting.clone();
            std::thread::Builder::new()
                .name(format!("grammar-compile-{i}"))
                .stack_size(STACK_BYTES)
                .spawn(move || {
                    loop {
                        let job = {
                            let rx = rx.lock().unwrap_or_else(|e| e.into_inner());
                            match rx.recv() {
                                Ok(job) => job,
                                Err(_) => return,
                            }
                        };
                        waiting.fetch_sub(1, Ordering::Relaxed);
                        if job.abandoned.load(Ordering::Acquire) {
                            continue;
                        }
                        job.started.store(true, Ordering::Release);
                        // A panic in the compiler is the input's and this job's alone: the job's reply
                        // channel drops unanswered (its caller hears of it) and the thread goes on.
                        CAUGHT_PANICS.set(true);
                        let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(job.run));
                    }
                })?;
        }
        Ok(Self {
            tx: Mutex::new(tx),
            waiting,
        })
    }

    /// Queues `run`, or says why not (at once: this never blocks).
    pub fn submit(&self, run: impl FnOnce() + Send + 'static) -> Result<Ticket, Submit> {
        let ticket = Ticket {
            abandoned: Arc::new(AtomicBool::new(false)),
            started: Arc::new(AtomicBool::new(false)),
        };
        let job = Job {
            run: Box::new(run),
            abandoned: ticket.abandoned.clone(),
            started: ticket.started.clone(),
        };
        self.waiting.fetch_add(1, Ordering::Relaxed);
        let sent = self.tx.lock().unwrap_or_else(|e| e.into_inner()).try_send(job);
        match sent {
            Ok(()) => Ok(ticket),
            Err(e) => {
                self.waiting.fetch_sub(1, Ordering::Relaxed);
                Err(match e {
                    TrySendError::Full(_) => Submit::Busy,
                    TrySendError::Disconnected(_) => Submit::Closed,
                })
            }
        }
    }

    /// Jobs queued and not yet taken by a thread.
    pub fn waiting(&self) -> usize {
        self.waiting.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc::channel;
    use std::time::Duration;

    #[test]
    fn a_full_queue_refuses_at_once_and_abandoned_jobs_are_skipped() {
        let threads = CompileThreads::start(1, 1).unwrap();
        let (release_tx, release_rx) = channel::<()>();
        let (done_tx, done_rx) = channel::<&'static str>();
        let d = done_tx.clone();
        let first = threads
            .submit(move || {
                release_rx.recv().unwrap();
                d.send("first").unwrap();
            })
            .unwrap();
        // Wait until the thread holds the first job, so the queue's one place is free.
        while !first.started() {
            std::thread::sleep(Duration::from_millis(1));
        }
        let d = done_tx.clone();
        let second = threads.submit(move || d.send("second").unwrap()).unwrap();
        assert_eq!(threads.waiting(), 1);
        assert_eq!(threads.submit(|| {}).err(), Some(Submit::Busy));
        second.abandon();
        release_tx.send(()).unwrap();
        // The thread finishes the first job and skips the abandoned one, freeing the queue.
        let third_ticket = loop {
            let d = done_tx.clone();
            match threads.submit(move || d.send("third").unwrap()) {
                Ok(t) => break t,
                Err(Submit::Busy) => std::thread::sleep(Duration::from_millis(1)),
                Err(Submit::Closed) => panic!("the threads are gone"),
            }
        };
        let got: Vec<_> = (0..2)
            .map(|_| done_rx.recv_timeout(Duration::from_secs(5)).unwrap())
            .collect();
        assert_eq!(got, ["first", "third"]);
        assert!(third_ticket.started());
        assert!(!second.started());
    }

    #[test]
    fn a_panicking_job_is_answered_by_its_dropped_channel_and_the_thread_goes_on() {
        let threads = CompileThreads::start(1, 4).unwrap();
        let (tx, rx) = channel::<u32>();
        threads
            .submit(move || {
                let _reply = tx;
                panic!("the compiler failed on this input");
            })
            .unwrap();
        assert!(
            rx.recv_timeout(Duration::from_secs(5)).is_err(),
            "no answer, a dropped channel"
        );
        let (tx, rx) = channel::<bool>();
        threads
            .submit(move || tx.send(panics_are_caught_here()).unwrap())
            .unwrap();
        assert!(rx.recv_timeout(Duration::from_secs(5)).unwrap());
        assert!(!panics_are_caught_here(), "only the compile threads");
    }

    #[test]
    fn threads_have_the_measured_stack() {
        let threads = CompileThreads::start(1, 1).unwrap();
        let (tx, rx) = channel();
        threads
            .submit(move || {
                // Recursion that needs far more than a default 2 MiB thread stack.
                fn deep(n: usize) -> usize {
                    let pad = [n as u8; 1024];
                    if n == 0 {
                        pad[0] as usize
                    } else {
                        deep(n - 1) + std::hint::black_box(pad)[1] as usize
                    }
                }
                tx.send(deep(6 * 1024)).unwrap();
            })
            .unwrap();
        rx.recv_timeout(Duration::from_secs(10)).unwrap();
    }
}
