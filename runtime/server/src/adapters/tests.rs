//! The registry without the server: residency under `max_cpu_loras` (eviction only of adapters no
//! request holds; a request for another waits until its deadline instead of failing), requests racing
//! an unload, `file://` sources copied (never linked) from the resolved path, and the start-up list
//! against a slow Hugging Face endpoint (a local listener).

use super::*;
use crate::gen_adapter::gen_adapter;
use crate::gen_model::{GenDType, GenFormat, GenModelOptions, Shape, gen_model};
use modelfleet_engine::ModelDir;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

fn registry(dir: &Path, max_cpu_loras: usize) -> Arc<Registry> {
    registry_with(dir, max_cpu_loras, |_| {})
}

/// The base model under `dir` (made once).
fn base_model(dir: &Path) -> std::path::PathBuf {
    let base = dir.join("base");
    if !base.exists() {
        let opts = GenModelOptions {
            shape: Shape::Tiny,
            seed: 1,
            dtype: GenDType::F32,
            format: GenFormat::Safetensors,
        };
        gen_model(&base, &opts).unwrap();
    }
    base
}

fn registry_with(dir: &Path, max_cpu_loras: usize, tweak: impl FnOnce(&mut RegistryConfig)) -> Arc<Registry> {
    let base = base_model(dir);
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
        fetch_limits: Default::default(),
    };
    let mut cfg = cfg;
    tweak(&mut cfg);
    std::fs::create_dir_all(dir.join("store")).unwrap();
    let config = ModelDir::open(&base).unwrap().config;
    Arc::new(Registry::new(cfg, config, "base".into(), metrics))
}

fn spec(dir: &Path, name: &str, seed: u64) -> AdapterSpec {
    let path = dir.join(name);
    gen_adapter(&path, &base_model(dir), 4, seed, &[]).unwrap();
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
    assert_eq!(e.status(), 404, "not allowed reads as not there");
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

#[tokio::test]
async fn a_file_source_is_copied_from_the_resolved_path_and_later_writes_do_not_reach_it() {
    let t = tempfile::tempdir().unwrap();
    let r = registry(t.path(), 2);
    let mut a = spec(t.path(), "a", 1);
    // Reached through a symlink under the root: read from the path that was checked.
    std::os::unix::fs::symlink(t.path().join("a"), t.path().join("via-link")).unwrap();
    a.uri = format!("file://{}/via-link", t.path().display());
    r.load(a.clone()).await.unwrap();
    // The source is rewritten in place (same inode) after the load: the store keeps what was verified.
    let weights = t.path().join("a/adapter_model.safetensors");
    let mut bytes = std::fs::read(&weights).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 0xff;
    std::fs::OpenOptions::new()
        .write(true)
        .open(&weights)
        .and_then(|mut f| std::io::Write::write_all(&mut f, &bytes))
        .unwrap();
    let stored = t
        .path()
        .join("store")
        .join(a.digest.trim_start_matches("sha256:"));
    assert_eq!(crate::digest::digest_path(&stored).unwrap(), a.digest);
}

/// A Hugging Face endpoint serving one adapter repository whose listing hangs while `hold` is set.
async fn hub(adapter: &Path, hold: Arc<std::sync::atomic::AtomicBool>) -> String {
    use axum::extract::Path as P;
    use axum::routing::get;
    let files: Arc<std::collections::BTreeMap<String, Vec<u8>>> = Arc::new(
        ["adapter_config.json", "adapter_model.safetensors"]
            .into_iter()
            .map(|f| (f.to_string(), std::fs::read(adapter.join(f)).unwrap()))
            .collect(),
    );
    let listing = {
        let files = files.clone();
        move || {
            let (files, hold) = (files.clone(), hold.clone());
            async move {
                while hold.load(std::sync::atomic::Ordering::SeqCst) {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                let siblings: Vec<_> = files
                    .keys()
                    .map(|f| serde_json::json!({"rfilename": f}))
                    .collect();
                axum::Json(serde_json::json!({"siblings": siblings}))
            }
        }
    };
    let file = move |P((_o, _r, _v, f)): P<(String, String, String, String)>| {
        let files = files.clone();
        async move { files.get(&f).cloned().unwrap_or_default() }
    };
    let app = axum::Router::new()
        .route("/api/models/{o}/{r}/revision/{v}", get(listing))
        .route("/{o}/{r}/resolve/{v}/{f}", get(file));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    format!("http://{addr}")
}

#[tokio::test]
async fn a_slow_start_up_adapter_does_not_hold_ready_and_loads_in_the_background() {
    use super::startup::{AdaptersFile, StartupPolicy, load_all};
    let t = tempfile::tempdir().unwrap();
    let fast = spec(t.path(), "fast", 1);
    let mut slow = spec(t.path(), "slow", 2);
    let hold = Arc::new(std::sync::atomic::AtomicBool::new(true));
    let endpoint = hub(&t.path().join("slow"), hold.clone()).await;
    slow.uri = "hf://org/slow@main".into();
    let r = registry_with(t.path(), 2, |cfg| {
        cfg.policy.schemes.push("hf".into());
        cfg.hf_endpoint = endpoint;
        cfg.fetch_limits.timeout = Some(Duration::from_millis(700));
    });
    let policy = StartupPolicy {
        concurrency: 2,
        deadline: Duration::from_millis(500),
    };
    let t0 = Instant::now();
    let file = AdaptersFile {
        adapters: vec![slow.clone(), fast.clone()],
    };
    load_all(r.clone(), file, policy).await;
    assert!(t0.elapsed() < Duration::from_secs(3), "{:?}", t0.elapsed());
    assert_eq!(
        state(&r, "fast"),
        "loaded",
        "loaded side by side with the slow one"
    );
    let listed = r.list().into_iter().find(|a| a.name == "slow").unwrap();
    assert_eq!(listed.state, "failed");
    assert!(
        listed.message.as_deref().unwrap().contains("start_up_deadline"),
        "{listed:?}"
    );
    // The source recovers: a retry in the background loads it.
    hold.store(false, std::sync::atomic::Ordering::SeqCst);
    let deadline = Instant::now() + Duration::from_secs(20);
    while state(&r, "slow") != "loaded" {
        assert!(Instant::now() < deadline, "{:?}", r.list());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(r.list().iter().all(|a| a.message.is_none()));
}
