//! How requests enter and leave the running set: arrival (`add`), the ways a request ends early
//! (abort, shutdown, deadline), preemption by recompute (the victim and what it gives back), and the
//! admission of waiting requests in fair order within the step's budget, sequence slots, adapter slots
//! and free blocks (see the invariants in the parent module).

use super::*;

impl Scheduler {
    /// Takes a request the gate has let in. A request that could never fit the KV pool, even alone,
    /// ends at once with an error instead of cycling through preemption.
    pub fn add(&mut self, s: Submitted) {
        let Submitted {
            id,
            request: r,
            events,
        } = s;
        let Request {
            tenant,
            cache_scope,
            adapter,
            cache_salt,
            priority,
            prompt,
            params,
            arrival,
            deadline,
            first_token_deadline,
        } = r;
        // A first-token deadline at or past the request's own deadline adds nothing.
        let first_token_deadline = first_token_deadline.filter(|f| deadline.is_none_or(|d| *f < d));
        let prompt_len = prompt.len();
        let most = prompt_len
            .saturating_add(params.max_tokens.unwrap_or(usize::MAX))
            .min(self.max_model_len);
        let capacity = self.kv.capacity_tokens(self.cfg.max_num_batched_tokens);
        let seq = Sequence::new(&prompt, params, &self.eos, self.max_model_len);
        self.next_seq += 1;
        let key = QueueKey {
            priority,
            seq: self.next_seq,
        };
        let entry = Entry {
            tenant,
            scope: cache_scope,
            adapter,
            salt: cache_salt,
            key,
            tokens: prompt,
            prompt_len,
            num_computed: 0,
            hashes: Vec::new(),
            seq,
            events,
            phase: Phase::Waiting,
            cached_tokens: 0,
            deadline,
            first_token_deadline,
            spec: SpecState::default(),
            timings: Timings {
                arrival,
                first_scheduled: None,
                first_token: None,
                finished: arrival,
                preemptions: 0,
                prefill_steps: 0,
            },
        };
        let tenant = entry.tenant.clone();
        self.queue.push(&tenant, key, id, prompt_len);
        for d in [deadline, first_token_deadline].into_iter().flatten() {
            self.deadlines.insert((d, id));
        }
        self.entries.insert(id, entry);
        if prompt_len == 0 || most > capacity {
            let message = if prompt_len == 0 {
                "the prompt is empty".to_owned()
            } else {
                format!("prompt + max_tokens ({most} tokens) exceeds the KV cache ({capacity} tokens)")
            };
            self.finish(id, FinishReason::Error, String::new(), Some(message));
        }
    }

    /// Ends `id` (waiting or running) with `reason`, e.g. the client went away; unknown ids are ignored.
    pub fn abort(&mut self, id: RequestId, reason: FinishReason, message: Option<String>, tok: &Tokenizer) {
        self.end_early(id, reason, message, tok);
    }

    /// Ends every request with `reason` (shutdown).
    pub fn abort_all(&mut self, reason: FinishReason, message: &str, tok: &Tokenizer) {
        let ids: Vec<RequestId> = self.entries.keys().copied().collect();
        for id in ids {
            self.end_early(id, reason, Some(message.to_owned()), tok);
        }
    }

    /// Ends a request from outside the sampler, flushing the text it held back.
    pub(super) fn end_early(
        &mut self,
        id: RequestId,
        reason: FinishReason,
        message: Option<String>,
        tok: &Tokenizer,
    ) {
        let Some(e) = self.entries.get_mut(&id) else {
            return;
        };
        // A detokenizer error here only loses the held-back tail; the request still ends cleanly.
        let tail = e.seq.abort(tok, reason).unwrap_or_default();
        self.finish(id, reason, tail, message);
    }

    /// Ends requests whose deadline passed, and those whose first-token deadline passed before their
    /// first token.
    pub(super) fn expire(&mut self, now: Instant, tok: &Tokenizer) {
        while let Some(&(d, id)) = self.deadlines.first() {
            if d > now {
                break;
            }
            self.deadlines.pop_first();
            let Some(e) = self.entries.get(&id) else {
                continue;
            };
            let generated = e.tokens.len() - e.prompt_len;
            if e.first_token_deadline == Some(d) {
                if generated == 0 {
                    let message = format!(
                        "no first token within the first-token deadline ({} ms after arrival)",
                        d.saturating_duration_since(e.timings.arrival).as_millis()
                    );
                    let reason = FinishReason::Timeout;
                    self.finish_as(
                        id,
                        reason,
                        String::new(),
                        Some(message),
                        Some(FIRST_TOKEN_DEADLINE),
                    );
                }
                continue;
            }
            let message = if generated > 0 {
                format!("the request's deadline passed after {generated} generated tokens")
            } else {
                "the request's deadline passed before its first token".to_owned()
            };
            self.end_early(id, FinishReason::Timeout, Some(message), tok);
        }
    }

    /// Picks the preemption victim: the tenant of the newest running request gives one up, by its
    /// own order — worst priority, then newest.
    pub(super) fn victim(&self) -> usize {
        let newest = self
            .running
            .iter()
            .max_by_key(|id| self.entries[*id].key.seq)
            .expect("a running request");
        let tenant = &self.entries[newest].tenant;
        let (i, _) = self
            .running
            .iter()
            .enumerate()
            .filter(|(_, id)| &self.entries[*id].tenant == tenant)
            .max_by_key(|(_, id)| {
                let k = self.entries[*id].key;
                (k.priority, k.seq)
            })
            .expect("the newest request's tenant has one");
        i
    }

    /// Frees `running[idx]`'s blocks and puts it back in its tenant's queue.
    pub(super) fn preempt(&mut self, idx: usize) {
        let id = self.running.remove(idx);
        self.kv.free(id);
        if let Some(d) = &mut self.draft_kv {
            d.release(id);
        }
        let e = self.entries.get_mut(&id).expect("running entry");
        e.spec.drafts.clear();
        e.phase = Phase::Preempted;
        e.num_computed = 0;
        e.timings.preemptions += 1;
        self.queue.left_batch(&e.tenant);
        self.queue.push(&e.tenant, e.key, id, e.tokens.len());
        self.counters.preemptions += 1;
    }

    /// Admits waiting requests in fair order while budget, sequence slots and blocks allow.
    pub(super) fn admit_waiting(&mut self, now: Instant, budget: &mut usize, batch: &mut Batch) {
        let bs = self.kv.block_size();
        let mut skip: Vec<String> = Vec::new();
        let mut adapters: HashSet<u64> = self
            .running
            .iter()
            .filter_map(|id| self.entries[id].adapter.as_ref().map(|a| a.id))
            .collect();
        while *budget > 0 && self.running.len() < self.cfg.max_num_seqs {
            let Some((tenant, key, id)) = self.queue.peek(&skip) else {
                break;
            };
            let tenant = tenant.to_owned();
            let caching = self.cfg.enable_prefix_caching;
            let e = self.entries.get_mut(&id).expect("queued entry");
            let adapter = e.adapter.as_ref().map(|a| a.id);
            if let Some(a) = adapter
                && !adapters.contains(&a)
                && adapters.len() >= self.cfg.max_loras
            {
                // Its adapter would be one too many in the batch: it waits for a slot.
                skip.push(tenant);
                continue;
            }
            let total = e.tokens.len();
            let mut prefix = CachedPrefix::default();
            if caching {
                e.extend_hashes(bs);
                // At least the last token is computed again: its logits give the next token.
                prefix = self.kv.cached_prefix(&e.hashes, (total - 1) / bs);
            }
            let computed = prefix.tokens(bs);
            let n = (total - computed).min(*budget);
            if self.kv.allocate_with_prefix(id, &prefix, n).is_err() {
                skip.push(tenant);
                continue;
            }
            let e = self.entries.get_mut(&id).expect("queued entry");
            if e.phase == Phase::Waiting {
                e.cached_tokens = computed;
                e.timings.first_scheduled = Some(now);
                self.gate.started(&tenant, e.prompt_len);
            }
            e.phase = Phase::Running;
            e.num_computed = computed;
            self.counters.prefix_query_tokens += total as u64;
            self.counters.prefix_hit_tokens += computed as u64;
            self.queue.admit(&tenant, key);
            self.queue.charge(&tenant, n);
            self.running.push(id);
            adapters.extend(adapter);
            batch.seqs.push(ScheduledSeq {
                id,
                start: computed,
                len: n,
                sample: computed + n == total,
                drafts: 0,
            });
            *budget -= n;
        }
    }
}
