//! LoRA adapters on the local control plane, end to end: a ModelDeployment of a generated tiny model
//! with two tenants; two generated adapters applied as LoraAdapters (one open, one restricted to
//! team-a) become Ready on every replica; chat completions naming them answer differently from the
//! base; team-b is refused the restricted one and does not see it in `/v1/models`; scaling 1 → 2 loads
//! both onto the new pod, which serves them with the same greedy answers; a later adapter reusing a
//! served name gets `NameConflict`; a wrong digest gets `Verified=False/DigestMismatch` and no pod
//! lists it; deleting an adapter unloads it from every pod and the object goes (finalizer); a steady
//! adapter's status is not rewritten; an adapter no LoraAdapter lists is swept off the pods. Run by
//! `make e2e`; nothing is mocked.

mod common;
use common::fleet::runtime;
use common::*;
use k8s_openapi::api::core::v1::{ConfigMap, Pod, Secret};
use kube::api::{Api, ListParams};
use modelfleet_crds::LoraAdapter;
use modelfleet_crds::lora_adapter::AdapterPodPhase;
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

const KEY_A: &str = "sk-lora-team-a";
const KEY_B: &str = "sk-lora-team-b";
const BASE: &str = "tiny-chat";

fn digest(dir: &Path) -> String {
    runtime(&["digest", dir.to_str().unwrap()]).trim().to_string()
}

/// A tiny model and two rank-8 adapters for it, under the cluster's artifacts directory (inside the
/// adapter file roots `ensure_operator` sets), with their digests.
fn artifacts(ns: &str) -> [(PathBuf, String); 3] {
    let root = cluster_dir().join("artifacts").join(ns);
    let _ = std::fs::remove_dir_all(&root);
    let model = root.join("model");
    runtime(&[
        "gen-model",
        model.to_str().unwrap(),
        "--shape",
        "tiny",
        "--seed",
        "11",
    ]);
    let adapter = |name: &str, seed: &str| {
        let dir = root.join(name);
        runtime(&[
            "gen-adapter",
            dir.to_str().unwrap(),
            "--base",
            model.to_str().unwrap(),
            "--rank",
            "8",
            "--seed",
            seed,
        ]);
        let d = digest(&dir);
        (dir, d)
    };
    let sql = adapter("sql", "1");
    let tone = adapter("tone", "2");
    let m = digest(&model);
    [(model, m), sql, tone]
}

fn manifests(ns: &str, model: &Path, model_digest: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Secret\nmetadata:\n  name: lora-keys\n  namespace: {ns}\nstringData:\n  tenants.yaml: |\n    \
         tenants:\n    - id: team-a\n      apiKeys: [\"{KEY_A}\"]\n    - id: team-b\n      apiKeys: [\"{KEY_B}\"]\n---\n\
         apiVersion: modelfleet.io/v1alpha1\nkind: ModelDeployment\nmetadata:\n  name: base\n  namespace: {ns}\nspec:\n  \
         model:\n    uri: file://{}\n    digest: \"{model_digest}\"\n    servedName: {BASE}\n  replicas: 1\n  runtime:\n    \
         threads: 1\n  autoscaling:\n    mode: Disabled\n  tenants:\n    secretRef:\n      name: lora-keys\n",
        model.display()
    )
}

fn lora(name: &str, served: Option<&str>, dir: &Path, digest: &str, tenants: &[&str]) -> String {
    let mut y = format!(
        "apiVersion: modelfleet.io/v1alpha1\nkind: LoraAdapter\nmetadata:\n  name: {name}\nspec:\n  \
         modelDeploymentRef:\n    name: base\n  uri: file://{}\n  digest: \"{digest}\"\n",
        dir.display()
    );
    if let Some(s) = served {
        y.push_str(&format!("  servedName: {s}\n"));
    }
    if !tenants.is_empty() {
        y.push_str(&format!("  tenants: {tenants:?}\n"));
    }
    y
}

fn condition(a: &LoraAdapter, type_: &str) -> Option<(String, String)> {
    let c = a.status.as_ref()?.conditions.iter().find(|c| c.type_ == type_)?;
    Some((c.status.clone(), c.reason.clone()))
}

/// Waits until adapter `name` is Ready with every one of `replicas` ready replicas listed as Loaded.
async fn wait_loaded(api: &Api<LoraAdapter>, name: &str, replicas: i32) -> LoraAdapter {
    wait_until(
        &format!("LoraAdapter {name} Ready and Loaded on {replicas} replicas"),
        Duration::from_secs(180),
        || async {
            let a = api.get(name).await.ok()?;
            let s = a.status.clone()?;
            let all_loaded = s.pods.len() == replicas as usize
                && s.pods.iter().all(|p| p.state == AdapterPodPhase::Loaded);
            (condition(&a, "Ready")? == ("True".into(), "Loaded".into())
                && s.loaded_replicas == replicas
                && s.desired_replicas == replicas
                && all_loaded
                && s.observed_generation == a.metadata.generation)
                .then_some(a)
        },
    )
    .await
}

/// A greedy chat completion as `key`'s tenant naming `model`: the answer's text, or (status, body).
async fn chat(ip: &str, key: &str, model: &str) -> Result<String, (u16, Value)> {
    let body = json!({"model": model, "messages": [{"role": "user", "content": "write a query"}],
                      "max_tokens": 16, "temperature": 0, "ignore_eos": true});
    let r = http()
        .post(format!("http://{ip}:8000/v1/chat/completions"))
        .bearer_auth(key)
        .json(&body)
        .send()
        .await
        .expect("the pod answers");
    let status = r.status().as_u16();
    let v: Value = r.json().await.expect("a JSON body");
    if status == 200 {
        assert_eq!(v["model"], model);
        Ok(v["choices"][0]["message"]["content"]
            .as_str()
            .unwrap()
            .to_string())
    } else {
        Err((status, v))
    }
}

/// The model ids `key`'s tenant sees.
async fn models(ip: &str, key: &str) -> Vec<String> {
    let v: Value = http()
        .get(format!("http://{ip}:8000/v1/models"))
        .bearer_auth(key)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    v["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["id"].as_str().unwrap().to_string())
        .collect()
}

/// `GET /v1/adapters` on a pod's admin API: name → (digest, state).
async fn admin_list(ip: &str, token: &str) -> BTreeMap<String, (String, String)> {
    let v: Value = http()
        .get(format!("http://{ip}:8001/v1/adapters"))
        .bearer_auth(token)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    v["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| {
            let s = |k: &str| a[k].as_str().unwrap_or_default().to_string();
            (s("name"), (s("digest"), s("state")))
        })
        .collect()
}

/// Whether a pod's admin list serves `name` at `digest` (`loaded`, or `evicted`: reloads on demand).
fn serves(list: &BTreeMap<String, (String, String)>, name: &str, digest: &str) -> bool {
    list.get(name)
        .is_some_and(|(d, state)| d == digest && (state == "loaded" || state == "evicted"))
}

#[tokio::test]
#[ignore = "needs the local cluster: make e2e"]
async fn adapters_load_serve_follow_scale_refuse_bad_bytes_and_unload() {
    ensure_operator().await;
    let ns = TestNamespace::new("lora");
    let client = client().await;
    let loras: Api<LoraAdapter> = Api::namespaced(client.clone(), &ns.name);
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns.name);
    let [
        (model, model_digest),
        (sql_dir, sql_digest),
        (tone_dir, tone_digest),
    ] = artifacts(&ns.name);
    kubectl_ok(
        &["apply", "-f", "-"],
        Some(&manifests(&ns.name, &model, &model_digest)),
    );
    kubectl_ok(
        &["apply", "-n", &ns.name, "-f", "-"],
        Some(&lora("sql", None, &sql_dir, &sql_digest, &[])),
    );
    kubectl_ok(
        &["apply", "-n", &ns.name, "-f", "-"],
        Some(&lora(
            "tone-v1",
            Some("tone"),
            &tone_dir,
            &tone_digest,
            &["team-a"],
        )),
    );

    // Both Ready on the one replica; the finalizer is on them.
    let sql = wait_loaded(&loras, "sql", 1).await;
    assert_eq!(
        condition(&sql, "Verified"),
        Some(("True".into(), "Verified".into()))
    );
    assert!(
        sql.metadata
            .finalizers
            .iter()
            .flatten()
            .any(|f| f == "modelfleet.io/lora-unload")
    );
    wait_loaded(&loras, "tone-v1", 1).await;
    let first = ready_pods(&pods, "base").await;
    let (first_pod, ip) = first.iter().next().map(|(n, i)| (n.clone(), i.clone())).unwrap();
    let token = {
        let s = Api::<Secret>::namespaced(client.clone(), &ns.name)
            .get("base-admin-token")
            .await
            .unwrap();
        String::from_utf8(s.data.unwrap()["token"].0.clone()).unwrap()
    };
    let listed = admin_list(&ip, &token).await;
    assert!(serves(&listed, "sql", &sql_digest), "{listed:?}");
    assert!(serves(&listed, "tone", &tone_digest), "{listed:?}");

    // Each adapter answers, greedily, differently from the base.
    let base = chat(&ip, KEY_A, BASE).await.expect("the base answers");
    let with_sql = chat(&ip, KEY_A, "sql").await.expect("sql answers team-a");
    let with_tone = chat(&ip, KEY_A, "tone").await.expect("tone answers team-a");
    assert_ne!(with_sql, base, "the sql adapter changes the output");
    assert_ne!(with_tone, base, "the tone adapter changes the output");
    assert_eq!(
        chat(&ip, KEY_B, "sql").await.expect("sql is open to team-b"),
        with_sql
    );
    // team-b may not use tone, and does not see it.
    let (status, body) = chat(&ip, KEY_B, "tone").await.unwrap_err();
    assert_eq!(
        status, 404,
        "an adapter team-b may not use reads as one that does not exist: {body}"
    );
    let mut seen_b = models(&ip, KEY_B).await;
    seen_b.sort();
    assert_eq!(seen_b, ["sql", BASE]);
    let mut seen_a = models(&ip, KEY_A).await;
    seen_a.sort();
    assert_eq!(seen_a, ["sql", BASE, "tone"]);

    // The start-up list new pods load before they turn ready.
    let configmaps: Api<ConfigMap> = Api::namespaced(client.clone(), &ns.name);
    let startup = |cm: ConfigMap| -> Vec<String> {
        let text = cm
            .data
            .unwrap_or_default()
            .remove("adapters.json")
            .unwrap_or_default();
        let v: Value = serde_json::from_str(&text).unwrap_or(Value::Null);
        v["adapters"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|a| a["name"].as_str().unwrap_or_default().to_string())
            .collect()
    };
    assert_eq!(
        startup(configmaps.get("base-adapters").await.unwrap()),
        ["sql", "tone"]
    );

    // 1 → 2 replicas: the new pod gets both (from the start-up list, confirmed by the operator).
    kubectl_ok(
        &[
            "patch",
            "-n",
            &ns.name,
            "md/base",
            "--type=merge",
            "-p",
            "{\"spec\":{\"replicas\":2}}",
        ],
        None,
    );
    let sql = wait_loaded(&loras, "sql", 2).await;
    wait_loaded(&loras, "tone-v1", 2).await;
    let both = ready_pods(&pods, "base").await;
    assert_eq!(both.len(), 2, "{both:?}");
    // Nothing changes, so nothing is written: the status of a loaded adapter does not tick. Every
    // new resourceVersion seen must carry a different status (a pod that really changed, say its
    // readiness on a loaded machine, is a change to report; a write of the same status is not).
    let steady = std::time::Instant::now();
    let mut seen: Vec<(Option<String>, Value)> = Vec::new();
    while steady.elapsed() < Duration::from_secs(8) {
        let a = loras.get("sql").await.unwrap();
        let status = serde_json::to_value(&a.status).unwrap();
        if seen.last().is_none_or(|(v, _)| *v != a.metadata.resource_version) {
            seen.push((a.metadata.resource_version, status));
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    assert!(
        seen.len() <= 3 && seen.windows(2).all(|w| w[0].1 != w[1].1),
        "sql was rewritten while nothing changed (at most a pod's flap out and back is news): {seen:#?}"
    );
    let status_pods: Vec<&str> = sql
        .status
        .as_ref()
        .unwrap()
        .pods
        .iter()
        .map(|p| p.pod.as_str())
        .collect();
    assert_eq!(status_pods, both.keys().map(String::as_str).collect::<Vec<_>>());
    let (new_pod, new_ip) = both.iter().find(|(n, _)| **n != first_pod).unwrap();
    let listed = admin_list(new_ip, &token).await;
    assert!(
        serves(&listed, "sql", &sql_digest) && serves(&listed, "tone", &tone_digest),
        "{new_pod}: {listed:?}"
    );
    assert_eq!(
        chat(new_ip, KEY_A, "sql").await.expect("the new pod serves sql"),
        with_sql
    );
    assert_eq!(
        chat(new_ip, KEY_A, "tone")
            .await
            .expect("the new pod serves tone"),
        with_tone
    );
    assert_eq!(chat(new_ip, KEY_B, "tone").await.unwrap_err().0, 404);

    // A later adapter reusing a served name is not loaded.
    kubectl_ok(
        &["apply", "-n", &ns.name, "-f", "-"],
        Some(&lora("tone-v2", Some("tone"), &sql_dir, &sql_digest, &[])),
    );
    wait_until("tone-v2 NameConflict", Duration::from_secs(60), || async {
        let a = loras.get("tone-v2").await.ok()?;
        (condition(&a, "Ready")? == ("False".into(), "NameConflict".into())).then_some(())
    })
    .await;

    // Wrong bytes: Verified=False/DigestMismatch, and no pod lists it.
    let wrong = format!("sha256:{}", "0".repeat(64));
    kubectl_ok(
        &["apply", "-n", &ns.name, "-f", "-"],
        Some(&lora("broken", None, &sql_dir, &wrong, &[])),
    );
    let broken = wait_until(
        "broken Verified=False/DigestMismatch",
        Duration::from_secs(120),
        || async {
            let a = loras.get("broken").await.ok()?;
            (condition(&a, "Verified")? == ("False".into(), "DigestMismatch".into())).then_some(a)
        },
    )
    .await;
    assert_eq!(
        condition(&broken, "Ready"),
        Some(("False".into(), "DigestMismatch".into()))
    );
    assert_eq!(
        condition(&broken, "Stalled"),
        Some(("True".into(), "DigestMismatch".into()))
    );
    for (pod, ip) in &both {
        let listed = admin_list(ip, &token).await;
        assert!(
            !listed.contains_key("broken"),
            "{pod} lists a refused adapter: {listed:?}"
        );
        assert!(
            serves(&listed, "tone", &tone_digest),
            "tone-v2 did not replace tone on {pod}: {listed:?}"
        );
    }
    wait_until(
        "the start-up list without conflicts or bad bytes",
        Duration::from_secs(30),
        || async { (startup(configmaps.get("base-adapters").await.ok()?) == ["sql", "tone"]).then_some(()) },
    )
    .await;

    // Deleting an adapter unloads it everywhere, then the object goes.
    kubectl_ok(
        &[
            "delete",
            "-n",
            &ns.name,
            "loraadapter/tone-v1",
            "--wait=true",
            "--timeout=90s",
        ],
        None,
    );
    assert!(loras.get_opt("tone-v1").await.unwrap().is_none());
    // tone-v1's bytes are gone from every pod. The name may already be tone-v2's (the sql bytes) in
    // any state: the operator starts loading it as soon as tone-v1 goes (a CI run saw `loading`).
    for (pod, ip) in &both {
        let listed = admin_list(ip, &token).await;
        assert!(
            listed.get("tone").is_none_or(|(digest, _)| *digest == sql_digest),
            "{pod} still has tone-v1's bytes: {listed:?}"
        );
    }
    // tone-v2 (the sql bytes) now owns the name and is loaded in its place.
    wait_loaded(&loras, "tone-v2", 2).await;
    for ip in both.values() {
        assert_eq!(
            chat(ip, KEY_B, "tone").await.expect("tone-v2 is open to team-b"),
            with_sql
        );
    }
    kubectl_ok(
        &[
            "delete",
            "-n",
            &ns.name,
            "loraadapter/tone-v2",
            "--wait=true",
            "--timeout=90s",
        ],
        None,
    );
    for (pod, ip) in &both {
        let listed = admin_list(ip, &token).await;
        assert!(!listed.contains_key("tone"), "{pod} still lists tone: {listed:?}");
        assert_eq!(chat(ip, KEY_A, "tone").await.unwrap_err().0, 404);
    }

    // An adapter no LoraAdapter lists (loaded by hand here; or one whose unload failed while its
    // LoraAdapter went away) is swept off the pods by the next ModelDeployment pass.
    let (_, ip) = both.iter().next().unwrap();
    let loaded = http()
        .post(format!("http://{ip}:8001/v1/adapters"))
        .bearer_auth(&token)
        .timeout(Duration::from_secs(60))
        .json(
            &json!({"name": "stray", "uri": format!("file://{}", sql_dir.display()),
                                  "digest": sql_digest, "tenants": []}),
        )
        .send()
        .await
        .unwrap();
    assert!(loaded.status().is_success(), "{:?}", loaded.text().await);
    assert!(admin_list(ip, &token).await.contains_key("stray"));
    // Any change to a LoraAdapter of the deployment brings a pass (so would the next minute's resync).
    kubectl_ok(
        &[
            "annotate",
            "-n",
            &ns.name,
            "loraadapter/sql",
            "e2e/nudge=1",
            "--overwrite",
        ],
        None,
    );
    wait_until("the stray adapter swept", Duration::from_secs(30), || async {
        let listed = admin_list(ip, &token).await;
        (!listed.contains_key("stray") && serves(&listed, "sql", &sql_digest)).then_some(())
    })
    .await;

    // The base going first never holds up the adapters' finalizers.
    kubectl_ok(
        &[
            "delete",
            "-n",
            &ns.name,
            "md/base",
            "--wait=true",
            "--timeout=60s",
        ],
        None,
    );
    kubectl_ok(
        &[
            "delete",
            "-n",
            &ns.name,
            "loraadapters",
            "--all",
            "--wait=true",
            "--timeout=60s",
        ],
        None,
    );
    assert!(loras.list(&ListParams::default()).await.unwrap().items.is_empty());
}
