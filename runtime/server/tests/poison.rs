//! Poison requests: constraints built to exhaust the grammar compiler — the repros and their
//! family — against a real `serve` on the real SmolLM2 (Q4_1) with two tenants. Each is answered 200
//! or 400 within 2 s, the process stays alive (same pid, `/health` 200), and the other tenant is served
//! while they run and after.
//!
//! The families: chains of Lark rules and tokens, nested brackets, `$ref` chains through
//! `properties`, `anyOf`, `allOf` with siblings and `items` in `response_format`, `guided_json`,
//! `structured_outputs.json`, tool parameters and `%json` in a grammar, deep nesting in schema text,
//! and nested counted repetition in regexes (at the top level and as a schema `pattern`). Sizes sit on
//! both sides of the depth limit (2,048 levels: docs/api.md) and past the old crash points (700 rules,
//! 500 `$defs`).

mod common;
mod constraint_gen;

use constraint_gen::*;
use serde_json::{Value, json};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

const KEY_A: &str = "sk-poisoner-1";
const KEY_B: &str = "sk-bystander-1";

fn tenants(dir: &std::path::Path) -> Vec<String> {
    common::tenants_file(dir, &[("poisoner", KEY_A), ("bystander", KEY_B)])
}

fn client() -> reqwest::Client {
    common::client(Duration::from_secs(30))
}

/// A completion constrained by `field` = `value` (a `structured_outputs` field, or a top-level one).
fn completion(field: &str, value: Value) -> (String, Value) {
    let mut body = json!({"model": "smollm2", "prompt": "x", "max_tokens": 4, "temperature": 0});
    match field.strip_prefix("structured_outputs.") {
        Some(inner) => body["structured_outputs"] = json!({ inner: value }),
        None => body[field] = value,
    }
    ("/v1/completions".into(), body)
}

fn chat(extra: Value) -> (String, Value) {
    let mut body = json!({"model": "smollm2", "messages": [{"role": "user", "content": "hi"}],
                          "max_tokens": 4, "temperature": 0});
    for (k, v) in extra.as_object().unwrap() {
        body[k] = v.clone();
    }
    ("/v1/chat/completions".into(), body)
}

fn json_format(schema: Value) -> Value {
    json!({"response_format": {"type": "json_schema", "json_schema": {"name": "s", "schema": schema}}})
}

/// Either answer is right: compiled, or refused while decoding (a right-recursive chain this deep
/// fills a parser row past llguidance's 2,000 items as the model descends it).
const OK_OR_400: u16 = 0;

/// (name, request, the status it must get, or [`OK_OR_400`]).
fn family() -> Vec<(String, (String, Value), u16)> {
    let mut out = Vec::new();
    let mut case = |name: String, req: (String, Value), want: u16| out.push((name, req, want));
    for n in [300, 700, 1000, 2046] {
        case(
            format!("lark rule chain {n}"),
            completion("structured_outputs.grammar", lark_rule_chain(n).into()),
            OK_OR_400,
        );
    }
    case(
        "lark rule chain 2100".into(),
        completion("structured_outputs.grammar", lark_rule_chain(2100).into()),
        400,
    );
    case(
        "lark token chain 2100".into(),
        completion("guided_grammar", lark_token_chain(2100).into()),
        400,
    );
    case(
        "lark brackets 3000".into(),
        completion("structured_outputs.grammar", lark_brackets(3000).into()),
        400,
    );
    for how in ["properties", "anyOf", "allOf", "items"] {
        case(
            format!("$ref chain 500 via {how} in response_format"),
            chat(json_format(ref_chain(500, how))),
            200,
        );
        case(
            format!("$ref chain 1000 via {how} in response_format"),
            chat(json_format(ref_chain(1000, how))),
            400,
        );
    }
    case(
        "$ref chain 1000 in guided_json".into(),
        completion("guided_json", ref_chain(1000, "properties")),
        400,
    );
    case(
        "$ref chain 1000 as schema text".into(),
        completion(
            "structured_outputs.json",
            ref_chain(1000, "properties").to_string().into(),
        ),
        400,
    );
    case(
        "$ref chain 1000 in tool parameters".into(),
        chat(json!({"tools": tools_with(ref_chain(1000, "properties")), "tool_choice": "required"})),
        400,
    );
    case(
        "$ref chain 1000 in %json".into(),
        completion(
            "structured_outputs.grammar",
            format!("start: \"x\" %json {}\n", ref_chain(1000, "properties")).into(),
        ),
        400,
    );
    case(
        "schema text nested 200 deep".into(),
        completion(
            "structured_outputs.json",
            format!(
                "{}{}",
                "{\"items\":".repeat(200),
                "{}".to_string() + &"}".repeat(200)
            )
            .into(),
        ),
        400,
    );
    case(
        "nested schema 60 deep".into(),
        completion("guided_json", nested_schema(60)),
        200,
    );
    case(
        "regex (a{1000}){1000}".into(),
        completion("structured_outputs.regex", "(a{1000}){1000}".into()),
        400,
    );
    case(
        "regex ((a{100}){100}){100}".into(),
        completion("guided_regex", "((a{100}){100}){100}".into()),
        400,
    );
    case(
        "pattern (a{1000}){1000}".into(),
        completion(
            "guided_json",
            json!({"type": "object", "properties": {"s": {"type": "string", "pattern": "(a{1000}){1000}"}}, "required": ["s"]}),
        ),
        OK_OR_400,
    );
    case(
        "regex nested groups 1000".into(),
        completion(
            "guided_regex",
            format!("{}a{}", "(".repeat(1000), ")".repeat(1000)).into(),
        ),
        400,
    );
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn poison_constraints_are_answered_in_time_and_the_process_lives() {
    let server = common::Launch::smollm2(&[]).start(tenants);
    let (base, pid, http) = (server.base(), server.pid(), client());
    common::wait_ready(&server);

    // The bystander sends requests the whole time.
    let stop = Arc::new(AtomicBool::new(false));
    let (served, failed) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let bystander = {
        let (stop, served, failed, http, base) = (
            stop.clone(),
            served.clone(),
            failed.clone(),
            http.clone(),
            base.clone(),
        );
        tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                let r = http
                    .post(format!("{base}/v1/completions"))
                    .bearer_auth(KEY_B)
                    .json(&json!({"model": "smollm2", "prompt": "Once upon a time", "max_tokens": 4}))
                    .send()
                    .await;
                match r {
                    Ok(r) if r.status() == 200 => served.fetch_add(1, Ordering::Relaxed),
                    _ => failed.fetch_add(1, Ordering::Relaxed),
                };
            }
        })
    };

    let mut report = Vec::new();
    for (name, (path, body), want) in family() {
        let t = Instant::now();
        let r = http
            .post(format!("{base}{path}"))
            .bearer_auth(KEY_A)
            .json(&body)
            .send()
            .await
            .unwrap_or_else(|e| panic!("{name}: no answer ({e}): did the process die?"));
        let status = r.status().as_u16();
        let text = r.text().await.unwrap_or_default();
        let took = t.elapsed();
        report.push(format!("{name}: {status} in {took:?}"));
        if want == OK_OR_400 {
            assert!(status == 200 || status == 400, "{name}: {status} {text}");
        } else {
            assert_eq!(status, want, "{name}: {text}");
        }
        assert!(took < Duration::from_secs(2), "{name}: answered in {took:?}");
        if status == 400 {
            let v: Value = serde_json::from_str(&text).unwrap();
            assert!(
                v["error"]["param"].is_string(),
                "{name}: the 400 names its field: {text}"
            );
        }
        let health = http.get(format!("{base}/health")).send().await;
        assert!(
            health.is_ok_and(|h| h.status() == 200),
            "{name}: the process is gone"
        );
    }
    stop.store(true, Ordering::Relaxed);
    bystander.await.unwrap();
    println!("{}", report.join("\n"));
    // Still the same process, and the bystander was served during and after.
    assert_eq!(server.pid(), pid);
    let after = http
        .post(format!("{base}/v1/completions"))
        .bearer_auth(KEY_B)
        .json(&json!({"model": "smollm2", "prompt": "After", "max_tokens": 4}))
        .send()
        .await
        .unwrap();
    assert_eq!(after.status(), 200);
    let (ok, bad) = (served.load(Ordering::Relaxed), failed.load(Ordering::Relaxed));
    println!("bystander: {ok} served, {bad} failed during the poison requests");
    assert!(ok > 0 && bad == 0, "bystander: {ok} served, {bad} failed");
}
