//! The registry without HTTP: residency under `max_cpu_loras` (eviction only of adapters no request
//! holds; a request for another waits until its deadline instead of failing), and requests racing an
//! unload.

use super::*;
use crate::gen_adapter::gen_adapter;
use crate::gen_model::{GenDType, GenFormat, GenModelOptions, Shape, gen_model};
use modelfleet_engine::ModelDir;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

fn registry(dir: &Path, max_cpu_loras: usize) -> Arc<Registry> {
    let base = dir.join("base");
    let opts = GenModelOptions {
        shape: Shape::Tiny,
        seed: 1,
        dtype: GenDType::F32,
        format: GenFormat::Safetensors,
    };
    gen_model(&base, &opts).unwrap();
    let metrics = Arc::new(LoraMetrics::new(&prometheus::Registry::new(), "base", 4));
    let cfg = RegistryConfig {
        max_cpu_loras,
        max_lora_rank: 16,
        max_adapters: 8,
        max_waiting: 2,
        store: dir.join("store"),
        policy: UriPolicy {
            schemes: vec!["file".into()],
            file_roots: vec![dir.to_path_buf()],
        },
        hf_endpoint: String::new(),
        token: None,
    };
    std::fs::create_dir_all(dir.join("store")).unwrap();
    let config = ModelDir::open(&base).unwrap().config;
    Arc::new(Registry::new(cfg, config, "base".into(), metrics))
}

fn spec(dir: &Path, name: &str, seed: u64) -> AdapterSpec {
    let path = dir.join(name);
    gen_adapter(&path, &dir.join("base"), 4, seed, &[]).unwrap();
    AdapterSpec {
        name: name.into(),
        uri: format!("file://{}", path.display()),
        digest: crate::digest::digest_path(&path).unwrap(),
        tenants: vec![],
    }
}

fn state(r: &Registry, name: &str) -> &'static str {
    r.list().into_iter().find(|a| a.name == name).unwrap().state
}

#[tokio::test]
async fn a_held_adapter_is_never_evicted_and_a_request_for_another_waits() {
    let t = tempfile::tempdir().unwrap();
    let r = registry(t.path(), 1);
    let (a, b) = (spec(t.path(), "a", 1), spec(t.path(), "b", 2));
    assert!(r.load(a).await.unwrap().0);
    assert!(r.load(b).await.unwrap().0);
    assert_eq!((state(&r, "a"), state(&r, "b")), ("evicted", "loaded"));
    // A request holds b; a request for a cannot take b's slot, so it waits — here until its deadline.
    let held = r
        .acquire("b", "t", Instant::now() + Duration::from_secs(5))
        .await
        .unwrap();
    let soon = Instant::now() + Duration::from_millis(200);
    let e = r.acquire("a", "t", soon).await.unwrap_err();
    assert_eq!(
        (e.status(), e.code.as_deref()),
        (504, Some("adapter_wait_timeout"))
    );
    assert_eq!(state(&r, "b"), "loaded");
    // Waiting is bounded: with two requests waiting, a third is refused at once (429).
    let (r1, r2) = (r.clone(), r.clone());
    let later = Instant::now() + Duration::from_millis(400);
    let w1 = tokio::spawn(async move { r1.acquire("a", "t", later).await.map(|_| ()) });
    let w2 = tokio::spawn(async move { r2.acquire("a", "t", later).await.map(|_| ()) });
    tokio::time::sleep(Duration::from_millis(100)).await;
    let e = r.acquire("a", "t", later).await.unwrap_err();
    assert_eq!((e.status(), e.code.as_deref()), (429, Some("adapter_queue_full")));
    assert_eq!(w1.await.unwrap().unwrap_err().status(), 504);
    assert_eq!(w2.await.unwrap().unwrap_err().status(), 504);
    // With a longer deadline it gets the slot as soon as b's request ends.
    let r2 = r.clone();
    let waiter = tokio::spawn(async move {
        r2.acquire("a", "t", Instant::now() + Duration::from_secs(10))
            .await
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(!waiter.is_finished(), "a waits while b is held");
    drop(held);
    let got = waiter.await.unwrap().unwrap();
    assert_eq!(got.identity.name, "a");
    assert_eq!((state(&r, "a"), state(&r, "b")), ("loaded", "evicted"));
    assert_eq!(r.resident(), 1);
}

#[tokio::test]
async fn a_request_racing_an_unload_gets_an_answer() {
    let t = tempfile::tempdir().unwrap();
    let r = registry(t.path(), 2);
    let mut a = spec(t.path(), "a", 1);
    a.tenants = vec!["team-a".into()];
    r.load(a).await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    let e = tokio::time::timeout(Duration::from_secs(5), r.acquire("a", "team-b", deadline))
        .await
        .expect("no deadlock")
        .unwrap_err();
    assert_eq!(e.status(), 403);
    assert!(r.unload("a").await);
    let e = tokio::time::timeout(Duration::from_secs(5), r.acquire("a", "team-a", deadline))
        .await
        .expect("no deadlock")
        .unwrap_err();
    assert_eq!(e.status(), 404);
    assert!(!r.unload("a").await);
}

#[tokio::test]
async fn a_name_is_loaded_by_one_call_at_a_time_and_other_names_are_not_held_up() {
    let t = tempfile::tempdir().unwrap();
    let r = registry(t.path(), 2);
    let first = super::registry::Loading::enter(&r, "a").unwrap();
    let e = super::registry::Loading::enter(&r, "a").err().unwrap();
    assert_eq!((e.status(), e.code.as_deref()), (503, Some("load_in_progress")));
    // Another name loads meanwhile.
    assert!(r.load(spec(t.path(), "b", 2)).await.unwrap().0);
    drop(first);
    assert!(r.load(spec(t.path(), "a", 1)).await.unwrap().0);
}
