//! Scenario 1 of the fleet gateway: prefix affinity pays at fleet scale. Three replicas whose KV pool
//! each holds about a third of the tenants' system prompts (the fleet's holds them all); 12 tenants,
//! chosen so the ring puts four at home on each pod, each with its own long system prompt, 5 turns each in a shuffled order (fixed seed), 2 clients at a
//! time. The same load runs twice in this test, with fresh prompts each time: through a second gateway
//! process with `--routing round-robin` (no affinity), then through the chart's gateway (affinity,
//! the default). The share of prompt tokens served from the prefix cache (the pods' own
//! `usage.prompt_tokens_details.cached_tokens`) must be ≥ 25 points higher with affinity, and every
//! pod must serve traffic in both runs. TTFT p50/p99 of each run are printed for the closing note.
//! The workload is `common/affinity.rs`. Run by `make e2e`; nothing is mocked.

mod common;
use common::affinity::*;
use common::fleet::*;
use common::*;
use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use kube::api::{Api, ListParams, Patch, PatchParams};
use modelfleet_crds::ModelDeployment;
use serde_json::json;
use std::collections::BTreeSet;
use std::path::PathBuf;
use std::time::Duration;

/// Prefixes one pod's pool holds (the fleet's holds 3×, more than the 12 tenants).
const PREFIXES_PER_POD: usize = 5;
/// Where the round-robin gateway listens (the chart's is at `MF_GATEWAY_URL`).
const RR_PORT: u16 = 18480;

fn gateway_bin() -> PathBuf {
    runtime_bin().with_file_name("modelfleet-gateway")
}

/// A second gateway, round-robin, on loopback, scoped to the test's namespace; killed on drop.
struct RoundRobinGateway(std::process::Child);
impl RoundRobinGateway {
    fn start(ns: &str) -> RoundRobinGateway {
        let child = std::process::Command::new(gateway_bin())
            .args(["run", "--host", "127.0.0.1", "--port", &RR_PORT.to_string()])
            .args(["--metrics-port", &(RR_PORT + 1).to_string()])
            .args(["--routing", "round-robin", "--namespaces", ns])
            .stdout(std::process::Stdio::null())
            .spawn()
            .expect("modelfleet-gateway built");
        RoundRobinGateway(child)
    }
}
impl Drop for RoundRobinGateway {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The deployment `aff` on 3 ready replicas whose KV pools each hold `PREFIXES_PER_POD` system
/// prompts of `words` words; their names.
async fn three_sized_replicas(ns: &TestNamespace, served: &str, words: usize) -> BTreeSet<String> {
    let client = client().await;
    let mds: Api<ModelDeployment> = Api::namespaced(client.clone(), &ns.name);
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns.name);
    let (dir, digest) = tiny_model(&ns.name);
    let md = format!(
        "apiVersion: modelfleet.io/v1alpha1\nkind: ModelDeployment\nmetadata:\n  name: aff\nspec:\n  model:\n    \
         uri: file://{}\n    digest: \"{digest}\"\n    servedName: {served}\n  replicas: 3\n  runtime:\n    threads: 1\n    \
         kvCache:\n      blockSize: {BLOCK}\n  autoscaling:\n    mode: Disabled\n",
        dir.display()
    );
    kubectl_ok(&["apply", "-n", &ns.name, "-f", "-"], Some(&md));
    let ready_pods = || async {
        let md = mds.get("aff").await.ok()?;
        let st = md.status.as_ref()?;
        let fresh = st.observed_generation == md.metadata.generation;
        if !(fresh && condition(&md, "Ready")?.0 == "True" && st.ready_replicas == 3 && st.replicas == 3) {
            return None;
        }
        let list = pods
            .list(&ListParams::default().labels("app.kubernetes.io/instance=aff"))
            .await
            .ok()?;
        let names: BTreeSet<String> = list
            .items
            .iter()
            .filter(|p| p.metadata.deletion_timestamp.is_none())
            .map(|p| p.name_any())
            .collect();
        (names.len() == 3).then_some(names)
    };
    let names = wait_until("3 ready replicas", Duration::from_secs(180), ready_pods).await;
    routes_to_all(&gateway_url(), served, &names).await;

    // Size each pod's pool from a real prompt: PREFIXES_PER_POD system prompts and room for the
    // running requests, so no pod holds all 12 tenants but the fleet does.
    let num_blocks = pool_blocks(&gateway_url(), served, words, PREFIXES_PER_POD).await;
    mds.patch(
        "aff",
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"runtime": {"kvCache": {"numBlocks": num_blocks}}}})),
    )
    .await
    .unwrap();
    kubectl_ok(
        &[
            "rollout",
            "status",
            "-n",
            &ns.name,
            "deployment/aff",
            "--timeout=240s",
        ],
        None,
    );
    wait_until(
        "3 ready replicas with the small pool",
        Duration::from_secs(180),
        || async {
            let n = ready_pods().await?;
            let all = pods
                .list(&ListParams::default().labels("app.kubernetes.io/instance=aff"))
                .await
                .ok()?;
            (all.items.len() == 3).then_some(n)
        },
    )
    .await
}

#[tokio::test]
#[ignore = "needs the local cluster: make e2e"]
async fn prefix_affinity_beats_round_robin_by_25_points_of_cached_prompt_tokens() {
    ensure_operator().await;
    let ns = TestNamespace::new("gwaff");
    let served = format!("aff-{}", ns.name);
    let words = 90;
    let names = three_sized_replicas(&ns, &served, words).await;

    // A request's home: the first pod of the chart gateway's ring from its key.
    let ring = modelfleet_gateway::ring::Ring::new(&names.iter().collect::<Vec<_>>());
    let home = |key: u64| ring.pods()[ring.walk(key).next().expect("three pods")].clone();

    // Round-robin first (its pods start with empty caches), then affinity with fresh prompts.
    let rr = RoundRobinGateway::start(&ns.name);
    let rr_base = format!("http://127.0.0.1:{RR_PORT}");
    routes_to_all(&rr_base, &served, &names).await;
    routes_to_all(&gateway_url(), &served, &names).await;
    let round_robin = run_load(
        &rr_base,
        &served,
        "rr",
        words,
        &tenants_covering(names.len(), "rr", words, home),
    )
    .await;
    drop(rr);
    let tenants = tenants_covering(names.len(), "affinity", words, home);
    eprintln!("affinity run: tenants {tenants:?}, a third of them at home on each pod");
    let affinity = run_load(&gateway_url(), &served, "affinity", words, &tenants).await;

    for (what, r) in [("round-robin", &round_robin), ("affinity", &affinity)] {
        eprintln!(
            "{what}: cached share of prompt tokens {:.1}%, TTFT p50 {:.1} ms p99 {:.1} ms, per pod {:?}",
            100.0 * r.cached_share,
            1e3 * quantile(&r.ttft, 0.5),
            1e3 * quantile(&r.ttft, 0.99),
            r.per_pod
        );
        assert_eq!(r.per_pod.len(), 3, "{what}: every pod served: {:?}", r.per_pod);
    }
    let gain = 100.0 * (affinity.cached_share - round_robin.cached_share);
    assert!(
        gain >= 25.0,
        "affinity's cached share is {gain:.1} points above round-robin's (≥ 25 wanted)"
    );
}
