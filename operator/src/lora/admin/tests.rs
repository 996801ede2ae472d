//! The admin client against the fake runtime admin API (real HTTP on loopback), and the error mapping
//! as a table.

use super::*;
use crate::labels::ADMIN_PORT;
use crate::lora::fake::{FakeAdmin, TOKEN};

fn entry(name: &str, digest: &str) -> AdapterSpec {
    AdapterSpec {
        name: name.into(),
        uri: format!("file:///adapters/{name}"),
        digest: digest.into(),
        tenants: vec!["team-a".into()],
    }
}

const D1: &str = "sha256:1111111111111111111111111111111111111111111111111111111111111111";
const D2: &str = "sha256:2222222222222222222222222222222222222222222222222222222222222222";

#[test]
fn error_codes_map_to_condition_reasons() {
    let cases = [
        (422, Some("digest_mismatch"), Reason::DigestMismatch),
        (422, Some("incompatible"), Reason::Incompatible),
        (422, Some("invalid_artifact"), Reason::Incompatible),
        (403, Some("uri_not_allowed"), Reason::LoadFailed),
        (502, Some("source_unavailable"), Reason::LoadFailed),
        (400, Some("invalid_request"), Reason::LoadFailed),
        (401, Some("invalid_api_key"), Reason::LoadFailed),
        (500, None, Reason::LoadFailed),
        (501, Some("adapters_not_supported"), Reason::LoadFailed),
    ];
    for (status, code, expected) in cases {
        assert_eq!(classify(status, code), expected, "{status} {code:?}");
    }
    assert!(Reason::DigestMismatch.is_verification() && Reason::Incompatible.is_verification());
    assert!(!Reason::LoadFailed.is_verification());
}

#[test]
fn error_messages_name_the_code_and_are_bounded() {
    let body = r#"{"error":{"message":"rank 64 over the limit 16","type":"invalid_request_error","param":null,"code":"incompatible"}}"#;
    let e = error_from_answer(422, body);
    assert_eq!(
        e,
        AdminError {
            reason: Reason::Incompatible,
            message: "422 incompatible: rank 64 over the limit 16".into()
        }
    );
    let e = error_from_answer(502, "<html>bad gateway</html>");
    assert_eq!(e.message, "502: <html>bad gateway</html>");
    let long = format!(
        r#"{{"error":{{"message":"{}","code":"source_unavailable"}}}}"#,
        "é".repeat(2000)
    );
    let e = error_from_answer(502, &long);
    assert!(e.message.len() <= MAX_MESSAGE && e.message.ends_with("..."));
    // A 401 says what happened without echoing anything from the request.
    let e = error_from_answer(
        401,
        r#"{"error":{"message":"bad token","code":"invalid_api_key"}}"#,
    );
    assert_eq!(e.message, "the pod refused the operator's admin token (401)");
}

#[test]
fn the_token_never_prints_and_names_are_path_safe() {
    let t = AdminToken::new(TOKEN.into());
    assert!(!format!("{t:?}").contains(TOKEN));
    assert_eq!(path_segment("org/sql-v2:1"), "org%2Fsql-v2%3A1");
    assert_eq!(base_url("127.1.0.3", ADMIN_PORT), "http://127.1.0.3:8001");
    assert_eq!(base_url("fd00::3", ADMIN_PORT), "http://[fd00::3]:8001");
}

#[tokio::test]
async fn load_and_unload_follow_the_contract() {
    let fake = FakeAdmin::start().await;
    let http = http_client();
    let token = AdminToken::new(TOKEN.into());
    let t = Timeouts::default();
    // 201 when new, 200 when the same name and digest are loaded again: both success.
    load(&http, &fake.base, &token, &entry("sql", D1), t.load)
        .await
        .unwrap();
    load(&http, &fake.base, &token, &entry("sql", D1), t.load)
        .await
        .unwrap();
    {
        let s = fake.state.lock().unwrap();
        let body = &s.requests[0].2;
        assert_eq!(
            body,
            &serde_json::json!({"name": "sql", "uri": "file:///adapters/sql", "digest": D1, "tenants": ["team-a"]})
        );
    }
    // A digest the runtime refuses.
    fake.state.lock().unwrap().bad_digests.insert(D2.into());
    let e = load(&http, &fake.base, &token, &entry("tone", D2), t.load)
        .await
        .unwrap_err();
    assert_eq!(e.reason, Reason::DigestMismatch);
    assert!(e.message.starts_with("422 digest_mismatch: "), "{}", e.message);
    // Unload: 200, then 404 adapter_not_found, which is done as well.
    unload(&http, &fake.base, &token, "sql", t.unload).await.unwrap();
    unload(&http, &fake.base, &token, "sql", t.unload).await.unwrap();
    assert!(fake.state.lock().unwrap().loaded.is_empty());
    // A wrong token.
    let wrong = AdminToken::new("f".repeat(64));
    let e = load(&http, &fake.base, &wrong, &entry("sql", D1), t.load)
        .await
        .unwrap_err();
    assert_eq!(e.reason, Reason::LoadFailed);
    assert!(!e.message.contains(&"f".repeat(64)));
    let e = unload(&http, &fake.base, &wrong, "sql", t.unload)
        .await
        .unwrap_err();
    assert!(e.message.contains("401"), "{}", e.message);
}

#[tokio::test]
async fn timeouts_and_refused_connections_are_load_failures() {
    let fake = FakeAdmin::start().await;
    fake.state.lock().unwrap().delay = Duration::from_secs(5);
    let http = http_client();
    let token = AdminToken::new(TOKEN.into());
    let started = std::time::Instant::now();
    let e = load(
        &http,
        &fake.base,
        &token,
        &entry("sql", D1),
        Duration::from_millis(200),
    )
    .await
    .unwrap_err();
    assert!(started.elapsed() < Duration::from_secs(2));
    assert_eq!(
        e,
        AdminError {
            reason: Reason::LoadFailed,
            message: "no answer from the admin API within 200ms".into()
        }
    );
    // Nothing listens on a port just released.
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = closed.local_addr().unwrap();
    drop(closed);
    let e = unload(
        &http,
        &format!("http://{addr}"),
        &token,
        "sql",
        Duration::from_secs(2),
    )
    .await
    .unwrap_err();
    assert_eq!(e.message, "cannot connect to the admin API");
}
