//! The server driven by the official `openai` Python package (tests/python/test_openai_client.py):
//! chat and completions, streaming and not, seeds, stop strings, logprobs, errors, tenant-scoped
//! prefix caching and 200 dropped streams. Needs `python3` with `openai`, `httpx`
//! and `pytest` (installed by e2e/scripts/setup.sh).

mod common;

use std::process::Command;

#[test]
fn the_openai_python_client_works_against_the_server() {
    let server = common::start(
        &[
            "--max-num-seqs",
            "8",
            "--max-num-queued-reqs",
            "256",
            // One tenant opens 200 streams at once (the dropped-streams test): give it the whole queue
            // (by default a tenant may fill half of it when there are several).
            "--max-num-queued-reqs-per-tenant",
            "256",
            "--block-size",
            "4",
            "--num-kv-blocks",
            "2048",
        ],
        |dir| {
            let tenants = dir.join("tenants.yaml");
            std::fs::write(
                &tenants,
                "tenants:\n- id: team-a\n  apiKeys: [\"sk-team-a\"]\n- id: team-b\n  apiKeys: [\"sk-team-b\"]\n",
            )
            .unwrap();
            vec!["--tenants".into(), tenants.display().to_string()]
        },
    );
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/python/test_openai_client.py");
    let out = Command::new("python3")
        .args(["-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", "-s", script])
        .env("MF_BASE_URL", server.base())
        .env("MF_ADMIN_URL", server.admin_base())
        .env("MF_MODEL", "tiny")
        .env("MF_KEY_A", "sk-team-a")
        .env("MF_KEY_B", "sk-team-b")
        .output()
        .expect("python3 runs (install the test packages with e2e/scripts/setup.sh)");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    println!("{text}");
    assert!(out.status.success(), "the openai client tests failed:\n{text}");
}
