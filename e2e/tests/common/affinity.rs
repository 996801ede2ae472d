//! The prefix-affinity workload (issue #15's scenario 1), shared by `gateway_affinity.rs` and
//! `rollout_affinity.rs`: `TENANTS` tenants, each with its own long system prompt, `TURNS` turns each in
//! a shuffled order (fixed seed), `CLIENTS` at a time, every turn `max_tokens: 1`. The figure is the
//! share of prompt tokens the pods served from their prefix cache (their own
//! `usage.prompt_tokens_details.cached_tokens`).

use super::fleet::{error_chain, gateway, served_by};
use super::wait_until;
use serde_json::{Value, json};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

pub const TENANTS: usize = 12;
pub const TURNS: usize = 5;
pub const CLIENTS: usize = 2;
/// The KV block size the scenarios deploy with.
pub const BLOCK: usize = 16;

/// A deterministic pseudo-random stream (splitmix64): prompts and order repeat run to run.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
}

const WORDS: &[&str] = &[
    "ledger",
    "harbor",
    "quartz",
    "meadow",
    "signal",
    "copper",
    "lantern",
    "orbit",
    "thimble",
    "canyon",
    "velvet",
    "pixel",
    "saddle",
    "gravel",
    "nectar",
    "falcon",
    "tundra",
    "marble",
    "rhythm",
    "willow",
    "beacon",
    "cobalt",
    "driftwood",
    "ember",
    "fjord",
    "glacier",
    "hollow",
    "inkwell",
    "juniper",
    "kettle",
];

/// Tenant `t`'s system prompt in run `run`: its own words from the first character on (the affinity
/// key reads the prompt's start), `words` long.
pub fn system_prompt(run: &str, t: usize, words: usize) -> String {
    let mut rng = Rng(0x5eed ^ ((t as u64) << 8) ^ run.len() as u64 ^ run.as_bytes()[0] as u64);
    let mut s = format!("{run} tenant {t}: you are the assistant of team {t}. Policies:");
    for _ in 0..words {
        s.push(' ');
        s.push_str(WORDS[(rng.next() % WORDS.len() as u64) as usize]);
    }
    s
}

/// One chat turn: (pod, prompt tokens, cached tokens, seconds to the answer).
pub async fn turn(
    http: &reqwest::Client,
    base: &str,
    model: &str,
    system: &str,
    user: &str,
) -> (String, u64, u64, f64) {
    let started = Instant::now();
    let r = http
        .post(format!("{base}/v1/chat/completions"))
        .json(&json!({"model": model, "max_tokens": 1, "temperature": 0,
            "messages": [{"role": "system", "content": system}, {"role": "user", "content": user}]}))
        .send()
        .await
        .unwrap_or_else(|e| panic!("{base}: {}", error_chain(&e)));
    let status = r.status();
    let pod = served_by(&r);
    let body: Value = r.json().await.expect("a JSON answer");
    assert_eq!(status, 200, "{body}");
    let usage = &body["usage"];
    (
        pod,
        usage["prompt_tokens"].as_u64().unwrap(),
        usage["prompt_tokens_details"]["cached_tokens"]
            .as_u64()
            .unwrap_or(0),
        started.elapsed().as_secs_f64(),
    )
}

pub struct RunResult {
    /// Cached prompt tokens over prompt tokens.
    pub cached_share: f64,
    /// Turns each pod served.
    pub per_pod: BTreeMap<String, u64>,
    /// The pods each tenant's turns were served by.
    pub tenant_pods: BTreeMap<usize, BTreeSet<String>>,
    /// Seconds to each answer, sorted.
    pub ttft: Vec<f64>,
}

/// KV blocks for a pod's pool that holds `prefixes` system prompts of `words` words and room for the
/// running requests of `CLIENTS`, sized from a real prompt sent through `base`.
pub async fn pool_blocks(base: &str, served: &str, words: usize, prefixes: usize) -> usize {
    let http = gateway(Duration::from_secs(60));
    let probe = system_prompt("probe", 0, words);
    let (_, prompt_tokens, _, _) = turn(&http, base, served, &probe, &user_turn(0)).await;
    let blocks_per_prompt = (prompt_tokens as usize).div_ceil(BLOCK) + 1;
    let blocks = (prefixes + CLIENTS) * blocks_per_prompt;
    eprintln!("prompt {prompt_tokens} tokens = {blocks_per_prompt} blocks; {blocks} blocks per pod");
    blocks
}

/// The user message of turn `k`.
pub fn user_turn(k: usize) -> String {
    format!("turn {k}: what does policy {k} say?")
}

/// `TENANTS` tenant numbers whose system prompts in run `run` have their home on each of `pods` pods
/// a `1/pods` share each, where `home` is the pod a request with affinity key `key` goes to (computed
/// with the gateway's own key, ring and split; an open deployment's scope is its `default` tenant,
/// and the key reads the first 512 characters, all of them the system prompt's). Tenants numbered
/// 0..12 could hash onto fewer pods than there are, which leaves fewer pool places than tenants and
/// tests the hash, not affinity.
pub fn tenants_covering(pods: usize, run: &str, words: usize, home: impl Fn(u64) -> String) -> Vec<usize> {
    use modelfleet_gateway::request;
    let per_pod = TENANTS / pods;
    let mut homes = BTreeMap::<String, usize>::new();
    let mut chosen = Vec::new();
    for t in 0.. {
        if chosen.len() == TENANTS {
            break;
        }
        let at: BTreeSet<String> = (0..TURNS)
            .map(|k| {
                let body = json!({"model": "m", "messages": [
                    {"role": "system", "content": system_prompt(run, t, words)},
                    {"role": "user", "content": user_turn(k)}]});
                let routed = request::peek(body.to_string().as_bytes(), 512).expect("a routable body");
                home(request::affinity_key("tenant:default", None, &routed))
            })
            .collect();
        assert_eq!(at.len(), 1, "tenant {t}'s turns share one key");
        let n = homes.entry(at.into_iter().next().unwrap()).or_default();
        if *n < per_pod {
            *n += 1;
            chosen.push(t);
        }
    }
    chosen
}

/// The shuffled turns of each of `tenants` through `base`, `CLIENTS` at a time.
pub async fn run_load(base: &str, model: &str, run: &str, words: usize, tenants: &[usize]) -> RunResult {
    let mut order: Vec<(usize, usize)> = tenants
        .iter()
        .flat_map(|&t| (0..TURNS).map(move |k| (t, k)))
        .collect();
    let mut rng = Rng(0xa11ce);
    for i in (1..order.len()).rev() {
        order.swap(i, (rng.next() % (i as u64 + 1)) as usize);
    }
    let queue = Arc::new(Mutex::new(order.into_iter()));
    let totals = Arc::new(Mutex::new((
        0u64,
        0u64,
        BTreeMap::<String, u64>::new(),
        Vec::new(),
        BTreeMap::<usize, BTreeSet<String>>::new(),
    )));
    let clients: Vec<_> = (0..CLIENTS)
        .map(|_| {
            let (queue, totals) = (queue.clone(), totals.clone());
            let (base, model, run) = (base.to_string(), model.to_string(), run.to_string());
            tokio::spawn(async move {
                let http = gateway(Duration::from_secs(60));
                loop {
                    let Some((t, k)) = queue.lock().unwrap().next() else {
                        return;
                    };
                    let system = system_prompt(&run, t, words);
                    let user = user_turn(k);
                    let (pod, prompt, cached, secs) = turn(&http, &base, &model, &system, &user).await;
                    let mut g = totals.lock().unwrap();
                    g.0 += prompt;
                    g.1 += cached;
                    *g.2.entry(pod.clone()).or_default() += 1;
                    g.3.push(secs);
                    g.4.entry(t).or_default().insert(pod);
                }
            })
        })
        .collect();
    for c in clients {
        c.await.unwrap();
    }
    let (prompt, cached, per_pod, mut ttft, tenant_pods) = totals.lock().unwrap().clone();
    ttft.sort_by(|a, b| a.total_cmp(b));
    RunResult {
        cached_share: cached as f64 / prompt as f64,
        per_pod,
        tenant_pods,
        ttft,
    }
}

pub fn quantile(sorted: &[f64], q: f64) -> f64 {
    sorted[((sorted.len() - 1) as f64 * q).round() as usize]
}

/// Waits until a gateway at `base` routes `model` to all of `pods`.
pub async fn routes_to_all(base: &str, model: &str, pods: &BTreeSet<String>) {
    wait_until(
        &format!("{base} to route to {pods:?}"),
        Duration::from_secs(60),
        || async {
            let http = gateway(Duration::from_secs(10));
            let mut seen = BTreeSet::new();
            for i in 0..24 {
                let r = http
                    .post(format!("{base}/v1/chat/completions"))
                    .json(&json!({"model": model, "max_tokens": 1,
                        "messages": [{"role": "user", "content": format!("probe {i} {}", i * 7919)}]}))
                    .send()
                    .await
                    .ok()?;
                if r.status() == 200 {
                    seen.insert(r.headers().get("x-modelfleet-pod")?.to_str().ok()?.to_string());
                }
            }
            (&seen == pods).then_some(())
        },
    )
    .await;
}
