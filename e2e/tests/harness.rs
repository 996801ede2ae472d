//! Proof that the local control plane is real: a Deployment scales through the real
//! kube-controller-manager, the process kubelet runs its pods with probes on their own loopback IPs,
//! Prometheus discovers and scrapes them through Kubernetes service discovery, deletion stops the
//! processes, ServiceAccount tokens are subject to RBAC, and termination messages reach pod status.
//! Run by `make e2e` against `e2e/cluster up`.

mod common;
use common::*;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams};
use std::time::Duration;

const WEB: &str = r#"
apiVersion: apps/v1
kind: Deployment
metadata:
  name: web
spec:
  replicas: 1
  selector:
    matchLabels: {app: web}
  template:
    metadata:
      labels: {app: web}
      annotations:
        prometheus.io/scrape: "true"
        prometheus.io/port: "8080"
        prometheus.io/path: /metrics
    spec:
      terminationGracePeriodSeconds: 5
      containers:
      - name: web
        image: modelfleet/testserver:dev
        ports:
        - {name: http, containerPort: 8080}
        env:
        - name: POD_IP
          valueFrom: {fieldRef: {fieldPath: status.podIP}}
        - name: POD_NAME
          valueFrom: {fieldRef: {fieldPath: metadata.name}}
        - name: POD_NAMESPACE
          valueFrom: {fieldRef: {fieldPath: metadata.namespace}}
        readinessProbe:
          httpGet: {path: /ready, port: http}
          periodSeconds: 1
        livenessProbe:
          httpGet: {path: /healthz, port: 8080}
          periodSeconds: 2
"#;

async fn ready_pods(pods: &Api<Pod>, selector: &str) -> Vec<Pod> {
    let list = pods.list(&ListParams::default().labels(selector)).await.unwrap();
    list.items.into_iter().filter(is_ready).collect()
}

#[tokio::test]
#[ignore = "needs the local cluster: make e2e"]
async fn deployment_scales_to_three_ready_pods_that_serve_and_are_scraped() {
    let ns = TestNamespace::new("web");
    let client = client().await;
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), &ns.name);
    let pods: Api<Pod> = Api::namespaced(client, &ns.name);
    kubectl_ok(&["apply", "-n", &ns.name, "-f", "-"], Some(WEB));

    wait_until("1 ready replica", Duration::from_secs(60), || async {
        let d = deployments.get("web").await.ok()?;
        (d.status?.ready_replicas? == 1).then_some(())
    })
    .await;

    kubectl_ok(&["scale", "-n", &ns.name, "deployment/web", "--replicas=3"], None);
    let ready = wait_until("3 ready pods", Duration::from_secs(60), || async {
        let ready = ready_pods(&pods, "app=web").await;
        (ready.len() == 3).then_some(ready)
    })
    .await;

    // Each pod has its own loopback address and answers on it.
    let mut ips: Vec<String> = ready
        .iter()
        .map(|p| p.status.as_ref().unwrap().pod_ip.clone().expect("podIP"))
        .collect();
    ips.sort();
    ips.dedup();
    assert_eq!(ips.len(), 3, "pod IPs are not unique: {ips:?}");
    let http = http();
    for pod in &ready {
        let ip = pod.status.as_ref().unwrap().pod_ip.as_ref().unwrap();
        assert!(ip.starts_with("127."), "pod IP {ip} is not on loopback");
        let name = pod.metadata.name.as_ref().unwrap();
        let body = http
            .get(format!("http://{ip}:8080/"))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        assert_eq!(body, format!("hello from {}/{name}\n", ns.name));
    }

    // Prometheus finds all three through Kubernetes service discovery and scrapes them.
    let query = format!("sum(mf_testserver_up{{namespace=\"{}\"}})", ns.name);
    wait_until("Prometheus to scrape 3 pods", Duration::from_secs(60), || async {
        let result = prometheus_query(&query).await;
        let value = result.first()?["value"][1].as_str()?.to_string();
        (value == "3").then_some(())
    })
    .await;

    // Deleting the Deployment removes the pods and stops their processes.
    kubectl_ok(
        &[
            "delete",
            "-n",
            &ns.name,
            "deployment/web",
            "--wait=true",
            "--timeout=60s",
        ],
        None,
    );
    wait_until("the pods to be gone", Duration::from_secs(60), || async {
        let list = pods.list(&ListParams::default().labels("app=web")).await.ok()?;
        list.items.is_empty().then_some(())
    })
    .await;
    for ip in &ips {
        let gone = http.get(format!("http://{ip}:8080/")).send().await;
        assert!(gone.is_err(), "a deleted pod's process still answers on {ip}");
    }
}

const RBAC: &str = r#"
apiVersion: v1
kind: ServiceAccount
metadata: {name: reader}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {name: pod-reader}
rules:
- {apiGroups: [""], resources: [pods], verbs: [get, list]}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {name: reader-reads-pods}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: Role, name: pod-reader}
subjects:
- {kind: ServiceAccount, name: reader}
"#;

fn kubectl_pod(name: &str, ns: &str, resource: &str) -> String {
    format!(
        r#"
apiVersion: v1
kind: Pod
metadata: {{name: {name}}}
spec:
  serviceAccountName: reader
  restartPolicy: Never
  containers:
  - name: kubectl
    image: modelfleet/kubectl:v1.35.4
    args: [get, {resource}, -n, {ns}]
    terminationMessagePolicy: FallbackToLogsOnError
"#
    )
}

async fn terminated(pods: &Api<Pod>, name: &str) -> (String, i32, String) {
    wait_until(
        &format!("pod {name} to finish"),
        Duration::from_secs(60),
        || async {
            let pod = pods.get(name).await.ok()?;
            let status = pod.status?;
            let phase = status.phase?;
            if phase != "Succeeded" && phase != "Failed" {
                return None;
            }
            let term = status
                .container_statuses?
                .first()?
                .state
                .as_ref()?
                .terminated
                .clone()?;
            Some((phase, term.exit_code, term.message.unwrap_or_default()))
        },
    )
    .await
}

#[tokio::test]
#[ignore = "needs the local cluster: make e2e"]
async fn pods_get_service_account_tokens_subject_to_rbac() {
    let ns = TestNamespace::new("rbac");
    let pods: Api<Pod> = Api::namespaced(client().await, &ns.name);
    kubectl_ok(&["apply", "-n", &ns.name, "-f", "-"], Some(RBAC));
    kubectl_ok(
        &["apply", "-n", &ns.name, "-f", "-"],
        Some(&kubectl_pod("allowed", &ns.name, "pods")),
    );
    kubectl_ok(
        &["apply", "-n", &ns.name, "-f", "-"],
        Some(&kubectl_pod("denied", &ns.name, "secrets")),
    );

    let (phase, code, _) = terminated(&pods, "allowed").await;
    assert_eq!((phase.as_str(), code), ("Succeeded", 0));
    let (phase, code, message) = terminated(&pods, "denied").await;
    assert_eq!(phase, "Failed");
    assert_ne!(code, 0);
    let who = format!("system:serviceaccount:{}:reader", ns.name);
    assert!(
        message.contains("forbidden") && message.contains(&who),
        "termination message: {message}"
    );
}

const INIT_FAILS: &str = r#"
apiVersion: v1
kind: Pod
metadata: {name: verify}
spec:
  restartPolicy: Never
  initContainers:
  - name: fetch
    image: modelfleet/kubectl:v1.35.4
    command: [sh, -c, 'echo "digest mismatch: want sha256:aa got sha256:bb" > /dev/termination-log; exit 3']
  containers:
  - name: main
    image: modelfleet/testserver:dev
"#;

#[tokio::test]
#[ignore = "needs the local cluster: make e2e"]
async fn a_failed_init_container_reports_its_termination_message() {
    let ns = TestNamespace::new("init");
    let pods: Api<Pod> = Api::namespaced(client().await, &ns.name);
    kubectl_ok(&["apply", "-n", &ns.name, "-f", "-"], Some(INIT_FAILS));
    let (phase, init) = wait_until("the init container to fail", Duration::from_secs(60), || async {
        let status = pods.get("verify").await.ok()?.status?;
        let init = status
            .init_container_statuses?
            .first()?
            .state
            .as_ref()?
            .terminated
            .clone()?;
        Some((status.phase?, init))
    })
    .await;
    assert_eq!(init.exit_code, 3);
    assert_eq!(
        init.message.as_deref(),
        Some("digest mismatch: want sha256:aa got sha256:bb\n")
    );
    wait_until("phase Failed", Duration::from_secs(30), || async {
        let phase = pods.get("verify").await.ok()?.status?.phase?;
        (phase == "Failed").then_some(())
    })
    .await;
    let _ = phase;
    // The main container never started.
    let status = pods.get("verify").await.unwrap().status.unwrap();
    let main = &status.container_statuses.unwrap()[0];
    assert!(
        main.state.as_ref().unwrap().terminated.is_none() && main.state.as_ref().unwrap().running.is_none()
    );
}

const PRE_STOP: &str = r#"
apiVersion: v1
kind: Pod
metadata: {name: draining}
spec:
  terminationGracePeriodSeconds: 20
  containers:
  - name: web
    image: modelfleet/testserver:dev
    env:
    - name: POD_IP
      valueFrom: {fieldRef: {fieldPath: status.podIP}}
    readinessProbe:
      httpGet: {path: /ready, port: 8080}
      periodSeconds: 1
    lifecycle:
      preStop:
        sleep: {seconds: 4}
"#;

#[tokio::test]
#[ignore = "needs the local cluster: make e2e"]
async fn a_pre_stop_sleep_keeps_the_pod_serving_before_sigterm() {
    let ns = TestNamespace::new("prestop");
    let pods: Api<Pod> = Api::namespaced(client().await, &ns.name);
    kubectl_ok(&["apply", "-n", &ns.name, "-f", "-"], Some(PRE_STOP));
    let ip = wait_until("the pod Ready", Duration::from_secs(60), || async {
        let pod = pods.get("draining").await.ok()?;
        is_ready(&pod).then(|| pod.status?.pod_ip)?
    })
    .await;
    let http = http();
    let answers = |ip: String| {
        let http = http.clone();
        async move { http.get(format!("http://{ip}:8080/")).send().await.is_ok() }
    };
    assert!(answers(ip.clone()).await);
    let deleted = std::time::Instant::now();
    kubectl_ok(
        &["delete", "pod", "-n", &ns.name, "draining", "--wait=false"],
        None,
    );
    // Terminating, and still serving for the preStop sleep: SIGTERM comes after it.
    wait_until("the pod to be terminating", Duration::from_secs(5), || async {
        pods.get("draining")
            .await
            .ok()?
            .metadata
            .deletion_timestamp
            .map(|_| ())
    })
    .await;
    while deleted.elapsed() < Duration::from_secs(3) {
        assert!(
            answers(ip.clone()).await,
            "the process stopped {:?} after the delete, inside the 4 s preStop sleep",
            deleted.elapsed()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    wait_until(
        "the process to stop after the hook",
        Duration::from_secs(15),
        || {
            let ip = ip.clone();
            let answers = &answers;
            async move { (!answers(ip).await).then_some(()) }
        },
    )
    .await;
    let stopped = deleted.elapsed();
    assert!(stopped >= Duration::from_secs(4), "stopped after {stopped:?}");
    eprintln!("preStop: the process served until {stopped:?} after the delete");
}
