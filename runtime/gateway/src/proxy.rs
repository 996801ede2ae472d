//! Forwarding one authorized request: choose a pod, send the body unchanged, and commit to the first
//! answer worth giving — retrying on another pod, within the request's deadline and at most
//! `--retries` times, what provably did not reach a pod's handler or was refused by a live pod:
//! connect refused, the pod's 503 (draining, not ready), its 429 `queue_full`, or its 404 for an
//! adapter it has not loaded. A connection that breaks after the request was sent (a reset before the
//! first body byte) is not proof the pod never started it, and it may be the request that killed the
//! pod: it is retried at most once, and only when the pod is still there ([`crate::suspect`]); a pod
//! that went away keeps the request (502 `upstream_failed`, logged with the tenant and a hash of the
//! body), so one poison request takes down at most one replica. A tenant-quota 429 and every other
//! answer go to the client as the pod gave them. With a first-token deadline (`Job::first_token_by`)
//! each pod is told what is left of it; its 504 `first_token_deadline`, or — for a stream — its
//! silence [`FIRST_TOKEN_GRACE`] past the deadline, ends the attempts without a retry
//! ([`crate::refusal`]).
//!
//! Invariants: nothing is retried once a byte reached the client; a stream whose pod fails midway
//! ends with `data: {"error": …}` and `data: [DONE]` (a JSON answer is cut off, which the client sees
//! as an incomplete body), never a hang — a pod silent for `--upstream-idle-timeout` counts as failed;
//! a client that goes away drops the upstream response, which closes the pod's connection, so the pod
//! cancels the request and frees its KV blocks; the in-flight count, the tenant's lease (which reads
//! the answer's token usage as it passes, `limits::meter`) and the record live as long as the response
//! body.

use crate::edge::Authorized;
use crate::fleet::{Deployment, Pod};
use crate::limits::Lease;
use crate::limits::meter::USAGE_HEADER;
use crate::load::InflightGuard;
use crate::record::Record;
use crate::refusal::{
    Failure, Refusal, Refused, Unstarted, broken_twice, exhausted, remember, timeout, went_away,
};
use crate::request::{Routed, affinity_key};
use crate::revision::{Probe, status_ok};
use crate::route::{Choice, choose, ready_deployment, wanted};
use crate::state::Gateway;
use crate::suspect::{Suspect, pod_gone, report};
use crate::trace;
use axum::body::Body;
use axum::http::{HeaderMap, HeaderName, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use modelfleet_api::deadline;
use modelfleet_api::error::{ApiError, ApiErrorKind};
use modelfleet_crds::FallbackTrigger;
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;
use tracing::Instrument;

/// Response header naming the pod that served (`--pod-header`).
pub const POD_HEADER: &str = "x-modelfleet-pod";
/// Largest error body read from a pod to decide whether to retry.
const MAX_ERROR_BODY: usize = 64 << 10;

/// Headers that describe one connection, not the request (RFC 9110 §7.6.1), plus those recomputed.
fn hop_by_hop(name: &HeaderName) -> bool {
    matches!(
        name.as_str(),
        "connection"
            | "keep-alive"
            | "proxy-connection"
            | "proxy-authenticate"
            | "proxy-authorization"
            | "te"
            | "trailer"
            | "transfer-encoding"
            | "upgrade"
            | "host"
            | "content-length"
    )
}

/// The request's headers as sent on (the caller's `Authorization` included, unchanged).
pub fn upstream_headers(h: &HeaderMap) -> HeaderMap {
    h.iter()
        .filter(|(k, _)| !hop_by_hop(k))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect()
}

/// One request to forward.
pub struct Job {
    /// Who and where.
    pub auth: Authorized,
    /// What routing read of the body.
    pub routed: Routed,
    /// `/v1/chat/completions` or `/v1/completions`.
    pub path: String,
    /// Headers to send.
    pub headers: HeaderMap,
    /// The body, unchanged.
    pub body: Bytes,
    /// First byte by then, or 504.
    pub deadline: Instant,
    /// First token by then, or the request moves or is answered 504 `first_token_deadline`
    /// (`modelfleet_api::deadline`): the pod is told what is left of it, and an attempt still
    /// silent [`FIRST_TOKEN_GRACE`] later is cut.
    pub first_token_by: Option<Instant>,
    /// When it arrived.
    pub arrival: Instant,
    /// Its share of the tenant's limits, settled when the answer ends.
    pub lease: Lease,
    /// Its accounting.
    pub record: Record,
}

impl Job {
    /// When an attempt stops waiting for its first byte: the deadline, or — for a stream, whose
    /// first byte comes with its first token — shortly after the first-token deadline (the pod
    /// answers 504 `first_token_deadline` at it; one that does not is cut). A JSON answer's first
    /// byte comes only with its last token: there the pod alone keeps the first-token deadline.
    fn first_byte_by(&self) -> Instant {
        match self.first_token_by {
            Some(by) if self.routed.stream => self.deadline.min(by + FIRST_TOKEN_GRACE),
            _ => self.deadline,
        }
    }

    /// Whether the first-token deadline has passed.
    pub fn late(&self) -> bool {
        self.first_token_by.is_some_and(|by| Instant::now() >= by)
    }
}

/// How long past the first-token deadline the gateway waits for the pod's own refusal.
pub const FIRST_TOKEN_GRACE: Duration = Duration::from_millis(250);

/// An answer from a pod that was not streamed (an error worth retrying, or the last one).
pub struct Buffered {
    status: StatusCode,
    headers: HeaderMap,
    body: Bytes,
}

/// Forwards `job`, retrying as the module header says; a deployment with `spec.fallback` may move it
/// ([`crate::fallback`]).
pub async fn forward(gw: Arc<Gateway>, job: Job) -> Response {
    if let Some(spec) = job.auth.deployment.fallback.clone()
        && job.auth.adapter.is_none()
    {
        return crate::fallback::forward(gw, job, &spec).await;
    }
    match attempt(&gw, job, None).await {
        Ok(resp) => resp,
        Err(refused) => {
            let Refused { refusal, mut job } = *refused;
            refusal.answer(&gw, &mut job.record)
        }
    }
}

/// Tries `job` on its deployment (`job.auth.deployment`): waits for a Ready replica until the request's
/// pending limit, its first-token deadline or, with `wait`, that long from now; then pods in turn as
/// the module header says. `Err` when no pod started it: no Ready replica in time, every pod tried
/// refused it, or the first-token deadline passed before a byte was sent.
pub async fn attempt(
    gw: &Arc<Gateway>,
    mut job: Job,
    wait: Option<Duration>,
) -> Result<Response, Box<Refused>> {
    let id = job.auth.deployment.id.clone();
    let model = job.routed.model.clone();
    gw.metrics.touch(&id);
    let pending_until = pending_until(gw, &job, wait);
    let key = cache_key(&job);
    crate::mirror::launch(gw, &job, key);
    let mut tried: Vec<String> = Vec::new();
    let mut last: Option<Failure> = None;
    let mut resets = 0u32;
    let mut previous: Option<String> = None;
    for attempt in 0..=gw.settings.retries {
        if job.late() {
            return refuse(job, Unstarted::Late(None, model));
        }
        let d = match ready_deployment(gw, &id, &model, pending_until).await {
            Ok(d) => d,
            Err(_) if job.late() => return refuse(job, Unstarted::Late(None, model)),
            Err(e) if e.code.as_deref() == Some("no_ready_replica") && tried.is_empty() => {
                return refuse(job, Unstarted::NoReplica(e));
            }
            Err(e) => return Ok(fail(&mut job.record, e)),
        };
        let want = wanted(&d, &job.auth.tenant.id, key);
        let Some(choice) = choose(gw, &d, key, job.auth.adapter.as_deref(), &tried, want.as_deref()) else {
            break;
        };
        count_route(gw, &d, &choice, want.is_some(), attempt);
        job.record.attempts += 1;
        tried.push(choice.pod.name.clone());
        let inflight = gw.loads.start(&choice.pod.name);
        let mut probe = Probe::new(gw.metrics.clone(), &id, &choice.pod, false);
        let span = attempt_span(attempt, &choice, previous.as_deref());
        let sent = Instant::now();
        let judged = match send(gw, &job, &choice.pod, &span).instrument(span.clone()).await {
            Ok(resp) => judge(gw, &job, &choice.pod, resp).instrument(span.clone()).await,
            Err(Sent::NotReached(why)) => {
                trace::failed(&span, &format!("not reached: {why}"));
                previous = Some("not_reached".into());
                remember(&mut last, Failure::Transport(why));
                continue;
            }
            Err(Sent::Broken(why)) => Judged::Reset(why),
            Err(Sent::Deadline) if job.late() => Judged::Late(None),
            Err(Sent::Deadline) => Judged::Timeout,
        };
        judged.tell(&mut probe, sent);
        previous = judged.trace(&span);
        match judged {
            Judged::Stream(resp, first) => {
                return Ok(commit(gw.clone(), job, choice.pod, resp, first, inflight, probe));
            }
            Judged::Retry(b) => remember(&mut last, Failure::Answer(b, choice.pod)),
            Judged::Final(b) => return Ok(buffered_response(gw, &mut job.record, b, &choice.pod)),
            Judged::Late(b) => return refuse(job, Unstarted::Late(b.map(|b| (b, choice.pod)), model)),
            Judged::Reset(why) => {
                drop(inflight);
                resets += 1;
                if let Some(answer) = after_reset(gw, &mut job, &choice.pod, resets, &why).await {
                    return Ok(answer);
                }
                remember(&mut last, Failure::Transport(why));
            }
            Judged::Timeout => return Ok(fail(&mut job.record, timeout(&model))),
        }
        if Instant::now() >= job.deadline {
            return Ok(fail(&mut job.record, timeout(&model)));
        }
    }
    // A reset may mean the request started on a pod: such a request is not moved (as it is not
    // retried twice); neither is one that met only transport failures after a reset.
    if resets > 0 {
        return Ok(exhausted(gw, &mut job.record, last, &model));
    }
    refuse(job, Unstarted::Exhausted(last, model))
}

/// How long `job` may wait for a Ready replica: its pending limit, its first-token deadline, and
/// `wait` from now, whichever ends first.
fn pending_until(gw: &Gateway, job: &Job, wait: Option<Duration>) -> Instant {
    let mut until = job.deadline.min(job.arrival + gw.settings.max_pending_wait);
    if let Some(wait) = wait {
        until = until.min(Instant::now() + wait);
    }
    if let Some(by) = job.first_token_by {
        until = until.min(by);
    }
    until
}

/// The request's prefix-affinity key, in its cache scope (the tenant's, or the deployment's).
fn cache_key(job: &Job) -> u64 {
    let scope = if job.auth.deployment.shared_prefix_cache {
        "deployment".to_string()
    } else {
        format!("tenant:{}", job.auth.tenant.id)
    };
    affinity_key(&scope, job.auth.adapter.as_deref(), &job.routed)
}

fn attempt_span(attempt: u32, choice: &Choice, previous: Option<&str>) -> tracing::Span {
    let pod = &choice.pod;
    trace::attempt_span(
        attempt,
        &pod.name,
        &pod.revision,
        choice.decision.label(),
        previous,
    )
}

/// Gives `job` back refused (see [`Refused`]); the trigger follows from why.
fn refuse(job: Job, unstarted: Unstarted) -> Result<Response, Box<Refused>> {
    let trigger = match unstarted {
        Unstarted::NoReplica(_) => FallbackTrigger::NoReadyReplica,
        Unstarted::Exhausted(..) => FallbackTrigger::Saturated,
        Unstarted::Late(..) => FallbackTrigger::FirstTokenDeadline,
    };
    let refusal = Refusal { trigger, unstarted };
    Err(Box::new(Refused { refusal, job }))
}

/// After the `resets`-th reset before the first byte: the answer if the request ends here (its pod
/// went away, so it may be what killed it; or a second connection broke), `None` to try another pod.
async fn after_reset(gw: &Gateway, job: &mut Job, pod: &Pod, resets: u32, why: &str) -> Option<Response> {
    let gone = pod_gone(gw, pod).await;
    gw.metrics
        .upstream_resets
        .with_label_values(&[
            job.auth.deployment.id.name.as_str(),
            if gone { "pod_gone" } else { "pod_alive" },
        ])
        .inc();
    let model = job.routed.model.clone();
    if gone {
        gw.loads.eject(&pod.name);
        report(&suspect(job, pod, "before_first_byte"));
        return Some(fail(&mut job.record, went_away(&model, pod, why)));
    }
    (resets > 1).then(|| fail(&mut job.record, broken_twice(&model, why)))
}

/// Counts a routing decision (and a retry, past the first attempt; and the revision, with a split).
fn count_route(gw: &Gateway, d: &Deployment, choice: &Choice, split: bool, attempt: u32) {
    let id = &d.id;
    if attempt > 0 {
        gw.metrics.retries.with_label_values(&[&id.name]).inc();
    }
    gw.metrics
        .route
        .with_label_values(&[&id.name, choice.decision.label()])
        .inc();
    if split {
        let reason = if choice.fallback { "fallback" } else { "weight" };
        gw.metrics
            .revisions
            .route
            .with_label_values(&[&id.namespace, &id.name, &choice.pod.revision, reason])
            .inc();
    }
}

fn suspect<'a>(job: &'a Job, pod: &'a Pod, phase: &'a str) -> Suspect<'a> {
    Suspect {
        namespace: &job.record.namespace,
        deployment: &job.record.deployment,
        tenant: &job.auth.tenant.id,
        pod: &pod.name,
        path: &job.path,
        body: &job.body,
        phase,
    }
}

/// Answers with a gateway error and records it.
pub fn fail(record: &mut Record, e: ApiError) -> Response {
    record.finish(&e.status().to_string());
    e.into_response()
}

/// How sending failed.
enum Sent {
    /// No connection: the request never reached the pod.
    NotReached(String),
    /// The connection broke after it was made: the pod may have started the request.
    Broken(String),
    /// The request's deadline passed.
    Deadline,
}

/// Sends the request to `pod` and waits for its response head.
async fn send(gw: &Gateway, job: &Job, pod: &Pod, span: &tracing::Span) -> Result<reqwest::Response, Sent> {
    let url = format!("http://{}:{}{}", pod.ip, gw.settings.pod_port, job.path);
    let mut request = gw
        .client
        .post(url)
        .headers(trace::to_pod(&job.headers, span))
        .header(USAGE_HEADER, "1");
    if let Some(by) = job.first_token_by {
        // What is left of it, as the pod counts from its own arrival (at least 1 ms).
        let left = by.saturating_duration_since(Instant::now()).as_millis().max(1);
        request = request.header(deadline::HEADER, left.to_string());
    }
    let request = request.body(job.body.clone()).send();
    match tokio::time::timeout_at(job.first_byte_by(), request).await {
        Ok(Ok(resp)) => Ok(resp),
        Ok(Err(e)) => {
            let why = format!("{}: {}", pod.name, error_chain(&e));
            if e.is_connect() {
                gw.loads.eject(&pod.name);
                Err(Sent::NotReached(why))
            } else {
                Err(Sent::Broken(why))
            }
        }
        Err(_) => Err(Sent::Deadline),
    }
}

pub(crate) fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut source = e.source();
    while let Some(inner) = source {
        s.push_str(": ");
        s.push_str(&inner.to_string());
        source = inner.source();
    }
    s
}

enum Judged {
    /// Commit: the response and its first body chunk (empty if the body is empty).
    Stream(reqwest::Response, Bytes),
    Retry(Buffered),
    Final(Buffered),
    /// The first-token deadline passed: the pod's 504 `first_token_deadline`, or nothing (cut).
    Late(Option<Buffered>),
    Reset(String),
    Timeout,
}

impl Judged {
    /// Tells the pod's revision how the attempt went (a stream's verdict waits for its end).
    fn tell(&self, probe: &mut Probe, sent: Instant) {
        match self {
            Judged::Stream(resp, _) => {
                if resp.status().is_success() {
                    probe.first_byte(sent.elapsed());
                }
            }
            Judged::Retry(b) | Judged::Final(b) => probe.finish(status_ok(b.status)),
            Judged::Late(_) | Judged::Reset(_) | Judged::Timeout => probe.finish(false),
        }
    }

    /// Writes the attempt's outcome on its span; returns why the next attempt is made, if one is.
    fn trace(&self, span: &tracing::Span) -> Option<String> {
        let status = |b: &Buffered| {
            let code = error_code(&b.body).map(|c| format!(" {c}")).unwrap_or_default();
            format!("status {}{code}", b.status.as_u16())
        };
        match self {
            Judged::Stream(resp, _) => {
                span.record("http.response.status_code", resp.status().as_u16());
                span.record("modelfleet.outcome", "first_byte");
                None
            }
            Judged::Final(b) => {
                span.record("http.response.status_code", b.status.as_u16());
                span.record("modelfleet.outcome", "answered");
                None
            }
            Judged::Retry(b) => {
                span.record("http.response.status_code", b.status.as_u16());
                let why = status(b);
                trace::failed(span, &why);
                Some(why)
            }
            Judged::Late(b) => {
                if let Some(b) = b {
                    span.record("http.response.status_code", b.status.as_u16());
                }
                trace::failed(span, deadline::CODE);
                None
            }
            Judged::Reset(why) => {
                trace::failed(span, &format!("reset: {why}"));
                Some("reset".into())
            }
            Judged::Timeout => {
                trace::failed(span, "deadline");
                None
            }
        }
    }
}

async fn read_small(resp: &mut reqwest::Response, deadline: Instant) -> Result<Bytes, String> {
    let mut out = Vec::new();
    loop {
        match tokio::time::timeout_at(deadline, resp.chunk()).await {
            Ok(Ok(Some(c))) => {
                if out.len() + c.len() > MAX_ERROR_BODY {
                    return Err("error body too large".into());
                }
                out.extend_from_slice(&c);
            }
            Ok(Ok(None)) => return Ok(out.into()),
            Ok(Err(e)) => return Err(error_chain(&e)),
            Err(_) => return Err("deadline".into()),
        }
    }
}

fn error_code(body: &[u8]) -> Option<String> {
    let v: serde_json::Value = serde_json::from_slice(body).ok()?;
    v["error"]["code"].as_str().map(str::to_string)
}

/// Decides what to do with a pod's response head.
async fn judge(gw: &Gateway, job: &Job, pod: &Pod, mut resp: reqwest::Response) -> Judged {
    let status = resp.status();
    let retryable_status = status == StatusCode::SERVICE_UNAVAILABLE
        || status == StatusCode::TOO_MANY_REQUESTS
        || (status == StatusCode::NOT_FOUND && job.auth.adapter.is_some());
    let maybe_late = status == StatusCode::GATEWAY_TIMEOUT && job.first_token_by.is_some();
    if retryable_status || maybe_late {
        let headers = resp.headers().clone();
        let body = match read_small(&mut resp, job.deadline).await {
            Ok(b) => b,
            Err(why) => return Judged::Reset(format!("{}: {why}", pod.name)),
        };
        let code = error_code(&body);
        let b = Buffered {
            status,
            headers,
            body,
        };
        if maybe_late {
            let late = code.as_deref() == Some(deadline::CODE);
            return if late {
                Judged::Late(Some(b))
            } else {
                Judged::Final(b)
            };
        }
        let retry = status != StatusCode::TOO_MANY_REQUESTS || code.as_deref() == Some("queue_full");
        return if retry { Judged::Retry(b) } else { Judged::Final(b) };
    }
    let sent = Instant::now();
    match tokio::time::timeout_at(job.first_byte_by(), resp.chunk()).await {
        Ok(Ok(first)) => {
            gw.metrics
                .upstream_ttft
                .with_label_values(&[&job.auth.deployment.id.name])
                .observe(sent.elapsed().as_secs_f64());
            gw.loads.restore(&pod.name);
            Judged::Stream(resp, first.unwrap_or_default())
        }
        Ok(Err(e)) => Judged::Reset(format!(
            "{}: reset before the first byte: {}",
            pod.name,
            error_chain(&e)
        )),
        Err(_) if job.late() => Judged::Late(None),
        Err(_) => Judged::Timeout,
    }
}

fn response_head(
    gw: &Gateway,
    status: StatusCode,
    headers: &HeaderMap,
    pod: &Pod,
) -> axum::http::response::Builder {
    let mut builder = Response::builder().status(status);
    for (k, v) in headers {
        if !hop_by_hop(k) || k == header::CONTENT_LENGTH {
            builder = builder.header(k, v);
        }
    }
    if gw.settings.pod_header
        && !pod.name.is_empty()
        && let Ok(v) = HeaderValue::from_str(&pod.name)
    {
        builder = builder.header(POD_HEADER, v);
    }
    builder
}

pub(crate) fn buffered_response(gw: &Gateway, record: &mut Record, b: Buffered, pod: &Pod) -> Response {
    record.pod = pod.name.clone();
    record.finish(b.status.as_str());
    response_head(gw, b.status, &b.headers, pod)
        .body(Body::from(b.body))
        .unwrap_or_else(|_| StatusCode::BAD_GATEWAY.into_response())
}

/// Where a streamed answer came from, to report its request if its pod goes away midway.
struct Origin {
    tenant: String,
    path: String,
    body: Bytes,
    pod: Pod,
    gw: Arc<Gateway>,
}

impl Origin {
    /// The stream broke: in the background, ask whether the pod went away, and if so log the request
    /// (nothing is retried: bytes already reached the client).
    fn check_pod(&self, namespace: &str, deployment: &str) {
        let (gw, pod) = (self.gw.clone(), self.pod.clone());
        let (tenant, path, body) = (self.tenant.clone(), self.path.clone(), self.body.clone());
        let (namespace, deployment) = (namespace.to_string(), deployment.to_string());
        tokio::spawn(async move {
            let gone = pod_gone(&gw, &pod).await;
            gw.metrics
                .upstream_resets
                .with_label_values(&[deployment.as_str(), if gone { "pod_gone" } else { "pod_alive" }])
                .inc();
            if gone {
                report(&Suspect {
                    namespace: &namespace,
                    deployment: &deployment,
                    tenant: &tenant,
                    pod: &pod.name,
                    path: &path,
                    body: &body,
                    phase: "streaming",
                });
            }
        });
    }
}

/// What a streamed body carries along until it ends.
struct Streaming {
    resp: reqwest::Response,
    first: Option<Bytes>,
    sse: bool,
    idle: Duration,
    done: bool,
    origin: Origin,
    record: Record,
    _inflight: InflightGuard,
    lease: Lease,
    /// The pod's revision's measurements (no verdict if the client goes away first).
    probe: Probe,
    /// What the record says once the answer is complete (`ok` or the status).
    outcome: String,
    /// Whether the pod's status is a good answer for its revision (not a 5xx).
    healthy: bool,
    /// Bytes of a declared `Content-Length` not passed on yet: at 0 the answer is complete (the server
    /// stops reading the body there, so its end is never seen).
    remaining: Option<u64>,
}

impl Streaming {
    /// `chunk` goes to the client.
    fn passed(&mut self, chunk: &Bytes) {
        if self.sse {
            self.lease.streamed(chunk);
            self.probe.streamed(chunk);
        }
        if let Some(left) = self.remaining.as_mut() {
            *left = left.saturating_sub(chunk.len() as u64);
            if *left == 0 {
                self.complete();
            }
        }
    }

    /// The whole answer went to the client.
    fn complete(&mut self) {
        self.probe.finish(self.healthy);
        self.record.finish(&self.outcome);
    }
}

fn stream_error(why: &str) -> Bytes {
    let e = ApiError {
        code: Some("upstream_failed".into()),
        ..ApiError::new(
            ApiErrorKind::BadGateway,
            format!("the replica serving this stream failed: {why}"),
        )
    };
    Bytes::from(format!("data: {}\n\ndata: [DONE]\n\n", e.body()))
}

/// Starts the client's response: the pod's status and headers, then its body as it comes.
fn commit(
    gw: Arc<Gateway>,
    mut job: Job,
    pod: Pod,
    resp: reqwest::Response,
    first: Bytes,
    inflight: InflightGuard,
    probe: Probe,
) -> Response {
    job.record.pod = pod.name.clone();
    let status = resp.status();
    let sse = resp
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("text/event-stream"));
    let head = response_head(&gw, status, resp.headers(), &pod);
    let ok = status.is_success();
    if ok {
        job.lease.serving(resp.headers());
    }
    let outcome = if ok { "ok" } else { status.as_str() }.to_string();
    let remaining = resp.content_length();
    let mut state = Streaming {
        outcome,
        healthy: status_ok(status),
        remaining,
        resp,
        first: Some(first),
        sse,
        idle: gw.settings.upstream_idle_timeout,
        done: false,
        origin: Origin {
            tenant: job.auth.tenant.id.clone(),
            path: job.path,
            body: job.body,
            pod,
            gw: gw.clone(),
        },
        record: job.record,
        _inflight: inflight,
        lease: job.lease,
        probe,
    };
    if state.remaining == Some(0) {
        state.complete();
    }
    // Each poll runs inside the request's span: a span ends when it is last exited (tracing-opentelemetry),
    // so the request's span ends with the stream, not at its first byte.
    let body = futures::stream::unfold(state, move |s| {
        let span = s.record.span.clone();
        next_chunk(s).instrument(span)
    });
    head.body(Body::from_stream(body))
        .unwrap_or_else(|_| StatusCode::BAD_GATEWAY.into_response())
}

/// The next chunk of a committed answer for the client, and the state after it.
async fn next_chunk(mut s: Streaming) -> Option<(Result<Bytes, std::io::Error>, Streaming)> {
    if s.done {
        return None;
    }
    if let Some(first) = s.first.take()
        && !first.is_empty()
    {
        s.passed(&first);
        return Some((Ok(first), s));
    }
    match tokio::time::timeout(s.idle, s.resp.chunk()).await {
        Ok(Ok(Some(chunk))) => {
            s.passed(&chunk);
            Some((Ok(chunk), s))
        }
        Ok(Ok(None)) => {
            s.complete();
            None
        }
        failed => {
            let why = match failed {
                Ok(Err(e)) => {
                    s.origin.check_pod(&s.record.namespace, &s.record.deployment);
                    error_chain(&e)
                }
                _ => format!("no data for {:?}", s.idle),
            };
            s.done = true;
            s.probe.finish(false);
            s.record.finish("stream_error");
            if s.sse {
                Some((Ok(stream_error(&why)), s))
            } else {
                Some((Err(std::io::Error::other(why)), s))
            }
        }
    }
}
