//! Multi-LoRA through `serve`: the admin API (load with digest verification and compatibility checks,
//! idempotence, generations, unload), per-tenant authorization and `/v1/models`, the URI policy, the
//! start-up adapters file gating `/ready`, eviction and digest-verified reloads under
//! `--max-cpu-loras`, and the per-adapter metrics.

mod common;

use common::http;
use modelfleet_runtime::gen_adapter::gen_adapter;
use serde_json::{Value, json};
use std::io::{Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

const ADMIN: &str = "admin-secret";

/// Writes the tenants file and admin token into `dir`; returns the serve flags for them.
fn auth_files(dir: &Path) -> Vec<String> {
    std::fs::write(
        dir.join("tenants.yaml"),
        "tenants:\n- id: team-a\n  apiKeys: [\"sk-team-a-1\"]\n- id: team-b\n  apiKeys: [\"sk-team-b-1\"]\n",
    )
    .unwrap();
    std::fs::write(dir.join("admin-token"), ADMIN).unwrap();
    vec![
        "--tenants".into(),
        dir.join("tenants.yaml").display().to_string(),
        "--admin-token-file".into(),
        dir.join("admin-token").display().to_string(),
        "--adapter-file-roots".into(),
        dir.join("adapters").display().to_string(),
    ]
}

/// A random adapter for the tiny model at `dir/tiny`, in `dir/adapters/<name>`; returns (path, digest).
fn adapter(dir: &Path, name: &str, rank: usize, seed: u64) -> (PathBuf, String) {
    let path = dir.join("adapters").join(name);
    gen_adapter(&path, &dir.join("tiny"), rank, seed, &[]).unwrap();
    let digest = modelfleet_runtime::digest::digest_path(&path).unwrap();
    (path, digest)
}

fn admin(s: &common::Server, method: &str, path: &str, body: &Value) -> (u16, Value) {
    let auth = format!("Bearer {ADMIN}");
    let (status, text) = http(
        s.admin_port,
        method,
        path,
        &[("Authorization", &auth)],
        &body.to_string(),
    );
    (status, serde_json::from_str(&text).unwrap_or(Value::Null))
}

fn load(s: &common::Server, name: &str, path: &Path, digest: &str, tenants: &[&str]) -> (u16, Value) {
    let body = json!({"name": name, "uri": format!("file://{}", path.display()), "digest": digest, "tenants": tenants});
    admin(s, "POST", "/v1/adapters", &body)
}

/// A greedy completion of `model` as the tenant with `key`: (status, text or error code, model field).
fn complete(s: &common::Server, key: &str, model: &str) -> (u16, String, String) {
    let body = json!({"model": model, "prompt": "Once upon a time", "max_tokens": 12, "temperature": 0});
    let auth = format!("Bearer {key}");
    let (status, text) = http(
        s.port,
        "POST",
        "/v1/completions",
        &[("Authorization", &auth)],
        &body.to_string(),
    );
    let v: Value = serde_json::from_str(&text).unwrap_or(Value::Null);
    let out = if status == 200 {
        v["choices"][0]["text"].as_str().unwrap_or_default().to_owned()
    } else {
        v["error"]["code"].as_str().unwrap_or_default().to_owned()
    };
    (status, out, v["model"].as_str().unwrap_or_default().to_owned())
}

/// A completion request's status and JSON body.
fn http_json(s: &common::Server, key: &str, model: &str) -> (u16, Value) {
    let body = json!({"model": model, "prompt": "Once upon a time", "max_tokens": 1});
    let auth = format!("Bearer {key}");
    let (status, text) = http(
        s.port,
        "POST",
        "/v1/completions",
        &[("Authorization", &auth)],
        &body.to_string(),
    );
    (status, serde_json::from_str(&text).unwrap_or(Value::Null))
}

fn models(s: &common::Server, key: &str) -> Vec<String> {
    let auth = format!("Bearer {key}");
    let (status, text) = http(s.port, "GET", "/v1/models", &[("Authorization", &auth)], "");
    assert_eq!(status, 200);
    let v: Value = serde_json::from_str(&text).unwrap();
    v["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["id"].as_str().unwrap().to_owned())
        .collect()
}

fn listed(s: &common::Server) -> Vec<(String, String)> {
    let (status, v) = admin(s, "GET", "/v1/adapters", &Value::Null);
    assert_eq!(status, 200);
    v["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| {
            (
                a["name"].as_str().unwrap().to_owned(),
                a["state"].as_str().unwrap().to_owned(),
            )
        })
        .collect()
}

fn metric(s: &common::Server, prefix: &str) -> f64 {
    let (_, text) = http(s.admin_port, "GET", "/metrics", &[], "");
    common::metric_sum(&text, prefix)
}

/// Flips one byte in the middle of `file`, in place (hard links see it too).
fn flip_byte(file: &Path) {
    let len = std::fs::metadata(file).unwrap().len();
    let mut f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(file)
        .unwrap();
    let mut b = [0u8; 1];
    f.seek(SeekFrom::Start(len / 2)).unwrap();
    std::io::Read::read_exact(&mut f, &mut b).unwrap();
    f.seek(SeekFrom::Start(len / 2)).unwrap();
    f.write_all(&[b[0] ^ 0x55]).unwrap();
}

#[test]
fn the_admin_api_loads_authorizes_replaces_and_unloads_adapters() {
    let s = common::start(&[], |dir| {
        std::fs::create_dir_all(dir.join("adapters")).unwrap();
        auth_files(dir)
    });
    let dir = s.dir.path().to_path_buf();
    let (a1, d1) = adapter(&dir, "a1", 8, 1);
    let (a2, d2) = adapter(&dir, "a2", 8, 2);
    let (a3, d3) = adapter(&dir, "a3", 8, 3);
    // Authentication first.
    let body = json!({"name": "a1", "uri": format!("file://{}", a1.display()), "digest": d1});
    let (status, _) = http(s.admin_port, "POST", "/v1/adapters", &[], &body.to_string());
    assert_eq!(status, 401);
    // Load, then load again (idempotent), and a second adapter for team-a only.
    let (status, v) = load(&s, "a1", &a1, &d1, &[]);
    assert_eq!(status, 201, "{v}");
    assert_eq!(
        (v["state"].as_str(), v["digest"].as_str()),
        (Some("loaded"), Some(d1.as_str()))
    );
    assert_eq!(load(&s, "a1", &a1, &d1, &[]).0, 200);
    assert_eq!(load(&s, "a2", &a2, &d2, &["team-a"]).0, 201);
    assert_eq!(
        listed(&s),
        vec![("a1".into(), "loaded".into()), ("a2".into(), "loaded".into())]
    );
    // Serving: each adapter differs from the base; the response names the adapter.
    let (st, base, _) = complete(&s, "sk-team-b-1", "tiny");
    assert_eq!(st, 200);
    let (st, out1, model) = complete(&s, "sk-team-b-1", "a1");
    assert_eq!((st, model.as_str()), (200, "a1"));
    assert_ne!(out1, base, "the adapter changes the output");
    // Authorization: team-b may not use a2 and does not see it: a2 answers it exactly as a name that
    // does not exist (no existence oracle).
    assert_eq!(complete(&s, "sk-team-b-1", "a2").0, 404);
    let (_, hidden) = http_json(&s, "sk-team-b-1", "a2");
    let (_, missing) = http_json(&s, "sk-team-b-1", "no-such-adapter");
    assert_eq!(
        hidden["error"]["code"], missing["error"]["code"],
        "{hidden} vs {missing}"
    );
    assert_eq!(
        hidden["error"]["message"].as_str().unwrap().replace("a2", "X"),
        missing["error"]["message"]
            .as_str()
            .unwrap()
            .replace("no-such-adapter", "X")
    );
    let (st, out2, _) = complete(&s, "sk-team-a-1", "a2");
    assert_eq!(st, 200);
    assert_ne!(out2, out1);
    assert_eq!(models(&s, "sk-team-b-1"), vec!["tiny", "a1"]);
    assert_eq!(models(&s, "sk-team-a-1"), vec!["tiny", "a1", "a2"]);
    // Refusals, each with its code, and nothing registered.
    let tampered = dir.join("adapters/tampered");
    common_copy(&a1, &tampered);
    flip_byte(&tampered.join("adapter_model.safetensors"));
    let (status, v) = load(&s, "bad", &tampered, &d1, &[]);
    assert_eq!(
        (status, v["error"]["code"].as_str()),
        (422, Some("digest_mismatch")),
        "{v}"
    );
    let (big, dbig) = adapter(&dir, "big", 32, 4);
    let (status, v) = load(&s, "big", &big, &dbig, &[]);
    assert_eq!(
        (status, v["error"]["code"].as_str()),
        (422, Some("incompatible")),
        "{v}"
    );
    assert!(
        v["error"]["message"].as_str().unwrap().contains("limit of 16"),
        "{v}"
    );
    let outside = tempfile::tempdir().unwrap();
    let (status, v) = load(&s, "out", outside.path(), &d1, &[]);
    assert_eq!(
        (status, v["error"]["code"].as_str()),
        (403, Some("uri_not_allowed")),
        "{v}"
    );
    let (status, v) = load(&s, "tiny", &a1, &d1, &[]);
    assert_eq!((status, v["error"]["param"].as_str()), (400, Some("name")), "{v}");
    assert_eq!(listed(&s).len(), 2, "refused adapters are not listed");
    // A new generation of a2 (a3's bytes) serves what a3 serves.
    assert_eq!(load(&s, "a3", &a3, &d3, &[]).0, 201);
    let (_, out3, _) = complete(&s, "sk-team-a-1", "a3");
    assert_eq!(
        load(&s, "a2", &a3, &d3, &["team-a"]).0,
        201,
        "same name, new digest"
    );
    assert_eq!(complete(&s, "sk-team-a-1", "a2").1, out3);
    // Metrics per adapter, and vLLM's info gauge.
    assert!(metric(&s, "modelfleet_lora_loads_total{adapter=\"a1\"") >= 1.0);
    let (_, text) = http(s.admin_port, "GET", "/metrics", &[], "");
    assert!(text.contains("vllm:lora_requests_info{"), "{text}");
    assert!(text.contains("modelfleet_lora_load_seconds_count"), "{text}");
    // Unload: gone for clients and from the list; a second unload is a 404.
    let (status, v) = admin(&s, "DELETE", "/v1/adapters/a1", &Value::Null);
    assert_eq!((status, v["deleted"].as_bool()), (200, Some(true)));
    assert_eq!(complete(&s, "sk-team-b-1", "a1").0, 404);
    let (status, v) = admin(&s, "DELETE", "/v1/adapters/a1", &Value::Null);
    assert_eq!(
        (status, v["error"]["code"].as_str()),
        (404, Some("adapter_not_found"))
    );
    assert!(!listed(&s).iter().any(|(n, _)| n == "a1"));
}

fn common_copy(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let p = e.unwrap().path();
        std::fs::copy(&p, to.join(p.file_name().unwrap())).unwrap();
    }
}

#[test]
fn start_up_adapters_gate_ready_and_evicted_adapters_reload_verified() {
    let s = common::start(&["--max-loras", "1", "--max-cpu-loras", "1"], |dir| {
        std::fs::create_dir_all(dir.join("adapters")).unwrap();
        let mut flags = auth_files(dir);
        let (a1, d1) = adapter(dir, "a1", 8, 1);
        let (a2, d2) = adapter(dir, "a2", 8, 2);
        let file = json!({"adapters": [
            {"name": "a1", "uri": format!("file://{}", a1.display()), "digest": d1},
            {"name": "a2", "uri": format!("file://{}", a2.display()), "digest": d2, "tenants": ["team-a"]},
            {"name": "wrong", "uri": format!("file://{}", a2.display()), "digest": d1},
        ]});
        std::fs::write(dir.join("adapters.json"), file.to_string()).unwrap();
        flags.extend([
            "--adapters-file".into(),
            dir.join("adapters.json").display().to_string(),
            "--adapter-dir".into(),
            dir.join("store").display().to_string(),
        ]);
        flags
    });
    common::wait_ready(&s);
    let mut states = listed(&s);
    states.sort();
    // One memory slot: whichever of the two (loaded side by side) finished last evicted the other; the
    // bad entry is listed as failed.
    let (a1, a2) = (states[0].1.as_str(), states[1].1.as_str());
    assert!(
        matches!((a1, a2), ("evicted", "loaded") | ("loaded", "evicted")),
        "{states:?}"
    );
    assert_eq!(
        (states[0].0.as_str(), states[1].0.as_str(), &states[2]),
        ("a1", "a2", &("wrong".to_string(), "failed".to_string()))
    );
    let (_, v) = admin(&s, "GET", "/v1/adapters", &Value::Null);
    let wrong = v["data"]
        .as_array()
        .unwrap()
        .iter()
        .find(|a| a["name"] == "wrong")
        .unwrap();
    assert!(
        wrong["message"].as_str().unwrap().contains("digest_mismatch"),
        "{wrong}"
    );
    // Alternating requests reload each adapter in turn (verified again), with the same outputs.
    let evictions0 = metric(&s, "modelfleet_lora_evictions_total");
    let (st, x1, _) = complete(&s, "sk-team-a-1", "a1");
    assert_eq!(st, 200);
    let (st, y1, _) = complete(&s, "sk-team-a-1", "a2");
    assert_eq!(st, 200);
    assert_eq!(complete(&s, "sk-team-a-1", "a1").1, x1);
    assert_eq!(complete(&s, "sk-team-a-1", "a2").1, y1);
    assert!(metric(&s, "modelfleet_lora_evictions_total") >= evictions0 + 3.0);
    // Bytes changed on disk while evicted: the reload refuses them, the adapter is marked failed.
    let (_, v) = admin(&s, "GET", "/v1/adapters", &Value::Null);
    let a1 = v["data"]
        .as_array()
        .unwrap()
        .iter()
        .find(|a| a["name"] == "a1")
        .unwrap();
    assert_eq!(a1["state"], "evicted");
    let hex = a1["digest"]
        .as_str()
        .unwrap()
        .trim_start_matches("sha256:")
        .to_owned();
    flip_byte(
        &s.dir
            .path()
            .join("store")
            .join(hex)
            .join("adapter_model.safetensors"),
    );
    let (st, code, _) = complete(&s, "sk-team-a-1", "a1");
    assert_eq!((st, code.as_str()), (503, "adapter_unavailable"));
    assert!(listed(&s).contains(&("a1".into(), "failed".into())));
    // The other adapter is unaffected.
    assert_eq!(complete(&s, "sk-team-a-1", "a2").1, y1);
}
