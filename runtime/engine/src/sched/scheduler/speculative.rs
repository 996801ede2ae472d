//! The scheduler's side of speculative decoding (`crate::spec`): who speculates this step and with how
//! many drafts, the n-gram proposals, the draft model's rounds, and verification in `update`.
//!
//! A request speculates in a step when it is in decode state (exactly one committed token not yet in
//! the KV cache, and some output), speculation is configured, the step is under
//! `disable_by_batch_size`, the measured step costs say its drafts pay (`speculative::cost`, which may also
//! keep only the first few; pinned requests skip this check), its own acceptance gate is open, and —
//! for a draft model — it uses no LoRA adapter (a draft model serves base requests only; n-gram lookup
//! serves adapter requests too, and their verification runs with their adapter like any of their
//! rows). It drafts at most `num_speculative_tokens` tokens and at most `remaining - 1`, so the
//! committed run never passes `max_tokens` or the context.
//!
//! A *pinned* request — a seeded, sampled request speculating with a draft model — must make the same
//! speculation decisions alone or batched, or its seed would not reproduce its text (its drafts are
//! verified against their distribution, which consumes its randomness differently from plain
//! sampling): it ignores `disable_by_batch_size`, and waits for a step with room for all its drafts
//! rather than drafting fewer. (Its draft cache can still run out of blocks under heavy load; then it
//! decodes that step plainly, and `docs/operations.md` says so.) N-gram and greedy speculation need no
//! pin: point-mass verification commits the very token plain sampling would.
//!
//! After verification the request's KV table is truncated to the accepted tokens and only blocks
//! full of accepted tokens are registered in the prefix cache; the draft cache is rolled back alike.

use super::*;
use crate::speculative::cost::Candidate;
use crate::speculative::draft::{DraftRound, DraftWant};
use crate::speculative::gate::step_allows;
use crate::speculative::{SpecMethod, ngram};

/// What one running request may draft this step.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct SpecWant {
    /// Drafts wanted (n-gram: already proposed, maybe fewer than configured).
    pub k: usize,
    /// See the module header.
    pub pinned: bool,
}

impl Scheduler {
    /// Gives the scheduler the draft model's block tables (`num_blocks` blocks of the engine's
    /// draft storage, shared by the draft model's KV-cache `groups`); needed when speculating with a
    /// draft model.
    pub fn attach_draft_kv(&mut self, num_blocks: usize, groups: &KvGroups) {
        self.draft_kv = Some(DraftKv::with_groups(num_blocks, self.kv.block_size(), groups));
    }

    /// Records a model step's scored positions and seconds (the cost model speculation decides by);
    /// `decode` when every sequence scored only its last token and its drafts.
    pub fn observe_step(&mut self, positions: usize, seconds: f64, decode: bool) {
        if self.cfg.speculative.is_none() {
            return;
        }
        if decode {
            self.step_cost.observe(positions, seconds);
        } else {
            self.step_cost.observe_prefill(positions, seconds);
        }
    }

    /// Records a draft model's pass: `positions` fed tokens in `seconds`.
    pub fn observe_draft(&mut self, positions: usize, seconds: f64) {
        self.step_cost.observe_draft(positions, seconds);
    }

    /// Speculation counters since start.
    pub fn spec_counters(&self) -> &SpecCounters {
        &self.spec_counters
    }

    /// KV blocks held by draft caches (0 without a draft model).
    pub fn draft_blocks_in_use(&self) -> usize {
        self.draft_kv.as_ref().map_or(0, DraftKv::blocks_in_use)
    }

    /// Decides, once per step, what each running request may draft; n-gram proposals are made here.
    pub(super) fn spec_wants(&mut self) -> HashMap<RequestId, SpecWant> {
        let mut wants = HashMap::new();
        let Some(cfg) = self.cfg.speculative else {
            return wants;
        };
        let batch_ok = step_allows(self.running.len(), cfg.disable_by_batch_size);
        let draft_model = cfg.method == SpecMethod::DraftModel;
        if draft_model && self.draft_kv.is_none() {
            return wants;
        }
        for id in &self.running {
            let e = self.entries.get_mut(id).expect("running entry");
            e.spec.drafts.clear();
            let decoding = e.tokens.len() == e.num_computed + 1 && e.tokens.len() > e.prompt_len;
            if !decoding || (draft_model && e.adapter.is_some()) {
                continue;
            }
            let p = e.seq.params();
            let pinned = draft_model && p.temperature > 0.0 && p.seed.is_some();
            if !(batch_ok || pinned) || !e.spec.gate.allows() {
                continue;
            }
            let mut k = cfg
                .num_speculative_tokens
                .min(e.seq.remaining().saturating_sub(1));
            if let SpecMethod::Ngram {
                prompt_lookup_min: lo,
                prompt_lookup_max: hi,
            } = cfg.method
            {
                let proposal = ngram::propose(&e.tokens, lo, hi, k);
                k = proposal.len();
                e.spec.drafts = proposal
                    .into_iter()
                    .map(|token| DraftToken { token, q: None })
                    .collect();
            }
            if k > 0 {
                wants.insert(*id, SpecWant { k, pinned });
            }
        }
        let offered = |w: &HashMap<RequestId, SpecWant>| w.values().map(|w| w.k as u64).sum::<u64>();
        self.spec_counters.proposed_tokens += offered(&wants);
        if cfg.cost_gate {
            self.keep_drafts_that_pay(&mut wants);
        }
        self.spec_counters.kept_tokens += offered(&wants);
        wants
    }

    /// Cuts the unpinned wants to the drafts the measured step costs say raise this step's tokens
    /// per second (`speculative::cost`), each priced by its sequence's per-token acceptance.
    fn keep_drafts_that_pay(&mut self, wants: &mut HashMap<RequestId, SpecWant>) {
        let budget = self.cfg.max_num_batched_tokens;
        let (mut positions, mut decoding) = (0, 0);
        for id in &self.running {
            let e = &self.entries[id];
            let n = e.tokens.len() - e.num_computed;
            positions += n;
            decoding += usize::from(n == 1 && e.tokens.len() > e.prompt_len);
        }
        positions += wants.values().filter(|w| w.pinned).map(|w| w.k).sum::<usize>();
        let prior = self.step_cost.prior();
        // In `running` order, so the decision does not depend on the map's iteration order.
        let ids: Vec<RequestId> = self
            .running
            .iter()
            .filter(|id| wants.get(id).is_some_and(|w| !w.pinned))
            .copied()
            .collect();
        if ids.is_empty() {
            return;
        }
        let candidates: Vec<Candidate> = ids
            .iter()
            .map(|id| {
                let e = &self.entries[id];
                Candidate {
                    per_token: e.spec.gate.per_token(prior),
                    k: wants[id].k,
                    behind: self
                        .draft_kv
                        .as_ref()
                        .map_or(0, |d| d.behind(*id, e.tokens.len())),
                    remaining: e.seq.remaining(),
                }
            })
            .collect();
        let keep = self
            .step_cost
            .choose(positions.min(budget), decoding, &candidates);
        for (id, k) in ids.iter().zip(keep) {
            if k == 0 {
                wants.remove(id);
            } else if let Some(w) = wants.get_mut(id) {
                w.k = k;
            }
        }
    }

    /// Records that `id` was granted `drafts` draft positions (n-gram drafts are cut to fit; a draft
    /// model's come later, in [`Self::end_draft_round`]).
    pub(super) fn set_drafts(&mut self, id: RequestId, drafts: usize) {
        let e = self.entries.get_mut(&id).expect("running entry");
        e.spec.drafts.truncate(drafts);
        e.spec.chunk.clear();
        if drafts > 0 && e.spec.drafts.len() == drafts {
            e.spec.chunk.push(e.tokens[e.num_computed]);
            e.spec.chunk.extend(e.spec.drafts.iter().map(|d| d.token));
        }
    }

    /// Starts the draft model's round for this step's speculating requests, if any.
    pub fn draft_round(&mut self, batch: &Batch) -> Option<DraftRound> {
        let draft_kv = self.draft_kv.as_mut()?;
        let wants: Vec<DraftWant<'_>> = batch
            .seqs
            .iter()
            .filter(|s| s.drafts > 0)
            .map(|s| DraftWant {
                id: s.id,
                tokens: &self.entries[&s.id].tokens,
                k: s.drafts,
            })
            .collect();
        (!wants.is_empty()).then(|| draft_kv.plan(&wants))
    }

    /// The draft model's inputs for the round's next pass.
    pub fn draft_inputs<'a>(&'a self, round: &'a DraftRound) -> Vec<SeqInput<'a>> {
        self.draft_kv.as_ref().map_or_else(Vec::new, |d| d.inputs(round))
    }

    /// Turns a draft pass's logits into each request's next draft (shaped by the request's own
    /// parameters); returns whether another pass is needed.
    pub fn draft_absorb(&mut self, round: &mut DraftRound, logits: &Logits) -> bool {
        let Some(d) = self.draft_kv.as_mut() else {
            return false;
        };
        let entries = &self.entries;
        d.absorb(round, logits, |id, row, drafted| {
            entries[&id].seq.propose(row, drafted)
        })
    }

    /// Hands the round's drafts to their requests; a request that got fewer than it was granted
    /// (its draft cache had no blocks, or the round failed) has its grant cut to what it got.
    pub fn end_draft_round(&mut self, round: Option<DraftRound>, batch: &mut Batch) {
        let mut got: HashMap<RequestId, Vec<DraftToken>> = match round {
            Some(r) => r.drafts().into_iter().collect(),
            None => HashMap::new(),
        };
        for s in batch.seqs.iter_mut().filter(|s| s.drafts > 0) {
            let e = self.entries.get_mut(&s.id).expect("scheduled entry");
            e.spec.drafts = got.remove(&s.id).unwrap_or_default();
            let drafts = e.spec.drafts.len().min(s.drafts);
            if drafts < s.drafts {
                s.len = 1 + drafts;
                s.drafts = drafts;
                self.kv.truncate(s.id, s.start + s.len);
            }
            self.set_drafts(s.id, drafts);
        }
    }

    /// Ends a round whose draft pass failed: its draft caches are dropped and nobody speculates.
    pub fn abandon_draft_round(&mut self, round: DraftRound, batch: &mut Batch) {
        if let Some(d) = self.draft_kv.as_mut() {
            d.abandon(round);
        }
        self.end_draft_round(None, batch);
    }

    /// Verifies request `s` (batch index `k`) and commits what was accepted: the table is cut back to
    /// the accepted tokens, full blocks of accepted tokens are registered, the draft cache is rolled
    /// back, and one event goes out per committed token.
    pub(super) fn update_speculative(
        &mut self,
        k: usize,
        s: &ScheduledSeq,
        logits: &Logits,
        tok: &Tokenizer,
    ) {
        let Some(e) = self.entries.get_mut(&s.id) else {
            return;
        };
        let cfg = self
            .cfg
            .speculative
            .expect("speculative grants come from a speculative config");
        let drafts = std::mem::take(&mut e.spec.drafts);
        let rows = logits.seq(k);
        if rows.len() != (1 + drafts.len()) * logits.vocab_size {
            let message = "the model returned the wrong number of verification rows".to_owned();
            self.finish(s.id, FinishReason::Error, String::new(), Some(message));
            return;
        }
        let verified = match e.seq.verify(tok, rows, logits.vocab_size, &drafts, cfg.rule) {
            Ok(v) => v,
            Err(err) => {
                self.finish_failed(s.id, &err);
                return;
            }
        };
        self.spec_counters.record(drafts.len(), verified.accepted);
        self.step_cost.observe_run(drafts.len(), verified.accepted);
        e.spec
            .gate
            .record(drafts.len(), verified.accepted, cfg.min_acceptance_rate);
        // The last committed token and the accepted drafts now have their KV; rejected positions
        // give their slots back.
        e.num_computed = s.start + 1 + verified.accepted;
        e.tokens.extend(verified.events.iter().map(|ev| ev.token));
        self.kv.truncate(s.id, e.num_computed);
        if let Some(d) = &mut self.draft_kv {
            d.rollback(s.id, e.num_computed);
        }
        if self.cfg.enable_prefix_caching {
            let bs = self.kv.block_size();
            e.extend_hashes(bs);
            let full = (e.num_computed / bs).min(e.hashes.len());
            self.kv.cache_full_blocks(s.id, &e.hashes[..full]);
        }
        e.timings.first_token.get_or_insert(Instant::now());
        let failed = verified.error;
        for ev in verified.events {
            let finish = ev.finish;
            let e = self.entries.get_mut(&s.id).expect("live entry");
            let sent = e.events.send(RequestEvent::Token(TokenOut {
                token: ev.token,
                text: ev.text,
                logprobs: ev.logprobs,
            }));
            if sent.is_err() {
                self.finish(s.id, FinishReason::Cancelled, String::new(), None);
                return;
            }
            if let Some(reason) = finish {
                self.finish(s.id, reason, String::new(), None);
                return;
            }
        }
        if let Some(message) = failed {
            self.finish(s.id, FinishReason::Error, String::new(), Some(message));
        }
    }
}
