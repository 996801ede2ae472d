//! Model delivery measured on the local cluster (bench/delivery.sh runs it; docs/benchmarks.md has the
//! figures): a generated model of real size served from each source, each pod's start split into its
//! phases (the operator's `PodStarted` report: the node's part — images, image volumes —, the fetch
//! container's signature, pull, verify and install, the runtime's load), and a scale-out 1 → 4 on the
//! one node with the registry's access log counting how often each blob was read.
//!
//! ```sh
//! eval "$(e2e/cluster env)"      # a cluster with the chart installed (make up, or a kept e2e cluster)
//! cargo run --release -p modelfleet-e2e --example delivery_bench -- scale-out     # ~1.3 GB (q8_0 GGUF)
//! cargo run --release -p modelfleet-e2e --example delivery_bench -- ready         # ~4.9 GB (f32 safetensors)
//! ```
//! Run inside the cluster's network (`e2e/cluster exec --`): the S3 server is reached at its ClusterIP.

#[path = "../tests/common/mod.rs"]
mod common;

use common::delivery::*;
use common::fleet::runtime;
use common::*;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams, Patch, PatchParams};
use modelfleet_crds::ModelDeployment;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// A generated model of its own (a fresh seed: nothing of it is on the node or in a cache yet).
fn model(ns: &str, dtype: &str, format: &str) -> PathBuf {
    let seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let dir = cluster_dir().join("artifacts").join(ns).join("bench-model");
    let _ = std::fs::remove_dir_all(&dir);
    let t = Instant::now();
    runtime(&[
        "gen-model",
        dir.to_str().unwrap(),
        "--shape",
        "llama-3.2-1b",
        "--dtype",
        dtype,
        "--format",
        format,
        "--seed",
        &seed.to_string(),
    ]);
    let bytes: u64 = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().metadata().unwrap().len())
        .sum();
    eprintln!(
        "model: llama-3.2-1b {dtype} {format}, {:.2} GB, generated in {:?}",
        bytes as f64 / 1e9,
        t.elapsed()
    );
    dir
}

/// Each source's `spec.model` lines for `dir` in namespace `ns` (pushed, uploaded, or on a claim).
async fn sources(ns: &str, dir: &Path, digest: &str) -> Vec<(&'static str, String, Option<Packaged>)> {
    let t = Instant::now();
    let image = package(dir, &format!("bench/{ns}/image"), "image");
    let modelpack = package(dir, &format!("bench/{ns}/modelpack"), "modelpack");
    eprintln!("packaged both shapes in {:?}", t.elapsed());
    let s3 = deploy_s3(ns).await;
    let t = Instant::now();
    upload_s3(&s3, dir, "bench").await;
    eprintln!("uploaded to S3 in {:?}", t.elapsed());
    let secret = format!(
        "apiVersion: v1\nkind: Secret\nmetadata:\n  name: s3-keys\nstringData:\n  AWS_ACCESS_KEY_ID: {S3_ACCESS}\n  \
         AWS_SECRET_ACCESS_KEY: {S3_SECRET}\n"
    );
    kubectl_ok(&["apply", "-n", ns, "-f", "-"], Some(&secret));
    let s3_model = format!(
        "    uri: s3://models/bench\n    digest: \"{digest}\"\n    credentialsSecretRef: {{name: s3-keys}}\n    \
         s3: {{endpoint: \"{s3}\", forcePathStyle: true}}\n"
    );
    vec![
        ("image-volume", oci_model(&image, true), Some(image)),
        ("modelpack", oci_model(&modelpack, false), Some(modelpack)),
        ("s3", s3_model, None),
    ]
}

async fn pods_of(pods: &Api<Pod>, name: &str) -> Vec<Pod> {
    let lp = ListParams::default().labels(&format!("app.kubernetes.io/instance={name}"));
    let mut list = pods.list(&lp).await.unwrap().items;
    list.sort_by_key(|p| p.metadata.creation_timestamp.as_ref().unwrap().0);
    list
}

/// 1 → 4 replicas per source, in a namespace that uses the node cache.
async fn scale_out() {
    let ns = TestNamespace::new("cache-bench");
    let client = client().await;
    let mds: Api<ModelDeployment> = Api::namespaced(client.clone(), &ns.name);
    let pods: Api<Pod> = Api::namespaced(client, &ns.name);
    let dir = model(&ns.name, "q8_0", "gguf");
    let digest = runtime(&["digest", dir.to_str().unwrap()]).trim().to_string();
    for (name, spec, packaged) in sources(&ns.name, &dir, &digest).await {
        kubectl_ok(
            &["apply", "-n", &ns.name, "-f", "-"],
            Some(&md_yaml(name, name, &spec, 1)),
        );
        wait_ready(&mds, name, 1, Duration::from_secs(900)).await;
        let p = json_patch(4);
        mds.patch(name, &PatchParams::default(), &Patch::Merge(&p))
            .await
            .unwrap();
        wait_ready(&mds, name, 4, Duration::from_secs(900)).await;
        let times: Vec<f64> = pods_of(&pods, name).await.iter().map(start_seconds).collect();
        let rest = &times[1..];
        let mean = rest.iter().sum::<f64>() / rest.len() as f64;
        let shown: Vec<String> = times.iter().map(|s| format!("{s:.1}")).collect();
        println!(
            "{name}: creation → Ready, oldest first: {} s; pod 1 / mean(pods 2-4) = {:.2}×",
            shown.join(", "),
            times[0] / mean
        );
        if let Some(p) = packaged {
            for blob in layer_digests(&p).await {
                println!(
                    "  blob {blob}: read {} time(s) from the registry",
                    registry_blob_reads(&p, &blob)
                );
            }
        }
        for e in started_events(&ns.name, name) {
            println!("  {e}");
        }
        kubectl_ok(&["delete", "md", name, "-n", &ns.name, "--wait=true"], None);
    }
}

fn json_patch(replicas: i32) -> serde_json::Value {
    serde_json::json!({"spec": {"replicas": replicas}})
}

/// One pod per source, each in a namespace without the node cache (every pod pulls).
async fn ready() {
    let ns = TestNamespace::new("ready-bench");
    let client = client().await;
    let mds: Api<ModelDeployment> = Api::namespaced(client, &ns.name);
    let dir = model(&ns.name, "f32", "safetensors");
    let digest = runtime(&["digest", dir.to_str().unwrap()]).trim().to_string();
    let mut all = sources(&ns.name, &dir, &digest).await;
    let pv = deploy_claim(&ns.name, &dir);
    all.push((
        "pvc",
        format!("    uri: pvc://models/tiny\n    digest: \"{digest}\"\n"),
        None,
    ));
    for (name, spec, _) in all {
        let t = Instant::now();
        kubectl_ok(
            &["apply", "-n", &ns.name, "-f", "-"],
            Some(&md_yaml(name, name, &spec, 1)),
        );
        wait_ready(&mds, name, 1, Duration::from_secs(1800)).await;
        println!("{name}: Ready {:?} after apply", t.elapsed());
        let events = wait_until("the PodStarted Event", Duration::from_secs(60), || async {
            let e = started_events(&ns.name, name);
            (!e.is_empty()).then_some(e)
        })
        .await;
        for e in events {
            println!("  {e}");
        }
        kubectl_ok(&["delete", "md", name, "-n", &ns.name, "--wait=true"], None);
    }
    let _ = kubectl(&["delete", "pv", &pv, "--wait=false"], None);
}

#[tokio::main]
async fn main() {
    ensure_operator().await;
    match std::env::args().nth(1).as_deref() {
        Some("scale-out") => scale_out().await,
        Some("ready") => ready().await,
        _ => {
            eprintln!("usage: delivery_bench scale-out|ready");
            std::process::exit(2);
        }
    }
}
