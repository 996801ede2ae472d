//! The trace backend of the tracing scenarios: a real Jaeger (v2, in-memory store) run as a pod from the
//! image e2e/scripts/push-images.sh pushes (e2e/images/jaeger: OTLP on 4317/4318, its query API on
//! 16686), behind a Service at a fixed ClusterIP so the chart's exporters can be pointed at it before
//! it runs. It is shared: deployed once into its own namespace, never deleted, by whichever scenario
//! asks first (it keeps up to 20,000 traces, the oldest dropped first), so scenarios tell their traces
//! apart by trace ID or service name. Its query API (`/api/traces`, `/api/services`) is read back
//! into [`Trace`]s. The ClusterIP answers from pods and inside the cluster's network (`e2e/cluster
//! exec`, as `make e2e` runs the scenarios) only: on the host, 10.96.0.81 takes the machine's default
//! route.

use super::*;
use serde_json::Value;
use std::collections::BTreeMap;

/// The Jaeger Service's ClusterIP (the Service range is 10.96.0.0/16; the gateway's is 10.96.0.80).
pub const JAEGER_CLUSTER_IP: &str = "10.96.0.81";

/// The namespace Jaeger runs in.
pub const TRACING_NS: &str = "modelfleet-tracing";

/// The OTLP/HTTP base URL (exporters append `/v1/traces`), from pods and from the cluster's network.
pub fn otlp_endpoint() -> String {
    format!("http://{JAEGER_CLUSTER_IP}:4318")
}

/// The OTLP/gRPC endpoint.
pub fn otlp_grpc_endpoint() -> String {
    format!("http://{JAEGER_CLUSTER_IP}:4317")
}

/// Jaeger's query API (and UI).
pub fn query_url() -> String {
    format!("http://{JAEGER_CLUSTER_IP}:16686")
}

/// Applies Jaeger's namespace, Deployment and Service (server-side: idempotent, and several scenario
/// binaries may apply it at once). Does not wait: [`wait_jaeger`] does.
pub fn deploy_jaeger() {
    let version = std::env::var("MF_JAEGER_VERSION").unwrap_or_else(|_| "v1.75.0".into());
    let manifest = format!(
        r#"apiVersion: v1
kind: Namespace
metadata: {{name: {TRACING_NS}}}
---
apiVersion: apps/v1
kind: Deployment
metadata: {{name: jaeger, namespace: {TRACING_NS}}}
spec:
  replicas: 1
  strategy: {{type: Recreate}}
  selector: {{matchLabels: {{app: jaeger}}}}
  template:
    metadata: {{labels: {{app: jaeger}}}}
    spec:
      securityContext:
        runAsUser: 65532
        runAsGroup: 65532
        runAsNonRoot: true
        seccompProfile: {{type: RuntimeDefault}}
      containers:
      - name: jaeger
        image: {registry}/modelfleet-e2e/jaeger:{version}
        ports:
        - {{name: otlp-grpc, containerPort: 4317}}
        - {{name: otlp-http, containerPort: 4318}}
        - {{name: health, containerPort: 13133}}
        - {{name: query, containerPort: 16686}}
        readinessProbe: {{httpGet: {{path: /status, port: 13133}}, periodSeconds: 1}}
        resources: {{requests: {{cpu: 50m, memory: 64Mi}}}}
        securityContext:
          allowPrivilegeEscalation: false
          readOnlyRootFilesystem: true
          capabilities: {{drop: [ALL]}}
---
apiVersion: v1
kind: Service
metadata: {{name: jaeger, namespace: {TRACING_NS}}}
spec:
  clusterIP: {JAEGER_CLUSTER_IP}
  selector: {{app: jaeger}}
  ports:
  - {{name: otlp-grpc, port: 4317, targetPort: 4317}}
  - {{name: otlp-http, port: 4318, targetPort: 4318}}
  - {{name: query, port: 16686, targetPort: 16686}}
"#,
        registry = registry(),
    );
    let args = [
        "apply",
        "--server-side",
        "--field-manager=modelfleet-e2e-tracing",
        "-f",
        "-",
    ];
    // Two processes creating the same object at once: the loser may see a conflict; applying again
    // finds it there.
    for _ in 0..4 {
        if kubectl(&args, Some(&manifest)).status.success() {
            return;
        }
        std::thread::sleep(Duration::from_millis(500));
    }
    kubectl_ok(&args, Some(&manifest));
}

/// Waits (up to 120 s) until Jaeger's query API answers at its ClusterIP: the Service sends only to a
/// Ready pod, which is Ready once every component (the OTLP receivers among them) has started.
pub async fn wait_jaeger() {
    wait_until(
        "Jaeger's query API to answer",
        Duration::from_secs(120),
        || async {
            let r = http()
                .get(format!("{}/api/services", query_url()))
                .send()
                .await
                .ok()?;
            r.status().is_success().then_some(())
        },
    )
    .await;
}

/// [`deploy_jaeger`], then [`wait_jaeger`].
pub async fn ensure_jaeger() {
    deploy_jaeger();
    wait_jaeger().await;
}

/// One trace as Jaeger's query API returns it.
#[derive(Clone, Debug)]
pub struct Trace {
    /// 32 lowercase hex digits.
    pub trace_id: String,
    pub spans: Vec<Span>,
}

/// One span: OTLP's span as Jaeger stores it (attributes are tags; the span kind is the tag
/// `span.kind`, the status `otel.status_code`/`otel.status_description` and `error: true`; events are
/// logs; the instrumentation scope `otel.scope.name`).
#[derive(Clone, Debug)]
pub struct Span {
    /// 32 lowercase hex digits (Jaeger drops leading zeros of a trace ID's high half: padded back).
    pub trace_id: String,
    /// 16 lowercase hex digits.
    pub span_id: String,
    /// The parent span (the `CHILD_OF` reference), if any: it may belong to a service that exported
    /// nothing, so be absent from the trace.
    pub parent_span_id: Option<String>,
    /// Span links (`FOLLOWS_FROM` references): (trace ID, span ID).
    pub links: Vec<(String, String)>,
    pub operation: String,
    /// The resource's `service.name`.
    pub service: String,
    /// The resource's other attributes (Jaeger's process tags).
    pub resource: BTreeMap<String, Value>,
    /// The span's attributes (and what Jaeger derives from its kind, status and scope).
    pub tags: BTreeMap<String, Value>,
    /// Events (Jaeger's logs), in order: the name (the `event` field; else `message`, else empty) and
    /// the other attributes.
    pub events: Vec<(String, BTreeMap<String, Value>)>,
    /// When each of `events` happened, in microseconds since the epoch.
    pub event_times_us: Vec<u64>,
    /// Microseconds since the epoch.
    pub start_us: u64,
    pub duration_us: u64,
}

impl Span {
    /// A tag's value as a string (strings as they are; numbers and booleans printed).
    pub fn tag(&self, key: &str) -> Option<String> {
        self.tags.get(key).map(|v| match v {
            Value::String(s) => s.clone(),
            other => other.to_string(),
        })
    }

    /// The span kind: `server`, `client`, `internal`, `producer`, `consumer` (Jaeger's `span.kind`
    /// tag; absent for an unspecified kind).
    pub fn kind(&self) -> Option<String> {
        self.tag("span.kind")
    }

    /// Whether the span's status is Error.
    pub fn is_error(&self) -> bool {
        self.tags.get("error") == Some(&Value::Bool(true))
            || self.tag("otel.status_code").as_deref() == Some("ERROR")
    }

    /// The events named `name`.
    pub fn events_named(&self, name: &str) -> Vec<&BTreeMap<String, Value>> {
        self.events
            .iter()
            .filter(|(n, _)| n == name)
            .map(|(_, a)| a)
            .collect()
    }

    pub fn end_us(&self) -> u64 {
        self.start_us + self.duration_us
    }
}

impl Trace {
    /// The spans whose operation is `op`, earliest first.
    pub fn spans_named(&self, op: &str) -> Vec<&Span> {
        let mut v: Vec<&Span> = self.spans.iter().filter(|s| s.operation == op).collect();
        v.sort_by_key(|s| s.start_us);
        v
    }

    /// The span `span_id`.
    pub fn span(&self, span_id: &str) -> Option<&Span> {
        self.spans.iter().find(|s| s.span_id == span_id)
    }

    /// The direct children of `span_id`, earliest first.
    pub fn children_of(&self, span_id: &str) -> Vec<&Span> {
        let mut v: Vec<&Span> = self
            .spans
            .iter()
            .filter(|s| s.parent_span_id.as_deref() == Some(span_id))
            .collect();
        v.sort_by_key(|s| s.start_us);
        v
    }

    /// The root: the span without a parent; failing that (the caller's span was not exported), the
    /// earliest span whose parent is not in the trace.
    pub fn root(&self) -> Option<&Span> {
        self.spans
            .iter()
            .find(|s| s.parent_span_id.is_none())
            .or_else(|| {
                self.spans
                    .iter()
                    .filter(|s| {
                        s.parent_span_id
                            .as_deref()
                            .is_some_and(|p| self.span(p).is_none())
                    })
                    .min_by_key(|s| s.start_us)
            })
    }

    /// The services that exported spans of this trace.
    pub fn services(&self) -> Vec<String> {
        let mut v: Vec<String> = self.spans.iter().map(|s| s.service.clone()).collect();
        v.sort();
        v.dedup();
        v
    }
}

/// A trace ID as W3C trace context and OTLP write it: 32 lowercase hex digits.
fn full_trace_id(id: &str) -> String {
    format!("{:0>32}", id.to_ascii_lowercase())
}

/// Jaeger's key-value list (`[{key, type, value}]`) as a map.
fn key_values(v: &Value) -> BTreeMap<String, Value> {
    v.as_array()
        .into_iter()
        .flatten()
        .filter_map(|kv| Some((kv["key"].as_str()?.to_string(), kv["value"].clone())))
        .collect()
}

/// One element of the query API's `data`, a trace (Jaeger v2, 1.75.0; tag types `string`, `bool`,
/// `int64` (a JSON number), `float64`, `binary` (base64)):
///
/// ```text
/// {"traceID": "0af7651916cd43dd8448eb211c80319c",
///  "spans": [{"traceID": "…", "spanID": "00f067aa0ba902b7", "operationName": "decode",
///             "references": [{"refType": "CHILD_OF", "traceID": "…", "spanID": "b7ad6b7169203331"},
///                            {"refType": "FOLLOWS_FROM", "traceID": "…", "spanID": "…"}],
///             "startTime": 1796638578034856, "duration": 3000,
///             "tags": [{"key": "span.kind", "type": "string", "value": "internal"},
///                      {"key": "otel.status_code", "type": "string", "value": "ERROR"}, …],
///             "logs": [{"timestamp": 1796638578035356,
///                       "fields": [{"key": "event", "type": "string", "value": "first_token"}, …]}],
///             "processID": "p1", "warnings": null}, …],
///  "processes": {"p1": {"serviceName": "smoke-svc",
///                       "tags": [{"key": "service.version", "type": "string", "value": "1.2.3"}]}},
///  "warnings": null}
/// ```
pub fn parse_trace(v: &Value) -> Trace {
    let processes: BTreeMap<String, (String, BTreeMap<String, Value>)> = v["processes"]
        .as_object()
        .into_iter()
        .flatten()
        .map(|(id, p)| {
            let service = p["serviceName"].as_str().unwrap_or_default().to_string();
            (id.clone(), (service, key_values(&p["tags"])))
        })
        .collect();
    let spans = v["spans"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|s| {
            let refs = s["references"].as_array().cloned().unwrap_or_default();
            let reference = |r: &Value| {
                (
                    full_trace_id(r["traceID"].as_str().unwrap_or_default()),
                    r["spanID"].as_str().unwrap_or_default().to_string(),
                )
            };
            let parent_span_id = refs
                .iter()
                .find(|r| r["refType"] == "CHILD_OF")
                .map(|r| reference(r).1);
            let links = refs
                .iter()
                .filter(|r| r["refType"] == "FOLLOWS_FROM")
                .map(reference)
                .collect();
            let (service, resource) = s["processID"]
                .as_str()
                .and_then(|p| processes.get(p))
                .cloned()
                .unwrap_or_default();
            let logs = s["logs"].as_array().cloned().unwrap_or_default();
            let event_times_us = logs
                .iter()
                .map(|l| l["timestamp"].as_u64().unwrap_or_default())
                .collect();
            let events = logs
                .iter()
                .map(|l| {
                    let mut fields = key_values(&l["fields"]);
                    let name = fields
                        .remove("event")
                        .or_else(|| fields.remove("message"))
                        .and_then(|n| n.as_str().map(str::to_string))
                        .unwrap_or_default();
                    (name, fields)
                })
                .collect();
            Span {
                trace_id: full_trace_id(s["traceID"].as_str().unwrap_or_default()),
                span_id: s["spanID"].as_str().unwrap_or_default().to_string(),
                parent_span_id,
                links,
                operation: s["operationName"].as_str().unwrap_or_default().to_string(),
                service,
                resource,
                tags: key_values(&s["tags"]),
                events,
                event_times_us,
                start_us: s["startTime"].as_u64().unwrap_or_default(),
                duration_us: s["duration"].as_u64().unwrap_or_default(),
            }
        })
        .collect();
    Trace {
        trace_id: full_trace_id(v["traceID"].as_str().unwrap_or_default()),
        spans,
    }
}

/// GETs `path` (with `query`) from the query API: its `data`, or `None` when Jaeger does not answer
/// 200 (404: no such trace) or cannot be reached.
async fn query(path: &str, query: &[(&str, String)]) -> Option<Value> {
    let r = http()
        .get(format!("{}{path}", query_url()))
        .query(query)
        .send()
        .await
        .ok()?;
    if !r.status().is_success() {
        return None;
    }
    let mut body: Value = r.json().await.expect("Jaeger's query API answers JSON");
    Some(body["data"].take())
}

/// The trace `trace_id_hex` (32 hex digits, as in a `traceparent`), or `None` while Jaeger has none of
/// its spans.
pub async fn get_trace(trace_id_hex: &str) -> Option<Trace> {
    let data = query(&format!("/api/traces/{}", trace_id_hex.to_ascii_lowercase()), &[]).await?;
    data.as_array()?.first().map(parse_trace)
}

/// Waits (up to 60 s) until the trace `trace_id_hex` satisfies `done` (spans of one trace arrive from
/// several exporters, each batching on its own), and returns it.
pub async fn wait_trace(trace_id_hex: &str, what: &str, done: impl Fn(&Trace) -> bool) -> Trace {
    wait_until(
        &format!("trace {trace_id_hex} in Jaeger: {what}"),
        Duration::from_secs(60),
        || async { get_trace(trace_id_hex).await.filter(|t| done(t)) },
    )
    .await
}

/// The traces of the last hour (at most 1,000) with a span of `service` (and, if given, `operation`).
pub async fn find_traces(service: &str, operation: Option<&str>) -> Vec<Trace> {
    find_traces_tagged(service, operation, &[]).await
}

/// [`find_traces`], of the spans that also carry every tag of `tags` (string-compared).
pub async fn find_traces_tagged(service: &str, operation: Option<&str>, tags: &[(&str, &str)]) -> Vec<Trace> {
    let now_us = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_micros() as u64;
    let mut q = vec![
        ("service", service.to_string()),
        ("start", (now_us - 3_600_000_000).to_string()),
        ("end", (now_us + 60_000_000).to_string()),
        ("limit", "1000".to_string()),
    ];
    if let Some(op) = operation {
        q.push(("operation", op.to_string()));
    }
    if !tags.is_empty() {
        let t: serde_json::Map<String, Value> = tags
            .iter()
            .map(|(k, v)| (k.to_string(), Value::String(v.to_string())))
            .collect();
        q.push(("tags", Value::Object(t).to_string()));
    }
    let Some(data) = query("/api/traces", &q).await else {
        return Vec::new();
    };
    data.as_array().into_iter().flatten().map(parse_trace).collect()
}
