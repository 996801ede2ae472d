//! `gen-model` end to end: the output is deterministic, loads with the engine (config, weights,
//! tokenizer, chat template, EOS ids), and the command line reports bad input.

use modelfleet_engine::ModelDir;
use modelfleet_engine::tokenizer::ChatMessage;
use modelfleet_runtime::gen_model::{GenDType, GenFormat, GenModelOptions, Shape, gen_model};
use std::path::Path;
use std::process::Command;

fn files(dir: &Path) -> Vec<(String, Vec<u8>)> {
    let mut v: Vec<(String, Vec<u8>)> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| {
            let e = e.unwrap();
            (
                e.file_name().to_string_lossy().into_owned(),
                std::fs::read(e.path()).unwrap(),
            )
        })
        .collect();
    v.sort();
    v
}

fn generate(shape: Shape, seed: u64, dtype: GenDType) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    gen_model(
        dir.path(),
        &GenModelOptions {
            shape,
            seed,
            dtype,
            format: GenFormat::Safetensors,
        },
    )
    .unwrap();
    dir
}

#[test]
fn output_is_a_pure_function_of_shape_seed_and_dtype() {
    let a = files(generate(Shape::Tiny, 3, GenDType::F32).path());
    let names: Vec<&str> = a.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(
        names,
        [
            "config.json",
            "generation_config.json",
            "model.safetensors",
            "tokenizer.json",
            "tokenizer_config.json"
        ]
    );
    assert_eq!(a, files(generate(Shape::Tiny, 3, GenDType::F32).path()));
    let b = files(generate(Shape::Tiny, 4, GenDType::F32).path());
    assert_eq!(a[0], b[0], "config does not depend on the seed");
    assert_ne!(a[2], b[2], "weights do");
    let h = files(generate(Shape::Tiny, 3, GenDType::Bf16).path());
    assert!(h[2].1.len() < a[2].1.len() * 6 / 10, "bf16 halves the weights");
}

#[test]
fn every_tiny_shape_loads_with_its_tokenizer_and_template() {
    for (shape, bos_prepended, eos) in [
        (Shape::Tiny, false, "<|im_end|>"),
        (Shape::TinyLlama3, true, "<|eot_id|>"),
        (Shape::TinyMistral, true, "</s>"),
        (Shape::TinyQwen2, false, "<|im_end|>"),
    ] {
        let dir = generate(shape, 1, GenDType::F16);
        let md = ModelDir::open(dir.path()).unwrap();
        let t = &md.tokenizer;
        assert_eq!(t.vocab_size(), md.config.vocab_size, "{shape:?}");
        assert!(
            md.eos_token_ids.contains(&t.token_to_id(eos).unwrap()),
            "{shape:?}"
        );
        let text = "Hello, wörld! 🚀";
        let ids = t.encode(text, true).unwrap();
        assert_eq!(
            ids[0] == md.config.bos_token_id.unwrap(),
            bos_prepended,
            "{shape:?}"
        );
        assert_eq!(t.decode(&ids, true).unwrap(), text);
        let chat = md.chat_template.as_ref().unwrap();
        let rendered = chat
            .render(&[ChatMessage::new("user", " Hi there ")], true)
            .unwrap();
        let untrimmed = ["\n Hi", "  Hi", "there  ", "there <"];
        assert!(rendered.contains("Hi there"), "{shape:?}: {rendered:?}");
        assert!(
            !untrimmed.iter().any(|u| rendered.contains(u)),
            "{shape:?}: content not trimmed: {rendered:?}"
        );
        let special = t.encode(&rendered, false).unwrap();
        assert!(
            special.iter().any(|&id| (id as usize) < 5),
            "{shape:?}: special tokens encode as one id"
        );
    }
}

#[test]
fn templates_raise_on_bad_conversations() {
    let dir = generate(Shape::TinyMistral, 1, GenDType::F32);
    let md = ModelDir::open(dir.path()).unwrap();
    let two_users = [ChatMessage::new("user", "a"), ChatMessage::new("user", "b")];
    let e = md
        .chat_template
        .as_ref()
        .unwrap()
        .render(&two_users, true)
        .unwrap_err()
        .to_string();
    assert!(e.contains("Conversation roles must alternate"), "{e}");
    let dir = generate(Shape::Tiny, 1, GenDType::F32);
    let md = ModelDir::open(dir.path()).unwrap();
    let e = md
        .chat_template
        .as_ref()
        .unwrap()
        .render(&[ChatMessage::new("robot", "x")], true)
        .unwrap_err();
    assert!(e.to_string().contains("Unknown role: robot"), "{e}");
}

#[test]
fn command_line_writes_a_model_and_rejects_unknown_shapes() {
    let bin = env!("CARGO_BIN_EXE_modelfleet-runtime");
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("m");
    let ok = Command::new(bin)
        .args([
            "gen-model",
            out.to_str().unwrap(),
            "--shape",
            "tiny-qwen2",
            "--seed",
            "5",
            "--dtype",
            "bf16",
        ])
        .output()
        .unwrap();
    assert!(ok.status.success(), "{}", String::from_utf8_lossy(&ok.stderr));
    assert!(ModelDir::open(&out).is_ok());
    let bad = Command::new(bin)
        .args(["gen-model", "x", "--shape", "gpt2", "--seed", "1"])
        .output()
        .unwrap();
    assert!(!bad.status.success());
    assert!(String::from_utf8_lossy(&bad.stderr).contains("gpt2"));
}
