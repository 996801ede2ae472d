//! Reconcile against a mocked API server that checks every request, in order: method, path, and the
//! parts of the body that matter (what is applied, what status is written). A request the scenario does not
//! expect fails the test; so does a missing one.

use super::{Context, reconcile};
use crate::config::OperatorConfig;
use crate::telemetry::Metrics;
use crate::testing::{Handle, echo, expect, not_found, ok};
use http::{Method, Request, Response};
use kube::Client;
use kube::client::Body;
use kube::runtime::events::{Recorder, Reporter};
use modelfleet_crds::ModelDeployment;
use serde_json::{Value, json};
use std::collections::HashMap;
use std::sync::Arc;

const NS: &str = "serving";
const DIGEST: &str = "sha256:1111111111111111111111111111111111111111111111111111111111111111";

fn md(extra: Value, status: Option<Value>) -> ModelDeployment {
    let mut v = json!({
        "apiVersion": "modelfleet.io/v1alpha1", "kind": "ModelDeployment",
        "metadata": {"name": "smollm2", "namespace": NS, "uid": "6f1e0c39-0000-4000-8000-000000000001",
                     "generation": 1, "resourceVersion": "7"},
        "spec": {"model": {"uri": "file:///models/smollm2.gguf", "digest": DIGEST}, "replicas": 2}
    });
    for (k, val) in extra.as_object().unwrap() {
        v["spec"][k] = val.clone();
    }
    if let Some(s) = status {
        v["status"] = s;
    }
    serde_json::from_value(v).unwrap()
}

fn context(client: Client) -> Arc<Context> {
    let reporter = Reporter {
        controller: "modelfleet-operator".into(),
        instance: Some("test".into()),
    };
    let metrics = Arc::new(Metrics::default());
    let http = crate::autoscaler::metrics::http_client();
    Arc::new(Context {
        capacity: crate::capacity::Capacity::new(http.clone(), metrics.clone()),
        rollouts: Default::default(),
        autoscaler: crate::autoscaler::Autoscaler::new(
            http.clone(),
            client.clone(),
            OperatorConfig::default().gateway,
            metrics.clone(),
        ),
        client: client.clone(),
        cfg: OperatorConfig::default(),
        http,
        metrics,
        recorder: Recorder::new(client, reporter),
        sweeper: super::sweep::Sweeper::new(crate::autoscaler::metrics::http_client()),
        peers: super::peers::Peers::empty(),
        started: Default::default(),
    })
}

/// The API server's answer to a status apply: the whole object with that status.
fn with_status(body: &Value) -> Response<Body> {
    ok(&serde_json::to_value(md(json!({}), Some(body["status"].clone()))).unwrap())
}

/// Answers every Event the reconciler publishes (best effort, order-insensitive) until it finishes.
async fn drain_events(handle: &mut Handle) -> Vec<String> {
    let mut reasons = Vec::new();
    while let Some((request, send)) = handle.next_request().await {
        let uri = request.uri().to_string();
        assert!(
            uri.contains("/events"),
            "unexpected request after the status write: {uri}"
        );
        let bytes = request.into_body().collect_bytes().await.unwrap();
        let body: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
        reasons.push(body["reason"].as_str().unwrap_or_default().to_string());
        send.send_response(ok(&body));
    }
    reasons
}

const APPS: &str = "/apis/apps/v1/namespaces/serving/deployments";
const PODS: &str = "/api/v1/namespaces/serving/pods";
const SECRETS: &str = "/api/v1/namespaces/serving/secrets";

const ADAPTERS: &str = "/apis/modelfleet.io/v1alpha1/namespaces/serving/loraadapters";

/// A LoraAdapter list holding one adapter of `smollm2` and one of another deployment.
fn adapter_list() -> Value {
    let adapter = |name: &str, md: &str| {
        json!({"apiVersion": "modelfleet.io/v1alpha1", "kind": "LoraAdapter",
               "metadata": {"name": name, "namespace": NS, "uid": format!("uid-{name}"), "generation": 1,
                            "creationTimestamp": "2027-01-15T08:00:00Z"},
               "spec": {"modelDeploymentRef": {"name": md}, "uri": format!("file:///adapters/{name}"),
                        "digest": DIGEST, "tenants": ["team-a"]}})
    };
    json!({"apiVersion": "modelfleet.io/v1alpha1", "kind": "LoraAdapterList", "metadata": {},
           "items": [adapter("sql", "smollm2"), adapter("other", "another-model")]})
}

const CONFIGMAPS: &str = "/api/v1/namespaces/serving/configmaps";
const SERVICES: &str = "/api/v1/namespaces/serving/services";
const PDBS: &str = "/apis/policy/v1/namespaces/serving/poddisruptionbudgets";

/// The GETs of the same-named objects a pass checks before applying anything; `secret` answers the
/// admin Secret's, the others are not found.
async fn observe_owned(handle: &mut Handle, secret: Response<Body>) {
    expect(
        handle,
        Method::GET,
        &format!("{SECRETS}/smollm2-admin-token"),
        |_| secret,
    )
    .await;
    expect(
        handle,
        Method::GET,
        &format!("{CONFIGMAPS}/smollm2-adapters"),
        |_| not_found(),
    )
    .await;
    expect(handle, Method::GET, &format!("{APPS}/smollm2"), |_| not_found()).await;
    expect(handle, Method::GET, &format!("{SERVICES}/smollm2"), |_| {
        not_found()
    })
    .await;
    expect(handle, Method::GET, &format!("{PDBS}/smollm2"), |_| not_found()).await;
}

/// The pods, tenants Secret and LoraAdapters a pass lists.
async fn observe_rest(handle: &mut Handle, tenants: Option<Response<Body>>) {
    expect(
        handle,
        Method::GET,
        &format!("{PODS}?&labelSelector=app.kubernetes.io%2Finstance%3Dsmollm2"),
        |_| ok(&json!({"kind": "PodList", "apiVersion": "v1", "metadata": {}, "items": []})),
    )
    .await;
    if let Some(answer) = tenants {
        expect(handle, Method::GET, &format!("{SECRETS}/keys"), |_| answer).await;
    }
    expect(handle, Method::GET, &format!("{ADAPTERS}?"), |_| {
        ok(&adapter_list())
    })
    .await;
}

/// The requests of a pass up to (not including) the status write; returns the applied Deployment.
async fn observe_and_apply(handle: &mut Handle, tenants: Option<Response<Body>>) -> Value {
    observe_owned(handle, not_found()).await;
    observe_rest(handle, tenants).await;
    // The admin Secret is created (never patched: the operator holds no right to patch Secrets).
    let secret = expect(handle, Method::POST, SECRETS, echo).await;
    assert_eq!(secret["kind"], "Secret");
    // The start-up list comes before the Deployment whose pods mount it: only this deployment's adapters.
    let configmap = expect(
        handle,
        Method::PATCH,
        "/api/v1/namespaces/serving/configmaps/smollm2-adapters?&force=true&fieldManager=modelfleet-operator",
        echo,
    )
    .await;
    let listed: Value = serde_json::from_str(configmap["data"]["adapters.json"].as_str().unwrap()).unwrap();
    assert_eq!(
        listed,
        json!({"adapters": [{"name": "sql", "uri": "file:///adapters/sql", "digest": DIGEST, "tenants": ["team-a"]}]})
    );
    assert_eq!(
        configmap["metadata"]["ownerReferences"][0]["kind"],
        "ModelDeployment"
    );
    let deployment = expect(
        handle,
        Method::PATCH,
        &format!("{APPS}/smollm2?&force=true&fieldManager=modelfleet-operator"),
        echo,
    )
    .await;
    let service = expect(
        handle,
        Method::PATCH,
        "/api/v1/namespaces/serving/services/smollm2?",
        echo,
    )
    .await;
    assert_eq!(service["spec"]["ports"][0]["port"], 8000);
    let pdb = expect(
        handle,
        Method::PATCH,
        "/apis/policy/v1/namespaces/serving/poddisruptionbudgets/smollm2?",
        echo,
    )
    .await;
    assert_eq!(pdb["spec"]["minAvailable"], 1);
    let applied = deployment.clone();
    expect(handle, Method::GET, &format!("{APPS}/smollm2"), move |_| {
        ok(&applied)
    })
    .await;
    deployment
}

#[tokio::test]
async fn first_pass_applies_owned_objects_and_writes_status() {
    let (service, mut handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    let ctx = context(Client::new(service, NS));
    let server = tokio::spawn(async move {
        let deployment = observe_and_apply(&mut handle, None).await;
        assert_eq!(deployment["spec"]["replicas"], 2);
        assert_eq!(
            deployment["metadata"]["ownerReferences"][0]["kind"],
            "ModelDeployment"
        );
        let status = expect(
            &mut handle,
            Method::PATCH,
            "/apis/modelfleet.io/v1alpha1/namespaces/serving/modeldeployments/smollm2/status?&force=true&fieldManager=modelfleet-operator",
            with_status,
        )
        .await;
        (status, drain_events(&mut handle).await)
    });
    reconcile(Arc::new(md(json!({}), None)), ctx.clone())
        .await
        .unwrap();
    drop(ctx);
    let (status, events) = server.await.unwrap();
    let s = &status["status"];
    assert_eq!(s["observedGeneration"], 1);
    assert_eq!(s["desiredReplicas"], 2);
    assert_eq!(
        s["selector"],
        "app.kubernetes.io/instance=smollm2,app.kubernetes.io/name=modelfleet-runtime"
    );
    let conditions: HashMap<String, (String, String)> = s["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            (
                c["type"].as_str().unwrap().into(),
                (
                    c["status"].as_str().unwrap().into(),
                    c["reason"].as_str().unwrap().into(),
                ),
            )
        })
        .collect();
    assert_eq!(conditions["Ready"], ("False".into(), "Progressing".into()));
    assert_eq!(conditions["Reconciling"], ("True".into(), "Progressing".into()));
    assert_eq!(conditions["DigestVerified"], ("Unknown".into(), "Pending".into()));
    assert_eq!(
        conditions["ScalingActive"],
        ("False".into(), "AutoscalingDisabled".into())
    );
    assert_eq!(events, ["Progressing"]);
}

#[tokio::test]
async fn an_unchanged_world_writes_nothing() {
    // First pass: capture the status it writes.
    let (service, mut handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    let ctx = context(Client::new(service, NS));
    let server = tokio::spawn(async move {
        observe_and_apply(&mut handle, None).await;
        let status = expect(
            &mut handle,
            Method::PATCH,
            "/apis/modelfleet.io/v1alpha1/",
            with_status,
        )
        .await;
        drain_events(&mut handle).await;
        status
    });
    reconcile(Arc::new(md(json!({}), None)), ctx.clone())
        .await
        .unwrap();
    drop(ctx);
    let written = server.await.unwrap();

    // Second pass over the same world, with that status: the same applies, no status write, no event.
    let (service, mut handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    let ctx = context(Client::new(service, NS));
    let server = tokio::spawn(async move {
        observe_and_apply(&mut handle, None).await;
        assert!(
            handle.next_request().await.is_none(),
            "a second pass over an unchanged world wrote something"
        );
    });
    reconcile(
        Arc::new(md(json!({}), Some(written["status"].clone()))),
        ctx.clone(),
    )
    .await
    .unwrap();
    drop(ctx);
    server.await.unwrap();
}

#[tokio::test]
async fn a_missing_tenants_secret_stalls_with_a_reason() {
    let (service, mut handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    let ctx = context(Client::new(service, NS));
    let server = tokio::spawn(async move {
        let deployment = observe_and_apply(&mut handle, Some(not_found())).await;
        let args = deployment["spec"]["template"]["spec"]["containers"][0]["args"].to_string();
        assert!(args.contains("/etc/modelfleet/tenants/tenants.yaml"), "{args}");
        let status = expect(
            &mut handle,
            Method::PATCH,
            "/apis/modelfleet.io/v1alpha1/",
            with_status,
        )
        .await;
        drain_events(&mut handle).await;
        status
    });
    let spec = json!({"tenants": {"secretRef": {"name": "keys"}}});
    reconcile(Arc::new(md(spec, None)), ctx.clone()).await.unwrap();
    drop(ctx);
    let status = server.await.unwrap();
    let stalled = status["status"]["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["type"] == "Stalled")
        .unwrap()
        .clone();
    assert_eq!(stalled["status"], "True");
    assert_eq!(stalled["reason"], "SecretNotFound");
    assert_eq!(stalled["message"], "tenants Secret \"keys\" does not exist");
}

#[tokio::test]
async fn a_foreign_object_of_the_same_name_stops_the_pass_with_name_conflict() {
    let (service, mut handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    let ctx = context(Client::new(service, NS));
    let server = tokio::spawn(async move {
        // A user's Secret under the admin token's name: no owner reference.
        let theirs = json!({"apiVersion": "v1", "kind": "Secret",
            "metadata": {"name": "smollm2-admin-token", "namespace": NS, "uid": "their-uid"},
            "data": {"token": "dGhlaXJz"}});
        observe_owned(&mut handle, ok(&theirs)).await;
        observe_rest(&mut handle, None).await;
        // Nothing is created or applied: the next request is the status write.
        let status = expect(
            &mut handle,
            Method::PATCH,
            "/apis/modelfleet.io/v1alpha1/namespaces/serving/modeldeployments/smollm2/status?",
            with_status,
        )
        .await;
        drain_events(&mut handle).await;
        status
    });
    let action = reconcile(Arc::new(md(json!({}), None)), ctx.clone())
        .await
        .unwrap();
    drop(ctx);
    assert_eq!(
        action,
        kube::runtime::controller::Action::requeue(super::CONFLICT_RETRY)
    );
    let status = server.await.unwrap();
    let stalled = status["status"]["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["type"] == "Stalled")
        .unwrap()
        .clone();
    assert_eq!(
        (stalled["status"].as_str(), stalled["reason"].as_str()),
        (Some("True"), Some("NameConflict"))
    );
    assert!(
        stalled["message"]
            .as_str()
            .unwrap()
            .starts_with("Secret \"smollm2-admin-token\" already exists"),
        "{stalled}"
    );
}
