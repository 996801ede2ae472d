//! Affinity holds within a revision (issue #30): the prefix-affinity workload of `gateway_affinity.rs`
//! (12 tenants' long system prompts, 5 turns each, 2 clients, each pod's KV pool sized for 4 of the
//! prompts) runs on 4 replicas of one revision, then again, with fresh prompts, while a canary holds at
//! a 50 % manual gate (2 pods of each revision). Every tenant's turns must stay on the revision the
//! gateway's split puts it on, and the share of prompt tokens served from the prefix cache must be
//! within 10 points of the one-revision run's. Then the promote annotation moves the gate: the canary
//! becomes stable, only its pods run and its Deployment is deleted. Run by `make e2e`; nothing is mocked.

mod common;
use common::affinity::*;
use common::fleet::*;
use common::*;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use kube::api::{Api, ListParams, Patch, PatchParams};
use modelfleet_crds::ModelDeployment;
use modelfleet_crds::rollout::{PROMOTE_ANNOTATION, REVISION_LABEL, RolloutPhase, RolloutStatus};
use modelfleet_gateway::canary::Split;
use modelfleet_gateway::ring::Ring;
use serde_json::json;
use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

/// Prefixes one pod's pool holds: 4 of the 12 tenants', so the fleet of 4 holds them all only when
/// each tenant stays at home.
const PREFIXES_PER_POD: usize = 4;
const REPLICAS: usize = 4;
const WORDS_PER_PROMPT: usize = 90;
const MD: &str = "raff";

/// The runtime pods of the deployment that are not being deleted: name → revision label.
async fn revisions(pods: &Api<Pod>) -> Option<(BTreeMap<String, String>, usize)> {
    let list = pods
        .list(&ListParams::default().labels(&format!("app.kubernetes.io/instance={MD}")))
        .await
        .ok()?;
    let live: Vec<&Pod> = list
        .items
        .iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .collect();
    let ready = live.iter().filter(|p| is_ready(p)).count();
    let by_name = live
        .iter()
        .map(|p| {
            let rev = p.labels().get(REVISION_LABEL).cloned().unwrap_or_default();
            (p.name_any(), rev)
        })
        .collect();
    (list.items.len() == live.len()).then_some((by_name, ready))
}

fn report(what: &str, r: &RunResult) {
    eprintln!(
        "[rollout-affinity] {what}: cached share of prompt tokens {:.1}%, TTFT p50 {:.1} ms p99 {:.1} ms, \
         per pod {:?}",
        100.0 * r.cached_share,
        1e3 * quantile(&r.ttft, 0.5),
        1e3 * quantile(&r.ttft, 0.99),
        r.per_pod
    );
}

/// The scenario's objects.
struct Scene {
    ns: TestNamespace,
    mds: Api<ModelDeployment>,
    pods: Api<Pod>,
    deployments: Api<Deployment>,
    served: String,
}

impl Scene {
    async fn rollout(&self) -> Option<RolloutStatus> {
        self.mds.get(MD).await.ok()?.status?.rollout
    }

    async fn patch(&self, v: serde_json::Value) {
        self.mds
            .patch(MD, &PatchParams::default(), &Patch::Merge(v))
            .await
            .unwrap();
    }

    /// Applies the deployment on one revision, sizes each pod's pool from a real prompt (as
    /// gateway_affinity.rs does) and turns the canary strategy on in the same change (the first
    /// revision the rollout sees is its stable one); the stable revision once it runs on every pod.
    async fn start(&self) -> (String, BTreeSet<String>) {
        let (dir, digest) = tiny_model(&self.ns.name);
        let md = format!(
            "apiVersion: modelfleet.io/v1alpha1\nkind: ModelDeployment\nmetadata:\n  name: {MD}\nspec:\n  model:\n    \
             uri: file://{}\n    digest: \"{digest}\"\n    servedName: {}\n  replicas: {REPLICAS}\n  runtime:\n    \
             threads: 1\n    kvCache:\n      blockSize: {BLOCK}\n  autoscaling:\n    mode: Disabled\n",
            dir.display(),
            self.served
        );
        kubectl_ok(&["apply", "-n", &self.ns.name, "-f", "-"], Some(&md));
        let (names, _) = wait_until("4 ready replicas", Duration::from_secs(240), || async {
            let (names, ready) = revisions(&self.pods).await?;
            (names.len() == REPLICAS && ready == REPLICAS).then_some((names, ()))
        })
        .await;
        let names: BTreeSet<String> = names.into_keys().collect();
        routes_to_all(&gateway_url(), &self.served, &names).await;
        let num_blocks = pool_blocks(&gateway_url(), &self.served, WORDS_PER_PROMPT, PREFIXES_PER_POD).await;
        // One step, a manual gate. The analysis is loose on purpose: this scenario is about routing,
        // and a gate the analysis failed would roll back before the promote.
        self.patch(json!({"spec": {
            "runtime": {"kvCache": {"numBlocks": num_blocks}},
            "rollout": {"strategy": "Canary", "steps": [{"weight": 50, "gate": "Manual"}],
                "analysis": {"windowSeconds": 30, "minRequests": 10,
                    "maxErrorRateIncrease": "50", "maxTtftP95Ratio": "1000", "maxItlP95Ratio": "1000"}}}}))
            .await;
        let (stable, names) = wait_until(
            "the sized revision stable on 4 ready pods",
            Duration::from_secs(300),
            || async {
                let r = self.rollout().await?;
                let (names, ready) = revisions(&self.pods).await?;
                let one = names.values().all(|rev| *rev == r.stable_revision);
                (r.phase == RolloutPhase::Stable && one && names.len() == REPLICAS && ready == REPLICAS)
                    .then_some((r.stable_revision, names))
            },
        )
        .await;
        let names: BTreeSet<String> = names.into_keys().collect();
        routes_to_all(&gateway_url(), &self.served, &names).await;
        (stable, names)
    }

    /// Changes the spec (a new revision) and waits for the canary to hold at its 50 % gate on 2 ready
    /// pods of each revision; the canary revision and the pods' revisions.
    async fn hold_at_the_gate(&self, stable: &str) -> (String, BTreeMap<String, String>) {
        let env = json!({"spec": {"runtime": {"env": [{"name": "MODELFLEET_DRILL", "value": "affinity"}]}}});
        self.patch(env).await;
        let started = Instant::now();
        let (canary, revs) = wait_until(
            "the canary paused at its 50 % gate with 2 ready pods of each revision",
            Duration::from_secs(300),
            || async {
                let r = self.rollout().await?;
                let canary = r.canary_revision.clone()?;
                let (names, ready) = revisions(&self.pods).await?;
                let count = |rev: &str| names.values().filter(|v| *v == rev).count();
                let held = r.phase == RolloutPhase::Paused && r.weight == 50 && r.stable_revision == stable;
                (held && ready == 4 && count(stable) == 2 && count(&canary) == 2).then_some((canary, names))
            },
        )
        .await;
        eprintln!(
            "[rollout-affinity] canary {canary} held at 50 % {:.0} s after the change",
            started.elapsed().as_secs_f64()
        );
        let names: BTreeSet<String> = revs.keys().cloned().collect();
        routes_to_all(&gateway_url(), &self.served, &names).await;
        (canary, revs)
    }

    /// Annotates the promote with the canary's revision and waits until it is stable on every pod, its
    /// Deployment gone.
    async fn promote(&self, canary: &str) {
        let held = self.rollout().await.expect("a rollout status");
        assert_eq!((held.phase, held.weight), (RolloutPhase::Paused, 50), "{held:?}");
        let annotation = format!("{PROMOTE_ANNOTATION}={canary}");
        let promoted_at = Instant::now();
        kubectl_ok(
            &[
                "annotate",
                "-n",
                &self.ns.name,
                "md",
                MD,
                &annotation,
                "--overwrite",
            ],
            None,
        );
        wait_until(
            "the canary promoted, only its pods left and its Deployment gone",
            Duration::from_secs(300),
            || async {
                let r = self.rollout().await?;
                let (names, ready) = revisions(&self.pods).await?;
                let only_new =
                    names.len() == REPLICAS && ready == REPLICAS && names.values().all(|v| v == canary);
                let gone = self
                    .deployments
                    .get_opt(&format!("{MD}-canary"))
                    .await
                    .ok()?
                    .is_none();
                let stable = r.phase == RolloutPhase::Stable && r.stable_revision == canary;
                (stable && r.canary_revision.is_none() && only_new && gone).then_some(())
            },
        )
        .await;
        eprintln!(
            "[rollout-affinity] promoted: {canary} stable on {REPLICAS} pods {:.0} s after the annotation",
            promoted_at.elapsed().as_secs_f64()
        );
        let md = self.mds.get(MD).await.unwrap();
        assert_eq!(
            condition(&md, "Progressing"),
            Some(("True".into(), "Stable".into())),
            "a promoted rollout leaves Progressing=True/Stable"
        );
    }
}

/// The revision the gateway's split names for run `run`'s tenant `t` (an open deployment's tenant is
/// `default`).
fn side_of(split: &Split, run: &str, t: usize) -> String {
    let body = json!({"model": "m", "messages": [
        {"role": "system", "content": system_prompt(run, t, WORDS_PER_PROMPT)},
        {"role": "user", "content": user_turn(0)}]});
    let routed = modelfleet_gateway::request::peek(body.to_string().as_bytes(), 512).unwrap();
    let key = modelfleet_gateway::request::affinity_key("tenant:default", None, &routed);
    split.revision(split.side("default", key)).to_string()
}

#[tokio::test]
#[ignore = "needs the local cluster: make e2e"]
async fn affinity_holds_within_a_revision_and_a_manual_gate_waits_for_its_promote_annotation() {
    ensure_operator().await;
    let ns = TestNamespace::new("rollaff");
    let client = client().await;
    let scene = Scene {
        mds: Api::namespaced(client.clone(), &ns.name),
        pods: Api::namespaced(client.clone(), &ns.name),
        deployments: Api::namespaced(client.clone(), &ns.name),
        served: format!("raff-{}", ns.name),
        ns,
    };
    let (stable, names) = scene.start().await;

    // One revision: each tenant's home is the first pod of the ring from its key.
    let ring = Ring::new(&names.iter().collect::<Vec<_>>());
    let home = |key: u64| ring.pods()[ring.walk(key).next().expect("4 pods")].clone();
    let tenants = tenants_covering(REPLICAS, "one", WORDS_PER_PROMPT, home);
    let one = run_load(&gateway_url(), &scene.served, "one", WORDS_PER_PROMPT, &tenants).await;
    report("one revision, 4 pods", &one);

    // A canary at 50 %: the split picks a revision from the tenant and key; within it, the first of
    // its pods on the ring.
    let (canary, revs) = scene.hold_at_the_gate(&stable).await;
    let split = Split {
        stable: stable.clone(),
        canary: canary.clone(),
        weight: 50,
        mirror_percent: 0,
    };
    let ring = Ring::new(&revs.keys().collect::<Vec<_>>());
    let home = |key: u64| {
        let rev = split.revision(split.side("default", key));
        let mut walk = ring.walk(key).map(|i| ring.pods()[i].clone());
        walk.find(|p| revs[p] == rev).expect("2 pods of each revision")
    };
    let tenants = tenants_covering(REPLICAS, "canary", WORDS_PER_PROMPT, home);
    let step = run_load(
        &gateway_url(),
        &scene.served,
        "canary",
        WORDS_PER_PROMPT,
        &tenants,
    )
    .await;
    report("50 % step, 2 + 2 pods", &step);

    // Every tenant's turns stayed on the revision its split side names.
    let mut per_revision = BTreeMap::<&str, usize>::new();
    for (t, served_by) in &step.tenant_pods {
        let on: BTreeSet<&str> = served_by.iter().map(|p| revs[p].as_str()).collect();
        assert_eq!(
            on.len(),
            1,
            "tenant {t}'s turns were served by {served_by:?} ({on:?})"
        );
        let want = side_of(&split, "canary", *t);
        assert_eq!(
            on.first().copied(),
            Some(want.as_str()),
            "tenant {t} on the split's side"
        );
        *per_revision
            .entry(if want == canary { "canary" } else { "stable" })
            .or_default() += 1;
    }
    eprintln!("[rollout-affinity] tenants per revision: {per_revision:?}");
    assert_eq!(step.per_pod.len(), 4, "every pod served: {:?}", step.per_pod);
    let gap = 100.0 * (step.cached_share - one.cached_share);
    eprintln!("[rollout-affinity] cached share at the 50 % step minus one revision's: {gap:+.1} points");
    assert!(
        gap.abs() <= 10.0,
        "the cached share at the 50 % step is {gap:+.1} points from one revision's (within 10 wanted)"
    );

    // The gate held through the load; the promote annotation (with the canary's revision) moves it.
    scene.promote(&canary).await;
}
