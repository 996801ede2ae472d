//! The operator on the local control plane, installed with its Helm chart and run as pods through the
//! process kubelet, reconciling real ModelDeployments: owned objects, the digest verdict of the real
//! `modelfleet-runtime fetch` init container, a digest mismatch on a spec update, status hygiene, and
//! garbage collection on delete. Run by `make e2e` against `e2e/cluster up`.
//!
//! Serving scenarios (chat through pod IPs, load-driven scaling, a bad digest under traffic) are in
//! `serving.rs`.

mod common;
use common::*;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Pod, Secret, Service};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::api::{Api, ListParams};
use modelfleet_crds::ModelDeployment;
use std::path::{Path, PathBuf};
use std::time::Duration;

#[tokio::test]
#[ignore = "needs the local cluster: make e2e"]
async fn the_standby_operator_takes_over_within_15_seconds() {
    ensure_operator().await;
    let client = client().await;
    let leases: Api<Lease> = Api::namespaced(client.clone(), OPERATOR_NS);
    let pods: Api<Pod> = Api::namespaced(client, OPERATOR_NS);
    let holder = |l: Lease| l.spec.and_then(|s| s.holder_identity).unwrap_or_default();
    // The holder must be a live pod (after an upgrade the lease may still name a replaced one).
    let leader = wait_until("a live leader", Duration::from_secs(30), || async {
        let h = holder(leases.get("modelfleet-operator").await.ok()?);
        let pod = pods.get_opt(&h).await.ok()??;
        pod.metadata.deletion_timestamp.is_none().then_some(h)
    })
    .await;
    let started = std::time::Instant::now();
    kubectl_ok(
        &["delete", "pod", "-n", OPERATOR_NS, &leader, "--wait=false"],
        None,
    );
    let successor = wait_until(
        "another replica to take the lease",
        Duration::from_secs(30),
        || async {
            let h = holder(leases.get("modelfleet-operator").await.ok()?);
            (!h.is_empty() && h != leader).then_some(h)
        },
    )
    .await;
    let took = started.elapsed();
    assert!(took < Duration::from_secs(15), "failover took {took:?}");
    eprintln!("failover from {leader} to {successor} in {took:?}");
    // The Deployment replaces the deleted replica, so two run again (one standing by).
    wait_until("two operator replicas again", Duration::from_secs(60), || async {
        let list = pods
            .list(&ListParams::default().labels("app.kubernetes.io/name=modelfleet-operator"))
            .await
            .ok()?;
        let running = list
            .items
            .iter()
            .filter(|p| p.metadata.deletion_timestamp.is_none())
            .count();
        (running == 2).then_some(())
    })
    .await;
}

/// A small artifact directory and its digest (computed by the real `modelfleet-runtime digest`).
fn artifact(name: &str) -> (PathBuf, String) {
    let dir = cluster_dir().join("artifacts").join(name);
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("config.json"), format!("{{\"name\": \"{name}\"}}")).unwrap();
    std::fs::write(dir.join("weights.bin"), vec![42u8; 4096]).unwrap();
    let target = std::env::var("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or(repo_root().join("target"));
    let out = std::process::Command::new(target.join("debug/modelfleet-runtime"))
        .arg("digest")
        .arg(&dir)
        .output()
        .expect("modelfleet-runtime built");
    assert!(out.status.success());
    (dir, String::from_utf8(out.stdout).unwrap().trim().to_string())
}

fn model_deployment(name: &str, dir: &Path, digest: &str, replicas: i32) -> String {
    format!(
        "apiVersion: modelfleet.io/v1alpha1\nkind: ModelDeployment\nmetadata:\n  name: {name}\nspec:\n  model:\n    \
         uri: file://{}\n    digest: \"{digest}\"\n  replicas: {replicas}\n",
        dir.display()
    )
}

fn condition(md: &ModelDeployment, type_: &str) -> Option<(String, String)> {
    let c = md.status.as_ref()?.conditions.iter().find(|c| c.type_ == type_)?;
    Some((c.status.clone(), c.reason.clone()))
}

#[tokio::test]
#[ignore = "needs the local cluster: make e2e"]
async fn operator_reconciles_owned_objects_digest_verdicts_and_deletion() {
    ensure_operator().await;
    let ns = TestNamespace::new("op");
    let client = client().await;
    let mds: Api<ModelDeployment> = Api::namespaced(client.clone(), &ns.name);
    let (dir, digest) = artifact(&ns.name);
    kubectl_ok(
        &["apply", "-n", &ns.name, "-f", "-"],
        Some(&model_deployment("tiny", &dir, &digest, 2)),
    );

    // The operator applies the runtime Deployment, Service, PDB and admin Secret, owned by the CR.
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), &ns.name);
    let deployment = wait_until("the runtime Deployment", Duration::from_secs(60), || async {
        deployments.get("tiny").await.ok()
    })
    .await;
    assert_eq!(deployment.spec.as_ref().unwrap().replicas, Some(2));
    let owner = &deployment.metadata.owner_references.as_ref().unwrap()[0];
    assert_eq!(
        (owner.kind.as_str(), owner.name.as_str()),
        ("ModelDeployment", "tiny")
    );
    // One pass applies the objects one after another: wait for each rather than racing the pass.
    let services: Api<Service> = Api::namespaced(client.clone(), &ns.name);
    wait_until("the Service", Duration::from_secs(30), || async {
        services.get_opt("tiny").await.ok().flatten()
    })
    .await;
    let pdbs: Api<PodDisruptionBudget> = Api::namespaced(client.clone(), &ns.name);
    wait_until("the PodDisruptionBudget", Duration::from_secs(30), || async {
        pdbs.get_opt("tiny").await.ok().flatten()
    })
    .await;
    let secrets: Api<Secret> = Api::namespaced(client.clone(), &ns.name);
    let secret = wait_until("the admin-token Secret", Duration::from_secs(30), || async {
        secrets.get_opt("tiny-admin-token").await.ok().flatten()
    })
    .await;
    let token = secret.data.unwrap()["token"].0.clone();
    assert_eq!(token.len(), 64);

    // The real `fetch` init container verifies the bytes; the operator reads its verdict.
    let md = wait_until("DigestVerified=True", Duration::from_secs(60), || async {
        let md = mds.get("tiny").await.ok()?;
        (condition(&md, "DigestVerified")? == ("True".into(), "Verified".into())).then_some(md)
    })
    .await;
    let status = md.status.clone().unwrap();
    assert_eq!(status.observed_generation, md.metadata.generation);
    assert_eq!(status.desired_replicas, Some(2));
    assert_eq!(
        status.selector.as_deref(),
        Some("app.kubernetes.io/instance=tiny,app.kubernetes.io/name=modelfleet-runtime")
    );
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns.name);
    let listed = pods
        .list(&ListParams::default().labels("app.kubernetes.io/instance=tiny"))
        .await
        .unwrap();
    assert!(!listed.items.is_empty());

    // The admin token is stable across passes (applying never rotates it); the runtime containers,
    // which crash-loop on this artifact (bytes, not a model), keep triggering passes meanwhile.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let again = Api::<Secret>::namespaced(client.clone(), &ns.name)
        .get("tiny-admin-token")
        .await
        .unwrap();
    assert_eq!(again.data.unwrap()["token"].0, token);

    // A spec update to bytes that do not match: DigestVerified=False/DigestMismatch, and Stalled.
    let wrong = format!("sha256:{}", "0".repeat(64));
    kubectl_ok(
        &["apply", "-n", &ns.name, "-f", "-"],
        Some(&model_deployment("tiny", &dir, &wrong, 2)),
    );
    let md = wait_until(
        "DigestVerified=False/DigestMismatch",
        Duration::from_secs(90),
        || async {
            let md = mds.get("tiny").await.ok()?;
            (condition(&md, "DigestVerified")? == ("False".into(), "DigestMismatch".into())).then_some(md)
        },
    )
    .await;
    let verified = md
        .status
        .as_ref()
        .unwrap()
        .conditions
        .iter()
        .find(|c| c.type_ == "DigestVerified")
        .unwrap();
    assert!(
        verified.message.contains(&wrong) && verified.message.contains(&digest),
        "{}",
        verified.message
    );
    assert_eq!(
        condition(&md, "Stalled"),
        Some(("True".into(), "DigestMismatch".into()))
    );
    let rolling = deployments.get("tiny").await.unwrap();
    let max_unavailable = rolling
        .spec
        .unwrap()
        .strategy
        .unwrap()
        .rolling_update
        .unwrap()
        .max_unavailable;
    assert_eq!(
        max_unavailable,
        Some(k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::Int(0))
    );

    // Deleting the ModelDeployment removes everything it owns (garbage collector), and nothing hangs.
    kubectl_ok(
        &[
            "delete",
            "-n",
            &ns.name,
            "md/tiny",
            "--wait=true",
            "--timeout=30s",
        ],
        None,
    );
    wait_until(
        "owned objects to be collected",
        Duration::from_secs(90),
        || async {
            let d = deployments.get_opt("tiny").await.ok()?;
            let s = Api::<Secret>::namespaced(client.clone(), &ns.name)
                .get_opt("tiny-admin-token")
                .await
                .ok()?;
            let p = pods
                .list(&ListParams::default().labels("app.kubernetes.io/instance=tiny"))
                .await
                .ok()?;
            (d.is_none() && s.is_none() && p.items.is_empty()).then_some(())
        },
    )
    .await;
}

#[tokio::test]
#[ignore = "needs the local cluster: make e2e"]
async fn a_same_named_object_it_did_not_create_is_left_alone_with_name_conflict() {
    ensure_operator().await;
    let ns = TestNamespace::new("conflict");
    let client = client().await;
    let mds: Api<ModelDeployment> = Api::namespaced(client.clone(), &ns.name);
    // Someone else's Secret under the name the admin token would take.
    kubectl_ok(
        &[
            "create",
            "secret",
            "generic",
            "tiny-admin-token",
            "-n",
            &ns.name,
            "--from-literal=token=theirs",
        ],
        None,
    );
    let (dir, digest) = artifact(&ns.name);
    kubectl_ok(
        &["apply", "-n", &ns.name, "-f", "-"],
        Some(&model_deployment("tiny", &dir, &digest, 1)),
    );
    let md = wait_until("Stalled=True/NameConflict", Duration::from_secs(60), || async {
        let md = mds.get("tiny").await.ok()?;
        (condition(&md, "Stalled")? == ("True".into(), "NameConflict".into())).then_some(md)
    })
    .await;
    let stalled = md
        .status
        .unwrap()
        .conditions
        .into_iter()
        .find(|c| c.type_ == "Stalled")
        .unwrap();
    assert!(
        stalled.message.contains("Secret \"tiny-admin-token\""),
        "{}",
        stalled.message
    );
    // Nothing changed: their Secret as it was (no owner, no new fields), and nothing else applied.
    let secret = Api::<Secret>::namespaced(client.clone(), &ns.name)
        .get("tiny-admin-token")
        .await
        .unwrap();
    assert_eq!(secret.data.unwrap()["token"].0, b"theirs");
    assert!(secret.metadata.owner_references.is_none());
    assert!(
        secret
            .metadata
            .managed_fields
            .unwrap()
            .iter()
            .all(|m| m.manager.as_deref() != Some("modelfleet-operator"))
    );
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), &ns.name);
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(deployments.get_opt("tiny").await.unwrap().is_none());
    // Their object gone, the next look (within 30 s) goes ahead.
    kubectl_ok(&["delete", "secret", "tiny-admin-token", "-n", &ns.name], None);
    wait_until(
        "the runtime Deployment after the conflict",
        Duration::from_secs(60),
        || async { deployments.get_opt("tiny").await.ok().flatten() },
    )
    .await;
    kubectl_ok(
        &[
            "delete",
            "-n",
            &ns.name,
            "md/tiny",
            "--wait=true",
            "--timeout=30s",
        ],
        None,
    );
}

/// `kubectl auth can-i VERB RESOURCE -n NS --as SUBJECT` → allowed?
fn can_i(verb: &str, resource: &str, ns: &str, subject: &str) -> bool {
    let out = kubectl(
        &["auth", "can-i", verb, resource, "-n", ns, "--as", subject],
        None,
    );
    String::from_utf8_lossy(&out.stdout).trim() == "yes"
}

#[tokio::test]
#[ignore = "needs the local cluster: make e2e"]
async fn the_operator_cannot_patch_secrets_and_namespaced_rbac_stays_in_its_namespaces() {
    ensure_operator().await;
    let ns = TestNamespace::new("rbac-op");
    let other = TestNamespace::new("rbac-other");
    // The installed chart (every namespace): Secrets are read and created, never patched or deleted.
    let sa = format!("system:serviceaccount:{OPERATOR_NS}:modelfleet");
    assert!(can_i("get", "secrets", &ns.name, &sa) && can_i("create", "secrets", &ns.name, &sa));
    for verb in ["patch", "update", "delete", "list"] {
        assert!(!can_i(verb, "secrets", &ns.name, &sa), "{verb} secrets");
    }
    assert!(can_i("patch", "deployments.apps", &ns.name, &sa));

    // The chart with watchNamespaces: a Role in each listed namespace, nothing cluster-wide.
    let chart = repo_root().join("charts/modelfleet");
    // `helm template` renders offline: tell it the API server's version (the chart requires >= 1.33).
    let version = client().await.apiserver_version().await.unwrap().git_version;
    let out = std::process::Command::new("helm")
        .args([
            "template",
            "scoped",
            chart.to_str().unwrap(),
            "--namespace",
            &other.name,
            "--kube-version",
            &version,
        ])
        .args(["--set", &format!("watchNamespaces={{{}}}", ns.name)])
        .args(["--set", &format!("image.registry={}", registry())])
        .args(["--show-only", "templates/rbac.yaml"])
        .output()
        .expect("helm on PATH");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let rendered = String::from_utf8(out.stdout).unwrap();
    assert!(!rendered.contains("kind: ClusterRole"), "{rendered}");
    kubectl_ok(&["apply", "-f", "-"], Some(&rendered));
    let scoped = format!("system:serviceaccount:{}:scoped-modelfleet", other.name);
    assert!(can_i("patch", "deployments.apps", &ns.name, &scoped));
    assert!(can_i("create", "secrets", &ns.name, &scoped));
    assert!(!can_i("patch", "secrets", &ns.name, &scoped));
    assert!(
        !can_i("get", "secrets", "default", &scoped),
        "no rights outside the listed namespaces"
    );
    assert!(!can_i("list", "pods", "default", &scoped));
    assert!(can_i(
        "update",
        "leases.coordination.k8s.io",
        &other.name,
        &scoped
    ));
}
