//! Traces end to end, read back from a real Jaeger (a pod of the suite, common::tracing) that the
//! chart's `tracing.otlpEndpoint` points the operator, the gateway and every runtime pod at: a caller
//! sends a streamed chat completion with its own `traceparent` (and exports its own span, the trace's
//! root) to the pod the gateway chose, just after that pod's runtime container was SIGKILLed. One
//! trace comes back: the caller → the gateway's SERVER span (tenant, model, outcome) → `limits` and
//! two `attempt`s — the first on the killed pod, failed, the second on the other pod, naming why the
//! first was given up — → the runtime's SERVER span under the second attempt, with `queue`, `prefill`
//! and `decode`, GenAI usage attributes, and ends that wait for the stream's end. The gateway's log
//! line of the request carries the trace id, and the operator's reconcile spans arrive with what they
//! decided. Run by `make e2e`; nothing is mocked.

mod common;
use common::fleet::*;
use common::tracing::*;
use common::*;
use k8s_openapi::api::core::v1::Pod;
use kube::api::Api;
use serde_json::json;
use std::hash::{BuildHasher, RandomState};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// `n` random bytes as lowercase hex.
fn random_hex(bytes: usize) -> String {
    (0..bytes.div_ceil(8))
        .map(|i| format!("{:016x}", RandomState::new().hash_one(i)))
        .collect::<String>()[..bytes * 2]
        .to_string()
}

fn unix_ns() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_nanos() as u64
}

/// The caller's own span, exported as any OTLP client would: the root of the trace.
async fn export_caller_span(trace_id: &str, span_id: &str, start_ns: u64, end_ns: u64) {
    let body = json!({"resourceSpans": [{
        "resource": {"attributes": [{"key": "service.name", "value": {"stringValue": "e2e-caller"}}]},
        "scopeSpans": [{"scope": {"name": "e2e"}, "spans": [{
            "traceId": trace_id, "spanId": span_id, "name": "caller", "kind": 3,
            "startTimeUnixNano": start_ns.to_string(), "endTimeUnixNano": end_ns.to_string(),
        }]}],
    }]});
    let r = http()
        .post(format!("{}/v1/traces", otlp_endpoint()))
        .json(&body)
        .send()
        .await
        .expect("Jaeger's OTLP receiver");
    assert!(r.status().is_success(), "OTLP export: {}", r.status());
}

/// A streamed chat completion through the gateway with `traceparent`; the pod that served and the
/// number of content chunks, once the stream ended.
async fn traced_stream(served: &str, prompt: &str, traceparent: &str) -> (String, usize) {
    let r = gateway(Duration::from_secs(60))
        .post(format!("{}/v1/chat/completions", gateway_url()))
        .header("traceparent", traceparent)
        .json(
            &json!({"model": served, "messages": [{"role": "user", "content": prompt}],
            "max_tokens": 6, "temperature": 0, "stream": true}),
        )
        .send()
        .await
        .expect("the gateway answers");
    assert_eq!(r.status(), 200);
    let pod = served_by(&r);
    let text = r.text().await.expect("the whole stream");
    assert!(text.trim_end().ends_with("data: [DONE]"), "{text}");
    (pod, text.matches("\"content\"").count())
}

/// The runtime pods of the deployment, by name.
async fn pod_named(pods: &Api<Pod>, name: &str) -> Pod {
    pods.get(name).await.unwrap()
}

/// A ModelDeployment of the tiny model on 2 replicas in `ns`, both Ready; its served name.
async fn two_replicas(ns: &str, pods: &Api<Pod>) -> String {
    let (dir, digest) = tiny_model(ns);
    let served = format!("traced-{ns}");
    let md = format!(
        "apiVersion: modelfleet.io/v1alpha1\nkind: ModelDeployment\nmetadata:\n  name: traced\nspec:\n  model:\n    \
         uri: file://{}\n    digest: \"{digest}\"\n    servedName: {served}\n  replicas: 2\n  runtime:\n    threads: 1\n  \
         autoscaling:\n    mode: Disabled\n",
        dir.display()
    );
    kubectl_ok(&["apply", "-n", ns, "-f", "-"], Some(&md));
    wait_until("2 Ready pods", Duration::from_secs(180), || async {
        (ready_pods(pods, "traced").await.len() == 2).then_some(())
    })
    .await;
    served
}

/// A prompt and the pod the gateway sends it to, once the gateway has answered from both pods (so
/// both are in its view).
async fn prompt_and_its_pod(served: &str, tag: &str) -> (String, String) {
    let http = gateway(Duration::from_secs(60));
    wait_until(
        "the gateway to answer from both pods",
        Duration::from_secs(120),
        || async {
            let mut seen: Vec<(String, String)> = Vec::new();
            for i in 0..24 {
                let prompt = format!("trace this request {tag} {i}");
                let (status, pod, _) = chat(&http, None, served, &prompt, 2).await.ok()?;
                if status == 200 && !seen.iter().any(|(_, p)| *p == pod) {
                    seen.push((prompt, pod));
                }
                if seen.len() == 2 {
                    return seen.into_iter().next();
                }
            }
            None
        },
    )
    .await
}

/// The gateway's spans: its SERVER span under the caller's, with who and what, a `limits` span and two
/// attempts — on the killed pod `first`, failed; on `second`, naming why. (gateway, attempt 0, attempt 1)
fn gateway_spans<'t>(t: &'t Trace, caller: &str, served: &str, first: &str, second: &str) -> [&'t Span; 3] {
    let gw = t.children_of(caller);
    let [gw] = gw.as_slice() else {
        panic!("one gateway span under the caller: {gw:?}")
    };
    assert_eq!(
        (gw.service.as_str(), gw.operation.as_str(), gw.kind().as_deref()),
        ("modelfleet-gateway", "POST /v1/chat/completions", Some("server"))
    );
    assert_eq!(gw.tag("gen_ai.request.model").as_deref(), Some(served));
    assert_eq!(gw.tag("modelfleet.outcome").as_deref(), Some("ok"));
    assert_eq!(gw.tag("modelfleet.pod").as_deref(), Some(second));
    assert!(gw.tag("modelfleet.tenant").is_some(), "{:?}", gw.tags);
    let children = t.children_of(&gw.span_id);
    assert_eq!(children.iter().filter(|s| s.operation == "limits").count(), 1);
    let mut attempts: Vec<_> = children
        .into_iter()
        .filter(|s| s.operation == "attempt")
        .collect();
    attempts.sort_by_key(|s| s.tag("modelfleet.attempt"));
    let [a0, a1] = attempts.as_slice() else {
        panic!("two attempts: {attempts:?}")
    };
    assert_eq!(a0.tag("modelfleet.pod").as_deref(), Some(first));
    assert!(
        a0.is_error(),
        "the attempt on the killed pod failed: {:?}",
        a0.tags
    );
    assert_eq!(a1.tag("modelfleet.pod").as_deref(), Some(second));
    assert!(!a1.is_error(), "{:?}", a1.tags);
    let why = a1.tag("modelfleet.retry.reason").unwrap_or_default();
    assert!(
        why == "not_reached" || why == "reset",
        "the retry names why: {why:?}"
    );
    assert_eq!(a1.tag("http.response.status_code").as_deref(), Some("200"));
    assert!(
        t.children_of(&a0.span_id).is_empty(),
        "nothing ran on the killed pod"
    );
    [gw, a0, a1]
}

/// The runtime's SERVER span under `attempt` (on pod `pod`), with the GenAI attributes and the
/// engine's phases in order. (runtime, queue, prefill, decode)
fn runtime_spans<'t>(t: &'t Trace, attempt: &Span, pod: &str, chunks: usize) -> [&'t Span; 4] {
    let rt = t.children_of(&attempt.span_id);
    let [rt] = rt.as_slice() else {
        panic!("one runtime span under the second attempt: {rt:?}")
    };
    assert_eq!(
        (rt.service.as_str(), rt.operation.as_str()),
        ("modelfleet-runtime", "POST /v1/chat/completions")
    );
    assert_eq!(
        rt.resource.get("k8s.pod.name").and_then(|v| v.as_str()),
        Some(pod)
    );
    assert_eq!(rt.tag("gen_ai.operation.name").as_deref(), Some("chat"));
    let out: usize = rt
        .tag("gen_ai.usage.output_tokens")
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    assert!(
        out >= chunks && out > 0,
        "output tokens {out} (≥ {chunks} content chunks)"
    );
    assert!(rt.tag("gen_ai.latency.time_to_first_token").is_some());
    let phases = t.children_of(&rt.span_id);
    let phase = |name: &str| {
        *phases
            .iter()
            .find(|s| s.operation == name)
            .unwrap_or_else(|| panic!("a {name} span under the runtime's: {phases:?}"))
    };
    let (queue, prefill, decode) = (phase("queue"), phase("prefill"), phase("decode"));
    assert!(queue.end_us() <= prefill.start_us + 1 && prefill.end_us() <= decode.start_us + 1);
    assert!(prefill.tag("modelfleet.prefill_steps").is_some_and(|s| s != "0"));
    for name in ["validate", "tokenize"] {
        phase(name);
    }
    [rt, queue, prefill, decode]
}

/// The operator's reconciles are spans too, with what they decided (here: 2 replicas).
async fn reconciles_are_traced() {
    let reconciles = wait_until(
        "the operator's reconcile spans",
        Duration::from_secs(60),
        || async {
            let traces = find_traces("modelfleet-operator", Some("reconciling object")).await;
            let decided: Vec<Span> = traces
                .into_iter()
                .flat_map(|t| t.spans)
                .filter(|s| s.tag("modelfleet.replicas.desired").as_deref() == Some("2"))
                .collect();
            (!decided.is_empty()).then_some(decided)
        },
    )
    .await;
    assert!(
        reconciles.iter().any(|s| s
            .tag("modelfleet.conditions")
            .is_some_and(|c| c.contains("Ready="))),
        "{:?}",
        reconciles[0].tags
    );
}

#[tokio::test]
#[ignore = "needs the local cluster: make e2e"]
async fn one_trace_from_the_caller_through_the_gateway_retry_and_the_pod() {
    ensure_jaeger().await;
    ensure_operator().await;
    let ns = TestNamespace::new("traces");
    let pods: Api<Pod> = Api::namespaced(client().await, &ns.name);
    let served = two_replicas(&ns.name, &pods).await;
    // Until a traced request is seen going to the killed pod first (the gateway may not try it at all
    // when its view already dropped the pod): up to 3 tries, each with both pods Ready and known.
    let mut tried = None;
    for round in 0..3 {
        let (prompt, first) = prompt_and_its_pod(&served, &format!("{} {round}", ns.name)).await;
        let trace_id = random_hex(16);
        let caller = random_hex(8);
        let start = unix_ns();
        sigkill_container(&pod_named(&pods, &first).await, "runtime");
        let (second, chunks) = traced_stream(&served, &prompt, &format!("00-{trace_id}-{caller}-01")).await;
        export_caller_span(&trace_id, &caller, start, unix_ns()).await;
        assert_ne!(second, first, "the request was answered by the other pod");
        let t = wait_trace(
            &trace_id,
            "the caller's, the gateway's and the runtime's spans",
            |t| !t.spans_named("decode").is_empty() && !t.spans_named("caller").is_empty(),
        )
        .await;
        if t.spans_named("attempt").len() > 1 {
            tried = Some((t, trace_id, caller, first, second, chunks));
            break;
        }
        eprintln!("round {round}: the gateway did not try {first} (out of its view already); again");
        wait_until("2 Ready pods again", Duration::from_secs(180), || async {
            (ready_pods(&pods, "traced").await.len() == 2).then_some(())
        })
        .await;
    }
    let (t, trace_id, caller, first, second, chunks) =
        tried.expect("a traced request tried the killed pod first");
    let root = t.root().expect("a root span");
    assert_eq!(
        (root.operation.as_str(), root.service.as_str()),
        ("caller", "e2e-caller")
    );
    let [gw, a0, a1] = gateway_spans(&t, &caller, &served, &first, &second);
    let [rt, queue, prefill, decode] = runtime_spans(&t, a1, &second, chunks);
    eprintln!(
        "ends (µs since the epoch): gateway {}, attempt 1 {}, runtime {}, decode {}",
        gw.end_us(),
        a1.end_us(),
        rt.end_us(),
        decode.end_us()
    );
    // A stream's spans end with the stream: after its last token.
    assert!(
        rt.end_us() >= decode.end_us(),
        "the runtime span ends after decode"
    );
    assert!(
        gw.end_us() >= decode.end_us(),
        "the gateway span ends after decode"
    );
    eprintln!(
        "trace {trace_id}: {} spans; gateway {} µs, attempt on {first} failed ({}), runtime on {second} {} µs \
         (queue {} µs, prefill {} µs, decode {} µs)",
        t.spans.len(),
        gw.duration_us,
        a0.tag("modelfleet.outcome").unwrap_or_default(),
        rt.duration_us,
        queue.duration_us,
        prefill.duration_us,
        decode.duration_us
    );

    // The gateway's log line of the request carries the trace id.
    wait_until(
        "the gateway's log line with the trace id",
        Duration::from_secs(30),
        || async {
            let selector = "app.kubernetes.io/name=modelfleet-gateway";
            let logs = kubectl(&["logs", "-n", OPERATOR_NS, "-l", selector, "--tail=-1"], None);
            String::from_utf8_lossy(&logs.stdout)
                .contains(&trace_id)
                .then_some(())
        },
    )
    .await;
    reconciles_are_traced().await;
}
