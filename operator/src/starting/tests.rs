use super::*;
use serde_json::json;

fn pod(status: serde_json::Value) -> Pod {
    serde_json::from_value(json!({"metadata": {"name": "p"}, "status": status})).unwrap()
}

fn check(status: serde_json::Value, want: State) {
    assert_eq!(classify(&pod(status.clone())), want, "{status}");
}

#[test]
fn states_from_pod_status() {
    check(
        json!({"conditions": [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
            "message": "0/1 nodes are available: 1 node(s) had untolerated taint"}]}),
        State::Unschedulable("0/1 nodes are available: 1 node(s) had untolerated taint".into()),
    );
    check(json!({}), State::Scheduling(None));
    check(
        json!({"hostIP": "10.0.0.1", "initContainerStatuses": [{"name": "fetch", "image": "i", "imageID": "",
            "ready": false, "restartCount": 0, "state": {"waiting": {"reason": "PodInitializing"}}}]}),
        State::ImagePull,
    );
    check(
        json!({"hostIP": "10.0.0.1", "podIP": "10.244.0.9", "initContainerStatuses": [{"name": "fetch",
            "image": "i", "imageID": "", "ready": false, "restartCount": 0, "state": {"running": {}}}]}),
        State::Fetch(None),
    );
    check(
        json!({"hostIP": "h", "podIP": "p", "initContainerStatuses": [{"name": "fetch", "image": "i", "imageID": "",
            "ready": false, "restartCount": 2, "state": {"waiting": {"reason": "CrashLoopBackOff"}},
            "lastState": {"terminated": {"exitCode": 9, "message": "SignatureInvalid: no signature verifies"}}}]}),
        State::Failed("CrashLoopBackOff: SignatureInvalid: no signature verifies".into()),
    );
    check(
        json!({"hostIP": "h", "podIP": "p",
            "initContainerStatuses": [{"name": "fetch", "image": "i", "imageID": "", "ready": false,
                "restartCount": 0, "state": {"terminated": {"exitCode": 0}}}],
            "containerStatuses": [{"name": "runtime", "image": "i", "imageID": "", "ready": false,
                "restartCount": 0, "state": {"running": {}}}]}),
        State::Load,
    );
    check(
        json!({"hostIP": "h", "initContainerStatuses": [{"name": "fetch", "image": "i", "imageID": "",
            "ready": false, "restartCount": 0, "state": {"waiting": {"reason": "ErrImagePull",
            "message": "failed to pull and unpack image"}}}]}),
        State::Failed("ErrImagePull: failed to pull and unpack image".into()),
    );
}

#[test]
fn progress_rate_and_eta_are_rounded() {
    let samples = [
        Sample {
            pod: "a".into(),
            state: State::Fetch(Some(Progress {
                phase: "pull".into(),
                bytes: 1_234_567_890,
                expected_bytes: 4_000_000_000,
                phase_seconds: 10.0,
            })),
        },
        Sample {
            pod: "b".into(),
            state: State::Load,
        },
    ];
    let (starts, summary) = status(&samples);
    let a = &starts[0];
    assert_eq!(
        (
            a.phase.as_str(),
            a.bytes,
            a.total_bytes,
            a.bytes_per_second,
            a.eta_seconds
        ),
        (
            "Pull",
            Some(1_234_000_000),
            Some(4_000_000_000),
            Some(123_000_000),
            Some(23)
        )
    );
    assert_eq!(starts[1].phase, "Load");
    assert_eq!(summary.as_deref(), Some("2 Pull 1.2 GB/4.0 GB 123 MB/s ETA 23s"));
    // Early in a pull (under a second) there is no rate yet, so no ETA.
    let early = status(&[Sample {
        pod: "c".into(),
        state: State::Fetch(Some(Progress {
            phase: "pull".into(),
            bytes: 5,
            expected_bytes: 10,
            phase_seconds: 0.2,
        })),
    }]);
    assert_eq!(
        (early.0[0].bytes_per_second, early.0[0].eta_seconds),
        (None, None)
    );
    assert_eq!(status(&[]), (vec![], None));
}
