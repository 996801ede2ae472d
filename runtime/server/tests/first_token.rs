//! The first-token deadline (`x-modelfleet-first-token-deadline-ms`, docs/api.md): a request that has
//! not sampled its first token in time is answered 504 `first_token_deadline` at the deadline —
//! whether it waited in the engine's queue or in a held (`--fault-delay-ms`) handler, one choice or a
//! fan-out of several — with nothing generated and nothing left running; one that started in time is not cut; a bad value is a 400
//! naming the header.

mod common;

use serde_json::{Value, json};
use std::path::Path;
use std::time::{Duration, Instant};

const HEADER: &str = modelfleet_api::deadline::HEADER;

fn tenants(dir: &Path) -> Vec<String> {
    common::tenants_file(dir, &[("team-a", "sk-team-a")])
}

async fn complete(base: &str, body: Value, deadline_ms: Option<&str>) -> (u16, Value, Duration) {
    let c = common::client(Duration::from_secs(60));
    let mut r = c
        .post(format!("{base}/v1/completions"))
        .bearer_auth("sk-team-a")
        .json(&body);
    if let Some(ms) = deadline_ms {
        r = r.header(HEADER, ms);
    }
    let t0 = Instant::now();
    let resp = r.send().await.unwrap();
    let status = resp.status().as_u16();
    let v: Value = resp.json().await.unwrap();
    (status, v, t0.elapsed())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queued_request_past_its_first_token_deadline_is_refused_and_the_running_one_goes_on() {
    let s = common::start(&["--max-num-seqs", "1"], tenants);
    let base = s.base();
    // Long answers hold the only sequence slot, one after another …
    let long = json!({"model": "tiny", "prompt": "hello", "max_tokens": 2000, "ignore_eos": true});
    let holders: Vec<_> = (0..10)
        .map(|_| {
            let (base, long) = (base.clone(), long.clone());
            tokio::spawn(async move { complete(&base, long, Some("60000")).await })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(200)).await;
    // … so the next one waits in the queue past its 200 ms deadline.
    let short = json!({"model": "tiny", "prompt": "hi", "max_tokens": 4});
    let (status, v, took) = complete(&base, short.clone(), Some("200")).await;
    assert_eq!(status, 504, "{v}");
    assert_eq!(v["error"]["code"], "first_token_deadline", "{v}");
    assert!(v["error"]["message"].as_str().unwrap().contains("200 ms"), "{v}");
    assert!(
        took < Duration::from_secs(3),
        "answered at the deadline, not later: {took:?}"
    );
    // A fan-out (two choices) is kept to the deadline as a whole, streamed or not.
    for stream in [false, true] {
        let fan = json!({"model": "tiny", "prompt": "hi", "max_tokens": 4, "n": 2, "stream": stream});
        let (status, v, took) = complete(&base, fan, Some("200")).await;
        assert_eq!(status, 504, "{v}");
        assert_eq!(v["error"]["code"], "first_token_deadline", "{v}");
        assert!(took < Duration::from_secs(3), "{took:?}");
    }
    // The holders each had their first token in time: they run to their end.
    for h in holders {
        let (status, v, _) = h.await.unwrap();
        assert_eq!(status, 200, "{v}");
        assert_eq!(v["usage"]["completion_tokens"], 2000, "{v}");
    }
    // Nothing was left behind: the next request with a deadline is served.
    let (status, v, _) = complete(&base, short, Some("30000")).await;
    assert_eq!(status, 200, "{v}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_held_request_is_refused_at_its_deadline_and_bad_values_name_the_header() {
    let flags = ["--enable-fault-injection", "--fault-delay-ms", "5000"];
    let s = common::start(&flags, tenants);
    let body = json!({"model": "tiny", "prompt": "hi", "max_tokens": 2});
    let (status, v, took) = complete(&s.base(), body.clone(), Some("300")).await;
    assert_eq!(status, 504, "{v}");
    assert_eq!(v["error"]["code"], "first_token_deadline", "{v}");
    assert!(took < Duration::from_secs(3), "not held the whole 5 s: {took:?}");
    for bad in ["0", "1.5", "600001", "soon"] {
        let (status, v, _) = complete(&s.base(), body.clone(), Some(bad)).await;
        assert_eq!(status, 400, "{bad}: {v}");
        assert!(v["error"]["message"].as_str().unwrap().contains(HEADER), "{v}");
    }
}
