//! The scheduler (vLLM v1's single algorithm, no prefill/decode phases): each step it grants tokens
//! under `max_num_batched_tokens` and `max_num_seqs` — running requests first, in admission order,
//! then waiting ones in fair order — allocating KV blocks only for the tokens it grants. A request whose
//! prompt does not fit the remaining budget gets a smaller grant (chunked prefill).
//!
//! When a running request cannot get a block, another is preempted by recompute: its blocks are freed
//! (its full blocks stay in the prefix cache, so re-prefill mostly hits), and it goes back to its
//! tenant's queue keeping its place, its sampler state and its output so far. The victim is the
//! tenant of the newest running request, and within that tenant the worst priority, then the newest —
//! so one tenant's priorities never preempt another's; a victim already granted tokens this step gives
//! them back.
//! No new request is admitted in a step that preempted.
//!
//! A waiting request that cannot be placed (not enough blocks) is skipped with the rest of its
//! tenant's queue for this step (its tenant's order is kept); other tenants are still admitted.
//!
//! With speculative decoding configured, a running request in decode state may be granted `1 + k`
//! positions — its last sampled token and `k` drafts — counted in the token budget and allocated like
//! any grant; `update` verifies them and truncates the table back to the accepted tokens (see
//! [`speculative`](self::speculative)).
//!
//! Invariants (checked by `check_invariants` in the randomized test):
//! - every live request is in one [`Phase`]: waiting or preempted (in the fair queue, no blocks) or
//!   running (a block table covering `num_computed` tokens, at most one partly filled block);
//! - `free uncached + in use + cached == total` blocks, and blocks in use are exactly those in tables;
//! - a request's blocks are freed, and its admission counts released, in the step it ends;
//! - each live request gets exactly one `Finished` event, and nothing after it.

use super::admission::AdmissionGate;
use super::fair_queue::{FairQueue, QueueKey};
use super::request::{
    EventSender, FIRST_TOKEN_DEADLINE, Finished, Request, RequestEvent, Submitted, Timings, TokenOut, Usage,
};
use crate::kv::{
    BlockHash, BlockPool, CachedPrefix, HashExtras, KvCacheManager, KvGroups, PrefixCachingPool, RequestId,
    hash_block,
};
use crate::lora::LoraAdapter;
use crate::model::{Logits, LogitsRows, SeqInput};
use crate::sequence::{DraftToken, Sequence};
use crate::speculative::cost::StepCost;
use crate::speculative::draft::DraftKv;
use crate::speculative::gate::AcceptanceGate;
use crate::speculative::{SpecConfig, SpecCounters};
use crate::stop::FinishReason;
use crate::tokenizer::Tokenizer;
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::Arc;
use std::time::Instant;

/// Scheduler limits (vLLM's flag names).
#[derive(Clone, Copy, Debug)]
pub struct SchedulerConfig {
    /// Most requests in one batch (`--max-num-seqs`).
    pub max_num_seqs: usize,
    /// Most tokens computed in one step (`--max-num-batched-tokens`).
    pub max_num_batched_tokens: usize,
    /// Reuse cached full blocks (`--enable-prefix-caching`).
    pub enable_prefix_caching: bool,
    /// Most distinct LoRA adapters among running requests, so in any step (`--max-loras`). A waiting
    /// request whose adapter would exceed it waits (skipped with its tenant for the step), never fails.
    pub max_loras: usize,
    /// Speculative decoding (`--speculative-config`); `None`: off.
    pub speculative: Option<SpecConfig>,
}

impl Default for SchedulerConfig {
    fn default() -> Self {
        Self {
            max_num_seqs: 64,
            max_num_batched_tokens: 512,
            enable_prefix_caching: true,
            max_loras: 4,
            speculative: None,
        }
    }
}

/// One request's part of a step.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ScheduledSeq {
    /// Which request.
    pub id: RequestId,
    /// Tokens of it already in the KV cache.
    pub start: usize,
    /// Tokens granted this step.
    pub len: usize,
    /// Whether this grant reaches its last token (so a token is sampled).
    pub sample: bool,
    /// Drafted positions among `len` (speculative decoding: `len == 1 + drafts`, all rows scored).
    pub drafts: usize,
}

/// What one step computes.
#[derive(Clone, Debug, Default)]
pub struct Batch {
    /// In batch order.
    pub seqs: Vec<ScheduledSeq>,
}

impl Batch {
    /// Whether nothing was scheduled.
    pub fn is_empty(&self) -> bool {
        self.seqs.is_empty()
    }

    /// Tokens computed by the step.
    pub fn num_tokens(&self) -> usize {
        self.seqs.iter().map(|s| s.len).sum()
    }
}

/// Requests of one adapter (for the per-adapter metrics).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AdapterCount {
    /// The adapter's served name.
    pub name: String,
    /// Its requests running.
    pub running: usize,
    /// Its requests waiting.
    pub waiting: usize,
}

/// Counters since start (for metrics and benchmarks).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SchedCounters {
    /// Tokens looked up in the prefix cache on admission.
    pub prefix_query_tokens: u64,
    /// Of those, tokens found.
    pub prefix_hit_tokens: u64,
    /// Preemptions.
    pub preemptions: u64,
}

struct Entry {
    tenant: String,
    scope: String,
    adapter: Option<Arc<LoraAdapter>>,
    salt: Option<String>,
    key: QueueKey,
    /// Prompt then output.
    tokens: Vec<u32>,
    prompt_len: usize,
    num_computed: usize,
    hashes: Vec<BlockHash>,
    seq: Sequence,
    events: EventSender,
    phase: Phase,
    cached_tokens: usize,
    deadline: Option<Instant>,
    /// Kept in `deadlines` too while it is earlier than `deadline`.
    first_token_deadline: Option<Instant>,
    timings: Timings,
    /// Speculative decoding state.
    spec: SpecState,
}

/// Where a request is in its life (vLLM's `RequestStatus`): every live request is in exactly one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    /// In its tenant's queue, never scheduled: admission still counts its prompt as queued.
    Waiting,
    /// Holds a block table and is scheduled every step.
    Running,
    /// Was running, gave its blocks up to another request and waits in its tenant's queue to be
    /// recomputed.
    Preempted,
}

/// A request's speculative decoding state.
#[derive(Default)]
struct SpecState {
    /// Its recent acceptance (skips speculation while low).
    gate: AcceptanceGate,
    /// This step's drafts, once proposed.
    drafts: Vec<DraftToken>,
    /// This step's verification chunk: the last committed token, then the drafts.
    chunk: Vec<u32>,
}

impl Entry {
    /// Extends the hash chain over every full block of `tokens`.
    fn extend_hashes(&mut self, bs: usize) {
        let extras = HashExtras {
            scope: &self.scope,
            adapter_digest: self.adapter.as_ref().map(|a| a.identity.digest.as_str()),
            cache_salt: self.salt.as_deref(),
        };
        while (self.hashes.len() + 1) * bs <= self.tokens.len() {
            let i = self.hashes.len();
            let h = hash_block(self.hashes.last(), &self.tokens[i * bs..(i + 1) * bs], &extras);
            self.hashes.push(h);
        }
    }
}

/// Called in the step loop for every request that ends, with its tenant — so usage and metrics are
/// recorded even when nobody is listening any more (a client that hung up).
pub type FinishHook = std::sync::Arc<dyn Fn(&str, &Finished) + Send + Sync>;

/// Requests, their KV blocks and the fair queue; owned by the step loop.
pub struct Scheduler {
    hook: Option<FinishHook>,
    cfg: SchedulerConfig,
    kv: KvCacheManager<PrefixCachingPool>,
    queue: FairQueue,
    running: Vec<RequestId>,
    entries: HashMap<RequestId, Entry>,
    deadlines: BTreeSet<(Instant, RequestId)>,
    gate: Arc<AdmissionGate>,
    eos: Vec<u32>,
    max_model_len: usize,
    next_seq: u64,
    counters: SchedCounters,
    /// Speculation counters.
    spec_counters: SpecCounters,
    /// The draft model's block tables, when speculating with a draft model.
    draft_kv: Option<DraftKv>,
    /// Measured step costs: whether a step's drafts pay (`speculative::cost`).
    step_cost: StepCost,
}

impl Scheduler {
    /// A scheduler over `num_blocks` KV blocks of `block_size` tokens.
    pub fn new(
        cfg: SchedulerConfig,
        num_blocks: usize,
        block_size: usize,
        max_model_len: usize,
        eos: Vec<u32>,
        gate: Arc<AdmissionGate>,
    ) -> Self {
        Self {
            hook: None,
            cfg,
            kv: KvCacheManager::new(PrefixCachingPool::new(num_blocks), block_size),
            queue: FairQueue::new(),
            running: Vec::new(),
            entries: HashMap::new(),
            deadlines: BTreeSet::new(),
            gate,
            eos,
            max_model_len,
            next_seq: 0,
            counters: SchedCounters::default(),
            spec_counters: SpecCounters::default(),
            draft_kv: None,
            step_cost: StepCost::default(),
        }
    }

    /// Gives the KV cache the model's groups (one block table per group per request; a window group
    /// gives blocks back as they leave its window). Before any request: the pool starts over.
    pub fn set_kv_groups(&mut self, groups: &KvGroups) {
        debug_assert!(
            self.entries.is_empty(),
            "KV-cache groups set with requests in flight"
        );
        let (blocks, bs) = (self.kv.pool().num_blocks(), self.kv.block_size());
        self.kv = KvCacheManager::with_groups(PrefixCachingPool::new(blocks), bs, groups);
    }

    /// Sets the hook called for every finished request.
    pub fn set_finish_hook(&mut self, hook: Option<FinishHook>) {
        self.hook = hook;
    }

    /// Whether any request is waiting or running.
    pub fn has_work(&self) -> bool {
        !self.entries.is_empty()
    }

    /// Requests waiting.
    pub fn num_waiting(&self) -> usize {
        self.queue.len()
    }

    /// Requests running.
    pub fn num_running(&self) -> usize {
        self.running.len()
    }

    /// The KV-cache manager (block counts).
    pub fn kv(&self) -> &KvCacheManager<PrefixCachingPool> {
        &self.kv
    }

    /// Counters since start.
    pub fn counters(&self) -> SchedCounters {
        self.counters
    }

    /// Token slots allocated to running requests that hold no token yet (at most one partly filled
    /// block per request, since nothing is reserved ahead).
    pub fn kv_slots_unused(&self) -> usize {
        let bs = self.kv.block_size();
        self.running
            .iter()
            .flat_map(|id| {
                let computed = self.entries[id].num_computed;
                self.kv.block_tables(*id).iter().map(move |t| {
                    let held = t.len() * bs;
                    held - computed.min(held)
                })
            })
            .sum()
    }

    /// The earliest pending deadline, so an idle loop knows when to wake up.
    pub fn next_deadline(&self) -> Option<Instant> {
        self.deadlines.first().map(|(d, _)| *d)
    }

    /// Chooses this step's batch.
    pub fn schedule(&mut self, now: Instant, tok: &Tokenizer) -> Batch {
        self.expire(now, tok);
        let mut budget = self.cfg.max_num_batched_tokens;
        let mut batch = Batch::default();
        let mut preempted = false;
        let wants = self.spec_wants();
        let mut i = 0;
        while i < self.running.len() && budget > 0 {
            let id = self.running[i];
            let e = &self.entries[&id];
            let (start, total) = (e.num_computed, e.tokens.len());
            let mut n = (total - start).min(budget);
            if n == 0 {
                i += 1;
                continue;
            }
            let want = wants.get(&id).copied().unwrap_or_default();
            if want.pinned && budget < 1 + want.k {
                // Its drafts must not depend on what else runs: it waits for a step with room.
                i += 1;
                continue;
            }
            let mut drafts = want.k.min(budget - 1);
            if drafts > 0 {
                n = 1 + drafts;
            }
            let mut granted = self.kv.allocate_slots(id, start, n).is_ok();
            if !granted && drafts > 0 && !want.pinned {
                // No blocks for the drafts: decode plainly rather than preempt someone.
                (n, drafts) = (1, 0);
                granted = self.kv.allocate_slots(id, start, 1).is_ok();
            }
            if granted {
                self.set_drafts(id, drafts);
                let tenant = self.entries[&id].tenant.clone();
                self.queue.charge(&tenant, n);
                batch.seqs.push(ScheduledSeq {
                    id,
                    start,
                    len: n,
                    sample: start + n >= total,
                    drafts,
                });
                budget -= n;
                i += 1;
                continue;
            }
            preempted = true;
            let v = self.victim();
            let vid = self.running[v];
            // A victim already granted tokens this step gives them back.
            if let Some(pos) = batch.seqs.iter().position(|s| s.id == vid) {
                let s = batch.seqs.remove(pos);
                budget += s.len;
                let tenant = self.entries[&vid].tenant.clone();
                self.queue.refund(&tenant, s.len);
            }
            self.preempt(v);
            if v < i {
                i -= 1;
            }
            // If the victim was this request, `running[i]` is now the next one.
        }
        if !preempted {
            self.admit_waiting(now, &mut budget, &mut batch);
        }
        batch
    }

    /// The model's inputs for `batch` (borrowing the requests' tokens and block tables) and the
    /// distinct adapters they use, which `SeqInput::adapter` indexes.
    pub fn inputs(&self, batch: &Batch) -> (Vec<SeqInput<'_>>, Vec<Arc<LoraAdapter>>) {
        let mut adapters: Vec<Arc<LoraAdapter>> = Vec::new();
        let inputs = batch
            .seqs
            .iter()
            .map(|s| {
                let e = &self.entries[&s.id];
                let adapter = e.adapter.as_ref().map(|a| {
                    adapters.iter().position(|x| x.id == a.id).unwrap_or_else(|| {
                        adapters.push(a.clone());
                        adapters.len() - 1
                    })
                });
                let (tokens, logits) = match (s.drafts, s.sample) {
                    (0, true) => (&e.tokens[s.start..s.start + s.len], LogitsRows::Last),
                    (0, false) => (&e.tokens[s.start..s.start + s.len], LogitsRows::None),
                    // A verification chunk: every position's row is checked.
                    _ => (&e.spec.chunk[..], LogitsRows::All),
                };
                SeqInput {
                    tokens,
                    start_pos: s.start,
                    block_tables: self.kv.block_tables(s.id),
                    logits,
                    adapter,
                }
            })
            .collect();
        (inputs, adapters)
    }

    /// Per adapter (by served name) in use: requests running and waiting, sorted by name.
    pub fn adapter_counts(&self) -> Vec<AdapterCount> {
        let mut counts: BTreeMap<&str, AdapterCount> = BTreeMap::new();
        for e in self.entries.values() {
            let Some(a) = &e.adapter else { continue };
            let c = counts.entry(&a.identity.name).or_insert_with(|| AdapterCount {
                name: a.identity.name.clone(),
                running: 0,
                waiting: 0,
            });
            if e.phase == Phase::Running {
                c.running += 1;
            } else {
                c.waiting += 1;
            }
        }
        counts.into_values().collect()
    }

    /// Applies a step's results: advances computed counts, registers newly full blocks, samples a
    /// token for each request whose grant reached its end, and sends the events.
    pub fn update(&mut self, batch: &Batch, logits: &Logits, tokenizer: &Tokenizer) {
        let bs = self.kv.block_size();
        let now = Instant::now();
        for (k, s) in batch.seqs.iter().enumerate() {
            if s.drafts > 0 {
                self.update_speculative(k, s, logits, tokenizer);
                continue;
            }
            let Some(e) = self.entries.get_mut(&s.id) else {
                continue;
            };
            e.num_computed = s.start + s.len;
            if e.timings.first_token.is_none() {
                e.timings.prefill_steps += 1;
            }
            if self.cfg.enable_prefix_caching {
                e.extend_hashes(bs);
                let full = (e.num_computed / bs).min(e.hashes.len());
                self.kv.cache_full_blocks(s.id, &e.hashes[..full]);
            }
            if !s.sample {
                continue;
            }
            let Some(row) = logits.last(k) else {
                self.finish(
                    s.id,
                    FinishReason::Error,
                    String::new(),
                    Some("the model returned no logits".into()),
                );
                continue;
            };
            match e.seq.step(tokenizer, row) {
                Ok(ev) => {
                    e.tokens.push(ev.token);
                    e.timings.first_token.get_or_insert(now);
                    let sent = e.events.send(RequestEvent::Token(TokenOut {
                        token: ev.token,
                        text: ev.text,
                        logprobs: ev.logprobs,
                    }));
                    if sent.is_err() {
                        // The caller is gone: free its blocks now.
                        self.finish(s.id, FinishReason::Cancelled, String::new(), None);
                    } else if let Some(reason) = ev.finish {
                        self.finish(s.id, reason, String::new(), None);
                    }
                }
                Err(err) => self.finish_failed(s.id, &err),
            }
        }
    }

    /// Ends every request of a batch whose forward pass failed.
    pub fn fail(&mut self, batch: &Batch, message: &str, tok: &Tokenizer) {
        for s in &batch.seqs {
            self.end_early(s.id, FinishReason::Error, Some(message.to_owned()), tok);
        }
    }

    /// Ends `id` with `err` (its message and type go to the client).
    pub(super) fn finish_failed(&mut self, id: RequestId, err: &crate::EngineError) {
        self.finish_as(
            id,
            FinishReason::Error,
            String::new(),
            Some(err.to_string()),
            Some(err.error_type()),
        );
    }

    /// Removes `id` everywhere, frees its blocks, releases its admission counts and sends `Finished`.
    fn finish(&mut self, id: RequestId, reason: FinishReason, text: String, message: Option<String>) {
        self.finish_as(id, reason, text, message, None);
    }

    fn finish_as(
        &mut self,
        id: RequestId,
        reason: FinishReason,
        text: String,
        message: Option<String>,
        error_type: Option<&'static str>,
    ) {
        let Some(e) = self.entries.remove(&id) else {
            return;
        };
        if e.phase == Phase::Running {
            self.running.retain(|r| *r != id);
            self.queue.left_batch(&e.tenant);
        } else {
            self.queue.remove(&e.tenant, e.key);
        }
        self.kv.free(id);
        if let Some(d) = &mut self.draft_kv {
            d.release(id);
        }
        for d in [e.deadline, e.first_token_deadline].into_iter().flatten() {
            self.deadlines.remove(&(d, id));
        }
        self.gate.left(&e.tenant, e.prompt_len, e.phase == Phase::Waiting);
        self.queue.gc();
        let mut timings = e.timings;
        timings.finished = Instant::now();
        let finished = Finished {
            reason,
            text,
            usage: Usage {
                prompt_tokens: e.prompt_len,
                cached_tokens: e.cached_tokens,
                completion_tokens: e.tokens.len() - e.prompt_len,
            },
            timings,
            message,
            error_type,
        };
        // Its sampling state (a grammar state included) goes before anyone hears it ended.
        drop(e.seq);
        if let Some(hook) = &self.hook {
            hook(&e.tenant, &finished);
        }
        let _ = e.events.send(RequestEvent::Finished(finished));
    }

    /// Checks the module's invariants, walking everything (tests only).
    #[cfg(test)]
    pub(crate) fn check_invariants(&self) {
        let bs = self.kv.block_size();
        let pool = self.kv.pool();
        pool.check_invariants();
        assert_eq!(self.queue.len() + self.running.len(), self.entries.len());
        assert_eq!(self.kv.num_tables(), self.running.len());
        let mut holders: HashMap<u32, u32> = HashMap::new();
        for (id, e) in &self.entries {
            let tables = self.kv.block_tables(*id);
            assert_eq!(
                e.phase == Phase::Running,
                self.running.contains(id),
                "request {id} state"
            );
            if e.phase == Phase::Running {
                assert_eq!(tables.len(), self.kv.groups().len(), "request {id}'s tables");
                for t in tables {
                    assert_eq!(t.len(), e.num_computed.div_ceil(bs), "request {id}'s table");
                }
            } else {
                assert!(tables.is_empty(), "waiting request {id} holds blocks");
            }
            for b in tables.iter().flatten().filter(|&&b| b != crate::kv::NULL_BLOCK) {
                *holders.entry(*b).or_default() += 1;
            }
        }
        assert_eq!(
            holders.len(),
            pool.num_in_use(),
            "blocks in use vs blocks in tables"
        );
        // Scope isolation: a block in a request's table that carries a hash carries this request's
        // own hash for that position and group — whose chain includes its scope, adapter and salt.
        for id in &self.running {
            let e = &self.entries[id];
            for (g, t) in self.kv.block_tables(*id).iter().enumerate() {
                for (i, b) in t.iter().enumerate().filter(|(_, b)| **b != crate::kv::NULL_BLOCK) {
                    if let Some(h) = pool.block_hash(*b) {
                        assert_eq!(
                            Some(h),
                            e.hashes.get(i).map(|h| h.for_group(g)),
                            "request {id} block {i} of group {g} is another chain's"
                        );
                    }
                }
            }
        }
        for (b, n) in holders {
            assert_eq!(pool.ref_count(b), n, "block {b}'s ref count");
        }
    }
}

mod queue;
mod speculative;
#[cfg(test)]
mod speculative_tests;
#[cfg(test)]
mod tests;
