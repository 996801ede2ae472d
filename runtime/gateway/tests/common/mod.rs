//! Test pods for the gateway's integration tests: small HTTP servers on their own loopback addresses
//! (one port for all, as pods share a port on different IPs), each told how to answer, counting what
//! reached it; and a gateway over a fleet the test publishes itself. The end-to-end suite runs the real
//! runtime behind the real gateway; these tests pin down the proxy's contract (retries, streams,
//! cancellation, waiting rooms, authentication) with answers a runtime gives only under failure.
//! `examples/overhead_bench` includes this module too: its trivial upstream is a test pod answering
//! [`Mode::Completion`].
#![allow(dead_code)]

use axum::body::Body;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use modelfleet_gateway::config::Routing;
use modelfleet_gateway::fleet::{Adapter, Deployment, DeploymentId, Fleet, Pod, Tenancy};
use modelfleet_gateway::ring::Ring;
use modelfleet_gateway::state::{Gateway, Settings};
use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::watch;

/// How a test pod answers.
#[derive(Clone, Debug)]
pub enum Mode {
    /// 200 JSON naming the pod (an SSE stream of three events if the body asks `"stream": true`).
    Ok,
    /// This status with an OpenAI error body carrying `code`.
    Status(u16, &'static str),
    /// SSE: one event, then the connection is cut.
    DieMidStream,
    /// SSE: an event every 50 ms until the client goes away (counted in `dropped`).
    Endless,
    /// Holds the request 10 s before answering (counted in `dropped` if the client goes away first).
    Slow,
    /// A fixed OpenAI chat completion ([`COMPLETION`]), or [`COMPLETION_CHUNKS`] as SSE if the body
    /// asks `"stream": true`: the trivial upstream of the overhead benchmark.
    Completion,
    /// The connection is dropped without an answer (the handler panics); the pod stays up.
    Reset,
    /// As a poison request would: the connection is dropped without an answer and the pod goes away
    /// (its `/health` fails from then on, as a dead process's would).
    Crash,
}

/// The answer of [`Mode::Completion`].
pub const COMPLETION: &str = concat!(
    r#"{"id":"chatcmpl-bench","object":"chat.completion","created":1764633600,"model":"llama","#,
    r#""choices":[{"index":0,"message":{"role":"assistant","content":"Hello! How can I help you today?"},"#,
    r#""finish_reason":"stop","logprobs":null}],"usage":{"prompt_tokens":20,"completion_tokens":9,"total_tokens":29}}"#
);

/// The streamed answer of [`Mode::Completion`]: SSE events, `[DONE]` last.
pub const COMPLETION_CHUNKS: [&str; 4] = [
    "data: {\"id\":\"chatcmpl-bench\",\"object\":\"chat.completion.chunk\",\"created\":1764633600,\"model\":\"llama\",\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"},\"finish_reason\":null}]}\n\n",
    "data: {\"id\":\"chatcmpl-bench\",\"object\":\"chat.completion.chunk\",\"created\":1764633600,\"model\":\"llama\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hello! How can I help you today?\"},\"finish_reason\":null}]}\n\n",
    "data: {\"id\":\"chatcmpl-bench\",\"object\":\"chat.completion.chunk\",\"created\":1764633600,\"model\":\"llama\",\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}]}\n\n",
    "data: [DONE]\n\n",
];

/// The usage chunk of [`Mode::Completion`]'s stream, sent when `stream_options.include_usage` asks.
pub const USAGE_CHUNK: &str = "data: {\"id\":\"chatcmpl-bench\",\"object\":\"chat.completion.chunk\",\"created\":1764633600,\"model\":\"llama\",\"choices\":[],\"usage\":{\"prompt_tokens\":20,\"completion_tokens\":3,\"total_tokens\":23,\"prompt_tokens_details\":{\"cached_tokens\":5}}}\n\n";

/// One test pod.
pub struct TestPod {
    pub name: String,
    pub ip: String,
    pub mode: Arc<Mutex<Mode>>,
    pub hits: Arc<AtomicUsize>,
    pub dropped: Arc<AtomicUsize>,
    pub last_auth: Arc<Mutex<Option<String>>>,
    pub last_body: Arc<Mutex<Vec<u8>>>,
    /// The first-token deadline the last request carried (`x-modelfleet-first-token-deadline-ms`).
    pub last_deadline: Arc<Mutex<Option<String>>>,
    /// Set when the pod "died" ([`Mode::Crash`]).
    pub gone: Arc<std::sync::atomic::AtomicBool>,
    task: Option<tokio::task::JoinHandle<()>>,
}

impl TestPod {
    pub fn pod(&self) -> Pod {
        Pod {
            name: self.name.clone(),
            ip: self.ip.clone(),
            revision: String::new(),
        }
    }

    pub fn set(&self, m: Mode) {
        *self.mode.lock().unwrap() = m;
    }

    pub fn hits(&self) -> usize {
        self.hits.load(Ordering::SeqCst)
    }

    /// Stops listening (later connections are refused).
    pub fn kill(&mut self) {
        if let Some(t) = self.task.take() {
            t.abort();
        }
    }
}

/// Counts a drop: the request's future or body went away before it finished.
struct DropCount(Arc<AtomicUsize>, bool);
impl Drop for DropCount {
    fn drop(&mut self) {
        if !self.1 {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }
}

fn error_body(status: u16, code: &str) -> Response {
    let body = serde_json::json!({"error": {"message": format!("test pod says {status}"), "type": "x", "param": null, "code": code}});
    let mut r = (StatusCode::from_u16(status).unwrap(), axum::Json(body)).into_response();
    if status == 429 {
        r.headers_mut().insert("retry-after", 1.into());
    }
    r
}

async fn answer(
    axum::extract::State(pod): axum::extract::State<Arc<TestPodState>>,
    headers: axum::http::HeaderMap,
    body: axum::body::Bytes,
) -> Response {
    pod.hits.fetch_add(1, Ordering::SeqCst);
    *pod.last_auth.lock().unwrap() = headers
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .map(String::from);
    *pod.last_body.lock().unwrap() = body.to_vec();
    *pod.last_deadline.lock().unwrap() = headers
        .get(modelfleet_api::deadline::HEADER)
        .and_then(|v| v.to_str().ok())
        .map(String::from);
    let stream = serde_json::from_slice::<serde_json::Value>(&body)
        .ok()
        .and_then(|v| v["stream"].as_bool())
        .unwrap_or(false);
    let mode = pod.mode.lock().unwrap().clone();
    let name = pod.name.clone();
    let sse = |events: Vec<String>| {
        let s = futures::stream::iter(events.into_iter().map(Ok::<_, std::io::Error>));
        Response::builder()
            .header("content-type", "text/event-stream")
            .body(Body::from_stream(s))
            .unwrap()
    };
    // The runtime's usage report, when the gateway asks for it (as it always does).
    let report = headers.contains_key("x-modelfleet-usage");
    match mode {
        Mode::Ok if stream => sse(vec![
            format!("data: {{\"pod\":\"{name}\",\"n\":1}}\n\n"),
            format!("data: {{\"pod\":\"{name}\",\"n\":2}}\n\n"),
            if report {
                ": modelfleet-usage prompt=7 cached=2 completion=2\n\n".into()
            } else {
                String::new()
            },
            "data: [DONE]\n\n".into(),
        ]),
        Mode::Ok if report => (
            [("x-modelfleet-usage", "prompt=7 cached=2 completion=1")],
            axum::Json(serde_json::json!({"pod": name})),
        )
            .into_response(),
        Mode::Ok => axum::Json(serde_json::json!({"pod": name})).into_response(),
        Mode::Completion if stream => {
            let mut events: Vec<String> = COMPLETION_CHUNKS.iter().map(|c| c.to_string()).collect();
            // The usage chunk, when asked for (as OpenAI's API does), before `[DONE]`.
            let asked = serde_json::from_slice::<serde_json::Value>(&body)
                .is_ok_and(|v| v["stream_options"]["include_usage"] == true);
            if asked {
                events.insert(events.len() - 1, USAGE_CHUNK.to_string());
            }
            sse(events)
        }
        Mode::Completion => (
            [(axum::http::header::CONTENT_TYPE, "application/json")],
            COMPLETION,
        )
            .into_response(),
        Mode::Status(s, code) => error_body(s, code),
        Mode::DieMidStream => {
            let first = futures::stream::iter([Ok::<_, std::io::Error>(format!(
                "data: {{\"pod\":\"{name}\"}}\n\n"
            ))]);
            let cut = futures::stream::once(async {
                tokio::time::sleep(Duration::from_millis(50)).await;
                Err(std::io::Error::other("pod killed"))
            });
            use futures::StreamExt;
            Response::builder()
                .header("content-type", "text/event-stream")
                .body(Body::from_stream(first.chain(cut)))
                .unwrap()
        }
        Mode::Endless => {
            let guard = DropCount(pod.dropped.clone(), false);
            let s = futures::stream::unfold(guard, |g| async move {
                tokio::time::sleep(Duration::from_millis(50)).await;
                Some((Ok::<_, std::io::Error>("data: {\"tick\":1}\n\n".to_string()), g))
            });
            Response::builder()
                .header("content-type", "text/event-stream")
                .body(Body::from_stream(s))
                .unwrap()
        }
        Mode::Reset => panic!("test pod {name} drops the connection"),
        Mode::Crash => {
            pod.gone.store(true, Ordering::SeqCst);
            panic!("test pod {name} dies of this request")
        }
        Mode::Slow => {
            let mut guard = DropCount(pod.dropped.clone(), false);
            tokio::time::sleep(Duration::from_secs(10)).await;
            guard.1 = true;
            axum::Json(serde_json::json!({"pod": name})).into_response()
        }
    }
}

async fn health(axum::extract::State(pod): axum::extract::State<Arc<TestPodState>>) -> StatusCode {
    if pod.gone.load(Ordering::SeqCst) {
        StatusCode::SERVICE_UNAVAILABLE
    } else {
        StatusCode::OK
    }
}

struct TestPodState {
    gone: Arc<std::sync::atomic::AtomicBool>,
    name: String,
    mode: Arc<Mutex<Mode>>,
    hits: Arc<AtomicUsize>,
    dropped: Arc<AtomicUsize>,
    last_auth: Arc<Mutex<Option<String>>>,
    last_body: Arc<Mutex<Vec<u8>>>,
    last_deadline: Arc<Mutex<Option<String>>>,
}

/// `n` test pods on 127.88.<k>.1..n sharing one free port; returns them and the port.
pub async fn pods(n: usize) -> (Vec<TestPod>, u16) {
    static NEXT: AtomicUsize = AtomicUsize::new(1);
    'attempt: for _ in 0..50 {
        let k = NEXT.fetch_add(1, Ordering::SeqCst) % 250 + 1;
        let probe = tokio::net::TcpListener::bind(format!("127.88.{k}.1:0"))
            .await
            .unwrap();
        let port = probe.local_addr().unwrap().port();
        drop(probe);
        let mut listeners = Vec::new();
        for i in 0..n {
            match tokio::net::TcpListener::bind(format!("127.88.{k}.{}:{port}", i + 1)).await {
                Ok(l) => listeners.push(l),
                Err(_) => continue 'attempt,
            }
        }
        let mut out = Vec::new();
        for (i, l) in listeners.into_iter().enumerate() {
            let state = Arc::new(TestPodState {
                gone: Arc::default(),
                name: format!("fleet-pod-{i}"),
                mode: Arc::new(Mutex::new(Mode::Ok)),
                hits: Arc::default(),
                dropped: Arc::default(),
                last_auth: Arc::default(),
                last_body: Arc::default(),
                last_deadline: Arc::default(),
            });
            let app = axum::Router::new()
                .route("/v1/chat/completions", axum::routing::post(answer))
                .route("/v1/completions", axum::routing::post(answer))
                .route("/health", axum::routing::get(health))
                .with_state(state.clone());
            let task = tokio::spawn(async move {
                let _ = axum::serve(l, app).await;
            });
            out.push(TestPod {
                name: state.name.clone(),
                ip: format!("127.88.{k}.{}", i + 1),
                mode: state.mode.clone(),
                hits: state.hits.clone(),
                dropped: state.dropped.clone(),
                last_auth: state.last_auth.clone(),
                last_body: state.last_body.clone(),
                last_deadline: state.last_deadline.clone(),
                gone: state.gone.clone(),
                task: Some(task),
            });
        }
        return (out, port);
    }
    panic!("no free port for the test pods")
}

pub fn settings(pod_port: u16) -> Settings {
    Settings {
        load_factor: 1.25,
        load_floor: 4.0,
        retries: 2,
        routing: Routing::Affinity,
        affinity_prefix_chars: 512,
        pod_port,
        pod_header: true,
        max_body_bytes: 64 << 10,
        body_read_timeout: Duration::from_secs(2),
        request_timeout: Duration::from_secs(20),
        max_pending_wait: Duration::from_secs(5),
        upstream_idle_timeout: Duration::from_secs(5),
    }
}

/// A deployment `chat` in namespace `ns` serving `llama` on `pods`.
pub fn deployment(pods: &[Pod], tenancy: Tenancy, adapters: &[(&str, &[&str], &[&str])]) -> Deployment {
    let names: Vec<&str> = pods.iter().map(|p| p.name.as_str()).collect();
    let mut sorted = pods.to_vec();
    sorted.sort_by(|a, b| a.name.cmp(&b.name));
    Deployment {
        id: DeploymentId {
            namespace: "ns".into(),
            name: "chat".into(),
        },
        served_name: "llama".into(),
        tenancy,
        shared_prefix_cache: false,
        prices: Default::default(),
        pods: sorted,
        ring: Arc::new(Ring::new(&names)),
        adapters: adapters
            .iter()
            .map(|(name, tenants, loaded)| {
                (
                    name.to_string(),
                    Adapter {
                        served_name: name.to_string(),
                        tenants: tenants.iter().map(|t| t.to_string()).collect(),
                        loaded_on: loaded.iter().map(|p| p.to_string()).collect::<BTreeSet<_>>(),
                    },
                )
            })
            .collect::<BTreeMap<_, _>>(),
        created: 1,
        max_model_len: Some(2048),
        task: None,
        split: None,
        fallback: None,
        providers: Default::default(),
    }
}

/// A running gateway: its address, its state, and the sender that publishes fleets to it.
pub struct TestGateway {
    pub addr: SocketAddr,
    pub gw: Arc<Gateway>,
    pub fleet: watch::Sender<Arc<Fleet>>,
}

impl TestGateway {
    pub async fn start(settings: Settings, fleet: Fleet, max_pending: usize) -> TestGateway {
        let (tx, rx) = watch::channel(Arc::new(fleet));
        let gw = Gateway::new(rx, settings, max_pending, Duration::from_secs(1));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let app = modelfleet_gateway::routes::api(gw.clone());
        tokio::spawn(modelfleet_api::listener::serve(
            listener,
            app,
            modelfleet_api::listener::Limits::default(),
            std::future::pending(),
        ));
        TestGateway { addr, gw, fleet: tx }
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    pub fn publish(&self, deployments: Vec<Deployment>) {
        self.fleet.send_replace(Arc::new(Fleet::new(deployments, true)));
    }

    pub fn metrics(&self) -> String {
        self.gw.metrics.render()
    }
}

pub fn client() -> reqwest::Client {
    let _ = rustls::crypto::ring::default_provider().install_default();
    reqwest::Client::builder()
        .no_proxy()
        .timeout(Duration::from_secs(30))
        .build()
        .unwrap()
}

pub fn chat(prompt: &str, stream: bool) -> serde_json::Value {
    serde_json::json!({"model": "llama", "stream": stream, "messages": [{"role": "user", "content": prompt}], "tools": [{"type": "function"}]})
}

/// POSTs `body` to `url` (with `key` as the bearer token, if any): status, headers, body text.
pub async fn post(
    url: &str,
    body: &serde_json::Value,
    key: Option<&str>,
) -> (u16, reqwest::header::HeaderMap, String) {
    post_with(url, body, key, &[]).await
}

/// [`post`] with extra request headers.
pub async fn post_with(
    url: &str,
    body: &serde_json::Value,
    key: Option<&str>,
    headers: &[(&str, &str)],
) -> (u16, reqwest::header::HeaderMap, String) {
    let mut r = client().post(url).json(body);
    for (k, v) in headers {
        r = r.header(*k, *v);
    }
    if let Some(k) = key {
        r = r.bearer_auth(k);
    }
    let resp = r.send().await.unwrap();
    let status = resp.status().as_u16();
    let headers = resp.headers().clone();
    (status, headers, resp.text().await.unwrap_or_default())
}

/// Header `name` as text (empty if absent).
pub fn header(h: &reqwest::header::HeaderMap, name: &str) -> String {
    h.get(name)
        .map(|v| v.to_str().unwrap().to_string())
        .unwrap_or_default()
}
