//! The step loop: one thread owns the [`Engine`] and the [`Scheduler`]; callers hold an
//! [`EngineHandle`] and talk to the loop through a command channel, each request receiving its own
//! stream of [`RequestEvent`]s.
//!
//! Each iteration: take every pending command (new requests, aborts), schedule, let the draft model
//! propose for speculating requests (when one is attached), run the model on the batch, sample or
//! verify and send events, publish [`Stats`]. When nothing is waiting or running the loop
//! sleeps on the channel (waking for the next deadline).
//!
//! Invariants: a [`RequestStream`] dropped before its `Finished` event aborts its request, so a client
//! that disconnects frees its KV blocks within one step; a request refused by the admission gate never
//! reaches the loop; after [`EngineHandle::shutdown`] every request still live gets `Finished` with
//! `cancelled` and the thread exits. If a step panics (a bug, an injected fault) or the loop ends without
//! being asked to, every live request ends with `error` and a message saying the replica is restarting,
//! the gate closes, and [`EngineHandle::failure`] reports why — the server turns `/health` and `/ready`
//! to 503 and exits non-zero, so the kubelet restarts the pod instead of keeping a dead engine in
//! service.

use super::admission::{AdmissionGate, QueueLimits, Rejection, TenantLimits};
use super::request::{EventReceiver, Request, RequestEvent, Submitted};
use super::scheduler::{AdapterCount, FinishHook, SchedCounters, Scheduler, SchedulerConfig};
use crate::engine::Engine;
use crate::error::{EngineError, Result};
use crate::kv::{BlockPool, RequestId};
use crate::model_dir::ModelDir;
use crate::speculative::{SpecCounters, SpecMethod};
use crate::stop::FinishReason;
use modelfleet_kernels::Kernels;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError, Sender, TryRecvError, channel};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

enum Command {
    /// The sequences of one API request, in one message: the loop takes them in the same iteration,
    /// so they are scheduled from the same step (a step between them would give the first a head
    /// start its siblings never make up).
    Submit(Vec<Submitted>),
    Abort(RequestId),
    Shutdown,
    /// Fault injection (tests, chaos drills): panic inside the loop as a bug would.
    InjectPanic,
}

/// What ended the loop when nobody asked it to, once it has (`None` while it runs or after a requested
/// shutdown).
type Failure = tokio::sync::watch::Receiver<Option<String>>;

/// What the loop publishes after every step (for `/metrics`, autoscaling and benchmarks). Published
/// after the step's events are sent, so it may lag a just-received `Finished` by one step.
#[derive(Clone, Debug, Default)]
pub struct Stats {
    /// Requests waiting.
    pub waiting: usize,
    /// Requests running.
    pub running: usize,
    /// KV blocks in the pool.
    pub kv_blocks_total: usize,
    /// KV blocks referenced by live requests.
    pub kv_blocks_in_use: usize,
    /// KV blocks nobody holds that keep a cached prefix.
    pub kv_blocks_cached: usize,
    /// Token slots allocated to running requests that hold no token (now, and the peak).
    pub kv_slots_unused: usize,
    /// Peak of `kv_slots_unused`.
    pub kv_slots_unused_peak: usize,
    /// Prefix-cache and preemption counters.
    pub counters: SchedCounters,
    /// Steps run.
    pub steps: u64,
    /// Tokens computed by all steps.
    pub step_tokens: u64,
    /// Steps that computed prompt positions (a chunk of two or more positions of one request that
    /// is not a speculative verification: a one-position last chunk of a prompt counts as decode).
    pub prefill_steps: u64,
    /// Prompt positions those steps computed.
    pub prefill_positions: u64,
    /// Seconds spent in the model (forward + sampling).
    pub model_seconds: f64,
    /// Seconds spent scheduling and building batches.
    pub schedule_seconds: f64,
    /// Requests per LoRA adapter in use, sorted by name.
    pub adapters: Vec<AdapterCount>,
    /// Decode-shaped steps (every sequence scoring its last token, nothing drafted): steps, the
    /// positions they computed and their seconds in the model.
    pub decode_steps: u64,
    /// See `decode_steps`.
    pub decode_positions: u64,
    /// See `decode_steps`.
    pub decode_seconds: f64,
    /// Speculative verification steps (decode-shaped, at least one sequence scoring drafts): steps,
    /// positions (drafts included) and seconds in the model — beside `decode_*`, what a verification
    /// position costs against a plain one.
    pub verify_steps: u64,
    /// See `verify_steps`.
    pub verify_positions: u64,
    /// See `verify_steps`.
    pub verify_seconds: f64,
    /// Speculative decoding counters.
    pub spec: SpecCounters,
    /// Seconds spent in the draft model's passes.
    pub draft_seconds: f64,
    /// Draft-model KV blocks held by live requests.
    pub draft_blocks_in_use: usize,
}

/// A request's events; dropping it before the end aborts the request.
pub struct RequestStream {
    /// The loop's id for the request.
    pub id: RequestId,
    rx: EventReceiver,
    tx: Sender<Command>,
    done: bool,
}

impl RequestStream {
    /// The next event; `None` after `Finished` (or if the loop is gone).
    pub async fn next(&mut self) -> Option<RequestEvent> {
        if self.done {
            return None;
        }
        let ev = self.rx.recv().await;
        self.observe(ev)
    }

    /// [`next`](Self::next) for callers outside an async runtime (benchmarks, tests).
    pub fn blocking_next(&mut self) -> Option<RequestEvent> {
        if self.done {
            return None;
        }
        let ev = self.rx.blocking_recv();
        self.observe(ev)
    }

    fn observe(&mut self, ev: Option<RequestEvent>) -> Option<RequestEvent> {
        if matches!(ev, None | Some(RequestEvent::Finished(_))) {
            self.done = true;
        }
        ev
    }
}

impl Drop for RequestStream {
    fn drop(&mut self) {
        if !self.done {
            let _ = self.tx.send(Command::Abort(self.id));
        }
    }
}

/// The KV pool a loaded engine allocated.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KvPoolInfo {
    /// Blocks.
    pub blocks: usize,
    /// Bytes of storage (every group's buffers).
    pub bytes: u64,
}

/// The callers' side of a running engine.
pub struct EngineHandle {
    tx: Mutex<Sender<Command>>,
    gate: Arc<AdmissionGate>,
    stats: Arc<Mutex<Stats>>,
    next_id: AtomicU64,
    model_dir: Arc<ModelDir>,
    max_model_len: usize,
    kv_capacity_tokens: usize,
    kv_pool: KvPoolInfo,
    thread: Mutex<Option<JoinHandle<()>>>,
    failure: Failure,
}

impl EngineHandle {
    /// Starts the loop on its own thread, loading the engine there with `load` (the engine never
    /// crosses threads); returns once it is loaded, or with the load error.
    pub fn start<K, F>(load: F, cfg: SchedulerConfig, limits: QueueLimits) -> Result<Self>
    where
        K: Kernels + 'static,
        F: FnOnce() -> Result<Engine<K>> + Send + 'static,
    {
        Self::start_with_hook(load, cfg, limits, None)
    }

    /// [`start`](Self::start), with a hook called in the loop for every request that ends.
    pub fn start_with_hook<K, F>(
        load: F,
        cfg: SchedulerConfig,
        limits: QueueLimits,
        hook: Option<FinishHook>,
    ) -> Result<Self>
    where
        K: Kernels + 'static,
        F: FnOnce() -> Result<Engine<K>> + Send + 'static,
    {
        let (tx, rx) = channel();
        let (ready_tx, ready_rx) = channel();
        let gate = Arc::new(AdmissionGate::new(limits));
        let stats = Arc::new(Mutex::new(Stats::default()));
        let (g, st) = (gate.clone(), stats.clone());
        let (failed_tx, failure) = tokio::sync::watch::channel(None);
        let thread = std::thread::Builder::new()
            .name("modelfleet-step-loop".into())
            .spawn(move || {
                let engine = match load() {
                    Ok(e) => e,
                    Err(e) => {
                        let _ = ready_tx.send(Err(e));
                        return;
                    }
                };
                let draft_method = cfg.speculative.map(|s| s.method) == Some(SpecMethod::DraftModel);
                if draft_method && engine.draft_num_kv_blocks().is_none() {
                    let e = EngineError::InvalidParam {
                        field: "speculative_config",
                        message: "speculation with a draft model needs one attached to the engine".into(),
                    };
                    let _ = ready_tx.send(Err(e));
                    return;
                }
                let capacity = engine.kv_capacity_tokens(cfg.max_num_batched_tokens);
                let pool = KvPoolInfo {
                    blocks: engine.num_kv_blocks(),
                    bytes: engine.kv_cache_bytes() as u64,
                };
                let loaded = (engine.model_dir.clone(), engine.max_model_len(), capacity, pool);
                let _ = ready_tx.send(Ok(loaded));
                let gate = g.clone();
                let run = AssertUnwindSafe(|| run(engine, cfg, g, st, rx, hook, &failed_tx));
                if let Err(panic) = catch_unwind(run) {
                    gate.close();
                    let why = format!("the step loop panicked: {}", panic_message(&*panic));
                    let _ = failed_tx.send(Some(why));
                }
            })
            .map_err(|e| EngineError::Batch(format!("cannot start the step loop thread: {e}")))?;
        let (model_dir, max_model_len, kv_capacity_tokens, kv_pool) = ready_rx
            .recv()
            .map_err(|_| EngineError::Batch("the step loop thread died while loading".into()))??;
        Ok(Self {
            tx: Mutex::new(tx),
            gate,
            stats,
            next_id: AtomicU64::new(1),
            model_dir,
            max_model_len,
            kv_capacity_tokens,
            kv_pool,
            thread: Mutex::new(Some(thread)),
            failure,
        })
    }

    /// Why the engine stopped working, if it did (a panic, or the loop ending unasked); `None` while it
    /// runs and after a requested [`shutdown`](Self::shutdown).
    pub fn failure(&self) -> Option<String> {
        self.failure.borrow().clone()
    }

    /// Resolves once the engine has failed (never, if it does not), with the reason.
    pub async fn failed(&self) -> String {
        let mut rx = self.failure.clone();
        match rx.wait_for(Option::is_some).await {
            Ok(why) => why.clone().unwrap_or_default(),
            // The loop ended as asked (shutdown) without failing: nothing to report, ever.
            Err(_) => std::future::pending().await,
        }
    }

    /// Fault injection: makes the step loop panic at its next iteration, as a bug would. For tests and
    /// chaos drills (the server exposes it only behind `--enable-fault-injection`).
    pub fn inject_panic(&self) {
        let _ = self.sender().send(Command::InjectPanic);
    }

    fn sender(&self) -> Sender<Command> {
        self.tx.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Submits a request if the admission gate lets it in (429-style refusal otherwise).
    pub fn submit(
        &self,
        request: Request,
        quota: TenantLimits,
    ) -> std::result::Result<RequestStream, Rejection> {
        let mut streams = self.submit_group(vec![request], quota)?;
        Ok(streams.pop().expect("one request, one stream"))
    }

    /// Submits the sequences of one API request (one tenant's prompts × `n`) as a group: the gate
    /// admits all of them or none, so a refused request leaves nothing running and never holds part of
    /// the queue.
    pub fn submit_group(
        &self,
        requests: Vec<Request>,
        quota: TenantLimits,
    ) -> std::result::Result<Vec<RequestStream>, Rejection> {
        let Some(tenant) = requests.first().map(|r| r.tenant.clone()) else {
            return Ok(Vec::new());
        };
        debug_assert!(
            requests.iter().all(|r| r.tenant == tenant),
            "one tenant per group"
        );
        let tokens: Vec<usize> = requests.iter().map(|r| r.prompt.len()).collect();
        // The sender's lock is held from the gate check to the sends, and `shutdown` closes the gate
        // and sends `Shutdown` under the same lock: every accepted request reaches the loop before
        // `Shutdown`, so it gets its `Finished` (cancelled) instead of silently vanishing.
        let guard = self.tx.lock().unwrap_or_else(|e| e.into_inner());
        self.gate.try_enter_group(&tenant, &tokens, quota)?;
        let mut out = Vec::with_capacity(requests.len());
        let mut group = Vec::with_capacity(requests.len());
        for request in requests {
            let id = self.next_id.fetch_add(1, Ordering::Relaxed);
            let (events, rx) = tokio::sync::mpsc::unbounded_channel();
            out.push(RequestStream {
                id,
                rx,
                tx: guard.clone(),
                done: false,
            });
            group.push(Submitted { id, request, events });
        }
        if guard.send(Command::Submit(group)).is_err() {
            // The loop is gone: none of them reaches it.
            for len in tokens {
                self.gate.left(&tenant, len, true);
            }
            return Err(Rejection::ShuttingDown);
        }
        drop(guard);
        Ok(out)
    }

    /// Aborts a request (it ends with `cancelled`).
    pub fn abort(&self, id: RequestId) {
        let _ = self.sender().send(Command::Abort(id));
    }

    /// The latest published stats.
    pub fn stats(&self) -> Stats {
        self.stats.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// The admission gate (queue depth, closing for drain).
    pub fn gate(&self) -> &AdmissionGate {
        &self.gate
    }

    /// The model's tokenizer, template and config, for the HTTP side.
    pub fn model_dir(&self) -> &Arc<ModelDir> {
        &self.model_dir
    }

    /// The context limit in force.
    pub fn max_model_len(&self) -> usize {
        self.max_model_len
    }

    /// Tokens the whole KV pool holds: no request may need more (prompt + output), or it could
    /// never run even alone.
    pub fn kv_capacity_tokens(&self) -> usize {
        self.kv_capacity_tokens
    }

    /// The KV pool's blocks and bytes, as allocated.
    pub fn kv_pool(&self) -> KvPoolInfo {
        self.kv_pool
    }

    /// Refuses new requests, cancels every live one, and waits for the loop to exit.
    pub fn shutdown(&self) {
        {
            let tx = self.tx.lock().unwrap_or_else(|e| e.into_inner());
            self.gate.close();
            let _ = tx.send(Command::Shutdown);
        }
        let t = self.thread.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(t) = t {
            let _ = t.join();
        }
    }
}

impl Drop for EngineHandle {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// How long an idle loop sleeps at most before looking at deadlines again.
const IDLE_WAIT: Duration = Duration::from_millis(200);

/// The text of a panic's payload.
fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    panic
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic without a message".into())
}

fn run<K: Kernels>(
    mut engine: Engine<K>,
    cfg: SchedulerConfig,
    gate: Arc<AdmissionGate>,
    stats: Arc<Mutex<Stats>>,
    rx: Receiver<Command>,
    hook: Option<FinishHook>,
    failed: &tokio::sync::watch::Sender<Option<String>>,
) {
    let md = engine.model_dir.clone();
    let tok = &md.tokenizer;
    let mut sched = Scheduler::new(
        cfg,
        engine.num_kv_blocks(),
        engine.block_size(),
        engine.max_model_len(),
        md.eos_token_ids.clone(),
        gate.clone(),
    );
    sched.set_kv_groups(engine.kv_groups());
    sched.set_finish_hook(hook);
    if let (Some(blocks), Some(groups)) = (engine.draft_num_kv_blocks(), engine.draft_kv_groups()) {
        sched.attach_draft_kv(blocks, groups);
    }
    let mut local = Stats::default();
    let mut idle = false;
    // The scheduler lives outside the unwinding boundary, so a step that panics leaves it to end every
    // live request properly (blocks freed, `Finished` sent) instead of dropping their streams silently.
    loop {
        let step = catch_unwind(AssertUnwindSafe(|| {
            iteration(&mut engine, &mut sched, &mut local, &mut idle, &stats, &rx, tok)
        }));
        match step {
            Ok(true) => {}
            Ok(false) => return,
            Err(panic) => {
                // Failure first (so whoever sees the requests' errors also sees why), then every live
                // request ends with `error`, its blocks freed.
                let why = format!("the engine failed: {}", panic_message(&*panic));
                gate.close();
                let _ = failed.send(Some(why.clone()));
                let message = format!("{why}; this replica is restarting, retry the request");
                let _ = catch_unwind(AssertUnwindSafe(|| {
                    sched.abort_all(FinishReason::Error, &message, tok);
                    publish(&sched, &mut local, &stats);
                }));
                return;
            }
        }
    }
}

/// One turn of the loop: commands, a schedule, a step. `false` when asked to stop.
fn iteration<K: Kernels>(
    engine: &mut Engine<K>,
    sched: &mut Scheduler,
    local: &mut Stats,
    idle: &mut bool,
    stats: &Mutex<Stats>,
    rx: &Receiver<Command>,
    tok: &crate::tokenizer::Tokenizer,
) -> bool {
    // Wait for work when there is none; otherwise take whatever arrived, without blocking.
    let mut first = None;
    if !sched.has_work() {
        if !*idle {
            *idle = true;
            release_memory(engine);
        }
        let wait = sched
            .next_deadline()
            .map_or(IDLE_WAIT, |d| d.saturating_duration_since(Instant::now()))
            .min(IDLE_WAIT);
        match rx.recv_timeout(wait) {
            Ok(c) => first = Some(c),
            Err(RecvTimeoutError::Timeout) => {}
            Err(RecvTimeoutError::Disconnected) => return false,
        }
    }
    let mut pending: Vec<Command> = first.into_iter().collect();
    loop {
        match rx.try_recv() {
            Ok(c) => pending.push(c),
            Err(TryRecvError::Empty) => break,
            Err(TryRecvError::Disconnected) => {
                pending.push(Command::Shutdown);
                break;
            }
        }
    }
    for c in pending {
        match c {
            Command::Submit(group) => group.into_iter().for_each(|s| sched.add(s)),
            Command::Abort(id) => sched.abort(id, FinishReason::Cancelled, None, tok),
            Command::Shutdown => {
                sched.abort_all(FinishReason::Cancelled, "the server is shutting down", tok);
                publish(sched, local, stats);
                return false;
            }
            Command::InjectPanic => panic!("injected fault (--enable-fault-injection)"),
        }
    }
    let t0 = Instant::now();
    let mut batch = sched.schedule(t0, tok);
    *idle &= batch.is_empty();
    if batch.is_empty() {
        publish(sched, local, stats);
        if sched.has_work() {
            // Work that cannot be placed right now (should not happen: requests that can never
            // fit are refused on arrival); do not spin.
            std::thread::sleep(Duration::from_millis(1));
        }
        return true;
    }
    let td = Instant::now();
    let drafting = if draft(engine, sched, &mut batch) {
        td.elapsed().as_secs_f64()
    } else {
        0.0
    };
    local.draft_seconds += drafting;
    let (inputs, adapters) = sched.inputs(&batch);
    let t1 = Instant::now();
    let result = engine.step_lora(&inputs, &adapters);
    drop(inputs);
    match result {
        Ok(logits) => {
            sched.update(&batch, &logits, tok);
            engine.recycle(logits);
        }
        Err(e) => sched.fail(&batch, &format!("model step failed: {e}"), tok),
    }
    let t2 = Instant::now();
    // Decode-shaped steps apart: a prefill chunk's hundreds of positions would dominate the fit of the
    // step sizes speculation decides between.
    let decode = batch.seqs.iter().all(|s| s.len == 1 + s.drafts);
    sched.observe_step(batch.num_tokens(), (t2 - t1).as_secs_f64(), decode);
    local.tally(&batch, (t2 - t1).as_secs_f64(), decode);
    local.schedule_seconds += (t1 - t0).as_secs_f64() - drafting;
    local.model_seconds += (t2 - t1).as_secs_f64();
    publish(sched, local, stats);
    true
}

impl Stats {
    /// Counts a model step over `batch` that took `seconds` (`decode`: decode-shaped, every sequence
    /// scoring its last token and its drafts).
    fn tally(&mut self, batch: &super::Batch, seconds: f64, decode: bool) {
        let positions = batch.num_tokens() as u64;
        self.steps += 1;
        self.step_tokens += positions;
        let prefill: usize = batch
            .seqs
            .iter()
            .filter(|s| s.len > 1 + s.drafts)
            .map(|s| s.len)
            .sum();
        self.prefill_steps += u64::from(prefill > 0);
        self.prefill_positions += prefill as u64;
        if decode {
            let (steps, at, secs) = if batch.seqs.iter().any(|s| s.drafts > 0) {
                (
                    &mut self.verify_steps,
                    &mut self.verify_positions,
                    &mut self.verify_seconds,
                )
            } else {
                (
                    &mut self.decode_steps,
                    &mut self.decode_positions,
                    &mut self.decode_seconds,
                )
            };
            *steps += 1;
            *at += positions;
            *secs += seconds;
        }
    }
}

/// Runs the draft model's round for the batch's speculating requests (nothing without a draft model):
/// one batched pass per draft position; a failed pass drops the round and the requests decode plainly.
/// Whether a round ran.
fn draft<K: Kernels>(engine: &mut Engine<K>, sched: &mut Scheduler, batch: &mut super::Batch) -> bool {
    let Some(mut round) = sched.draft_round(batch) else {
        return false;
    };
    while !round.is_done() {
        let inputs = sched.draft_inputs(&round);
        let positions = inputs.iter().map(|s| s.tokens.len()).sum();
        let t = Instant::now();
        let result = engine.draft_step(&inputs);
        drop(inputs);
        match result {
            Ok(logits) => {
                sched.observe_draft(positions, t.elapsed().as_secs_f64());
                sched.draft_absorb(&mut round, &logits);
                engine.recycle_draft(logits);
            }
            Err(_) => {
                sched.abandon_draft_round(round, batch);
                return true;
            }
        }
    }
    sched.end_draft_round(Some(round), batch);
    true
}

/// On running out of work: the step buffers go back to the allocator (they are reused from step to
/// step only while there is work), and glibc is asked to hand its free pages back to the kernel, so
/// memory at rest is what it was before the load (a burst of connections, each with its buffers on
/// the server's threads, otherwise left its peak resident).
fn release_memory<K: Kernels>(engine: &Engine<K>) {
    engine.release_scratch();
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: `malloc_trim` only returns free memory to the kernel; it is thread-safe.
    unsafe {
        libc::malloc_trim(0);
    }
}

fn publish(sched: &Scheduler, local: &mut Stats, out: &Mutex<Stats>) {
    let pool = sched.kv().pool();
    local.waiting = sched.num_waiting();
    local.running = sched.num_running();
    local.kv_blocks_total = pool.num_blocks();
    local.kv_blocks_in_use = pool.num_in_use();
    local.kv_blocks_cached = pool.num_cached();
    local.kv_slots_unused = sched.kv_slots_unused();
    local.kv_slots_unused_peak = local.kv_slots_unused_peak.max(local.kv_slots_unused);
    local.counters = sched.counters();
    local.adapters = sched.adapter_counts();
    local.spec = sched.spec_counters().clone();
    local.draft_blocks_in_use = sched.draft_blocks_in_use();
    *out.lock().unwrap_or_else(|e| e.into_inner()) = local.clone();
}
