//! The call table: decisions as a table over exact times, superseded outcomes, and real calls to fake
//! pods (a slow pod does not hold up another).

use super::*;
use crate::lora::admin::Reason;
use crate::lora::fake::{FakeAdmin, TOKEN};
use futures::StreamExt;

fn want(kind: Kind, restarts: i32) -> Want {
    Want {
        kind,
        entry: AdapterSpec {
            name: "sql".into(),
            uri: "file:///adapters/sql".into(),
            digest: format!("sha256:{}", "1".repeat(64)),
            tenants: vec![],
        },
        restarts,
    }
}

fn failed(reason: Reason) -> Option<Result<(), AdminError>> {
    Some(Err(AdminError {
        reason,
        message: "x".into(),
    }))
}

fn op(w: Want, result: Option<Result<(), AdminError>>, failures: u32, finished: Option<Instant>) -> Op {
    Op {
        want: w,
        result,
        failures,
        finished,
        seq: 1,
    }
}

#[test]
fn decisions() {
    let t0 = Instant::now();
    let s = Duration::from_secs;
    let load = want(Kind::Load, 0);
    let restarted = want(Kind::Load, 1);
    let unload = want(Kind::Unload, 0);
    // (last call, want, seconds since it finished, expected)
    let cases: Vec<(Option<Op>, &Want, u64, Next)> = vec![
        (None, &load, 0, Next::Start),
        (Some(op(load.clone(), None, 0, None)), &load, 0, Next::Idle),
        // A call for an older want still runs: one call per pair at a time.
        (
            Some(op(want(Kind::Load, 0), None, 0, None)),
            &restarted,
            0,
            Next::Idle,
        ),
        // The runtime restarted, or the spec changed: ask again at once.
        (
            Some(op(load.clone(), Some(Ok(())), 0, Some(t0))),
            &restarted,
            0,
            Next::Start,
        ),
        (
            Some(op(load.clone(), Some(Ok(())), 0, Some(t0))),
            &unload,
            0,
            Next::Start,
        ),
        // Loaded: resync later.
        (
            Some(op(load.clone(), Some(Ok(())), 0, Some(t0))),
            &load,
            10,
            Next::After(s(590)),
        ),
        (
            Some(op(load.clone(), Some(Ok(())), 0, Some(t0))),
            &load,
            600,
            Next::Start,
        ),
        // Failed loads back off, doubling, capped.
        (
            Some(op(load.clone(), failed(Reason::LoadFailed), 1, Some(t0))),
            &load,
            0,
            Next::After(s(5)),
        ),
        (
            Some(op(load.clone(), failed(Reason::LoadFailed), 3, Some(t0))),
            &load,
            0,
            Next::After(s(20)),
        ),
        (
            Some(op(load.clone(), failed(Reason::LoadFailed), 3, Some(t0))),
            &load,
            20,
            Next::Start,
        ),
        (
            Some(op(load.clone(), failed(Reason::LoadFailed), 30, Some(t0))),
            &load,
            0,
            Next::After(s(300)),
        ),
        // The bytes were refused: the same bytes fail the same way, so wait long.
        (
            Some(op(load.clone(), failed(Reason::DigestMismatch), 1, Some(t0))),
            &load,
            1,
            Next::After(s(599)),
        ),
        (
            Some(op(load.clone(), failed(Reason::Incompatible), 1, Some(t0))),
            &load,
            600,
            Next::Start,
        ),
        // Unloads: done is done; failures retry a few times, then give up.
        (
            Some(op(unload.clone(), Some(Ok(())), 0, Some(t0))),
            &unload,
            0,
            Next::Idle,
        ),
        (
            Some(op(unload.clone(), failed(Reason::LoadFailed), 1, Some(t0))),
            &unload,
            0,
            Next::After(s(2)),
        ),
        (
            Some(op(unload.clone(), failed(Reason::LoadFailed), 2, Some(t0))),
            &unload,
            4,
            Next::Start,
        ),
        (
            Some(op(unload.clone(), failed(Reason::LoadFailed), 3, Some(t0))),
            &unload,
            100,
            Next::Idle,
        ),
    ];
    for (i, (last, w, after, expected)) in cases.into_iter().enumerate() {
        assert_eq!(next(last.as_ref(), w, t0 + s(after)), expected, "case {i}");
    }
}

#[test]
fn only_the_latest_call_records_and_progress_follows_the_want() {
    let mut ops = Ops::default();
    let key = Key {
        adapter: "a".into(),
        pod: "p".into(),
    };
    let w = want(Kind::Load, 0);
    assert_eq!(ops.progress(&key, &w), Progress::InFlight);
    let (first, _) = ops.begin(key.clone(), w.clone());
    let (second, _) = ops.begin(key.clone(), w.clone());
    let err = AdminError {
        reason: Reason::LoadFailed,
        message: "cannot connect to the admin API".into(),
    };
    assert!(!ops.end(&key, first, Err(err.clone()), Instant::now()));
    assert!(ops.end(&key, second, Err(err.clone()), Instant::now()));
    assert_eq!(
        ops.progress(&key, &w),
        Progress::Failed {
            error: err.clone(),
            settled: false
        }
    );
    assert_eq!(ops.get(&key).unwrap().failures, 1);
    // A retry of the same want keeps counting; success resets.
    let (third, _) = ops.begin(key.clone(), w.clone());
    assert!(ops.end(&key, third, Err(err.clone()), Instant::now()));
    assert_eq!(ops.get(&key).unwrap().failures, 2);
    // Another want is in flight until its own call ends.
    assert_eq!(ops.progress(&key, &want(Kind::Load, 1)), Progress::InFlight);
    // Unloads settle after the last attempt.
    let u = want(Kind::Unload, 0);
    for _ in 0..MAX_UNLOAD_ATTEMPTS {
        let (seq, _) = ops.begin(key.clone(), u.clone());
        ops.end(&key, seq, Err(err.clone()), Instant::now());
    }
    assert_eq!(
        ops.progress(&key, &u),
        Progress::Failed {
            error: err.clone(),
            settled: true
        }
    );
    // Forgotten pairs record nothing.
    let (seq, _) = ops.begin(key.clone(), w.clone());
    ops.forget("a");
    assert!(!ops.end(&key, seq, Ok(()), Instant::now()));
    assert!(ops.get(&key).is_none());
}

#[tokio::test]
async fn a_slow_pod_does_not_hold_up_another() {
    let fast = FakeAdmin::start().await;
    let slow = FakeAdmin::start().await;
    slow.state.lock().unwrap().delay = Duration::from_secs(30);
    let (wake, mut woken) = futures::channel::mpsc::unbounded();
    let runner = Runner {
        http: admin::http_client(),
        ops: Arc::default(),
        wake,
        timeouts: Timeouts {
            load: Duration::from_secs(60),
            unload: Duration::from_secs(1),
        },
        metrics: Arc::new(Metrics::default()),
        admin_port: 0,
    };
    let token = AdminToken::new(TOKEN.into());
    let call = |adapter: &str, pod: &str, base: &str| Call {
        key: Key {
            adapter: adapter.into(),
            pod: pod.into(),
        },
        want: want(Kind::Load, 0),
        base: base.into(),
        token: token.clone(),
        unload_first: None,
        adapter: ObjectRef::new(adapter).within("serving"),
    };
    let now = Instant::now();
    // Two adapters on the slow pod first, then the same two on the fast one.
    for a in ["a1", "a2"] {
        assert_eq!(runner.ensure(call(a, "slow", &slow.base), now), None);
    }
    for a in ["a1", "a2"] {
        assert_eq!(runner.ensure(call(a, "fast", &fast.base), now), None);
    }
    // A second pass while they run starts nothing new.
    assert_eq!(runner.ensure(call("a1", "fast", &fast.base), now), None);
    let started = Instant::now();
    let mut got = Vec::new();
    for _ in 0..2 {
        let r = tokio::time::timeout(Duration::from_secs(5), woken.next())
            .await
            .expect("the fast pod's loads end while the slow pod stalls")
            .unwrap();
        got.push(r.name);
    }
    got.sort();
    assert_eq!(got, ["a1", "a2"]);
    assert!(started.elapsed() < Duration::from_secs(5));
    let ops = runner.ops.lock().unwrap();
    for a in ["a1", "a2"] {
        let key = |pod: &str| Key {
            adapter: a.into(),
            pod: pod.into(),
        };
        assert_eq!(
            ops.progress(&key("fast"), &want(Kind::Load, 0)),
            Progress::Succeeded
        );
        assert_eq!(
            ops.progress(&key("slow"), &want(Kind::Load, 0)),
            Progress::InFlight
        );
    }
    assert_eq!(fast.calls().len(), 2, "one call per pair: {:?}", fast.calls());
    drop(ops);
    assert_eq!(
        runner
            .metrics
            .adapter_calls
            .with_label_values(&["load", "ok"])
            .get(),
        2
    );
}
