//! Fitting a real cluster (docs/user-guide.md, "Placing a fleet on a node pool"; docs/autoscaling.md,
//! "External autoscalers"), on the real node:
//! - the node tainted and labelled as a dedicated pool: a ModelDeployment with the toleration and the
//!   nodeSelector runs there, its priority class, extra volume, pod labels and overlay in its pods'
//!   spec; one without the toleration says `Schedulable=False` with the scheduler's reason within
//!   30 s, and `True` once the taint is gone;
//! - the built-in autoscaler under load scales 1 → 2 into a required anti-affinity the one node can
//!   only hold once: the second pod is `Unschedulable`, `Schedulable=False` quotes the scheduler, and
//!   the autoscaler holds at 2 (`ScaleUpHeld`) while the load asks for 4;
//! - overlays and pod fields that would change what the operator owns are refused by the API server,
//!   naming the field;
//! - a HorizontalPodAutoscaler (autoscaling/v2, an External metric the operator serves) scales an
//!   `External`-mode ModelDeployment 1 → 2 under load and back through `/scale`; the operator never
//!   writes the spec.
//!
//! The taint is the only thing here another pod could notice: with effect `NoSchedule` it leaves
//! running pods alone but would keep new ones of a concurrent test off the node. The suite runs test
//! binaries one after another, so only this file's tests run beside it — and the pool scenario holds
//! [`NODE`] exclusively (the others share it), removes the taint on every path (`Pool`'s drop, also
//! on a panic), and `ensure_operator` removes a taint a killed run left behind. Run by `make e2e`.

mod common;
use common::fleet::{condition, tiny_model};
use common::load::Load;
use common::*;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams};
use modelfleet_crds::ModelDeployment;
use std::path::Path;
use std::time::{Duration, Instant};

/// The node: the pool scenario (which taints it) alone, the others together.
static NODE: tokio::sync::RwLock<()> = tokio::sync::RwLock::const_new(());

/// The label of the pool the node joins for the pool scenario.
const POOL_LABEL: &str = "modelfleet.io/e2e-pool";

/// The one node's name.
fn node_name() -> String {
    kubectl_ok(
        &["get", "nodes", "-o", "jsonpath={.items[0].metadata.name}"],
        None,
    )
    .trim()
    .to_string()
}

/// The node labelled `POOL_LABEL=placement` and tainted `PLACEMENT_TAINT=pool:NoSchedule` while this
/// lives; both removed when it drops (a panic included), the taint earlier by [`Pool::untaint`].
struct Pool {
    node: String,
}

impl Pool {
    fn new() -> Pool {
        let node = node_name();
        kubectl_ok(
            &[
                "label",
                "node",
                &node,
                &format!("{POOL_LABEL}=placement"),
                "--overwrite",
            ],
            None,
        );
        let taint = format!("{PLACEMENT_TAINT}=pool:NoSchedule");
        kubectl_ok(&["taint", "node", &node, &taint, "--overwrite"], None);
        Pool { node }
    }

    /// The taint removed, the label kept (a pod selecting the pool still finds the node).
    fn untaint(&self) {
        let _ = kubectl(
            &[
                "taint",
                "node",
                &self.node,
                &format!("{PLACEMENT_TAINT}:NoSchedule-"),
            ],
            None,
        );
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        self.untaint();
        let _ = kubectl(&["label", "node", &self.node, &format!("{POOL_LABEL}-")], None);
    }
}

/// A cluster-scoped object deleted when this drops.
struct ClusterObject(String);

impl Drop for ClusterObject {
    fn drop(&mut self) {
        let _ = kubectl(&["delete", &self.0, "--wait=false"], None);
    }
}

/// A ModelDeployment of the tiny model at `dir`: `runtime` and `rest` are YAML indented under
/// `spec.runtime` (4 spaces) and `spec` (2 spaces).
fn manifest(name: &str, ns: &str, (dir, digest): (&Path, &str), runtime: &str, rest: &str) -> String {
    format!(
        "apiVersion: modelfleet.io/v1alpha1\nkind: ModelDeployment\nmetadata:\n  name: {name}\nspec:\n  model:\n    \
         uri: file://{}\n    digest: \"{digest}\"\n    servedName: {name}-{ns}\n  runtime:\n    threads: 1\n\
         {runtime}{rest}",
        dir.display()
    )
}

fn apply(ns: &str, yaml: &str) {
    kubectl_ok(&["apply", "-n", ns, "-f", "-"], Some(yaml));
}

async fn wait_ready(mds: &Api<ModelDeployment>, name: &str) {
    wait_until(&format!("{name} Ready"), Duration::from_secs(240), || async {
        let md = mds.get(name).await.ok()?;
        (condition(&md, "Ready")?.0 == "True").then_some(())
    })
    .await;
}

/// `Schedulable`'s status and message.
async fn schedulable(mds: &Api<ModelDeployment>, name: &str) -> Option<(String, String)> {
    let md = mds.get(name).await.ok()?;
    let c = md
        .status?
        .conditions
        .into_iter()
        .find(|c| c.type_ == "Schedulable")?;
    Some((c.status, c.message))
}

async fn pods_of(pods: &Api<Pod>, name: &str) -> Vec<Pod> {
    let lp = ListParams::default().labels(&format!("app.kubernetes.io/instance={name}"));
    pods.list(&lp).await.map(|l| l.items).unwrap_or_default()
}

#[tokio::test]
#[ignore = "needs the local cluster: make e2e"]
async fn a_fleet_runs_on_a_tainted_pool_and_one_without_the_toleration_says_why() {
    ensure_operator().await;
    let _alone = NODE.write().await;
    let ns = TestNamespace::new("pool");
    let client = client().await;
    let mds: Api<ModelDeployment> = Api::namespaced(client.clone(), &ns.name);
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns.name);
    let (dir, digest) = tiny_model(&ns.name);
    let (priority, _priority) = pool_objects(&ns.name);
    let pool_node = Pool::new();
    let pool = pool_runtime(&priority);
    let fixed = "  replicas: 1\n  autoscaling:\n    mode: Disabled\n";
    apply(
        &ns.name,
        &manifest("pool", &ns.name, (&dir, &digest), &pool, fixed),
    );
    let stray = format!("    nodeSelector: {{{POOL_LABEL}: placement}}\n");
    let applied = Instant::now();
    apply(
        &ns.name,
        &manifest("stray", &ns.name, (&dir, &digest), &stray, fixed),
    );

    // Without the toleration: the scheduler's reason in status within 30 s.
    stray_says_why(&mds, applied).await;

    // With it: Ready on the pool, everything asked for in the pod.
    wait_ready(&mds, "pool").await;
    let pod = pods_of(&pods, "pool")
        .await
        .into_iter()
        .next()
        .expect("a pool pod");
    check_pool_pod(&pod, &priority);
    assert_eq!(schedulable(&mds, "pool").await.unwrap().0, "True");
    assert_eq!(
        mds.get("stray").await.unwrap().status.unwrap().desired_replicas,
        Some(1)
    );

    // The taint gone (the label kept), the stray pod schedules and the condition clears.
    pool_node.untaint();
    wait_until("stray Schedulable=True", Duration::from_secs(30), || async {
        (schedulable(&mds, "stray").await?.0 == "True").then_some(())
    })
    .await;
}

/// A PriorityClass (value 1000, deleted on drop) and the ConfigMap `ca-bundle` in `ns`.
fn pool_objects(ns: &str) -> (String, ClusterObject) {
    let priority = format!("{ns}-high");
    kubectl_ok(
        &[
            "create",
            "priorityclass",
            &priority,
            "--value=1000",
            "--description=e2e placement",
        ],
        None,
    );
    let guard = ClusterObject(format!("priorityclass/{priority}"));
    kubectl_ok(
        &[
            "create",
            "configmap",
            "ca-bundle",
            "-n",
            ns,
            "--from-literal=ca.crt=not-really-a-ca",
        ],
        None,
    );
    (priority, guard)
}

/// `spec.runtime` of the pool deployment: the pool's selector and toleration, the priority class,
/// a label, the CA bundle mounted, and an overlay (an annotation, an env var on the runtime).
fn pool_runtime(priority: &str) -> String {
    format!(
        "    nodeSelector: {{{POOL_LABEL}: placement}}\n    tolerations:\n    - {{key: {PLACEMENT_TAINT}, operator: \
         Equal, value: pool, effect: NoSchedule}}\n    priorityClassName: {priority}\n    podLabels: {{team: \
         ml}}\n    volumes:\n    - name: ca\n      configMap: {{name: ca-bundle}}\n    volumeMounts:\n    - \
         {{name: ca, mountPath: /etc/ssl/custom, readOnly: true}}\n    podTemplate:\n      metadata:\n        \
         annotations: {{placed-by: e2e}}\n      spec:\n        containers:\n        - name: runtime\n          \
         env: [{{name: PLACEMENT, value: pool}}]\n"
    )
}

/// `stray` (no toleration) says `Schedulable=False` quoting the scheduler within 30 s of `applied`,
/// and its pod is `Unschedulable` in `status.starting`.
async fn stray_says_why(mds: &Api<ModelDeployment>, applied: Instant) {
    let message = wait_until("stray Schedulable=False", Duration::from_secs(30), || async {
        let (status, message) = schedulable(mds, "stray").await?;
        (status == "False").then_some(message)
    })
    .await;
    eprintln!(
        "Schedulable=False {:?} after applying: {message}",
        applied.elapsed()
    );
    // The scheduler's own words, quoted: v1.35 counts untolerated taints without naming them.
    assert!(
        message.contains("pod stray-")
            && message.contains("0/1 nodes are available")
            && message.contains("untolerated taint"),
        "{message}"
    );
    let md = mds.get("stray").await.unwrap();
    let starting = &md.status.as_ref().unwrap().starting;
    assert_eq!(
        starting.first().map(|s| s.phase.as_str()),
        Some("Unschedulable"),
        "{starting:?}"
    );
}

/// The pool pod's spec carries every placement field and the overlay.
fn check_pool_pod(pod: &Pod, priority: &str) {
    let spec = pod.spec.as_ref().unwrap();
    assert_eq!(spec.priority_class_name.as_deref(), Some(priority));
    assert_eq!(
        spec.priority,
        Some(1000),
        "the priority admission resolved the class"
    );
    assert_eq!(spec.node_selector.as_ref().unwrap()[POOL_LABEL], "placement");
    assert!(
        spec.tolerations
            .iter()
            .flatten()
            .any(|t| t.key.as_deref() == Some(PLACEMENT_TAINT)),
        "{:?}",
        spec.tolerations
    );
    let volume = spec
        .volumes
        .iter()
        .flatten()
        .find(|v| v.name == "ca")
        .expect("the ca volume");
    assert_eq!(volume.config_map.as_ref().unwrap().name, "ca-bundle");
    let runtime = spec.containers.iter().find(|c| c.name == "runtime").unwrap();
    assert!(
        runtime
            .volume_mounts
            .iter()
            .flatten()
            .any(|m| m.name == "ca" && m.mount_path == "/etc/ssl/custom"),
        "{:?}",
        runtime.volume_mounts
    );
    assert!(
        runtime.env.iter().flatten().any(|e| e.name == "PLACEMENT"),
        "the overlay's env"
    );
    let meta = &pod.metadata;
    assert_eq!(meta.labels.as_ref().unwrap()["team"], "ml");
    assert_eq!(meta.annotations.as_ref().unwrap()["placed-by"], "e2e");
    assert!(pod.status.as_ref().unwrap().host_ip.is_some(), "on the node");
}

#[tokio::test]
#[ignore = "needs the local cluster: make e2e"]
async fn replicas_that_cannot_be_placed_hold_the_autoscaler() {
    ensure_operator().await;
    let _shared = NODE.read().await;
    let ns = TestNamespace::new("hold");
    let client = client().await;
    let mds: Api<ModelDeployment> = Api::namespaced(client.clone(), &ns.name);
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns.name);
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), &ns.name);
    let (dir, digest) = tiny_model(&ns.name);
    // One replica per node, and one node.
    let apart = "    maxNumSeqs: 1\n    affinity:\n      podAntiAffinity:\n        \
                 requiredDuringSchedulingIgnoredDuringExecution:\n        - labelSelector: {matchLabels: \
                 {app.kubernetes.io/instance: hold}}\n          topologyKey: kubernetes.io/hostname\n";
    let autoscaling = "  autoscaling:\n    minReplicas: 1\n    maxReplicas: 4\n    targetQueueDepthPerReplica: 1\n    \
                       scaleUpStabilizationSeconds: 5\n    scaleDownStabilizationSeconds: 600\n";
    apply(
        &ns.name,
        &manifest("hold", &ns.name, (&dir, &digest), apart, autoscaling),
    );
    wait_ready(&mds, "hold").await;
    let load = Load::start(pods.clone(), "hold", &format!("hold-{}", ns.name), 6, 64);

    // 1 → 2: the second replica cannot join the first on the node.
    let second = wait_until(
        "a second, unplaceable replica",
        Duration::from_secs(90),
        || async {
            let all = pods_of(&pods, "hold").await;
            (all.len() >= 2).then(|| {
                all.into_iter()
                    .max_by_key(|p| p.metadata.creation_timestamp.clone())
            })?
        },
    )
    .await;
    let created = second.metadata.creation_timestamp.clone().unwrap().0;
    let message = wait_until("hold Schedulable=False", Duration::from_secs(30), || async {
        let (status, message) = schedulable(&mds, "hold").await?;
        (status == "False").then_some(message)
    })
    .await;
    let after = k8s_openapi::jiff::Timestamp::now().duration_since(created);
    eprintln!("Schedulable=False {after:?} after the pod was created: {message}");
    assert!(message.contains("anti-affinity"), "{message}");
    assert!(after.as_secs() <= 30, "{after:?}");

    // The load asks for 4; the count stays at 2 while the pod waits, and says why once the
    // scale-up's stabilization has passed on fresh metrics (on a loaded machine, tens of seconds).
    let mut held = false;
    let (at_least, at_most) = (
        Instant::now() + Duration::from_secs(20),
        Instant::now() + Duration::from_secs(60),
    );
    while Instant::now() < at_most && !(held && Instant::now() >= at_least) {
        let md = mds.get("hold").await.unwrap();
        let status = md.status.clone().unwrap();
        assert_eq!(status.desired_replicas, Some(2), "{:?}", status.recent_decisions);
        let replicas = deployments.get("hold").await.unwrap().spec.unwrap().replicas;
        assert_eq!(replicas, Some(2));
        held |= condition(&md, "ScalingActive").is_some_and(|(_, reason)| reason == "ScaleUpHeld");
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    let answered = load.stop().await;
    let md = mds.get("hold").await.unwrap();
    assert!(
        held,
        "ScalingActive never said ScaleUpHeld in 60 s: {:?}; decisions {:?}",
        condition(&md, "ScalingActive"),
        md.status.map(|s| s.recent_decisions)
    );
    assert!(answered > 0, "the first replica served the load");
}

#[tokio::test]
#[ignore = "needs the local cluster: make e2e"]
async fn what_the_operator_owns_is_refused_by_the_api_server_naming_the_field() {
    ensure_operator().await;
    let ns = TestNamespace::new("owned");
    let model = (
        Path::new("/models/tiny"),
        "sha256:1111111111111111111111111111111111111111111111111111111111111111",
    );
    let cases = [
        (
            "    podTemplate:\n      spec:\n        containers:\n        - name: runtime\n          command: [/bin/sh]\n",
            "spec.runtime.podTemplate.spec.containers[0]: Invalid value",
            "container runtime: command is the operator's",
        ),
        (
            "    podTemplate:\n      spec:\n        initContainers:\n        - name: fetch\n          args: [fetch, --uri, x]\n",
            "spec.runtime.podTemplate.spec.initContainers[0]",
            "container fetch: args is the operator's",
        ),
        (
            "    podTemplate:\n      metadata:\n        labels: {app.kubernetes.io/instance: other}\n",
            "spec.runtime.podTemplate.metadata.labels",
            "app.kubernetes.io/instance is the operator's",
        ),
        (
            "    podTemplate:\n      spec:\n        volumes:\n        - name: model\n          emptyDir: {}\n",
            "spec.runtime.podTemplate.spec.volumes",
            "model is the name of a volume the operator mounts",
        ),
        (
            "    volumes:\n    - name: model\n      emptyDir: {}\n",
            "spec.runtime.volumes",
            "model is the name of a volume the operator mounts",
        ),
        (
            "    podLabels: {modelfleet.io/revision: x}\n",
            "spec.runtime.podLabels",
            "modelfleet.io/revision is the operator's",
        ),
        (
            "    volumeMounts:\n    - {name: x, mountPath: /var/lib/modelfleet/model/x}\n",
            "spec.runtime.volumeMounts",
            "/var/lib/modelfleet/model/x is under a directory the operator mounts",
        ),
    ];
    for (runtime, field, says) in cases {
        let yaml = manifest("owned", &ns.name, model, runtime, "");
        let out = kubectl(
            &["apply", "--dry-run=server", "-n", &ns.name, "-f", "-"],
            Some(&yaml),
        );
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "accepted:\n{yaml}");
        assert!(
            stderr.contains(field) && stderr.contains(says),
            "expected {field:?} and {says:?} in: {stderr}"
        );
    }
    // What is not the operator's goes through: a sidecar, the runtime's env and resources, a volume.
    let fine = "    podTemplate:\n      metadata:\n        labels: {team: ml}\n      spec:\n        containers:\n        \
                - name: runtime\n          env: [{name: A, value: \"1\"}]\n        - name: sidecar\n          \
                image: example.org/proxy:1\n        volumes:\n        - name: scratch\n          emptyDir: {}\n";
    kubectl_ok(
        &["apply", "--dry-run=server", "-n", &ns.name, "-f", "-"],
        Some(&manifest("fine", &ns.name, model, fine, "")),
    );
}

/// The HPA of `name`: its External metric (the queue) from the operator, 1–2 replicas, scaling at once.
fn hpa(name: &str) -> String {
    format!(
        "apiVersion: autoscaling/v2\nkind: HorizontalPodAutoscaler\nmetadata:\n  name: {name}\nspec:\n  scaleTargetRef:\n    \
         apiVersion: modelfleet.io/v1alpha1\n    kind: ModelDeployment\n    name: {name}\n  minReplicas: 1\n  maxReplicas: 2\n  \
         metrics:\n  - type: External\n    external:\n      metric:\n        name: modelfleet_requests_waiting\n        \
         selector: {{matchLabels: {{modelfleet.io/model-deployment: {name}}}}}\n      target: {{type: AverageValue, \
         averageValue: \"1\"}}\n  behavior:\n    scaleUp: {{stabilizationWindowSeconds: 0}}\n    scaleDown:\n      \
         stabilizationWindowSeconds: 0\n      policies: [{{type: Pods, value: 1, periodSeconds: 15}}]\n"
    )
}

/// `spec.replicas` of the ModelDeployment and of its Deployment.
async fn replicas(
    mds: &Api<ModelDeployment>,
    deployments: &Api<Deployment>,
    name: &str,
) -> Option<(i32, i32)> {
    let md = mds.get(name).await.ok()?.spec.replicas?;
    let d = deployments.get(name).await.ok()?.spec?.replicas?;
    Some((md, d))
}

#[tokio::test]
#[ignore = "needs the local cluster: make e2e"]
async fn an_hpa_scales_an_external_mode_deployment_through_scale() {
    ensure_operator().await;
    let _shared = NODE.read().await;
    let ns = TestNamespace::new("hpa");
    let client = client().await;
    let mds: Api<ModelDeployment> = Api::namespaced(client.clone(), &ns.name);
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns.name);
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), &ns.name);
    let (dir, digest) = tiny_model(&ns.name);
    let external = "  replicas: 1\n  autoscaling:\n    mode: External\n";
    apply(
        &ns.name,
        &manifest("hpa", &ns.name, (&dir, &digest), "    maxNumSeqs: 1\n", external),
    );
    wait_ready(&mds, "hpa").await;

    // The metric, as the HPA reads it through the aggregation layer.
    let path = format!(
        "/apis/external.metrics.k8s.io/v1beta1/namespaces/{}/modelfleet_requests_waiting?labelSelector=modelfleet.io%2Fmodel-deployment%3Dhpa",
        ns.name
    );
    let raw = wait_until(
        "the external metric through the API server",
        Duration::from_secs(60),
        || async {
            let out = kubectl(&["get", "--raw", &path], None);
            out.status
                .success()
                .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
        },
    )
    .await;
    assert!(
        raw.contains("\"metricName\":\"modelfleet_requests_waiting\""),
        "{raw}"
    );
    apply(&ns.name, &hpa("hpa"));

    let load = Load::start(pods.clone(), "hpa", &format!("hpa-{}", ns.name), 6, 64);
    let started = Instant::now();
    wait_until("the HPA at 2 replicas", Duration::from_secs(120), || async {
        (replicas(&mds, &deployments, "hpa").await? == (2, 2)).then_some(())
    })
    .await;
    eprintln!("HPA 1 -> 2 in {:?}", started.elapsed());
    load.stop().await;
    let stopped = Instant::now();
    wait_until("the HPA back at 1 replica", Duration::from_secs(120), || async {
        (replicas(&mds, &deployments, "hpa").await? == (1, 1)).then_some(())
    })
    .await;
    eprintln!("HPA 2 -> 1 in {:?} after the load stopped", stopped.elapsed());
    check_spec_writers(&mds, "hpa").await;
}

/// The HPA wrote `spec.replicas` through `/scale`; the operator wrote nothing but status.
async fn check_spec_writers(mds: &Api<ModelDeployment>, name: &str) {
    let md = mds.get(name).await.unwrap();
    let fields = md.metadata.managed_fields.unwrap_or_default();
    let through_scale = fields.iter().any(|f| f.subresource.as_deref() == Some("scale"));
    assert!(through_scale, "no write through /scale: {fields:?}");
    for f in &fields {
        if f.manager.as_deref() == Some("modelfleet-operator") {
            assert_eq!(
                f.subresource.as_deref(),
                Some("status"),
                "the operator wrote more than status: {f:?}"
            );
        }
    }
}
