//! Speculative decoding of structured-output (JSON-schema-constrained) requests on the served path. The
//! step-loop tests (greedy and seeded tokens equal to speculation off with n-gram and draft-model drafts,
//! valid outputs, grammar states released) are `runtime/engine/tests/spec_constrained.rs`.

mod common;

use modelfleet_testkit::fixtures::{OBJECT_SCHEMA, check_object_instance};

use serde_json::Value;

/// The served path: `serve --speculative-config` with a `response_format` JSON schema over HTTP gives
/// the content of a server without speculation, valid, and the speculation counters are on the admin
/// port's `/metrics` (the API port has none).
#[test]
fn served_constrained_requests_speculate_and_report_on_the_admin_port() {
    let spec = r#"{"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 1, "prompt_lookup_max": 3, "min_acceptance_rate": 0}"#;
    let on = common::start(&["--speculative-config", spec], |_| vec![]);
    let off = common::start(&[], |_| vec![]);
    let body = |i: u32| {
        serde_json::json!({
            "model": "tiny",
            "messages": [{"role": "user", "content": format!(
                "Give one like {{\"id\":{i},\"tags\":[\"a\",\"bb\"],\"ok\":true}} or {{\"id\":{},\"tags\":[\"ccc\"],\"ok\":false}}",
                i + 1
            )}],
            "temperature": 0,
            "max_tokens": 64,
            "response_format": {"type": "json_schema", "json_schema": {
                "name": "item", "schema": serde_json::from_str::<Value>(OBJECT_SCHEMA).unwrap()
            }}
        })
        .to_string()
    };
    let content = |port: u16, i: u32| {
        let (status, text) = common::http(port, "POST", "/v1/chat/completions", &[], &body(i));
        assert_eq!(status, 200, "{text}");
        let v: Value = serde_json::from_str(&text).unwrap();
        assert_eq!(v["choices"][0]["finish_reason"], "stop", "{v}");
        v["choices"][0]["message"]["content"]
            .as_str()
            .unwrap()
            .to_string()
    };
    for i in 0..3 {
        let got = content(on.port, i);
        check_object_instance(&got);
        assert_eq!(got, content(off.port, i), "request {i}: speculation on vs off");
    }
    let (status, metrics) = common::http(on.admin_port, "GET", "/metrics", &[], "");
    assert_eq!(status, 200);
    let counter = |name: &str| -> f64 {
        metrics
            .lines()
            .find(|l| l.starts_with(name) && !l.starts_with('#'))
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("{name} not in the admin port's /metrics:\n{metrics}"))
    };
    let drafted = counter("vllm:spec_decode_num_draft_tokens_total");
    let accepted = counter("vllm:spec_decode_num_accepted_tokens_total");
    assert!(
        drafted > 0.0 && accepted > 0.0,
        "drafted {drafted}, accepted {accepted}"
    );
    assert!(accepted <= drafted);
    assert_eq!(counter("modelfleet_spec_decode_draft_tokens_total"), drafted);
    // The step counters account for every position the model computed: the prompts' uncached tokens,
    // then per decode row the last committed token and its drafts. A row commits 1 + its accepted
    // drafts, or only the accepted ones when one of them ends the request (at most once a request);
    // a request's first token comes from its prompt's last position.
    let sum = |name: &str| -> f64 {
        metrics
            .lines()
            .filter(|l| l.starts_with(name) && !l.starts_with('#'))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum()
    };
    let requests = sum("modelfleet_requests_total");
    let prompt = sum("modelfleet_prompt_tokens_total") - sum("modelfleet_cached_prompt_tokens_total");
    let generated = sum("modelfleet_generation_tokens_total");
    let least = prompt + drafted + generated - accepted - requests;
    let positions = counter("modelfleet_engine_step_positions_total");
    assert!(
        (least..=least + requests).contains(&positions),
        "{positions} positions, expected {least} to {}: {metrics}",
        least + requests
    );
    assert!(counter("modelfleet_engine_steps_total") > 0.0);
    assert!(counter("modelfleet_engine_model_seconds_total") > 0.0);
    assert_eq!(
        counter("modelfleet_engine_draft_seconds_total"),
        0.0,
        "no draft model"
    );
    let (status, _) = common::http(on.port, "GET", "/metrics", &[], "");
    assert_ne!(status, 200, "/metrics is served on the admin port only");
}
