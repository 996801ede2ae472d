//! Speculative decoding in the scheduler, with a fake model that keeps a fake KV cache: every token it
//! is given is written to its slot, and every position before a chunk is read back and must hold the
//! request's committed token there — so a stale draft, a wrong rollback, or a cached block holding
//! rejected tokens is caught on the next read. The fake target predicts a mostly periodic sequence (so
//! n-gram lookup finds drafts, some wrong); a fake draft model predicts it with deliberate mistakes.

use super::*;
use crate::kv::BlockId;
use crate::sampling::SamplingParams;
use crate::sched::admission::{QueueLimits, TenantLimits};
use crate::sched::request::{EventReceiver, RequestEvent};
use crate::speculative::SpecConfig;
use crate::tokenizer::test_tokenizer;
use rand::{RngExt, SeedableRng};
use rand_chacha::ChaCha8Rng;

const EOS: u32 = 0;
/// The fake models' tokens: 2..62 (byte symbols; never EOS).
const LO: u32 = 2;
const SPAN: u32 = 60;

/// The fake target's prediction for the token after `t` at position `pos`: a cycle of 10 (2, 3, …,
/// 11, 2, …; any token leads into it), broken every 7th position.
fn next(t: u32, pos: usize) -> u32 {
    if pos % 7 == 3 {
        LO + (t * 5 + 1) % SPAN
    } else {
        LO + (t + 9) % 10
    }
}

/// The fake draft model: right except at positions divisible by 5 (and `bad`: only every other time).
fn draft_next(t: u32, pos: usize, bad: bool) -> u32 {
    if pos.is_multiple_of(5) || (bad && pos.is_multiple_of(2)) {
        LO + (t + 17) % SPAN
    } else {
        next(t, pos)
    }
}

/// A row whose argmax is `token` (a greedy request takes it).
fn row(vocab: usize, token: u32) -> Vec<f32> {
    let mut r = vec![0.0; vocab];
    r[token as usize] = 8.0;
    r[(token as usize + 1) % vocab] = 6.0;
    r
}

struct Fake {
    s: Scheduler,
    tok: Tokenizer,
    gate: Arc<AdmissionGate>,
    rx: HashMap<RequestId, EventReceiver>,
    next_id: RequestId,
    /// The fake KV caches: (block, offset) → token, for the target and the draft model.
    kv: HashMap<(BlockId, usize), u32>,
    draft_kv: HashMap<(BlockId, usize), u32>,
    /// Every hash a block was registered under → the tokens it covers.
    hashed: HashMap<BlockHash, Vec<u32>>,
    bad_draft: bool,
}

fn fake(spec: Option<SpecConfig>, blocks: usize, bs: usize, budget: usize) -> Fake {
    let gate = Arc::new(AdmissionGate::new(QueueLimits {
        max_queued_requests: 100_000,
        max_queued_tokens: 100_000_000,
    }));
    let cfg = SchedulerConfig {
        max_num_seqs: 8,
        max_num_batched_tokens: budget,
        enable_prefix_caching: true,
        max_loras: 4,
        speculative: spec,
    };
    let mut s = Scheduler::new(cfg, blocks, bs, 4096, vec![EOS], gate.clone());
    if spec.is_some_and(|c| c.method == crate::speculative::SpecMethod::DraftModel) {
        s.attach_draft_kv(blocks + 8, &KvGroups::uniform(1));
    }
    Fake {
        s,
        tok: test_tokenizer::tokenizer(),
        gate,
        rx: HashMap::new(),
        next_id: 0,
        kv: HashMap::new(),
        draft_kv: HashMap::new(),
        hashed: HashMap::new(),
        bad_draft: false,
    }
}

/// A prompt of `n` fake-model tokens that differs per `salt`.
fn prompt(n: usize, salt: u32) -> Vec<u32> {
    (0..n as u32).map(|i| LO + (i * 3 + salt * 7) % SPAN).collect()
}

impl Fake {
    fn add(&mut self, tenant: &str, prompt: Vec<u32>, params: SamplingParams) -> RequestId {
        self.gate
            .try_enter(tenant, prompt.len(), TenantLimits::default())
            .unwrap();
        self.next_id += 1;
        let id = self.next_id;
        let (events, rx) = tokio::sync::mpsc::unbounded_channel();
        self.s.add(Submitted {
            id,
            request: Request {
                tenant: tenant.into(),
                cache_scope: tenant.into(),
                adapter: None,
                cache_salt: None,
                priority: 0,
                prompt,
                params: params.validate(self.tok.vocab_size()).unwrap(),
                arrival: Instant::now(),
                deadline: None,
                first_token_deadline: None,
            },
            events,
        });
        self.rx.insert(id, rx);
        id
    }

    fn greedy(&mut self, tenant: &str, prompt: Vec<u32>, max_tokens: usize) -> RequestId {
        self.add(tenant, prompt, SamplingParams::greedy(max_tokens))
    }

    /// Writes `tokens` at positions `start..` of a table into `store`, after checking that positions
    /// `0..check` hold `truth`.
    fn write(
        store: &mut HashMap<(BlockId, usize), u32>,
        table: &[BlockId],
        bs: usize,
        (start, tokens): (usize, &[u32]),
        (check, truth): (usize, &[u32]),
        what: &str,
    ) {
        for (p, want) in truth.iter().enumerate().take(check) {
            let got = store.get(&(table[p / bs], p % bs));
            assert_eq!(
                got,
                Some(want),
                "{what}: position {p} reads a stale or foreign token"
            );
        }
        for (j, &t) in tokens.iter().enumerate() {
            let p = start + j;
            store.insert((table[p / bs], p % bs), t);
        }
    }

    /// One step: schedule, draft (fake draft model), run the fake target, update, check invariants.
    fn step(&mut self) -> Batch {
        let bs = self.s.kv.block_size();
        let vocab = self.tok.vocab_size();
        let mut batch = self.s.schedule(Instant::now(), &self.tok);
        if let Some(mut round) = self.s.draft_round(&batch) {
            while !round.is_done() {
                let inputs = self.s.draft_inputs(&round);
                let mut logits = Logits {
                    vocab_size: vocab,
                    data: Vec::new(),
                    rows: Vec::new(),
                };
                for (r, inp) in inputs.iter().enumerate() {
                    let id = self.draft_owner(inp);
                    // Positions before the pass that hold committed tokens must read them back.
                    let truth = &self.s.entries[&id].tokens;
                    let committed = inp.start_pos.min(truth.len());
                    let (store, table) = (&mut self.draft_kv, &inp.block_tables[0][..]);
                    Self::write(
                        store,
                        table,
                        bs,
                        (inp.start_pos, inp.tokens),
                        (committed, truth),
                        "draft",
                    );
                    let last = *inp.tokens.last().unwrap();
                    let pos = inp.start_pos + inp.tokens.len();
                    logits
                        .data
                        .extend(row(vocab, draft_next(last, pos, self.bad_draft)));
                    logits.rows.push(r..r + 1);
                }
                drop(inputs);
                self.s.draft_absorb(&mut round, &logits);
            }
            self.s.end_draft_round(Some(round), &mut batch);
        }
        let mut logits = Logits {
            vocab_size: vocab,
            data: Vec::new(),
            rows: Vec::new(),
        };
        let (inputs, _) = self.s.inputs(&batch);
        for (inp, seq) in inputs.iter().zip(&batch.seqs) {
            let truth = &self.s.entries[&seq.id].tokens;
            Self::write(
                &mut self.kv,
                &inp.block_tables[0],
                bs,
                (seq.start, inp.tokens),
                (seq.start, truth),
                "target",
            );
            let first = logits.data.len() / vocab;
            let rows: Vec<usize> = match inp.logits {
                LogitsRows::None => vec![],
                LogitsRows::Last => vec![inp.tokens.len() - 1],
                LogitsRows::All => (0..inp.tokens.len()).collect(),
            };
            for &j in &rows {
                logits
                    .data
                    .extend(row(vocab, next(inp.tokens[j], seq.start + j + 1)));
            }
            logits.rows.push(first..first + rows.len());
        }
        drop(inputs);
        self.s.update(&batch, &logits, &self.tok);
        self.s.check_invariants();
        self.check_cached_blocks();
        batch
    }

    /// The request whose draft table `inp` uses (draft tables are not shared).
    fn draft_owner(&self, inp: &SeqInput<'_>) -> RequestId {
        let d = self.s.draft_kv.as_ref().unwrap();
        *self
            .s
            .entries
            .keys()
            .find(|id| d.block_table(**id) == &inp.block_tables[0][..])
            .expect("a draft input belongs to a live request")
    }

    /// Every registered block holds exactly the tokens its hash was computed from.
    fn check_cached_blocks(&mut self) {
        let bs = self.s.kv.block_size();
        for (id, e) in &self.s.entries {
            for (i, &b) in self.s.kv.block_table(*id).iter().enumerate() {
                if let Some(h) = self.s.kv.pool().block_hash(b) {
                    let tokens = e.tokens[i * bs..(i + 1) * bs].to_vec();
                    assert_eq!(self.hashed.entry(h).or_insert(tokens.clone()), &tokens);
                }
            }
        }
        let pool = self.s.kv.pool();
        for b in 0..pool.num_blocks() as BlockId {
            if let Some(h) = pool.block_hash(b)
                && let Some(tokens) = self.hashed.get(&h)
            {
                for (o, t) in tokens.iter().enumerate() {
                    assert_eq!(
                        self.kv.get(&(b, o)),
                        Some(t),
                        "cached block {b} holds other tokens"
                    );
                }
            }
        }
    }

    /// Runs until idle; the tokens and finish of each request.
    fn run(&mut self) -> HashMap<RequestId, (Vec<u32>, FinishReason)> {
        while self.s.has_work() {
            self.step();
        }
        let ids: Vec<RequestId> = self.rx.keys().copied().collect();
        ids.into_iter()
            .map(|id| {
                let rx = self.rx.get_mut(&id).unwrap();
                let evs: Vec<RequestEvent> = std::iter::from_fn(|| rx.try_recv().ok()).collect();
                let tokens = evs
                    .iter()
                    .filter_map(|e| match e {
                        RequestEvent::Token(t) => Some(t.token),
                        RequestEvent::Finished(_) => None,
                    })
                    .collect();
                let reason = match evs.last() {
                    Some(RequestEvent::Finished(f)) => f.reason,
                    other => panic!("request {id} ended with {other:?}"),
                };
                (id, (tokens, reason))
            })
            .collect()
    }
}

fn ngram() -> SpecConfig {
    SpecConfig {
        min_acceptance_rate: 0.0,
        ..SpecConfig::ngram(4, 1, 3)
    }
}

fn draft_model() -> SpecConfig {
    SpecConfig {
        min_acceptance_rate: 0.0,
        ..SpecConfig::draft_model(3)
    }
}

/// Runs the same requests under `spec` and returns their outputs, the steps taken and the counters.
fn outputs(
    spec: Option<SpecConfig>,
    bad: bool,
    reqs: &[(Vec<u32>, SamplingParams)],
) -> (Vec<(Vec<u32>, FinishReason)>, usize, SpecCounters) {
    let mut f = fake(spec, 64, 4, 64);
    f.bad_draft = bad;
    let ids: Vec<RequestId> = reqs
        .iter()
        .enumerate()
        .map(|(i, (p, params))| f.add(&format!("t{}", i % 2), p.clone(), params.clone()))
        .collect();
    let mut steps = 0;
    while f.s.has_work() {
        f.step();
        steps += 1;
    }
    let mut out = f.run();
    (
        ids.iter().map(|id| out.remove(id).unwrap()).collect(),
        steps,
        f.s.spec_counters().clone(),
    )
}

#[test]
fn greedy_speculation_gives_the_tokens_of_plain_decoding() {
    let reqs: Vec<(Vec<u32>, SamplingParams)> = (0..6)
        .map(|i| (prompt(5 + 3 * i, i as u32), SamplingParams::greedy(20 + 7 * i)))
        .collect();
    let (plain, plain_steps, _) = outputs(None, false, &reqs);
    for (name, spec, bad) in [
        ("ngram", ngram(), false),
        ("draft", draft_model(), false),
        ("bad draft", draft_model(), true),
    ] {
        let (got, steps, c) = outputs(Some(spec), bad, &reqs);
        assert_eq!(got, plain, "{name}");
        assert!(
            c.accepted_tokens > 0 && c.accepted_tokens < c.draft_tokens,
            "{name}: {c:?}"
        );
        assert!(
            steps < plain_steps,
            "{name}: {steps} steps vs {plain_steps} plain"
        );
    }
}

#[test]
fn stops_inside_an_accepted_run_end_where_plain_decoding_ends() {
    // The fake target cycles 2..12, so a stop token, EOS-free max_tokens and a stop string all land
    // inside runs n-gram lookup drafts correctly.
    let stop_tok = |t: u32| SamplingParams {
        stop_token_ids: vec![t],
        ..SamplingParams::greedy(40)
    };
    let text = test_tokenizer::tokenizer().decode(&[LO + 5], false).unwrap();
    let stop_str = SamplingParams {
        stop: vec![text],
        ..SamplingParams::greedy(40)
    };
    let reqs = vec![
        (prompt(12, 1), stop_tok(LO + 7)),
        (prompt(12, 2), SamplingParams::greedy(13)),
        (prompt(12, 3), stop_str),
        (
            prompt(12, 4),
            SamplingParams {
                min_tokens: 5,
                ..stop_tok(LO + 3)
            },
        ),
    ];
    let (plain, _, _) = outputs(None, false, &reqs);
    let (spec, _, c) = outputs(Some(ngram()), false, &reqs);
    assert_eq!(spec, plain);
    assert!(c.accepted_tokens > 0);
    assert_eq!(plain[1].0.len(), 13);
    assert!(plain[0].0.len() < 40 && plain[0].1 == FinishReason::Stop);
}

#[test]
fn rejected_positions_give_their_blocks_back_and_are_never_cached() {
    // Blocks of 4, 4 drafts per step. The prompt follows the fake target's cycle, so after the first
    // sampled token (4) the lookup of 2 3 4 drafts 5 6 7 2 at positions 9..12: the target accepts 5
    // and breaks the cycle at position 10, so 6 7 2 are rejected (10 valid tokens of 13 scored).
    let mut f = fake(Some(ngram()), 32, 4, 64);
    let id = f.greedy("a", vec![2, 3, 4, 5, 6, 7, 2, 3], 30);
    f.step(); // prefill: 8 tokens, the first sampled
    let b = f.step();
    let s = b.seqs[0];
    assert!(s.drafts > 0, "n-gram lookup found the repeated 2 3 4");
    assert_eq!((s.start, s.len, s.drafts), (8, 5, 4));
    let e = &f.s.entries[&id];
    assert_eq!(e.num_computed, 10);
    assert_eq!(e.tokens[8..], [4, 5, 28]);
    assert_eq!(
        f.s.kv.block_table(id).len(),
        3,
        "the fourth block held rejected drafts only"
    );
    let c = f.s.spec_counters().clone();
    assert_eq!(c.drafts, 1);
    f.run();
    let p = f.s.kv.pool();
    assert_eq!(p.num_in_use(), 0);
    assert_eq!(p.num_cached() + p.num_free_uncached(), 32);
}

#[test]
fn a_thousand_speculative_requests_with_cancellations_leave_nothing_behind() {
    for (name, spec) in [("ngram", ngram()), ("draft", draft_model())] {
        let mut rng = ChaCha8Rng::seed_from_u64(11);
        // A small pool: preemption and draft-cache eviction happen too.
        let mut f = fake(Some(spec), 40, 4, 48);
        let systems: Vec<Vec<u32>> = (0..3).map(|i| prompt(8, 100 + i)).collect();
        let mut live: Vec<RequestId> = Vec::new();
        let mut added = 0;
        while added < 1000 || f.s.has_work() {
            match rng.random_range(0..10) {
                0..=3 if added < 1000 => {
                    let mut p = systems[rng.random_range(0..3)].clone();
                    p.extend(prompt(rng.random_range(1..10), rng.random_range(0..4)));
                    let params = if rng.random_range(0..3) == 0 {
                        SamplingParams {
                            temperature: 0.9,
                            seed: Some(rng.random()),
                            max_tokens: Some(rng.random_range(1..40)),
                            ..SamplingParams::default()
                        }
                    } else {
                        SamplingParams::greedy(rng.random_range(1..40))
                    };
                    let t = ["a", "b"][rng.random_range(0..2)];
                    live.push(f.add(t, p, params));
                    added += 1;
                }
                4 if !live.is_empty() => {
                    let id = live.swap_remove(rng.random_range(0..live.len()));
                    if rng.random_range(0..2) == 0 {
                        f.s.abort(id, FinishReason::Cancelled, None, &f.tok);
                    } else {
                        f.rx.remove(&id); // the client went away mid-stream
                    }
                    f.s.check_invariants();
                }
                _ => {
                    f.step();
                }
            }
            live.retain(|id| f.s.entries.contains_key(id));
        }
        let p = f.s.kv.pool();
        assert_eq!(p.num_in_use(), 0, "{name}: blocks leaked");
        assert_eq!(p.num_free_uncached() + p.num_cached(), 40, "{name}");
        assert_eq!(f.s.draft_blocks_in_use(), 0, "{name}: draft blocks leaked");
        assert_eq!(f.gate.queued(), (0, 0), "{name}");
        let c = f.s.spec_counters();
        assert!(c.drafts > 100 && c.accepted_tokens > 0, "{name}: {c:?}");
        assert!(
            f.s.counters().prefix_hit_tokens > 0,
            "{name}: the prefix cache was exercised"
        );
        for (id, rx) in &mut f.rx {
            let evs: Vec<RequestEvent> = std::iter::from_fn(|| rx.try_recv().ok()).collect();
            let n = evs
                .iter()
                .filter(|e| matches!(e, RequestEvent::Finished(_)))
                .count();
            assert_eq!(n, 1, "{name}: request {id}");
            assert!(matches!(evs.last(), Some(RequestEvent::Finished(_))));
        }
    }
}
