//! LoraAdapter passes against a mocked API server that checks every request in order, with pods whose
//! admin API is the fake runtime (real HTTP on loopback): the first pass adds the finalizer and starts
//! loads without waiting for them; the end of the loads wakes a second pass that reports them; deletion
//! unloads, then releases the finalizer — at once when the base is gone or the adapter never owned its
//! served name.

use super::super::fake::{FakeAdmin, TOKEN};
use super::super::ops::{Ops, Runner};
use super::super::{Context, admin};
use super::reconcile;
use crate::telemetry::Metrics;
use crate::testing::{Handle, expect, next_request, not_found, ok};
use futures::StreamExt;
use futures::channel::mpsc::UnboundedReceiver;
use http::{Method, Request, Response};
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use kube::Client;
use kube::client::Body;
use kube::runtime::events::{Recorder, Reporter};
use kube::runtime::reflector::ObjectRef;
use modelfleet_crds::LoraAdapter;
use serde_json::{Value, json};
use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

const NS: &str = "serving";
const DIGEST: &str = "sha256:2222222222222222222222222222222222222222222222222222222222222222";
const ADAPTERS: &str = "/apis/modelfleet.io/v1alpha1/namespaces/serving/loraadapters";
const MDS: &str = "/apis/modelfleet.io/v1alpha1/namespaces/serving/modeldeployments";
const PODS: &str = "/api/v1/namespaces/serving/pods";
const SECRETS: &str = "/api/v1/namespaces/serving/secrets";

fn adapter(name: &str, served: &str, created: &str, finalizer: bool, deleting: bool) -> Value {
    let mut v = json!({
        "apiVersion": "modelfleet.io/v1alpha1", "kind": "LoraAdapter",
        "metadata": {"name": name, "namespace": NS, "uid": format!("uid-{name}"), "generation": 1,
                     "resourceVersion": "11", "creationTimestamp": created},
        "spec": {"modelDeploymentRef": {"name": "smollm2"}, "servedName": served,
                 "uri": format!("file:///adapters/{name}"), "digest": DIGEST, "tenants": ["team-a"]}
    });
    if finalizer {
        v["metadata"]["finalizers"] = json!(["modelfleet.io/lora-unload"]);
    }
    if deleting {
        v["metadata"]["deletionTimestamp"] = json!("2027-01-15T09:00:00Z");
    }
    v
}

fn parse(v: &Value) -> LoraAdapter {
    serde_json::from_value(v.clone()).unwrap()
}

fn list(kind: &str, api_version: &str, items: Vec<Value>) -> Value {
    json!({"apiVersion": api_version, "kind": kind, "metadata": {}, "items": items})
}

fn md() -> Value {
    json!({"apiVersion": "modelfleet.io/v1alpha1", "kind": "ModelDeployment",
           "metadata": {"name": "smollm2", "namespace": NS, "uid": "uid-md", "generation": 1},
           "spec": {"model": {"uri": "file:///models/m", "digest": DIGEST}}})
}

/// A runtime pod on 127.0.0.1 (where the fake admin API listens).
fn pod(name: &str, ready: bool) -> Value {
    json!({"apiVersion": "v1", "kind": "Pod",
           "metadata": {"name": name, "namespace": NS, "uid": format!("uid-{name}")},
           "status": {"podIP": "127.0.0.1",
                      "conditions": [{"type": "Ready", "status": if ready { "True" } else { "False" }}],
                      "containerStatuses": [{"name": "runtime", "ready": ready, "restartCount": 0, "image": "i",
                                             "imageID": "", "state": {"running": {}}}]}})
}

fn secret() -> Value {
    let s = Secret {
        metadata: kube::api::ObjectMeta {
            name: Some("smollm2-admin-token".into()),
            ..Default::default()
        },
        data: Some(BTreeMap::from([(
            "token".to_string(),
            ByteString(TOKEN.as_bytes().to_vec()),
        )])),
        ..Default::default()
    };
    serde_json::to_value(s).unwrap()
}

fn context(client: Client, port: u16) -> (Arc<Context>, UnboundedReceiver<ObjectRef<LoraAdapter>>) {
    let (wake, woken) = futures::channel::mpsc::unbounded();
    let metrics = Arc::new(Metrics::default());
    let reporter = Reporter {
        controller: "modelfleet-operator".into(),
        instance: Some("test".into()),
    };
    let ctx = Arc::new(Context {
        client: client.clone(),
        runner: Runner {
            http: admin::http_client(),
            ops: Arc::new(Mutex::new(Ops::default())),
            wake,
            timeouts: admin::Timeouts::default(),
            metrics: metrics.clone(),
            admin_port: port as i32,
        },
        metrics,
        recorder: Recorder::new(client, reporter),
        failures: Mutex::new(HashMap::new()),
    });
    (ctx, woken)
}

fn port(fake: &FakeAdmin) -> u16 {
    fake.base.rsplit(':').next().unwrap().parse().unwrap()
}

/// The observation requests of a pass: the base, the siblings, and (when the base exists) pods and token.
async fn observe(handle: &mut Handle, siblings: Vec<Value>, pods: Option<Vec<Value>>) {
    let base_exists = pods.is_some();
    expect(handle, Method::GET, &format!("{MDS}/smollm2"), move |_| {
        if base_exists { ok(&md()) } else { not_found() }
    })
    .await;
    let adapters = list("LoraAdapterList", "modelfleet.io/v1alpha1", siblings);
    expect(handle, Method::GET, &format!("{ADAPTERS}?"), move |_| {
        ok(&adapters)
    })
    .await;
    if let Some(pods) = pods {
        let pods = list("PodList", "v1", pods);
        expect(
            handle,
            Method::GET,
            &format!("{PODS}?&labelSelector=app.kubernetes.io%2Finstance%3Dsmollm2"),
            move |_| ok(&pods),
        )
        .await;
        expect(
            handle,
            Method::GET,
            &format!("{SECRETS}/smollm2-admin-token"),
            |_| ok(&secret()),
        )
        .await;
    }
}

/// Answers Events (recording their reasons) until the next non-Event request, which it returns.
async fn events_then_next(
    handle: &mut Handle,
    reasons: &mut Vec<String>,
) -> Option<(
    Method,
    String,
    Value,
    tower_test::mock::SendResponse<Response<Body>>,
)> {
    loop {
        let (m, uri, body, send) = next_request(handle).await?;
        if uri.contains("/events") {
            reasons.push(body["reason"].as_str().unwrap_or_default().to_string());
            send.send_response(ok(&body));
            continue;
        }
        return Some((m, uri, body, send));
    }
}

/// The API server's answer to a status apply on `object`: the object with that status.
fn with_status(object: &Value) -> impl FnOnce(&Value) -> Response<Body> + use<> {
    let mut object = object.clone();
    move |body| {
        object["status"] = body["status"].clone();
        ok(&object)
    }
}

fn conditions(status: &Value) -> HashMap<String, (String, String)> {
    status["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            let s = |k: &str| c[k].as_str().unwrap().to_string();
            (s("type"), (s("status"), s("reason")))
        })
        .collect()
}

#[tokio::test]
async fn loads_run_off_the_pass_and_wake_the_next_one() {
    let fake = FakeAdmin::start().await;
    let (service, mut handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    let (ctx, mut woken) = context(Client::new(service, NS), port(&fake));
    let created = "2027-01-15T08:00:00Z";
    let fresh = adapter("sql", "sql", created, false, false);
    let with_finalizer = adapter("sql", "sql", created, true, false);
    let pods = vec![pod("p-1", true), pod("p-2", true), pod("p-3", false)];

    let server = {
        let (with_finalizer, pods) = (with_finalizer.clone(), pods.clone());
        tokio::spawn(async move {
            // Pass 1: the finalizer first, then observation, then status — no waiting for pods.
            let patch = expect(&mut handle, Method::PATCH, &format!("{ADAPTERS}/sql?"), |_| {
                ok(&with_finalizer)
            })
            .await;
            assert_eq!(
                patch,
                json!({"metadata": {"finalizers": ["modelfleet.io/lora-unload"], "resourceVersion": "11"}})
            );
            observe(&mut handle, vec![with_finalizer.clone()], Some(pods.clone())).await;
            let first = expect(
                &mut handle,
                Method::PATCH,
                &format!("{ADAPTERS}/sql/status?&force=true&fieldManager=modelfleet-operator"),
                with_status(&with_finalizer),
            )
            .await;
            let mut reasons = Vec::new();
            // Pass 2 (woken by the finished loads).
            let (m, uri, _, send) = events_then_next(&mut handle, &mut reasons).await.unwrap();
            assert_eq!(
                (m, uri.starts_with(&format!("{MDS}/smollm2"))),
                (Method::GET, true),
                "{uri}"
            );
            send.send_response(ok(&md()));
            let adapters = list(
                "LoraAdapterList",
                "modelfleet.io/v1alpha1",
                vec![with_finalizer.clone()],
            );
            expect(&mut handle, Method::GET, &format!("{ADAPTERS}?"), move |_| {
                ok(&adapters)
            })
            .await;
            let podlist = list("PodList", "v1", pods);
            expect(&mut handle, Method::GET, PODS, move |_| ok(&podlist)).await;
            expect(
                &mut handle,
                Method::GET,
                &format!("{SECRETS}/smollm2-admin-token"),
                |_| ok(&secret()),
            )
            .await;
            let second = expect(
                &mut handle,
                Method::PATCH,
                &format!("{ADAPTERS}/sql/status?"),
                with_status(&with_finalizer),
            )
            .await;
            if let Some((_, uri, body, _)) = events_then_next(&mut handle, &mut reasons).await {
                panic!("unexpected request {uri}: {body}");
            }
            (first, second, reasons)
        })
    };

    reconcile(Arc::new(parse(&fresh)), ctx.clone()).await.unwrap();
    let woke = tokio::time::timeout(Duration::from_secs(10), woken.next())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(woke, ObjectRef::new("sql").within(NS));
    // Both ready pods answered; wait for the second wake so both outcomes are recorded.
    tokio::time::timeout(Duration::from_secs(10), woken.next())
        .await
        .unwrap()
        .unwrap();
    let mut next = parse(&with_finalizer);
    next.status = None;
    reconcile(Arc::new(next), ctx.clone()).await.unwrap();
    drop(ctx);
    let (first, second, reasons) = server.await.unwrap();

    let s1 = &first["status"];
    assert_eq!(conditions(s1)["Ready"], ("False".into(), "Loading".into()));
    assert_eq!(
        (s1["loadedReplicas"].clone(), s1["desiredReplicas"].clone()),
        (json!(0), json!(2))
    );
    let states: Vec<&str> = s1["pods"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["state"].as_str().unwrap())
        .collect();
    assert_eq!(states, ["Loading", "Loading"], "only ready pods get loads");
    let s2 = &second["status"];
    assert_eq!(conditions(s2)["Ready"], ("True".into(), "Loaded".into()));
    assert_eq!(conditions(s2)["Verified"], ("True".into(), "Verified".into()));
    assert_eq!(
        (s2["loadedReplicas"].clone(), s2["desiredReplicas"].clone()),
        (json!(2), json!(2))
    );
    assert_eq!(reasons, ["Verified", "Loaded"]);
    // The runtime saw exactly one load per ready pod, with the served name, digest and tenants.
    let calls = fake.calls();
    let post = ("POST".to_string(), "/v1/adapters".to_string());
    assert_eq!(calls, [post.clone(), post]);
    let body = fake.state.lock().unwrap().requests[0].2.clone();
    assert_eq!(
        body,
        json!({"name": "sql", "uri": "file:///adapters/sql", "digest": DIGEST, "tenants": ["team-a"]})
    );
}

#[tokio::test]
async fn deletion_unloads_from_running_pods_then_releases_the_finalizer() {
    let fake = FakeAdmin::start().await;
    fake.state
        .lock()
        .unwrap()
        .loaded
        .insert("sql".into(), json!({"name": "sql", "digest": DIGEST}));
    let (service, mut handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    let (ctx, mut woken) = context(Client::new(service, NS), port(&fake));
    let deleting = adapter("sql", "sql", "2027-01-15T08:00:00Z", true, true);
    let server = {
        let deleting = deleting.clone();
        tokio::spawn(async move {
            // Pass 1: unload started (a pod that is not ready but runs gets it too), status says so.
            let pods = vec![pod("p-1", false)];
            observe(&mut handle, vec![deleting.clone()], Some(pods.clone())).await;
            let status = expect(
                &mut handle,
                Method::PATCH,
                &format!("{ADAPTERS}/sql/status?"),
                with_status(&deleting),
            )
            .await;
            let mut reasons = Vec::new();
            // Pass 2: done; the finalizer goes.
            let (m, uri, _, send) = events_then_next(&mut handle, &mut reasons).await.unwrap();
            assert_eq!(
                (m, uri.starts_with(&format!("{MDS}/smollm2"))),
                (Method::GET, true),
                "{uri}"
            );
            send.send_response(ok(&md()));
            let adapters = list(
                "LoraAdapterList",
                "modelfleet.io/v1alpha1",
                vec![deleting.clone()],
            );
            expect(&mut handle, Method::GET, &format!("{ADAPTERS}?"), move |_| {
                ok(&adapters)
            })
            .await;
            let podlist = list("PodList", "v1", pods);
            expect(&mut handle, Method::GET, PODS, move |_| ok(&podlist)).await;
            expect(
                &mut handle,
                Method::GET,
                &format!("{SECRETS}/smollm2-admin-token"),
                |_| ok(&secret()),
            )
            .await;
            let (m, uri, patch, send) = events_then_next(&mut handle, &mut reasons).await.unwrap();
            assert_eq!(m, Method::PATCH);
            assert!(uri.starts_with(&format!("{ADAPTERS}/sql?")), "{uri}");
            send.send_response(ok(&deleting));
            assert!(events_then_next(&mut handle, &mut reasons).await.is_none());
            (status, patch, reasons)
        })
    };
    reconcile(Arc::new(parse(&deleting)), ctx.clone()).await.unwrap();
    tokio::time::timeout(Duration::from_secs(10), woken.next())
        .await
        .unwrap()
        .unwrap();
    reconcile(Arc::new(parse(&deleting)), ctx.clone()).await.unwrap();
    drop(ctx);
    let (status, patch, reasons) = server.await.unwrap();
    assert_eq!(
        conditions(&status["status"])["Ready"],
        ("False".into(), "Deleting".into())
    );
    assert_eq!(status["status"]["pods"][0]["state"], "Unloading");
    assert_eq!(
        patch,
        json!({"metadata": {"finalizers": [], "resourceVersion": "11"}})
    );
    assert_eq!(reasons, ["Unloaded"]);
    assert_eq!(
        fake.calls(),
        [("DELETE".to_string(), "/v1/adapters/sql".to_string())]
    );
    assert!(fake.state.lock().unwrap().loaded.is_empty());
}

/// Runs one deletion pass that must release the finalizer at once, with no admin call.
async fn released_at_once(siblings: Vec<Value>, pods: Option<Vec<Value>>, deleting: Value) {
    let fake = FakeAdmin::start().await;
    let (service, mut handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    let (ctx, _woken) = context(Client::new(service, NS), port(&fake));
    let server = {
        let deleting = deleting.clone();
        tokio::spawn(async move {
            observe(&mut handle, siblings, pods).await;
            let patch = expect(
                &mut handle,
                Method::PATCH,
                &format!("{ADAPTERS}/sql-new?"),
                move |_| ok(&deleting),
            )
            .await;
            let mut reasons = Vec::new();
            assert!(events_then_next(&mut handle, &mut reasons).await.is_none());
            patch
        })
    };
    reconcile(Arc::new(parse(&deleting)), ctx.clone()).await.unwrap();
    drop(ctx);
    let patch = server.await.unwrap();
    assert_eq!(patch["metadata"]["finalizers"], json!([]));
    assert!(fake.calls().is_empty(), "no admin call: {:?}", fake.calls());
}

#[tokio::test]
async fn the_finalizer_never_waits_for_a_missing_base() {
    let deleting = adapter("sql-new", "sql", "2027-01-15T08:00:00Z", true, true);
    released_at_once(vec![deleting.clone()], None, deleting).await;
}

#[tokio::test]
async fn the_finalizer_never_waits_for_missing_pods() {
    let deleting = adapter("sql-new", "sql", "2027-01-15T08:00:00Z", true, true);
    released_at_once(vec![deleting.clone()], Some(vec![]), deleting).await;
}

#[tokio::test]
async fn an_adapter_that_lost_its_name_never_unloads_the_owners() {
    let owner = adapter("sql-old", "sql", "2027-01-15T07:00:00Z", true, false);
    let deleting = adapter("sql-new", "sql", "2027-01-15T08:00:00Z", true, true);
    released_at_once(
        vec![owner, deleting.clone()],
        Some(vec![pod("p-1", true)]),
        deleting,
    )
    .await;
}

#[tokio::test]
async fn a_name_conflict_is_reported_and_nothing_is_loaded() {
    let fake = FakeAdmin::start().await;
    let (service, mut handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    let (ctx, _woken) = context(Client::new(service, NS), port(&fake));
    let owner = adapter("sql-old", "sql", "2027-01-15T07:00:00Z", true, false);
    let later = adapter("sql-new", "sql", "2027-01-15T08:00:00Z", true, false);
    let server = {
        let (owner, later) = (owner.clone(), later.clone());
        tokio::spawn(async move {
            observe(
                &mut handle,
                vec![later.clone(), owner],
                Some(vec![pod("p-1", true)]),
            )
            .await;
            let status = expect(
                &mut handle,
                Method::PATCH,
                &format!("{ADAPTERS}/sql-new/status?"),
                with_status(&later),
            )
            .await;
            let mut reasons = Vec::new();
            assert!(events_then_next(&mut handle, &mut reasons).await.is_none());
            (status, reasons)
        })
    };
    let action = reconcile(Arc::new(parse(&later)), ctx.clone()).await.unwrap();
    drop(ctx);
    let (status, reasons) = server.await.unwrap();
    assert_eq!(
        conditions(&status["status"])["Ready"],
        ("False".into(), "NameConflict".into())
    );
    assert_eq!(
        conditions(&status["status"])["Stalled"],
        ("True".into(), "NameConflict".into())
    );
    assert_eq!(reasons, ["NameConflict"]);
    assert!(fake.calls().is_empty());
    assert_eq!(
        action,
        kube::runtime::controller::Action::requeue(super::CONFLICT_RECHECK)
    );
}
