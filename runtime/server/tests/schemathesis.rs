//! `schemathesis` (installed by e2e/scripts/setup.sh) fuzzes every operation of `/openapi.json` on a
//! running server: no 5xx, no status code, content type, header or body that the document does not
//! declare, authentication enforced, and schema-violating requests refused. (Its "schema-valid request
//! rejected" check is left out: the server refuses some schema-valid values on purpose — a token id
//! outside the vocabulary, a prompt longer than the context — with a 400 or 413 naming the field.)

mod common;

use std::process::Command;

#[test]
fn schemathesis_finds_no_server_error_and_no_undocumented_response() {
    let server = common::start(&["--max-model-len", "256"], |dir| {
        let tenants = dir.join("tenants.yaml");
        std::fs::write(
            &tenants,
            "tenants:\n- id: fuzz\n  apiKeys: [\"sk-fuzz-tenant\"]\n",
        )
        .unwrap();
        vec!["--tenants".into(), tenants.display().to_string()]
    });
    // schemathesis writes a `.schemathesis/` cache into its working directory: keep it out of the tree.
    let scratch = tempfile::tempdir().unwrap();
    let out = Command::new("schemathesis")
        .current_dir(scratch.path())
        .arg("run")
        .arg(format!("{}/openapi.json", server.base()))
        .args(["--checks", "all", "--exclude-checks", "positive_data_acceptance"])
        .args(["-H", "Authorization: Bearer sk-fuzz-tenant"])
        .args(["--max-examples", "60", "--generation-deterministic"])
        .env("NO_COLOR", "1")
        .output()
        .expect("schemathesis runs (install the test packages with e2e/scripts/setup.sh)");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    println!("{text}");
    assert!(out.status.success(), "schemathesis found failures:\n{text}");
    // Every operation of the API port: chat, completions, models, tokenize, detokenize, health, ready
    // (`/metrics` is on the admin port, outside this document).
    assert!(
        text.contains("Operations:") && text.contains("7 selected"),
        "{text}"
    );
}
