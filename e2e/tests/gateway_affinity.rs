//! Scenario 1 of the fleet gateway: prefix affinity pays at fleet scale. Three replicas whose KV pool
//! each holds about a third of the tenants' system prompts (the fleet's holds them all); 12 tenants,
//! chosen so the ring puts four at home on each pod, each with its own long system prompt, 5 turns each in a shuffled order (fixed seed), 2 clients at a
//! time. The same load runs twice in this test, with fresh prompts each time: through a second gateway
//! process with `--routing round-robin` (no affinity), then through the chart's gateway (affinity,
//! the default). The share of prompt tokens served from the prefix cache (the pods' own
//! `usage.prompt_tokens_details.cached_tokens`) must be ≥ 25 points higher with affinity, and every
//! pod must serve traffic in both runs. TTFT p50/p99 of each run are printed for the closing note.
//! Run by `make e2e`; nothing is mocked.

mod common;
use common::fleet::*;
use common::*;
use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use kube::api::{Api, ListParams, Patch, PatchParams};
use modelfleet_crds::ModelDeployment;
use serde_json::{Value, json};
use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const TENANTS: usize = 12;
const TURNS: usize = 5;
const CLIENTS: usize = 2;
const BLOCK: usize = 16;
/// Prefixes one pod's pool holds (the fleet's holds 3×, more than the 12 tenants).
const PREFIXES_PER_POD: usize = 5;
/// Where the round-robin gateway listens (the chart's is at `MF_GATEWAY_URL`).
const RR_PORT: u16 = 18480;

fn gateway_bin() -> PathBuf {
    runtime_bin().with_file_name("modelfleet-gateway")
}

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
fn system_prompt(run: &str, t: usize, words: usize) -> String {
    let mut rng = Rng(0x5eed ^ ((t as u64) << 8) ^ run.len() as u64 ^ run.as_bytes()[0] as u64);
    let mut s = format!("{run} tenant {t}: you are the assistant of team {t}. Policies:");
    for _ in 0..words {
        s.push(' ');
        s.push_str(WORDS[(rng.next() % WORDS.len() as u64) as usize]);
    }
    s
}

/// One chat turn: (pod, prompt tokens, cached tokens, seconds to the answer).
async fn turn(
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
    let pod = r
        .headers()
        .get("x-modelfleet-pod")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_string();
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

struct RunResult {
    cached_share: f64,
    per_pod: BTreeMap<String, u64>,
    ttft: Vec<f64>,
}

/// The user message of turn `k`.
fn user_turn(k: usize) -> String {
    format!("turn {k}: what does policy {k} say?")
}

/// `TENANTS` tenant numbers whose system prompts in run `run` have their home on the chart gateway's
/// ring over `pods` a third each, computed with the gateway's own key and ring (an open deployment's
/// scope is its `default` tenant; the key reads the first 512 characters, all of them the system
/// prompt's). Tenants numbered 0..12 could hash onto two of the three pods (about one run in 40),
/// which leaves ten pool places for twelve tenants and tests the hash, not affinity.
fn tenants_covering(pods: &BTreeSet<String>, run: &str, words: usize) -> Vec<usize> {
    use modelfleet_gateway::{request, ring::Ring};
    let names: Vec<&String> = pods.iter().collect();
    let ring = Ring::new(&names);
    let per_pod = TENANTS / pods.len();
    let mut homes = BTreeMap::<usize, usize>::new();
    let mut chosen = Vec::new();
    for t in 0.. {
        if chosen.len() == TENANTS {
            break;
        }
        let home: BTreeSet<usize> = (0..TURNS)
            .map(|k| {
                let body = json!({"model": "m", "messages": [
                    {"role": "system", "content": system_prompt(run, t, words)},
                    {"role": "user", "content": user_turn(k)}]});
                let routed = request::peek(body.to_string().as_bytes(), 512).expect("a routable body");
                ring.walk(request::affinity_key("tenant:default", None, &routed))
                    .next()
                    .expect("three pods")
            })
            .collect();
        assert_eq!(home.len(), 1, "tenant {t}'s turns share one key");
        let home = *home.first().unwrap();
        let n = homes.entry(home).or_default();
        if *n < per_pod {
            *n += 1;
            chosen.push(t);
        }
    }
    chosen
}

/// The shuffled turns of each of `tenants` through `base`, `CLIENTS` at a time.
async fn run_load(base: &str, model: &str, run: &str, words: usize, tenants: &[usize]) -> RunResult {
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
                    *g.2.entry(pod).or_default() += 1;
                    g.3.push(secs);
                }
            })
        })
        .collect();
    for c in clients {
        c.await.unwrap();
    }
    let (prompt, cached, per_pod, mut ttft) = totals.lock().unwrap().clone();
    ttft.sort_by(|a, b| a.total_cmp(b));
    RunResult {
        cached_share: cached as f64 / prompt as f64,
        per_pod,
        ttft,
    }
}

fn quantile(sorted: &[f64], q: f64) -> f64 {
    sorted[((sorted.len() - 1) as f64 * q).round() as usize]
}

/// A second gateway, round-robin, on loopback, scoped to the test's namespace; killed on drop.
struct RoundRobinGateway(std::process::Child);
impl RoundRobinGateway {
    fn start(ns: &str) -> RoundRobinGateway {
        let child = std::process::Command::new(gateway_bin())
            .args(["run", "--host", "127.0.0.1", "--port", &RR_PORT.to_string()])
            .args(["--metrics-port", &(RR_PORT + 1).to_string()])
            .args(["--routing", "round-robin", "--namespaces", ns])
            .stdout(std::process::Stdio::null())
            .spawn()
            .expect("modelfleet-gateway built");
        RoundRobinGateway(child)
    }
}
impl Drop for RoundRobinGateway {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Waits until a gateway at `base` routes `model` to all of `pods`.
async fn routes_to_all(base: &str, model: &str, pods: &BTreeSet<String>) {
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

#[tokio::test]
#[ignore = "needs the local cluster: make e2e"]
async fn prefix_affinity_beats_round_robin_by_25_points_of_cached_prompt_tokens() {
    ensure_operator().await;
    let ns = TestNamespace::new("gwaff");
    let client = client().await;
    let mds: Api<ModelDeployment> = Api::namespaced(client.clone(), &ns.name);
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns.name);
    let (dir, digest) = tiny_model(&ns.name);
    let served = format!("aff-{}", ns.name);
    let words = 90;
    let md = format!(
        "apiVersion: modelfleet.io/v1alpha1\nkind: ModelDeployment\nmetadata:\n  name: aff\nspec:\n  model:\n    \
         uri: file://{}\n    digest: \"{digest}\"\n    servedName: {served}\n  replicas: 3\n  runtime:\n    threads: 1\n    \
         kvCache:\n      blockSize: {BLOCK}\n  autoscaling:\n    mode: Disabled\n",
        dir.display()
    );
    kubectl_ok(&["apply", "-n", &ns.name, "-f", "-"], Some(&md));
    let ready_pods = || async {
        let md = mds.get("aff").await.ok()?;
        let st = md.status.as_ref()?;
        let fresh = st.observed_generation == md.metadata.generation;
        if !(fresh && condition(&md, "Ready")?.0 == "True" && st.ready_replicas == 3 && st.replicas == 3) {
            return None;
        }
        let list = pods
            .list(&ListParams::default().labels("app.kubernetes.io/instance=aff"))
            .await
            .ok()?;
        let names: BTreeSet<String> = list
            .items
            .iter()
            .filter(|p| p.metadata.deletion_timestamp.is_none())
            .map(|p| p.name_any())
            .collect();
        (names.len() == 3).then_some(names)
    };
    let names = wait_until("3 ready replicas", Duration::from_secs(180), ready_pods).await;
    routes_to_all(&gateway_url(), &served, &names).await;

    // Size each pod's pool from a real prompt: PREFIXES_PER_POD system prompts and room for the
    // running requests, so no pod holds all 12 tenants but the fleet does.
    let http = gateway(Duration::from_secs(60));
    let (_, prompt_tokens, _, _) = turn(
        &http,
        &gateway_url(),
        &served,
        &system_prompt("probe", 0, words),
        &user_turn(0),
    )
    .await;
    let blocks_per_prompt = (prompt_tokens as usize).div_ceil(BLOCK) + 1;
    let num_blocks = PREFIXES_PER_POD * blocks_per_prompt + CLIENTS * blocks_per_prompt;
    eprintln!("prompt {prompt_tokens} tokens = {blocks_per_prompt} blocks; {num_blocks} blocks per pod");
    mds.patch(
        "aff",
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"runtime": {"kvCache": {"numBlocks": num_blocks}}}})),
    )
    .await
    .unwrap();
    kubectl_ok(
        &[
            "rollout",
            "status",
            "-n",
            &ns.name,
            "deployment/aff",
            "--timeout=240s",
        ],
        None,
    );
    let names = wait_until(
        "3 ready replicas with the small pool",
        Duration::from_secs(180),
        || async {
            let n = ready_pods().await?;
            let all = pods
                .list(&ListParams::default().labels("app.kubernetes.io/instance=aff"))
                .await
                .ok()?;
            (all.items.len() == 3).then_some(n)
        },
    )
    .await;

    // Round-robin first (its pods start with empty caches), then affinity with fresh prompts.
    let rr = RoundRobinGateway::start(&ns.name);
    let rr_base = format!("http://127.0.0.1:{RR_PORT}");
    routes_to_all(&rr_base, &served, &names).await;
    routes_to_all(&gateway_url(), &served, &names).await;
    let round_robin = run_load(
        &rr_base,
        &served,
        "rr",
        words,
        &tenants_covering(&names, "rr", words),
    )
    .await;
    drop(rr);
    let tenants = tenants_covering(&names, "affinity", words);
    eprintln!("affinity run: tenants {tenants:?}, a third of them at home on each pod");
    let affinity = run_load(&gateway_url(), &served, "affinity", words, &tenants).await;

    for (what, r) in [("round-robin", &round_robin), ("affinity", &affinity)] {
        eprintln!(
            "{what}: cached share of prompt tokens {:.1}%, TTFT p50 {:.1} ms p99 {:.1} ms, per pod {:?}",
            100.0 * r.cached_share,
            1e3 * quantile(&r.ttft, 0.5),
            1e3 * quantile(&r.ttft, 0.99),
            r.per_pod
        );
        assert_eq!(r.per_pod.len(), 3, "{what}: every pod served: {:?}", r.per_pod);
    }
    let gain = 100.0 * (affinity.cached_share - round_robin.cached_share);
    assert!(
        gain >= 25.0,
        "affinity's cached share is {gain:.1} points above round-robin's (≥ 25 wanted)"
    );
}
