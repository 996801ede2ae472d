//! The embedding step loop: one thread owns the encoder and turns queued requests into steps of many
//! inputs — first come, first served, up to a token budget per step, a large request's inputs spread
//! over several steps — and answers each request when its last input is done.
//!
//! Invariants: a request is in the [`AdmissionGate`] from the moment it is accepted until it is
//! answered or abandoned (so the queue, the tenants' quotas and `modelfleet_requests_waiting` count
//! it); a request whose client went away before any of its inputs ran is dropped without running; no
//! step holds more than the budget's tokens unless one input alone is longer; an embedding is the same
//! bits whatever step it ran in (the encoder is batch-invariant).

use modelfleet_engine::embed::Embedder;
use modelfleet_engine::kernels::cpu::CpuKernels;
use modelfleet_engine::sched::AdmissionGate;
use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc;
use std::time::Instant;
use tokio::sync::oneshot;

/// What a request gets back.
pub type Reply = Result<Done, String>;

/// A finished request.
pub struct Done {
    /// One embedding per input, in order.
    pub vectors: Vec<Vec<f32>>,
    /// When its first input entered a step.
    pub first_scheduled: Instant,
}

/// An accepted request.
pub struct Job {
    /// The tenant (for the gate's counts).
    pub tenant: String,
    /// Token ids of each input.
    pub inputs: Vec<Vec<u32>>,
    /// Their total.
    pub tokens: usize,
    /// Where the answer goes.
    pub reply: oneshot::Sender<Reply>,
}

/// A job in the worker's hands.
struct Queued {
    job: Job,
    out: Vec<Vec<f32>>,
    first_scheduled: Option<Instant>,
}

/// The handle the handlers submit to.
pub struct EmbedWorker {
    tx: std::sync::Mutex<mpsc::Sender<Job>>,
    /// Admission: the queue's bounds and the tenants' quotas.
    pub gate: Arc<AdmissionGate>,
    /// Requests with inputs in the current step.
    pub running: Arc<AtomicUsize>,
}

impl EmbedWorker {
    /// Starts the step loop on its own thread, `budget` tokens per step.
    pub fn start(embedder: Embedder<CpuKernels>, gate: Arc<AdmissionGate>, budget: usize) -> Self {
        let (tx, rx) = mpsc::channel();
        let running = Arc::new(AtomicUsize::new(0));
        let (g, r) = (gate.clone(), running.clone());
        std::thread::Builder::new()
            .name("embed-steps".into())
            .spawn(move || run(embedder, rx, g, r, budget))
            .expect("spawning the embedding thread");
        Self {
            tx: std::sync::Mutex::new(tx),
            gate,
            running,
        }
    }

    /// Queues an admitted job (already counted by the gate).
    pub fn submit(&self, job: Job) {
        let tx = self.tx.lock().unwrap_or_else(|e| e.into_inner());
        if let Err(mpsc::SendError(job)) = tx.send(job) {
            // The loop is gone (it only ends when every sender is dropped): answer rather than hang.
            self.gate.left(&job.tenant, job.tokens, true);
            let _ = job.reply.send(Err("the embedding loop stopped".into()));
        }
    }
}

fn run(
    embedder: Embedder<CpuKernels>,
    rx: mpsc::Receiver<Job>,
    gate: Arc<AdmissionGate>,
    running: Arc<AtomicUsize>,
    budget: usize,
) {
    let mut queue: VecDeque<Queued> = VecDeque::new();
    loop {
        if queue.is_empty() {
            match rx.recv() {
                Ok(job) => queue.push_back(queued(job)),
                Err(_) => return,
            }
        }
        while let Ok(job) = rx.try_recv() {
            queue.push_back(queued(job));
        }
        // Abandoned before starting: never run.
        queue.retain(|q| {
            let gone = q.first_scheduled.is_none() && q.job.reply.is_closed();
            if gone {
                gate.left(&q.job.tenant, q.job.tokens, true);
            }
            !gone
        });
        let step = plan(&queue, budget);
        if step.is_empty() {
            continue;
        }
        let now = Instant::now();
        for &(j, _) in &step {
            let q = &mut queue[j];
            if q.first_scheduled.is_none() {
                q.first_scheduled = Some(now);
                gate.started(&q.job.tenant, q.job.tokens);
            }
        }
        let mut inputs: Vec<&[u32]> = Vec::new();
        for (j, range) in &step {
            inputs.extend(queue[*j].job.inputs[range.clone()].iter().map(Vec::as_slice));
        }
        running.store(step.len(), Ordering::Relaxed);
        let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| embedder.embed(&inputs)));
        running.store(0, Ordering::Relaxed);
        let mut vectors = match result {
            Ok(Ok(v)) => v.into_iter(),
            Ok(Err(e)) => {
                fail(&mut queue, &step, &gate, &e.to_string());
                continue;
            }
            Err(_) => {
                fail(&mut queue, &step, &gate, "the encoder panicked");
                continue;
            }
        };
        for (j, range) in &step {
            queue[*j].out.extend(vectors.by_ref().take(range.len()));
        }
        // Answer every job whose inputs are all done (they are at the front: steps go in order).
        while queue.front().is_some_and(|q| q.out.len() == q.job.inputs.len()) {
            let q = queue.pop_front().expect("checked");
            gate.left(&q.job.tenant, q.job.tokens, false);
            let _ = q.job.reply.send(Ok(Done {
                vectors: q.out,
                first_scheduled: q.first_scheduled.unwrap_or(now),
            }));
        }
    }
}

fn queued(job: Job) -> Queued {
    Queued {
        out: Vec::with_capacity(job.inputs.len()),
        job,
        first_scheduled: None,
    }
}

/// The next step: (job, its inputs) in queue order, up to `budget` tokens (at least one input).
fn plan(queue: &VecDeque<Queued>, budget: usize) -> Vec<(usize, std::ops::Range<usize>)> {
    let mut step = Vec::new();
    let mut tokens = 0;
    'jobs: for (j, q) in queue.iter().enumerate() {
        let start = q.out.len();
        let mut end = start;
        for input in &q.job.inputs[start..] {
            if tokens > 0 && tokens + input.len() > budget {
                if end > start {
                    step.push((j, start..end));
                }
                break 'jobs;
            }
            tokens += input.len();
            end += 1;
        }
        if end > start {
            step.push((j, start..end));
        }
    }
    step
}

/// A step failed (the engine refused its inputs — the handlers check them first, so a bug — or
/// panicked): its jobs are answered with the error; the loop goes on with the rest.
fn fail(
    queue: &mut VecDeque<Queued>,
    step: &[(usize, std::ops::Range<usize>)],
    gate: &AdmissionGate,
    why: &str,
) {
    tracing::error!(error = why, "an embedding step failed");
    let mut j = 0;
    queue.retain_mut(|q| {
        let failed = step.iter().any(|(s, _)| *s == j);
        j += 1;
        if failed {
            gate.left(&q.job.tenant, q.job.tokens, false);
            let (reply, _) = oneshot::channel();
            let _ = std::mem::replace(&mut q.job.reply, reply).send(Err(why.to_string()));
        }
        !failed
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job(lens: &[usize]) -> Queued {
        let (reply, _) = oneshot::channel();
        queued(Job {
            tenant: "t".into(),
            inputs: lens.iter().map(|&n| vec![1; n]).collect(),
            tokens: lens.iter().sum(),
            reply,
        })
    }

    #[test]
    fn steps_fill_the_budget_in_order_and_split_large_requests() {
        let q: VecDeque<Queued> = [job(&[3, 3]), job(&[4, 4, 4]), job(&[2])].into_iter().collect();
        assert_eq!(plan(&q, 10), vec![(0, 0..2), (1, 0..1)]);
        assert_eq!(plan(&q, 100), vec![(0, 0..2), (1, 0..3), (2, 0..1)]);
        // One input longer than the budget still runs, alone.
        let q: VecDeque<Queued> = [job(&[50, 1])].into_iter().collect();
        assert_eq!(plan(&q, 10), vec![(0, 0..1)]);
        // A job part-way through continues where it stopped.
        let mut q: VecDeque<Queued> = [job(&[4, 4, 4])].into_iter().collect();
        q[0].out.push(vec![]);
        assert_eq!(plan(&q, 8), vec![(0, 1..3)]);
    }
}
