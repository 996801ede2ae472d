//! Helpers of the model-delivery scenarios: the cluster's registry as pods reach it, `package` (the
//! real command) and what it prints, the in-cluster S3 server (versitygw, a pod from the image
//! e2e/scripts/push-images.sh pushes), a static PersistentVolume and its claim, cosign, and the
//! registry's access log.

use super::fleet::{chat, condition, gateway, runtime};
use super::*;
use k8s_openapi::api::core::v1::Pod;
use kube::api::Api;
use modelfleet_crds::ModelDeployment;
use std::path::Path;

/// The cluster's registry as pods and the node reach it (`MF_REGISTRY_CLUSTER`, the node's address).
pub fn cluster_registry() -> String {
    std::env::var("MF_REGISTRY_CLUSTER").expect("MF_REGISTRY_CLUSTER (from e2e/cluster env)")
}

/// A peer binary e2e/scripts/build-tools.sh built (`MF_TOOLS_BIN`).
pub fn tool(name: &str) -> PathBuf {
    let dir = std::env::var("MF_TOOLS_BIN").expect("MF_TOOLS_BIN (from e2e/cluster env)");
    let p = PathBuf::from(dir).join(name);
    assert!(
        p.exists(),
        "{} is missing: run e2e/scripts/build-tools.sh",
        p.display()
    );
    p
}

/// What `package` pushed: the pinned URI and the canonical digest.
#[derive(Clone, Debug)]
pub struct Packaged {
    pub uri: String,
    pub digest: String,
}

impl Packaged {
    /// `registry/repo@sha256:…` (what cosign signs).
    pub fn by_digest(&self) -> String {
        let rest = self.uri.strip_prefix("oci://").unwrap();
        let (name, digest) = rest.split_once('@').unwrap();
        let repo = match name.rsplit_once(':') {
            Some((r, tag)) if !tag.contains('/') => r,
            _ => name,
        };
        format!("{repo}@{digest}")
    }

    /// The manifest digest.
    pub fn manifest_digest(&self) -> String {
        self.uri.rsplit_once('@').unwrap().1.to_string()
    }
}

/// Runs `modelfleet-runtime package DIR --to oci://<cluster registry>/<repo>:v1 --format FORMAT`.
pub fn package(dir: &Path, repo: &str, format: &str) -> Packaged {
    let to = format!("oci://{}/{repo}:v1", cluster_registry());
    let out = runtime(&[
        "package",
        dir.to_str().unwrap(),
        "--to",
        &to,
        "--format",
        format,
        "--plain-http",
    ]);
    let field = |k: &str| {
        out.lines()
            .find_map(|l| l.trim().strip_prefix(&format!("{k}: ")))
            .unwrap_or_else(|| panic!("package printed no {k}: {out}"))
            .trim_matches('"')
            .to_string()
    };
    Packaged {
        uri: field("uri"),
        digest: field("digest"),
    }
}

/// The layer digests of a manifest in the cluster's registry.
pub async fn layer_digests(p: &Packaged) -> Vec<String> {
    let rest = p.by_digest();
    let (repo, digest) = rest.split_once('@').unwrap();
    let repo = repo.split_once('/').unwrap().1;
    let v: serde_json::Value = http()
        .get(format!(
            "http://{}/v2/{repo}/manifests/{digest}",
            cluster_registry()
        ))
        .header("Accept", "application/vnd.oci.image.manifest.v1+json")
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    v["layers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l["digest"].as_str().unwrap().to_string())
        .collect()
}

/// GETs of blob `digest` of `p`'s repository the registry answered with bytes (200 or 206), from its
/// access log.
pub fn registry_blob_reads(p: &Packaged, digest: &str) -> usize {
    let log = std::fs::read_to_string(cluster_dir().join("logs/registry.log")).unwrap_or_default();
    let by_digest = p.by_digest();
    let repo = by_digest.split_once('@').unwrap().0.split_once('/').unwrap().1;
    let needle = format!("/v2/{repo}/blobs/{digest} ");
    log.lines()
        .filter(|l| l.contains("\"GET ") && l.contains(&needle))
        .filter(|l| l.contains("\" 200 ") || l.contains("\" 206 "))
        .count()
}

/// A generated tiny model of its own (seed `seed`: its bytes, and so its blobs, are no other test's)
/// under the cluster's artifacts directory.
pub fn unique_tiny_model(ns: &str, seed: u64) -> PathBuf {
    let dir = cluster_dir()
        .join("artifacts")
        .join(ns)
        .join(format!("model-{seed}"));
    let _ = std::fs::remove_dir_all(&dir);
    runtime(&[
        "gen-model",
        dir.to_str().unwrap(),
        "--shape",
        "tiny",
        "--seed",
        &seed.to_string(),
    ]);
    dir
}

/// Access and secret key of the in-cluster S3 server.
pub const S3_ACCESS: &str = "e2e-access";
pub const S3_SECRET: &str = "e2e-secret-key-for-delivery";

/// Runs versitygw as a pod (its data a node directory with the bucket `models`) with a Service, and
/// returns its endpoint (`http://<ClusterIP>:7070`) once it answers.
pub async fn deploy_s3(ns: &str) -> String {
    let data = cluster_dir().join("artifacts").join(ns).join("s3");
    std::fs::create_dir_all(data.join("models")).unwrap();
    for d in [data.clone(), data.join("models")] {
        std::os::unix::fs::chown(&d, Some(65532), Some(65532)).unwrap();
    }
    let version = std::env::var("MF_VERSITYGW_VERSION").unwrap_or_else(|_| "v1.8.0".into());
    let manifest = format!(
        r#"apiVersion: apps/v1
kind: Deployment
metadata: {{name: s3-server}}
spec:
  replicas: 1
  selector: {{matchLabels: {{app: s3-server}}}}
  template:
    metadata: {{labels: {{app: s3-server}}}}
    spec:
      securityContext: {{runAsUser: 65532, runAsGroup: 65532, runAsNonRoot: true}}
      containers:
      - name: versitygw
        image: {registry}/modelfleet-e2e/versitygw:{version}
        args: ["--access", "{S3_ACCESS}", "--secret", "{S3_SECRET}", "--port", ":7070", "posix", "/data"]
        ports: [{{containerPort: 7070}}]
        readinessProbe: {{tcpSocket: {{port: 7070}}, periodSeconds: 1}}
        volumeMounts: [{{name: data, mountPath: /data}}]
        securityContext: {{allowPrivilegeEscalation: false, readOnlyRootFilesystem: true}}
      volumes:
      - name: data
        hostPath: {{path: {data}, type: Directory}}
---
apiVersion: v1
kind: Service
metadata: {{name: s3-server}}
spec:
  selector: {{app: s3-server}}
  ports: [{{port: 7070, targetPort: 7070}}]
"#,
        registry = registry(),
        data = data.display()
    );
    kubectl_ok(&["apply", "-n", ns, "-f", "-"], Some(&manifest));
    let ip = kubectl_ok(
        &[
            "get",
            "svc",
            "s3-server",
            "-n",
            ns,
            "-o",
            "jsonpath={.spec.clusterIP}",
        ],
        None,
    );
    let endpoint = format!("http://{ip}:7070");
    wait_until("the S3 server to answer", Duration::from_secs(90), || async {
        http().get(&endpoint).send().await.ok().map(|_| ())
    })
    .await;
    endpoint
}

/// Uploads every file of `dir` under `prefix/` in the bucket `models`, with object_store (SigV4).
pub async fn upload_s3(endpoint: &str, dir: &Path, prefix: &str) {
    use object_store::ObjectStoreExt;
    let _ = rustls::crypto::ring::default_provider().install_default();
    let store = object_store::aws::AmazonS3Builder::new()
        .with_endpoint(endpoint)
        .with_allow_http(true)
        .with_bucket_name("models")
        .with_region("us-east-1")
        .with_access_key_id(S3_ACCESS)
        .with_secret_access_key(S3_SECRET)
        .with_virtual_hosted_style_request(false)
        .build()
        .unwrap();
    for entry in std::fs::read_dir(dir).unwrap() {
        let p = entry.unwrap().path();
        let key = format!("{prefix}/{}", p.file_name().unwrap().to_string_lossy());
        let bytes = std::fs::read(&p).unwrap();
        store
            .put(&object_store::path::Path::from(key.as_str()), bytes.into())
            .await
            .unwrap();
    }
}

/// A static PersistentVolume (a node directory holding a copy of `model`) bound to the claim `models`
/// in `ns`, read-only; returns the PV's name (cluster-scoped: delete it when done).
pub fn deploy_claim(ns: &str, model: &Path) -> String {
    let dir = cluster_dir().join("artifacts").join(ns).join("pv");
    std::fs::create_dir_all(dir.join("tiny")).unwrap();
    for entry in std::fs::read_dir(model).unwrap() {
        let p = entry.unwrap().path();
        std::fs::copy(&p, dir.join("tiny").join(p.file_name().unwrap())).unwrap();
    }
    let pv = format!("{ns}-models");
    let manifest = format!(
        r#"apiVersion: v1
kind: PersistentVolume
metadata: {{name: {pv}}}
spec:
  capacity: {{storage: 1Gi}}
  accessModes: [ReadOnlyMany]
  persistentVolumeReclaimPolicy: Retain
  storageClassName: ""
  hostPath: {{path: {dir}, type: Directory}}
  claimRef: {{namespace: {ns}, name: models}}
---
apiVersion: v1
kind: PersistentVolumeClaim
metadata: {{name: models, namespace: {ns}}}
spec:
  accessModes: [ReadOnlyMany]
  storageClassName: ""
  volumeName: {pv}
  resources: {{requests: {{storage: 1Gi}}}}
"#,
        dir = dir.display()
    );
    kubectl_ok(&["apply", "-f", "-"], Some(&manifest));
    pv
}

/// Runs cosign with `args` in `dir` (no password on the key, no transparency log, plain HTTP).
pub fn cosign(dir: &Path, args: &[&str]) -> String {
    let out = Command::new(tool("cosign"))
        .args(args)
        .current_dir(dir)
        .env("COSIGN_PASSWORD", "")
        .env("COSIGN_YES", "true")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "cosign {args:?}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A cosign key pair in a new directory of its own (`cosign.key`, `cosign.pub`).
pub fn cosign_keys(root: &Path, name: &str) -> PathBuf {
    let dir = root.join(name);
    std::fs::create_dir_all(&dir).unwrap();
    cosign(&dir, &["generate-key-pair"]);
    dir
}

/// Signs `p`'s manifest with the key in `keys` (offline: no transparency log).
pub fn cosign_sign(keys: &Path, p: &Packaged) {
    cosign(
        keys,
        &[
            "sign",
            "--key",
            "cosign.key",
            "--tlog-upload=false",
            "--allow-http-registry",
            "--allow-insecure-registry",
            &p.by_digest(),
        ],
    );
}

/// A ModelDeployment with `replicas` fixed (no autoscaler), one compute thread per pod, and `model`
/// (the `spec.model` lines after `servedName`).
pub fn md_yaml(name: &str, served: &str, model: &str, replicas: i32) -> String {
    format!(
        "apiVersion: modelfleet.io/v1alpha1\nkind: ModelDeployment\nmetadata:\n  name: {name}\nspec:\n  model:\n    \
         servedName: {served}\n{model}  runtime:\n    threads: 1\n  replicas: {replicas}\n  autoscaling:\n    \
         mode: Disabled\n"
    )
}

/// `spec.model` lines (indented for [`md_yaml`]) for an oci:// artifact.
pub fn oci_model(p: &Packaged, image_volume: bool) -> String {
    let delivery = if image_volume {
        "    delivery: ImageVolume\n"
    } else {
        ""
    };
    format!(
        "    uri: {}\n    digest: \"{}\"\n{delivery}    oci:\n      plainHTTP: true\n",
        p.uri, p.digest
    )
}

pub async fn wait_ready(
    mds: &Api<ModelDeployment>,
    name: &str,
    replicas: i32,
    timeout: Duration,
) -> ModelDeployment {
    wait_until(
        &format!("{name} Ready with {replicas} replicas"),
        timeout,
        || async {
            let md = mds.get(name).await.ok()?;
            let ready = md.status.as_ref()?.ready_replicas;
            (condition(&md, "Ready") == Some(("True".into(), "Ready".into())) && ready == replicas)
                .then_some(md)
        },
    )
    .await
}

/// A chat completion through the gateway answers 200 (retried while the gateway learns of the model).
pub async fn serves(served: &str) {
    let client = gateway(Duration::from_secs(60));
    wait_until(
        &format!("{served} to answer through the gateway"),
        Duration::from_secs(60),
        || async {
            match chat(&client, None, served, "hello", 4).await {
                Ok((200, _, _)) => Some(()),
                _ => None,
            }
        },
    )
    .await;
}

/// The `PodStarted` Events of a ModelDeployment (the operator's report of each pod's start).
pub fn started_events(ns: &str, name: &str) -> Vec<String> {
    let out = kubectl_ok(
        &[
            "get",
            "events",
            "-n",
            ns,
            "--field-selector",
            &format!("involvedObject.name={name},reason=PodStarted"),
            "-o",
            "jsonpath={range .items[*]}{.note}{.message}{\"\\n\"}{end}",
        ],
        None,
    );
    out.lines()
        .filter(|l| !l.is_empty())
        .map(str::to_string)
        .collect()
}

/// Seconds from a pod's creation to its Ready transition.
pub fn start_seconds(p: &Pod) -> f64 {
    let created = p.metadata.creation_timestamp.as_ref().unwrap().0;
    let ready = p
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|cs| cs.iter().find(|c| c.type_ == "Ready" && c.status == "True"))
        .and_then(|c| c.last_transition_time.as_ref())
        .unwrap()
        .0;
    (ready.as_millisecond() - created.as_millisecond()) as f64 / 1000.0
}
