//! A thinking model over HTTP: the generated `tiny-qwen3` (its Qwen3-style template and `<think>`
//! tokens) served for real. `chat_template_kwargs` reach the template (`enable_thinking: false` adds
//! the empty think block to the prompt: `usage.prompt_tokens` is the tokenizer's count of the template
//! rendered with it), bad ones are 400s naming the field, and an answer that holds a think block — made
//! so honestly by a regex constraint, since random weights never emit `<think>` on their own — comes
//! back split into `reasoning_content` and `content`, the same whole and streamed; with the official
//! `openai` package too, when `python3` has it.

mod common;

use modelfleet_engine::ModelDir;
use modelfleet_engine::tokenizer::ChatMessage;
use modelfleet_runtime::gen_model::{GenDType, GenFormat, GenModelOptions, Shape, gen_model};
use serde_json::{Value, json};

fn qwen3() -> common::Server {
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("qwen3");
    let opts = GenModelOptions {
        shape: Shape::TinyQwen3,
        seed: 7,
        dtype: GenDType::F32,
        format: GenFormat::Safetensors,
    };
    gen_model(&model, &opts).unwrap();
    let args = ["--threads", "1", "--max-model-len", "512"];
    common::Launch::model(dir, model, "qwen3", &args).start(|_| Vec::new())
}

fn post(s: &common::Server, body: &Value) -> (u16, Value) {
    let (status, text) = common::http(s.port, "POST", "/v1/chat/completions", &[], &body.to_string());
    (status, serde_json::from_str(&text).unwrap_or(Value::String(text)))
}

fn request(extra: Value) -> Value {
    let mut body = json!({"model": "qwen3", "messages": [{"role": "user", "content": "What is 2+2?"}],
        "max_tokens": 1, "temperature": 0});
    for (k, v) in extra.as_object().unwrap() {
        body[k] = v.clone();
    }
    body
}

/// The server's prompt, rendered and tokenized here with the model's own template and tokenizer.
fn expected_prompt_tokens(s: &common::Server, kwargs: Option<&Value>) -> u64 {
    let md = ModelDir::open(&s.model).unwrap();
    let text = md
        .chat_template
        .as_ref()
        .unwrap()
        .render_with(
            &[ChatMessage::new("user", "What is 2+2?")],
            None,
            true,
            kwargs.and_then(Value::as_object),
        )
        .unwrap();
    md.tokenizer.encode(&text, false).unwrap().len() as u64
}

#[test]
fn template_kwargs_reach_the_template_and_bad_ones_are_named() {
    let s = qwen3();
    let (status, on) = post(&s, &request(json!({})));
    assert_eq!(status, 200, "{on}");
    let off_kwargs = json!({"enable_thinking": false});
    let (status, off) = post(&s, &request(json!({"chat_template_kwargs": off_kwargs})));
    assert_eq!(status, 200, "{off}");
    let (p_on, p_off) = (
        on["usage"]["prompt_tokens"].as_u64().unwrap(),
        off["usage"]["prompt_tokens"].as_u64().unwrap(),
    );
    assert_eq!(p_on, expected_prompt_tokens(&s, None));
    assert_eq!(p_off, expected_prompt_tokens(&s, Some(&off_kwargs)));
    assert!(
        p_off > p_on,
        "the empty think block is in the prompt: {p_off} vs {p_on}"
    );
    for (kwargs, param) in [
        (json!({"messages": []}), "chat_template_kwargs.messages"),
        (
            json!({"add_generation_prompt": false}),
            "chat_template_kwargs.add_generation_prompt",
        ),
        (
            json!({"not-an-identifier": 1}),
            "chat_template_kwargs.not-an-identifier",
        ),
        (json!([1, 2]), "chat_template_kwargs"),
        (json!({"big": "x".repeat(17 << 10)}), "chat_template_kwargs"),
    ] {
        let (status, e) = post(&s, &request(json!({"chat_template_kwargs": kwargs})));
        assert_eq!(status, 400, "{e}");
        assert_eq!(e["error"]["param"], param, "{e}");
    }
}

/// A think block of 3–12 letters, then an answer of 2–8: what the regex lets the model choose.
const THINKING: &str = "<think>[a-z]{3,12}</think>\n\n[a-z]{2,8}";

fn constrained(stream: bool) -> Value {
    request(
        json!({"max_tokens": 64, "guided_regex": THINKING, "stream": stream,
        "stream_options": if stream { json!({"include_usage": true}) } else { Value::Null }}),
    )
}

/// The SSE events' JSON payloads.
fn events(body: &str) -> Vec<Value> {
    body.lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .filter(|d| *d != "[DONE]")
        .map(|d| serde_json::from_str(d).unwrap())
        .collect()
}

#[test]
fn a_think_block_comes_back_as_reasoning_content_whole_and_streamed() {
    let s = qwen3();
    let (status, whole) = post(&s, &constrained(false));
    assert_eq!(status, 200, "{whole}");
    let m = &whole["choices"][0]["message"];
    let reasoning = m["reasoning_content"].as_str().unwrap();
    let content = m["content"].as_str().unwrap();
    assert!(
        (3..=12).contains(&reasoning.len()) && reasoning.chars().all(|c| c.is_ascii_lowercase()),
        "{m}"
    );
    assert!(
        (2..=8).contains(&content.len()) && content.chars().all(|c| c.is_ascii_lowercase()),
        "{m}"
    );
    assert_eq!(whole["choices"][0]["finish_reason"], "stop");
    let (status, body) = common::http(
        s.port,
        "POST",
        "/v1/chat/completions",
        &[],
        &constrained(true).to_string(),
    );
    assert_eq!(status, 200, "{body}");
    let (mut r, mut c, mut usage) = (String::new(), String::new(), Value::Null);
    for e in events(&body) {
        if !e["usage"].is_null() {
            usage = e["usage"].clone();
        }
        for ch in e["choices"].as_array().unwrap() {
            let d = &ch["delta"];
            assert!(
                !d.to_string().contains("<think>") && !d.to_string().contains("</think>"),
                "{d}"
            );
            r.push_str(d["reasoning_content"].as_str().unwrap_or(""));
            c.push_str(d["content"].as_str().unwrap_or(""));
        }
    }
    assert_eq!(
        (r.as_str(), c.as_str()),
        (reasoning, content),
        "greedy: the same answer"
    );
    // (`cached_tokens` differs: the second request found the first's prompt in the prefix cache.)
    for k in ["prompt_tokens", "completion_tokens", "total_tokens"] {
        assert_eq!(
            usage[k], whole["usage"][k],
            "{k}: every token counts, reasoning included"
        );
    }
    assert!(
        whole["usage"]["completion_tokens"].as_u64().unwrap() >= 4,
        "{}",
        whole["usage"]
    );
    // The official client sees the field (`model_extra`), when python3 has the package.
    let script = format!(
        "import openai,sys\nc=openai.OpenAI(base_url='{}/v1',api_key='x')\n\
         r=c.chat.completions.create(model='qwen3',messages=[{{'role':'user','content':'What is 2+2?'}}],\
         max_tokens=64,temperature=0,extra_body={{'guided_regex':{:?}}})\n\
         m=r.choices[0].message\nprint(m.reasoning_content, m.content)",
        s.base(),
        THINKING
    );
    match std::process::Command::new("python3")
        .args(["-c", &script])
        .output()
    {
        Ok(out) if out.status.success() => {
            assert_eq!(
                String::from_utf8_lossy(&out.stdout).trim(),
                format!("{reasoning} {content}")
            );
        }
        Ok(out) => {
            let err = String::from_utf8_lossy(&out.stderr);
            assert!(
                err.contains("No module named 'openai'"),
                "the openai client failed: {err}"
            );
            eprintln!("python3 has no openai package: client check skipped");
        }
        Err(_) => eprintln!("no python3: client check skipped"),
    }
}
