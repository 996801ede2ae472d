//! Tenant limits over the fleet, end to end, with three gateway replicas behind the Service and the
//! chart's limits store (redis-server from our store image): the real `openai` client reads OpenAI's
//! `x-ratelimit-*` headers; under a skewed load two noisy tenants — one over its requestsPerMinute, one
//! over its tokensPerMinute — are admitted at their limits (±10 %, summed over the replicas) while three
//! quiet tenants see no 429 and keep their median latency (±10 % of the same load without the noisy
//! ones); a daily budget stops its tenant within one request (overshoot reported) and stays spent when
//! every gateway replica restarts, and the billing export (`modelfleet-gateway usage` in a gateway pod)
//! counts exactly what the client was answered; with the store gone, `failureMode: open` keeps serving and `closed`
//! answers 503 `limits_unavailable` at once, and nothing hangs. Run by `make e2e`; nothing is mocked.

mod common;
use common::fleet::*;
use common::*;
use k8s_openapi::api::core::v1::Pod;
use kube::api::Api;
use serde_json::{Value, json};
use std::process::Command;
use std::time::{Duration, Instant};

const QUIET: [&str; 3] = ["quiet-1", "quiet-2", "quiet-3"];
/// Noisy tenants' limits, and what each sends (requests per second, open loop).
const NOISY_RPM: u64 = 30;
const NOISY_TPM: u64 = 900;
const NOISY_RATE: f64 = 3.0;
const QUIET_RATE: f64 = 5.0;
/// The spender's daily budget, EUR, and the deployment's prices per million tokens.
const BUDGET: &str = "0.005";
const PRICES: (u64, u64, u64) = (10, 5, 100);
/// Completion tokens asked: the quiet tenants' answers are long enough (`ignore_eos`) that their latency
/// is the model's work, not the network's.
const MAX_TOKENS: u32 = 8;
const QUIET_MAX_TOKENS: u32 = 48;

fn key(tenant: &str) -> String {
    format!("sk-{tenant}-limits-e2e")
}

fn manifests(ns: &str, dir: &std::path::Path, digest: &str, model: &str, rpm: u64) -> String {
    let entry = |id: &str, extra: &str| format!("    - id: {id}\n      apiKeys: [\"{}\"]\n{extra}", key(id));
    let mut tenants: String = QUIET.iter().map(|t| entry(t, "")).collect();
    tenants += &entry("noisy-r", &format!("      requestsPerMinute: {rpm}\n"));
    tenants += &entry("noisy-t", &format!("      tokensPerMinute: {NOISY_TPM}\n"));
    tenants += &entry("spender", &format!("      budget: {{daily: \"{BUDGET}\"}}\n"));
    let (i, c, o) = PRICES;
    format!(
        "apiVersion: v1\nkind: Secret\nmetadata:\n  name: limits-keys\n  namespace: {ns}\nstringData:\n  \
         tenants.yaml: |\n    tenants:\n{tenants}---\napiVersion: modelfleet.io/v1alpha1\nkind: ModelDeployment\n\
         metadata:\n  name: limits\nspec:\n  model:\n    uri: file://{}\n    digest: \"{digest}\"\n    servedName: {model}\n  \
         replicas: 2\n  runtime:\n    threads: 1\n    maxNumSeqs: 16\n  autoscaling:\n    mode: Disabled\n  tenants:\n    \
         secretRef:\n      name: limits-keys\n  cost:\n    currency: EUR\n    inputPerMillionTokens: \"{i}\"\n    \
         cachedInputPerMillionTokens: \"{c}\"\n    outputPerMillionTokens: \"{o}\"\n",
        dir.display()
    )
}

/// What a client saw of one request.
#[derive(Clone, Debug)]
struct Seen {
    /// Sent at, since the phase began.
    at: Duration,
    status: u16,
    latency: Duration,
    /// Prompt + completion tokens, and the price of the answer in millionths of a EUR.
    tokens: u64,
    cost: u64,
    code: String,
}

/// A fresh connection per request, so kube-proxy spreads requests over the gateway replicas.
fn spread_client() -> reqwest::Client {
    let _ = rustls::crypto::ring::default_provider().install_default();
    reqwest::Client::builder()
        .timeout(Duration::from_secs(30))
        .pool_max_idle_per_host(0)
        .build()
        .unwrap()
}

async fn one(http: &reqwest::Client, tenant: &str, model: &str, began: Instant) -> Seen {
    let at = began.elapsed();
    let t = Instant::now();
    let quiet = tenant.starts_with("quiet");
    let max_tokens = if quiet { QUIET_MAX_TOKENS } else { MAX_TOKENS };
    let body = json!({"model": model, "messages": [{"role": "user", "content": "How are the limits?"}],
        "max_tokens": max_tokens, "ignore_eos": quiet, "temperature": 0});
    let r = http
        .post(format!("{}/v1/chat/completions", gateway_url()))
        .bearer_auth(key(tenant))
        .json(&body)
        .send()
        .await;
    let (status, v) = match r {
        Ok(r) => (r.status().as_u16(), r.json::<Value>().await.unwrap_or_default()),
        Err(e) => (0, json!({"error": {"code": error_chain(&e)}})),
    };
    let u = &v["usage"];
    let n = |x: &Value| x.as_u64().unwrap_or(0);
    let (p, c, o) = (
        n(&u["prompt_tokens"]),
        n(&u["prompt_tokens_details"]["cached_tokens"]),
        n(&u["completion_tokens"]),
    );
    let c = c.min(p);
    Seen {
        at,
        status,
        latency: t.elapsed(),
        tokens: p + o,
        cost: (p - c) * PRICES.0 + c * PRICES.1 + o * PRICES.2,
        code: v["error"]["code"].as_str().unwrap_or_default().to_string(),
    }
}

/// `rate` requests per second of `tenant` for `span`, open loop (each in its own task).
async fn open_loop(
    tenant: &'static str,
    model: String,
    rate: f64,
    span: Duration,
    began: Instant,
) -> Vec<Seen> {
    let http = spread_client();
    let mut tasks = Vec::new();
    let mut tick = tokio::time::interval(Duration::from_secs_f64(1.0 / rate));
    while began.elapsed() < span {
        tick.tick().await;
        let (http, model) = (http.clone(), model.clone());
        tasks.push(tokio::spawn(
            async move { one(&http, tenant, &model, began).await },
        ));
    }
    let mut out = Vec::new();
    for t in tasks {
        out.push(t.await.unwrap());
    }
    out
}

fn p50(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

/// `helm upgrade` of the chart the harness installed, keeping its values but `sets`.
fn helm_set(sets: &[&str]) {
    let mut cmd = Command::new("helm");
    cmd.args(["upgrade", "modelfleet"])
        .arg(repo_root().join("charts/modelfleet"))
        .args([
            "--namespace",
            OPERATOR_NS,
            "--reuse-values",
            "--wait",
            "--timeout",
            "180s",
        ]);
    for s in sets {
        cmd.args(["--set", s]);
    }
    let out = cmd.output().expect("helm");
    assert!(
        out.status.success(),
        "helm upgrade {sets:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Puts the chart back as the harness installed it (one gateway replica, fail-open, the store up).
struct Restore;
impl Drop for Restore {
    fn drop(&mut self) {
        helm_set(&["gateway.replicas=1", "limitsStore.failureMode=open"]);
        let _ = kubectl(
            &[
                "scale",
                "-n",
                OPERATOR_NS,
                "deployment/modelfleet-limits-store",
                "--replicas=1",
            ],
            None,
        );
    }
}

/// The real `openai` client: `mode` = `headers` (a raw response's rate-limit headers) or `quota` (the
/// error of a refused request).
fn openai(mode: &str, tenant: &str, model: &str) -> Value {
    const SCRIPT: &str = r#"
import json, sys, openai
mode, base, key, model = sys.argv[1:5]
c = openai.OpenAI(base_url=base + "/v1", api_key=key, max_retries=0)
msgs = [{"role": "user", "content": "hi"}]
names = ["x-ratelimit-limit-requests", "x-ratelimit-remaining-requests", "x-ratelimit-reset-requests",
         "x-ratelimit-limit-tokens", "x-ratelimit-remaining-tokens", "x-ratelimit-reset-tokens"]
if mode == "headers":
    raw = c.chat.completions.with_raw_response.create(model=model, messages=msgs, max_tokens=4)
    print(json.dumps({"headers": {n: raw.headers.get(n) for n in names}, "total": raw.parse().usage.total_tokens}))
else:
    try:
        c.chat.completions.create(model=model, messages=msgs, max_tokens=4)
        print(json.dumps({"error": None}))
    except openai.RateLimitError as e:
        print(json.dumps({"error": e.code, "status": e.status_code, "retry_after": e.response.headers.get("retry-after")}))
"#;
    let out = Command::new("python3")
        .args(["-c", SCRIPT, mode, &gateway_url(), &key(tenant), model])
        .output()
        .expect("python3");
    assert!(
        out.status.success(),
        "openai client: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

#[tokio::test]
#[ignore = "needs the local cluster: make e2e"]
async fn tenant_limits_hold_over_three_gateway_replicas_and_the_store() {
    ensure_operator().await;
    let ns = TestNamespace::new("limits");
    let (dir, digest) = tiny_model(&ns.name);
    let model = format!("lim-{}", ns.name);
    kubectl_ok(
        &["apply", "-n", &ns.name, "-f", "-"],
        Some(&manifests(&ns.name, &dir, &digest, &model, NOISY_RPM)),
    );
    let _restore = Restore;
    helm_set(&["gateway.replicas=3"]);
    let http = spread_client();
    wait_until(
        "the deployment served through the gateway",
        Duration::from_secs(240),
        || async {
            let s = one(&http, "quiet-1", &model, Instant::now()).await;
            (s.status == 200).then_some(())
        },
    )
    .await;
    let pods: Api<Pod> = Api::namespaced(client().await, &ns.name);
    wait_until("2 runtime pods", Duration::from_secs(120), || async {
        (pod_count(&pods, "limits").await == 2).then_some(())
    })
    .await;

    headers_read_by_the_openai_client(&model);

    skewed_load(&model).await;
    quiet_latency_unchanged(&model).await;
    budget_stops_and_survives_restarts(&model).await;
    store_gone(&model).await;

    let raised = manifests(&ns.name, &dir, &digest, &model, 2 * NOISY_RPM);
    a_raised_limit_takes_effect(&ns.name, &raised, &model).await;
}

/// The real `openai` client reads the rate-limit headers of each noisy tenant's answer.
fn headers_read_by_the_openai_client(model: &str) {
    let seen = openai("headers", "noisy-r", model);
    let h = &seen["headers"];
    assert_eq!(h["x-ratelimit-limit-requests"], NOISY_RPM.to_string(), "{seen}");
    assert_eq!(
        h["x-ratelimit-remaining-requests"],
        (NOISY_RPM - 1).to_string(),
        "{seen}"
    );
    assert!(
        h["x-ratelimit-reset-requests"]
            .as_str()
            .is_some_and(|r| r.ends_with('s')),
        "{seen}"
    );
    assert!(
        h["x-ratelimit-limit-tokens"].is_null(),
        "noisy-r has no token limit: {seen}"
    );
    let tokens = openai("headers", "noisy-t", model);
    assert_eq!(
        tokens["headers"]["x-ratelimit-limit-tokens"],
        NOISY_TPM.to_string(),
        "{tokens}"
    );
    eprintln!("[limits] the openai client read the x-ratelimit-* headers: noisy-r {seen}, noisy-t {tokens}");
}

/// A changed limit takes effect without a restart: the Secret re-applied as `raised`.
async fn a_raised_limit_takes_effect(ns: &str, raised: &str, model: &str) {
    kubectl_ok(&["apply", "-n", ns, "-f", "-"], Some(raised));
    let http = spread_client();
    let t0 = Instant::now();
    wait_until(
        "the new requestsPerMinute in force",
        Duration::from_secs(30),
        || async {
            let r = http
            .post(format!("{}/v1/chat/completions", gateway_url()))
            .bearer_auth(key("noisy-r"))
            .json(&json!({"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}))
            .send()
            .await
            .ok()?;
            let limit = r
                .headers()
                .get("x-ratelimit-limit-requests")?
                .to_str()
                .ok()?
                .to_string();
            (limit == (2 * NOISY_RPM).to_string()).then_some(())
        },
    )
    .await;
    eprintln!(
        "[limits] requestsPerMinute {} in force {:?} after the Secret changed",
        2 * NOISY_RPM,
        t0.elapsed()
    );
}

/// The quiet tenants' open loops over `span` from `began`.
fn quiet(model: &str, span: Duration, began: Instant) -> [tokio::task::JoinHandle<Vec<Seen>>; 3] {
    QUIET.map(|t| tokio::spawn(open_loop(t, model.to_string(), QUIET_RATE, span, began)))
}

/// The noisy tenants' open loops (far over their limits) over `span` from `began`.
fn noisy(model: &str, span: Duration, began: Instant) -> [tokio::task::JoinHandle<Vec<Seen>>; 2] {
    ["noisy-r", "noisy-t"].map(|t| tokio::spawn(open_loop(t, model.to_string(), NOISY_RATE, span, began)))
}

async fn joined<const N: usize>(tasks: [tokio::task::JoinHandle<Vec<Seen>>; N]) -> Vec<Vec<Seen>> {
    let mut out = Vec::new();
    for t in tasks {
        out.push(t.await.unwrap());
    }
    out
}

/// Both noisy tenants with the quiet ones for 95 s: the noisy are admitted at their limits, summed over
/// the replicas (each of which refuses some), and the quiet get no 429.
async fn skewed_load(model: &str) {
    let began = Instant::now();
    let span = Duration::from_secs(95);
    let loud = noisy(model, span, began);
    let quiet_seen: Vec<Seen> = joined(quiet(model, span, began)).await.concat();
    let [r, t]: [Vec<Seen>; 2] = joined(loud).await.try_into().unwrap();
    // Judged from 20 s on (each bucket starts full: a minute's worth at once) over one minute.
    let window = |s: &Seen| s.at >= Duration::from_secs(20) && s.at < Duration::from_secs(80);
    let admitted_r = r.iter().filter(|s| window(s) && s.status == 200).count() as f64;
    let tokens_t: u64 = t
        .iter()
        .filter(|s| window(s) && s.status == 200)
        .map(|s| s.tokens)
        .sum();
    let refused = |v: &[Seen]| v.iter().filter(|s| s.status == 429).count();
    let other: Vec<&Seen> = r
        .iter()
        .chain(&t)
        .filter(|s| ![200, 429].contains(&s.status))
        .collect();
    let quiet_bad: Vec<&Seen> = quiet_seen.iter().filter(|s| s.status != 200).collect();
    eprintln!(
        "[limits] noisy-r admitted {admitted_r} requests in a minute (limit {NOISY_RPM}), {} refused in all; \
         noisy-t admitted {tokens_t} tokens in a minute (limit {NOISY_TPM}), {} refused; {} quiet requests, \
         {} not 200",
        refused(&r),
        refused(&t),
        quiet_seen.len(),
        quiet_bad.len()
    );
    assert!(
        other.is_empty(),
        "noisy requests neither served nor 429: {other:?}"
    );
    assert!(
        quiet_bad.is_empty(),
        "quiet tenants refused or failed: {quiet_bad:?}"
    );
    assert!(
        (admitted_r / NOISY_RPM as f64 - 1.0).abs() <= 0.1,
        "noisy-r admitted {admitted_r}/min"
    );
    assert!(
        (tokens_t as f64 / NOISY_TPM as f64 - 1.0).abs() <= 0.1,
        "noisy-t admitted {tokens_t} tokens/min"
    );
    // Every replica refused some of noisy-r's requests: the limit held for their sum.
    let per_replica = wait_until("each gateway replica's refusals in Prometheus", Duration::from_secs(30), || async {
        let q = "sum by (instance) (modelfleet_gateway_limited_total{tenant=\"noisy-r\",reason=\"requests\"})";
        let r = prometheus_query(q).await;
        let counts: Vec<f64> = r.iter().filter_map(|s| s["value"][1].as_str()?.parse().ok()).collect();
        (counts.len() == 3 && counts.iter().all(|c| *c > 0.0)).then_some(counts)
    })
    .await;
    eprintln!("[limits] noisy-r's refusals per gateway replica: {per_replica:?}");
}

/// The quiet tenants' median latency with the noisy ones at their limits against without them: 12 s
/// blocks alternating (ABBA…, so drift on a shared machine falls on both sides), 6 of each.
async fn quiet_latency_unchanged(model: &str) {
    let block = Duration::from_secs(12);
    let (mut alone, mut with) = (Vec::new(), Vec::new());
    for i in 0..12 {
        let loud = [1, 2, 5, 6, 9, 10].contains(&i);
        let began = Instant::now();
        let noise = loud.then(|| noisy(model, block, began));
        let seen = joined(quiet(model, block, began)).await.concat();
        if let Some(n) = noise {
            joined(n).await;
        }
        let latencies = seen.iter().filter(|s| s.status == 200).map(|s| s.latency);
        if loud {
            with.extend(latencies)
        } else {
            alone.extend(latencies)
        }
    }
    let (a, w) = (alone.len(), with.len());
    let (a50, w50) = (p50(alone), p50(with));
    let change = w50.as_secs_f64() / a50.as_secs_f64() - 1.0;
    eprintln!(
        "[limits] quiet p50 {a50:?} alone ({a} requests), {w50:?} with the noisy at their limits ({w} requests): \
         {:+.1} %",
        change * 100.0
    );
    assert!(change.abs() < 0.1, "quiet p50 {a50:?} → {w50:?}");
}

/// The spender's budget: refused within one request of it, and still after all gateways restart.
async fn budget_stops_and_survives_restarts(model: &str) {
    let budget: u64 = (BUDGET.parse::<f64>().unwrap() * 1e6).round() as u64;
    let http = spread_client();
    let (mut spent, mut largest, mut served) = (0u64, 0u64, 0u64);
    let refusal = loop {
        let s = one(&http, "spender", model, Instant::now()).await;
        match s.status {
            200 => {
                (spent, largest, served) = (spent + s.cost, largest.max(s.cost), served + 1);
                // Settling is asynchronous: the next admission reads the spend a moment later.
                tokio::time::sleep(Duration::from_millis(300)).await;
            }
            _ => break s,
        }
        assert!(served < 100, "never refused after {spent} µEUR");
    };
    assert_eq!(
        (refusal.status, refusal.code.as_str()),
        (429, "insufficient_quota"),
        "{refusal:?}"
    );
    eprintln!(
        "[limits] budget {budget} µEUR: {served} requests served, {spent} µEUR spent, overshoot {} µEUR \
         (one request costs up to {largest} µEUR)",
        spent as i64 - budget as i64
    );
    assert!(
        spent >= budget && spent - budget < largest,
        "spent {spent} of {budget}, largest {largest}"
    );
    kubectl_ok(
        &[
            "rollout",
            "restart",
            "-n",
            OPERATOR_NS,
            "deployment/modelfleet-gateway",
        ],
        None,
    );
    kubectl_ok(
        &[
            "rollout",
            "status",
            "-n",
            OPERATOR_NS,
            "deployment/modelfleet-gateway",
            "--timeout=180s",
        ],
        None,
    );
    let after = openai("quota", "spender", model);
    assert_eq!(
        after["error"], "insufficient_quota",
        "after a restart of every gateway: {after}"
    );
    assert_eq!(after["status"], 429, "{after}");
    eprintln!("[limits] after every gateway replica restarted, the openai client gets {after}");
    usage_export_matches(model, served, spent);
}

/// The billing export (`modelfleet-gateway usage`, run in a gateway pod) counts the spender's answered
/// requests and charges exactly what the client was answered.
fn usage_export_matches(model: &str, served: u64, spent: u64) {
    let csv = kubectl_ok(
        &[
            "exec",
            "-n",
            OPERATOR_NS,
            "deploy/modelfleet-gateway",
            "-c",
            "gateway",
            "--",
        ]
        .into_iter()
        .chain(["modelfleet-gateway", "usage", "--last", "2"])
        .collect::<Vec<_>>(),
        None,
    );
    let mut lines = csv.lines();
    let header: Vec<&str> = lines.next().unwrap_or_default().split(',').collect();
    let col = |name: &str| {
        header
            .iter()
            .position(|h| *h == name)
            .unwrap_or_else(|| panic!("{csv}"))
    };
    let (mut requests, mut cost) = (0u64, 0u64);
    for line in lines {
        let cells: Vec<&str> = line.split(',').collect();
        if cells[col("tenant")] == "spender" && cells[col("model")] == model {
            requests += cells[col("requests")].parse::<u64>().unwrap();
            cost += cells[col("cost_micros")].parse::<u64>().unwrap();
        }
    }
    eprintln!("[limits] usage export: spender {requests} requests, {cost} µEUR (client: {served}, {spent})");
    assert_eq!((requests, cost), (served, spent), "{csv}");
}

/// With the store gone: fail-open serves, fail-closed answers 503 at once; unlimited tenants never
/// depend on it.
async fn store_gone(model: &str) {
    let http = spread_client();
    let scale = |n: &str| {
        kubectl_ok(
            &[
                "scale",
                "-n",
                OPERATOR_NS,
                "deployment/modelfleet-limits-store",
                &format!("--replicas={n}"),
            ],
            None,
        )
    };
    let store_pods = || async {
        let out = kubectl_ok(
            &[
                "get",
                "pods",
                "-n",
                OPERATOR_NS,
                "-l",
                "app.kubernetes.io/name=modelfleet-limits-store",
                "-o",
                "name",
            ],
            None,
        );
        out.lines().count()
    };
    let store_down = || async {
        scale("0");
        wait_until("the store gone", Duration::from_secs(60), || async {
            (store_pods().await == 0).then_some(())
        })
        .await;
    };
    store_down().await;
    for _ in 0..5 {
        let s = one(&http, "noisy-t", model, Instant::now()).await;
        assert_eq!(s.status, 200, "fail-open serves: {s:?}");
        assert!(s.latency < Duration::from_secs(5), "{s:?}");
    }
    helm_set(&["limitsStore.failureMode=closed"]);
    store_down().await;
    for _ in 0..5 {
        let s = one(&http, "noisy-t", model, Instant::now()).await;
        assert_eq!(
            (s.status, s.code.as_str()),
            (503, "limits_unavailable"),
            "fail-closed: {s:?}"
        );
        assert!(s.latency < Duration::from_secs(2), "{s:?}");
        let q = one(&http, "quiet-1", model, Instant::now()).await;
        assert_eq!(
            q.status, 200,
            "a tenant without limits does not need the store: {q:?}"
        );
    }
    scale("1");
    wait_until("limits checked again", Duration::from_secs(120), || async {
        (one(&http, "noisy-t", model, Instant::now()).await.status == 200).then_some(())
    })
    .await;
    eprintln!(
        "[limits] store gone: fail-open served, fail-closed answered 503 limits_unavailable; back when it returned"
    );
}
