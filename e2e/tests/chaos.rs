//! Chaos on the control plane: while a ModelDeployment scales 1 → 3, the operator leader is killed
//! (force-deleted) and the kube-apiserver is restarted. The fleet must converge (Ready, 3 ready
//! replicas) with exactly one Deployment and one ReplicaSet, and its status must not flap: every status
//! write is counted from the API server's audit log (`e2e/cluster` records each write of
//! `modeldeployments/status` with the object it left, so no write is missed across watch gaps), and each
//! condition may change its status at most once per real change — the scale-up starting, and ending.
//! The figures are printed. Bounded: about 2 minutes, 6 at most. Run by `make e2e`; nothing is mocked.

mod common;
use common::fleet::tiny_model;
use common::*;
use k8s_openapi::api::apps::v1::{Deployment, ReplicaSet};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams};
use modelfleet_crds::ModelDeployment;
use serde_json::Value;
use std::collections::BTreeMap;
use std::io::{Read, Seek, SeekFrom};
use std::time::{Duration, Instant};

fn fleet(dir: &std::path::Path, digest: &str) -> String {
    format!(
        "apiVersion: modelfleet.io/v1alpha1\nkind: ModelDeployment\nmetadata:\n  name: fleet\nspec:\n  model:\n    \
         uri: file://{dir}\n    digest: \"{digest}\"\n    servedName: tiny-chat\n  replicas: 1\n  runtime:\n    \
         threads: 1\n    maxNumSeqs: 1\n",
        dir = dir.display()
    )
}

fn audit_log() -> std::path::PathBuf {
    cluster_dir().join("logs/audit.log")
}

fn audit_offset() -> u64 {
    std::fs::metadata(audit_log()).map(|m| m.len()).unwrap_or(0)
}

/// The statuses the successful status writes of `ns/name` left, in the audit log between two offsets.
fn status_writes(ns: &str, name: &str, from: u64, to: u64) -> Vec<Value> {
    let mut file = std::fs::File::open(audit_log()).expect("the API server's audit log");
    file.seek(SeekFrom::Start(from)).unwrap();
    let mut text = String::new();
    file.take(to - from).read_to_string(&mut text).unwrap();
    text.lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|e| {
            let o = &e["objectRef"];
            o["resource"] == "modeldeployments"
                && o["subresource"] == "status"
                && o["namespace"] == ns
                && o["name"] == name
                && e["responseStatus"]["code"]
                    .as_i64()
                    .is_some_and(|c| (200..300).contains(&c))
        })
        .map(|e| e["responseObject"]["status"].clone())
        .collect()
}

/// The audit log's offset just past the status write of `ns/name` that left it converged (Ready at 3
/// ready replicas), once that write is in the log. The API server appends a write's audit line after
/// answering it, so a client can see the converged status before the log holds the write.
fn converging_write_end(ns: &str, name: &str, from: u64) -> Option<u64> {
    let mut file = std::fs::File::open(audit_log()).ok()?;
    file.seek(SeekFrom::Start(from)).ok()?;
    let mut text = String::new();
    file.read_to_string(&mut text).ok()?;
    let mut end = from;
    for line in text.split_inclusive('\n') {
        end += line.len() as u64;
        let Ok(e) = serde_json::from_str::<Value>(line) else {
            continue;
        };
        let o = &e["objectRef"];
        let status = &e["responseObject"]["status"];
        let ready = conditions(status).get("Ready").is_some_and(|(s, _)| s == "True");
        if o["resource"] == "modeldeployments"
            && o["subresource"] == "status"
            && o["namespace"] == ns
            && o["name"] == name
            && status["readyReplicas"] == 3
            && ready
        {
            return Some(end);
        }
    }
    None
}

/// Condition type → (status, reason).
fn conditions(status: &Value) -> BTreeMap<String, (String, String)> {
    status["conditions"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|c| {
            (
                c["type"].as_str().unwrap_or_default().to_string(),
                (
                    c["status"].as_str().unwrap_or_default().to_string(),
                    c["reason"].as_str().unwrap_or_default().to_string(),
                ),
            )
        })
        .collect()
}

/// Per write along `states` (starting from `before`): the status fields it changed, old → new.
fn changed_fields(before: &Value, states: &[Value]) -> Vec<BTreeMap<String, (Value, Value)>> {
    let mut prev = before;
    let mut out = Vec::new();
    for s in states {
        let keys = |v: &Value| v.as_object().map(|o| o.keys().cloned().collect::<Vec<_>>());
        let mut names = keys(prev).unwrap_or_default();
        names.extend(keys(s).unwrap_or_default());
        names.sort();
        names.dedup();
        let diff = names
            .into_iter()
            .filter(|k| prev[k] != s[k])
            .map(|k| (k.clone(), (prev[&k].clone(), s[&k].clone())))
            .collect();
        out.push(diff);
        prev = s;
    }
    out
}

/// Per condition type: how often its status changed along `states` (starting from `before`).
fn transitions(before: &Value, states: &[Value]) -> BTreeMap<String, usize> {
    let mut counts: BTreeMap<String, usize> = conditions(before).keys().map(|k| (k.clone(), 0)).collect();
    let mut last = conditions(before);
    for s in states {
        let now = conditions(s);
        for (t, (status, _)) in &now {
            if last.get(t).map(|(st, _)| st) != Some(status) {
                *counts.entry(t.clone()).or_default() += 1;
            }
        }
        last = now;
    }
    counts
}

fn md_ready(md: &ModelDeployment) -> bool {
    md.status.as_ref().is_some_and(|s| {
        s.ready_replicas == 3
            && s.desired_replicas == Some(3)
            && s.conditions
                .iter()
                .any(|c| c.type_ == "Ready" && c.status == "True")
    })
}

#[tokio::test]
#[ignore = "needs the local cluster: make e2e"]
async fn a_scaling_fleet_converges_through_a_leader_kill_and_an_apiserver_restart() {
    let started = Instant::now();
    ensure_operator().await;
    let ns = TestNamespace::new("chaos");
    let (dir, digest) = tiny_model(&ns.name);
    kubectl_ok(&["apply", "-n", &ns.name, "-f", "-"], Some(&fleet(&dir, &digest)));
    let client = client().await;
    let mds: Api<ModelDeployment> = Api::namespaced(client.clone(), &ns.name);
    let before = ready_at_one(&mds).await;

    // Scale 1 → 3; once the operator acted on it, kill its leader and restart the API server.
    let from = audit_offset();
    let t0 = Instant::now();
    kubectl_ok(
        &[
            "patch",
            "-n",
            &ns.name,
            "md/fleet",
            "--type=merge",
            "-p",
            r#"{"spec":{"replicas":3}}"#,
        ],
        None,
    );
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), &ns.name);
    wait_until(
        "the Deployment at 3 replicas",
        Duration::from_secs(30),
        || async {
            let d = deployments.get("fleet").await.ok()?;
            (d.spec?.replicas? == 3).then_some(())
        },
    )
    .await;
    kill_the_leader_and_restart_the_apiserver(&client, t0).await;

    // Converges: Ready, 3 ready replicas, one Deployment, one ReplicaSet.
    let client = common::client().await;
    let mds: Api<ModelDeployment> = Api::namespaced(client.clone(), &ns.name);
    wait_until(
        "the fleet Ready at 3 replicas",
        Duration::from_secs(240),
        || async { md_ready(&mds.get("fleet").await.ok()?).then_some(()) },
    )
    .await;
    let took = t0.elapsed();
    let seen = audit_offset();
    let written = wait_until(
        "the converging status write in the audit log",
        Duration::from_secs(30),
        || async { converging_write_end(&ns.name, "fleet", from) },
    )
    .await;
    let converged = seen.max(written);
    tokio::time::sleep(Duration::from_secs(20)).await;
    let after = audit_offset();

    check_still_converged(&client, &ns.name, &mds).await;

    // Status writes and condition transitions, from the audit log.
    let during = status_writes(&ns.name, "fleet", from, converged);
    let steady = status_writes(&ns.name, "fleet", converged, after);
    eprintln!("[chaos] converged {took:?} after the scale request");
    check_status_writes(&before, &during, &steady);
    kubectl_ok(
        &[
            "delete",
            "-n",
            &ns.name,
            "md/fleet",
            "--wait=true",
            "--timeout=60s",
        ],
        None,
    );
    eprintln!("[chaos] scenario took {:?}", started.elapsed());
}

/// One Deployment, one ReplicaSet (the pod template never changed), 3 ready pods, `fleet` Ready.
async fn check_still_converged(client: &kube::Client, ns: &str, mds: &Api<ModelDeployment>) {
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), ns);
    let sets: Api<ReplicaSet> = Api::namespaced(client.clone(), ns);
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    assert_eq!(
        deployments
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .len(),
        1
    );
    let rs = sets.list(&ListParams::default()).await.unwrap().items;
    assert_eq!(rs.len(), 1, "one ReplicaSet: the pod template never changed");
    let ready = pods.list(&ListParams::default()).await.unwrap().items;
    assert_eq!(ready.iter().filter(|p| is_ready(p)).count(), 3);
    let md = mds.get("fleet").await.unwrap();
    assert!(md_ready(&md), "still converged 20 s later");
}

/// Waits for `fleet` Ready at 1 replica; its status then.
async fn ready_at_one(mds: &Api<ModelDeployment>) -> Value {
    let ready_one = wait_until(
        "the fleet Ready at 1 replica",
        Duration::from_secs(120),
        || async {
            let md = mds.get("fleet").await.ok()?;
            let ready = md
                .status
                .as_ref()?
                .conditions
                .iter()
                .any(|c| c.type_ == "Ready" && c.status == "True");
            ready.then_some(md)
        },
    )
    .await;
    serde_json::to_value(ready_one.status.unwrap()).unwrap()
}

/// Kills the operator's leader and restarts the API server (`t0`: the scale request).
async fn kill_the_leader_and_restart_the_apiserver(client: &kube::Client, t0: Instant) {
    let leases: Api<Lease> = Api::namespaced(client.clone(), OPERATOR_NS);
    let leader = leases
        .get("modelfleet-operator")
        .await
        .unwrap()
        .spec
        .and_then(|s| s.holder_identity)
        .unwrap();
    kubectl_ok(
        &[
            "delete",
            "pod",
            "-n",
            OPERATOR_NS,
            &leader,
            "--grace-period=0",
            "--force",
        ],
        None,
    );
    let down = Instant::now();
    cluster_script(&["restart", "kube-apiserver"]);
    eprintln!(
        "[chaos] killed the leader {leader} at {:?} into the scale-up; the API server was back {:?} later",
        down - t0,
        down.elapsed()
    );
}

/// The status writes from `before` while converging (`during`) and in the 20 s after (`steady`): a
/// real change each while converging, none after.
fn check_status_writes(before: &Value, during: &[Value], steady: &[Value]) {
    let changes = transitions(before, during);
    let later = transitions(during.last().unwrap_or(before), steady);
    eprintln!(
        "[chaos] status writes: {} while converging, {} in the 20 s after; condition status changes \
         while converging: {changes:?}; after: {later:?}",
        during.len(),
        steady.len()
    );
    // A real change each: the scale-up starting (Ready/Reconciling/Degraded flip) and ending (back).
    for (t, n) in &changes {
        let real = if ["Ready", "Reconciling", "Degraded"].contains(&t.as_str()) {
            2
        } else {
            0
        };
        assert!(
            *n <= real,
            "{t} changed {n} times for {real} real changes: {during:#?}"
        );
    }
    assert!(
        later.values().all(|n| *n == 0),
        "conditions changed after convergence: {steady:#?}"
    );
    assert!(
        steady.is_empty(),
        "status written {} times with no condition changing; what each write changed: {:#?}",
        steady.len(),
        changed_fields(during.last().unwrap_or(before), steady)
    );
}
