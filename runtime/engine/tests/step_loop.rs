//! The step loop end to end on a real (tiny, generated) model: `EngineHandle::start` owning an
//! `Engine`, requests submitted through the handle and consumed through their streams.
//!
//! - concurrent greedy requests (chunked prefill, mixed lengths) give the tokens each gives alone;
//! - a repeated long prompt hits the prefix cache in its tenant's scope and only there;
//! - dropped streams free everything within a bounded wait;
//! - a full queue refuses at once, and every accepted request still completes;
//! - a deadline already passed ends a request with `timeout` and no tokens;
//! - a pool small enough to force preemption still gives every request its tokens-alone output.

use modelfleet_engine::sampling::SamplingParams;
use modelfleet_engine::sched::{
    EngineHandle, Finished, QueueLimits, Rejection, Request, RequestEvent, RequestStream, SchedulerConfig,
    TenantLimits,
};
use modelfleet_engine::stop::FinishReason;
use modelfleet_engine::{Engine, EngineConfig};
use std::path::Path;
use std::time::{Duration, Instant};

mod common;
use common::tiny_model;

const MAX_MODEL_LEN: usize = 512;

fn roomy() -> QueueLimits {
    QueueLimits {
        max_queued_requests: 1000,
        max_queued_tokens: 1_000_000,
    }
}

/// A step loop over the model in `dir` with `num_kv_blocks` blocks of 16 tokens.
fn start(dir: &Path, num_kv_blocks: usize, cfg: SchedulerConfig, limits: QueueLimits) -> EngineHandle {
    let path = dir.to_path_buf();
    EngineHandle::start(
        move || {
            Engine::load(
                &path,
                &EngineConfig {
                    threads: 1,
                    block_size: 16,
                    num_kv_blocks: Some(num_kv_blocks),
                    max_model_len: Some(MAX_MODEL_LEN),
                    ..EngineConfig::default()
                },
            )
        },
        cfg,
        limits,
    )
    .unwrap()
}

/// A greedy request of `tenant` (also its cache scope) for `max_tokens` tokens, EOS ignored.
fn request(h: &EngineHandle, tenant: &str, prompt: Vec<u32>, max_tokens: usize) -> Request {
    let vocab = h.model_dir().config.vocab_size;
    Request {
        tenant: tenant.into(),
        cache_scope: tenant.into(),
        adapter: None,
        cache_salt: None,
        priority: 0,
        prompt,
        params: SamplingParams {
            ignore_eos: true,
            ..SamplingParams::greedy(max_tokens)
        }
        .validate(vocab)
        .unwrap(),
        arrival: Instant::now(),
        deadline: None,
        first_token_deadline: None,
    }
}

/// A prompt of `n` token ids (ordinary byte-level tokens of the 512-token vocabulary) that differs
/// per `salt`.
fn prompt(n: usize, salt: u32) -> Vec<u32> {
    (0..n as u32)
        .map(|i| 20 + (i * 7 + salt * 31 + i * i * 3) % 400)
        .collect()
}

/// Reads a stream to its end: the generated tokens and the one `Finished`, which must come last.
fn collect(mut s: RequestStream) -> (Vec<u32>, Finished) {
    let mut tokens = Vec::new();
    loop {
        match s.blocking_next() {
            Some(RequestEvent::Token(t)) => tokens.push(t.token),
            Some(RequestEvent::Finished(f)) => {
                assert!(s.blocking_next().is_none(), "nothing after Finished");
                return (tokens, f);
            }
            None => panic!("request {} ended without Finished", s.id),
        }
    }
}

fn run_alone(h: &EngineHandle, r: Request) -> (Vec<u32>, Finished) {
    collect(h.submit(r, TenantLimits::default()).unwrap())
}

/// Polls `stats()` until `done` holds, for at most `limit`.
fn wait_for(
    h: &EngineHandle,
    limit: Duration,
    done: impl Fn(&modelfleet_engine::sched::Stats) -> bool,
) -> bool {
    let t = Instant::now();
    loop {
        if done(&h.stats()) {
            return true;
        }
        if t.elapsed() > limit {
            return false;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

fn idle(s: &modelfleet_engine::sched::Stats) -> bool {
    s.running == 0 && s.waiting == 0 && s.kv_blocks_in_use == 0
}

#[test]
fn concurrent_requests_give_the_same_tokens_as_alone() {
    let dir = tiny_model();
    // A small token budget so the longer prompts are prefilled in chunks next to others' decodes.
    let cfg = SchedulerConfig {
        max_num_seqs: 8,
        max_num_batched_tokens: 32,
        enable_prefix_caching: true,
        max_loras: 4,
        speculative: None,
    };
    let h = start(dir.path(), 256, cfg, roomy());
    let tok = &h.model_dir().tokenizer;
    let mut prompts: Vec<Vec<u32>> = [
        "Once upon a time",
        "The server answers every request",
        "Hello, world! How are you today?",
    ]
    .iter()
    .map(|t| tok.encode(t, false).unwrap())
    .collect();
    prompts.extend([prompt(3, 1), prompt(70, 2), prompt(100, 3)]);
    let max_tokens = [7, 20, 33, 40, 12, 25];

    // Alone, one after another, in a scope of their own (so the concurrent run below gets no cache hits).
    let alone: Vec<(Vec<u32>, Finished)> = prompts
        .iter()
        .zip(max_tokens)
        .map(|(p, m)| run_alone(&h, request(&h, "alone", p.clone(), m)))
        .collect();
    let before = h.stats();

    // All at once, each in its own tenant.
    let streams: Vec<RequestStream> = prompts
        .iter()
        .zip(max_tokens)
        .enumerate()
        .map(|(i, (p, m))| {
            h.submit(
                request(&h, &format!("t{i}"), p.clone(), m),
                TenantLimits::default(),
            )
            .unwrap()
        })
        .collect();
    let together: Vec<(Vec<u32>, Finished)> = streams.into_iter().map(collect).collect();
    let after = h.stats();

    for (i, ((a, fa), (t, ft))) in alone.iter().zip(&together).enumerate() {
        assert_eq!(a, t, "request {i}: tokens alone vs together");
        assert_eq!(t.len(), max_tokens[i], "request {i}");
        for f in [fa, ft] {
            assert_eq!(f.reason, FinishReason::Length, "request {i}");
            assert_eq!(f.usage.prompt_tokens, prompts[i].len(), "request {i}");
            assert_eq!(f.usage.completion_tokens, max_tokens[i], "request {i}");
            assert!(f.message.is_none());
            assert!(f.timings.first_token.is_some() && f.timings.first_scheduled.is_some());
        }
        assert_eq!(
            ft.usage.cached_tokens, 0,
            "request {i}: another scope's blocks are not reused"
        );
    }
    assert_ne!(together[0].0, together[1].0);
    // They really shared steps: fewer steps than the requests' steps one by one.
    let steps = after.steps - before.steps;
    let alone_steps = before.steps;
    assert!(
        steps * 4 < alone_steps * 3,
        "{steps} steps together vs {alone_steps} alone: requests did not share steps"
    );
    assert!(wait_for(&h, Duration::from_secs(2), idle), "{:?}", h.stats());
}

#[test]
fn a_repeated_long_prompt_hits_the_prefix_cache_in_its_scope_only() {
    let dir = tiny_model();
    let h = start(dir.path(), 256, SchedulerConfig::default(), roomy());
    let long = prompt(60, 9); // 3 full blocks of 16 and a partial one
    let (first, f1) = run_alone(&h, request(&h, "a", long.clone(), 10));
    assert_eq!(f1.usage.cached_tokens, 0);
    let (second, f2) = run_alone(&h, request(&h, "a", long.clone(), 10));
    assert_eq!(f2.usage.cached_tokens, 48, "three full prompt blocks reused");
    assert_eq!(f2.usage.prompt_tokens, 60);
    assert_eq!(second, first, "cached KV gives the same tokens");
    let (third, f3) = run_alone(&h, request(&h, "b", long.clone(), 10));
    assert_eq!(
        f3.usage.cached_tokens, 0,
        "tenant b does not see tenant a's blocks"
    );
    assert_eq!(third, first);
    // A prompt that is exactly whole blocks: its last token is computed again, so at most 2 blocks hit.
    let whole = long[..48].to_vec();
    let (_, f4) = run_alone(&h, request(&h, "a", whole, 3));
    assert_eq!(f4.usage.cached_tokens, 32);
    // Stats are published after the step that sent the last `Finished`.
    assert!(wait_for(&h, Duration::from_secs(2), idle), "{:?}", h.stats());
    let s = h.stats();
    assert_eq!(s.counters.prefix_hit_tokens, 48 + 32, "{:?}", s.counters);
    assert!(
        s.kv_blocks_cached >= 3 + 3,
        "both scopes' blocks stay cached: {s:?}"
    );
}

#[test]
fn dropped_streams_free_everything_quickly() {
    let dir = tiny_model();
    let h = start(dir.path(), 256, SchedulerConfig::default(), roomy());
    let mut streams: Vec<RequestStream> = (0..20)
        .map(|i| {
            h.submit(
                request(&h, &format!("t{}", i % 3), prompt(20 + i, i as u32), 400),
                TenantLimits::default(),
            )
            .unwrap()
        })
        .collect();
    for (i, s) in streams.iter_mut().enumerate() {
        for _ in 0..1 + i % 2 {
            assert!(matches!(s.blocking_next(), Some(RequestEvent::Token(_))));
        }
    }
    assert!(h.stats().kv_blocks_in_use > 0);
    drop(streams);
    assert!(
        wait_for(&h, Duration::from_secs(2), idle),
        "still busy 2 s after the streams were dropped: {:?}",
        h.stats()
    );
    assert_eq!(h.gate().queued(), (0, 0));
    // The engine still serves.
    let (t, f) = run_alone(&h, request(&h, "t0", prompt(5, 99), 4));
    assert_eq!((t.len(), f.reason), (4, FinishReason::Length));
}

#[test]
fn a_full_queue_refuses_at_once_and_accepted_requests_complete() {
    let dir = tiny_model();
    // One sequence at a time, so whatever is submitted behind the blocker stays queued.
    let cfg = SchedulerConfig {
        max_num_seqs: 1,
        ..SchedulerConfig::default()
    };
    let limits = QueueLimits {
        max_queued_requests: 2,
        max_queued_tokens: 100_000,
    };
    let h = start(dir.path(), 256, cfg, limits);
    let mut blocker = h
        .submit(request(&h, "a", prompt(10, 0), 400), TenantLimits::default())
        .unwrap();
    assert!(matches!(blocker.blocking_next(), Some(RequestEvent::Token(_))));
    let mut accepted = Vec::new();
    let mut refused = 0;
    for i in 0..6 {
        let t = Instant::now();
        match h.submit(request(&h, "b", prompt(12, i), 5), TenantLimits::default()) {
            Ok(s) => accepted.push(s),
            Err(r) => {
                assert!(t.elapsed() < Duration::from_millis(50), "refused at once");
                assert_eq!(
                    r,
                    Rejection::QueueFull {
                        limit: "max-num-queued-reqs",
                        value: 2
                    }
                );
                assert_eq!(r.label(), "queue_full");
                refused += 1;
            }
        }
    }
    assert_eq!((accepted.len(), refused), (2, 4));
    assert_eq!(h.gate().queued().0, 2);
    let (bt, bf) = collect(blocker);
    assert_eq!((bt.len() + 1, bf.reason), (400, FinishReason::Length));
    for s in accepted {
        let (t, f) = collect(s);
        assert_eq!(
            (t.len(), f.reason, f.usage.completion_tokens),
            (5, FinishReason::Length, 5)
        );
    }
    assert!(wait_for(&h, Duration::from_secs(2), idle), "{:?}", h.stats());
    assert_eq!(h.gate().queued(), (0, 0));
}

#[test]
fn a_passed_deadline_times_out_without_tokens() {
    let dir = tiny_model();
    let h = start(dir.path(), 64, SchedulerConfig::default(), roomy());
    let mut r = request(&h, "a", prompt(30, 1), 50);
    r.deadline = Some(Instant::now());
    std::thread::sleep(Duration::from_millis(2));
    let (tokens, f) = run_alone(&h, r);
    assert!(tokens.is_empty());
    assert_eq!(f.reason, FinishReason::Timeout);
    assert_eq!((f.usage.prompt_tokens, f.usage.completion_tokens), (30, 0));
    assert!(f.message.is_some_and(|m| m.contains("deadline")));
    assert!(f.timings.first_token.is_none());
    assert!(wait_for(&h, Duration::from_secs(2), idle), "{:?}", h.stats());
    assert_eq!(h.gate().queued(), (0, 0));
}

#[test]
fn preemption_under_a_small_pool_keeps_every_output() {
    let dir = tiny_model();
    let reqs: Vec<(Vec<u32>, usize)> = (0..6)
        .map(|i| (prompt(20 + 3 * i, 40 + i as u32), 50 + 5 * i))
        .collect();
    // References, alone on a roomy pool.
    let roomy_h = start(dir.path(), 256, SchedulerConfig::default(), roomy());
    let want: Vec<Vec<u32>> = reqs
        .iter()
        .map(|(p, m)| run_alone(&roomy_h, request(&roomy_h, "ref", p.clone(), *m)).0)
        .collect();
    drop(roomy_h);

    // Each request needs up to 6 blocks; 6 of them together need 30–36: 12 blocks force preemption.
    let h = start(dir.path(), 12, SchedulerConfig::default(), roomy());
    let streams: Vec<RequestStream> = reqs
        .iter()
        .enumerate()
        .map(|(i, (p, m))| {
            h.submit(
                request(&h, &format!("t{}", i % 2), p.clone(), *m),
                TenantLimits::default(),
            )
            .unwrap()
        })
        .collect();
    let got: Vec<(Vec<u32>, Finished)> = streams.into_iter().map(collect).collect();
    let preempted: u32 = got.iter().map(|(_, f)| f.timings.preemptions).sum();
    for (i, ((t, f), w)) in got.iter().zip(&want).enumerate() {
        assert_eq!(t, w, "request {i}: tokens under preemption vs alone");
        assert_eq!(f.reason, FinishReason::Length);
        assert_eq!(f.usage.completion_tokens, reqs[i].1);
        assert_eq!(f.usage.prompt_tokens, reqs[i].0.len());
    }
    let s = h.stats();
    assert!(s.counters.preemptions > 0, "{:?}", s.counters);
    assert_eq!(s.counters.preemptions, preempted as u64);
    assert!(wait_for(&h, Duration::from_secs(2), idle), "{:?}", h.stats());
}

#[test]
fn every_request_accepted_during_a_shutdown_still_gets_its_finished() {
    let dir = tiny_model();
    let h = std::sync::Arc::new(start(dir.path(), 256, SchedulerConfig::default(), roomy()));
    // Four threads submit as fast as they can while the main thread shuts the engine down.
    let submitters: Vec<_> = (0..4)
        .map(|t| {
            let h = h.clone();
            std::thread::spawn(move || {
                let mut accepted = Vec::new();
                for i in 0..10_000u32 {
                    match h.submit(
                        request(&h, "t", prompt(8, t * 10_000 + i), 64),
                        TenantLimits::default(),
                    ) {
                        Ok(s) => accepted.push(s),
                        Err(Rejection::ShuttingDown) => break,
                        // The queue fills up long before the shutdown: wait for room.
                        Err(Rejection::QueueFull { .. }) => std::thread::sleep(Duration::from_millis(1)),
                        Err(other) => panic!("unexpected refusal {other:?}"),
                    }
                }
                accepted
            })
        })
        .collect();
    std::thread::sleep(Duration::from_millis(30));
    h.shutdown();
    let mut total = 0;
    for s in submitters {
        for mut stream in s.join().unwrap() {
            let mut last = None;
            while let Some(ev) = stream.blocking_next() {
                last = Some(ev);
            }
            assert!(
                matches!(last, Some(RequestEvent::Finished(_))),
                "an accepted request ended without its Finished"
            );
            total += 1;
        }
    }
    assert!(total > 0, "some requests were accepted before the shutdown");
}
