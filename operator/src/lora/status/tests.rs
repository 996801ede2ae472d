//! Status building: conditions per situation (as data), the 64-pod bound, transition times, and the
//! carry-over that keeps re-checks from ticking.

use super::*;
use crate::lora::desired::Conflict;

const D: &str = "sha256:2222222222222222222222222222222222222222222222222222222222222222";

fn obs(pods: Vec<(&str, PodLoad)>) -> Observed {
    Observed {
        generation: 2,
        deployment: "smollm2".into(),
        digest: D.into(),
        base_found: true,
        conflict: None,
        token_missing: false,
        deleting: false,
        pods: pods.into_iter().map(|(p, l)| (p.to_string(), l)).collect(),
    }
}

fn failed(reason: Reason, message: &str) -> PodLoad {
    PodLoad::Failed(AdminError {
        reason,
        message: message.into(),
    })
}

fn get(s: &LoraAdapterStatus, t: &str) -> (String, String) {
    let c = s.conditions.iter().find(|c| c.type_ == t).unwrap();
    (c.status.clone(), c.reason.clone())
}

fn t(secs: i64) -> Timestamp {
    Timestamp::from_second(1_800_000_000 + secs).unwrap()
}

/// (situation, observed, expected (Ready, Verified, Reconciling, Stalled) as (status, reason))
#[test]
fn conditions_per_situation() {
    type Expect = [(&'static str, &'static str); 4];
    let mut conflict = obs(vec![("a", PodLoad::InFlight)]);
    conflict.conflict = Some(Conflict::Adapter {
        name: "sql".into(),
        owner: "sql-old".into(),
    });
    let mut no_base = obs(vec![]);
    no_base.base_found = false;
    let mut no_token = obs(vec![("a", PodLoad::InFlight)]);
    no_token.token_missing = true;
    let cases: Vec<(&str, Observed, Expect)> = vec![
        (
            "loaded everywhere",
            obs(vec![("a", PodLoad::Loaded), ("b", PodLoad::Loaded)]),
            [
                ("True", "Loaded"),
                ("True", "Verified"),
                ("False", "Idle"),
                ("False", "NotStalled"),
            ],
        ),
        (
            "one pod still loading",
            obs(vec![("a", PodLoad::Loaded), ("b", PodLoad::InFlight)]),
            [
                ("False", "Loading"),
                ("True", "Verified"),
                ("True", "Loading"),
                ("False", "NotStalled"),
            ],
        ),
        (
            "the bytes do not match",
            obs(vec![
                (
                    "a",
                    failed(Reason::DigestMismatch, "422 digest_mismatch: expected x, got y"),
                ),
                ("b", PodLoad::InFlight),
            ]),
            [
                ("False", "DigestMismatch"),
                ("False", "DigestMismatch"),
                ("False", "Idle"),
                ("True", "DigestMismatch"),
            ],
        ),
        (
            "rank over the pod's limit",
            obs(vec![(
                "a",
                failed(Reason::Incompatible, "422 incompatible: rank 64 > 16"),
            )]),
            [
                ("False", "Incompatible"),
                ("False", "Incompatible"),
                ("False", "Idle"),
                ("True", "Incompatible"),
            ],
        ),
        (
            "a pod cannot be reached",
            obs(vec![
                ("a", PodLoad::Loaded),
                ("b", failed(Reason::LoadFailed, "cannot connect to the admin API")),
            ]),
            [
                ("False", "LoadFailed"),
                ("True", "Verified"),
                ("True", "LoadFailed"),
                ("False", "NotStalled"),
            ],
        ),
        (
            "served name taken",
            conflict,
            [
                ("False", "NameConflict"),
                ("Unknown", "NameConflict"),
                ("False", "Idle"),
                ("True", "NameConflict"),
            ],
        ),
        (
            "no base",
            no_base,
            [
                ("False", "BaseModelNotFound"),
                ("Unknown", "BaseModelNotFound"),
                ("False", "Idle"),
                ("True", "BaseModelNotFound"),
            ],
        ),
        (
            "no ready replicas",
            obs(vec![]),
            [
                ("False", "NoReadyReplicas"),
                ("Unknown", "Pending"),
                ("True", "NoReadyReplicas"),
                ("False", "NotStalled"),
            ],
        ),
        (
            "no admin token yet",
            no_token,
            [
                ("False", "Loading"),
                ("Unknown", "Pending"),
                ("True", "Loading"),
                ("False", "NotStalled"),
            ],
        ),
    ];
    for (what, o, expected) in cases {
        let s = build(&o, &LoraAdapterStatus::default(), t(0));
        let got: Vec<(String, String)> = [READY, VERIFIED, RECONCILING, STALLED]
            .iter()
            .map(|c| get(&s, c))
            .collect();
        let want: Vec<(String, String)> = expected
            .iter()
            .map(|(a, b)| (a.to_string(), b.to_string()))
            .collect();
        assert_eq!(got, want, "{what}");
        assert_eq!(s.observed_generation, Some(2), "{what}");
        assert!(
            s.conditions.iter().all(|c| c.observed_generation == Some(2)),
            "{what}"
        );
    }
}

#[test]
fn messages_name_the_pod_the_counts_and_the_owner() {
    let s = build(
        &obs(vec![
            ("a", PodLoad::Loaded),
            (
                "b",
                failed(Reason::LoadFailed, "403 uri_not_allowed: file:// is off"),
            ),
        ]),
        &LoraAdapterStatus::default(),
        t(0),
    );
    let ready = s.conditions.iter().find(|c| c.type_ == READY).unwrap();
    assert_eq!(
        ready.message,
        "loaded on 1/2 ready replicas; pod b: 403 uri_not_allowed: file:// is off"
    );
    assert_eq!((s.loaded_replicas, s.desired_replicas), (1, 2));
    let b = &s.pods[1];
    assert_eq!((b.pod.as_str(), b.state), ("b", AdapterPodPhase::Failed));
    assert_eq!(b.message.as_deref(), Some("403 uri_not_allowed: file:// is off"));
    let mut o = obs(vec![]);
    o.conflict = Some(Conflict::Adapter {
        name: "sql".into(),
        owner: "sql-old".into(),
    });
    let s = build(&o, &LoraAdapterStatus::default(), t(0));
    let ready = s.conditions.iter().find(|c| c.type_ == READY).unwrap();
    assert_eq!(
        ready.message,
        "served name \"sql\" is already used by LoraAdapter \"sql-old\" of ModelDeployment \"smollm2\", created first"
    );
}

#[test]
fn pods_are_bounded_to_64_while_counts_cover_all() {
    let names: Vec<String> = (0..100).map(|i| format!("pod-{i:03}")).collect();
    let o = Observed {
        pods: names
            .iter()
            .map(|n| {
                (
                    n.clone(),
                    if n == "pod-099" {
                        PodLoad::InFlight
                    } else {
                        PodLoad::Loaded
                    },
                )
            })
            .collect(),
        ..obs(vec![])
    };
    let s = build(&o, &LoraAdapterStatus::default(), t(0));
    assert_eq!(s.pods.len(), MAX_PODS);
    assert_eq!(s.pods[0].pod, "pod-000");
    assert_eq!(s.pods[63].pod, "pod-063");
    assert_eq!((s.loaded_replicas, s.desired_replicas), (99, 100));
    assert_eq!(get(&s, READY), ("False".into(), "Loading".into()));
}

#[test]
fn an_unchanged_world_gives_an_identical_status_and_times_move_on_transitions() {
    let o = obs(vec![("a", PodLoad::Loaded), ("b", PodLoad::InFlight)]);
    let first = build(&o, &LoraAdapterStatus::default(), t(0));
    assert_eq!(build(&o, &first, t(50)), first);
    let o2 = obs(vec![("a", PodLoad::Loaded), ("b", PodLoad::Loaded)]);
    let second = build(&o2, &first, t(60));
    let b = second.pods.iter().find(|p| p.pod == "b").unwrap();
    assert_eq!(b.last_transition_time, Some(Time(t(60))));
    let a = second.pods.iter().find(|p| p.pod == "a").unwrap();
    assert_eq!(a.last_transition_time, Some(Time(t(0))));
    let ready = second.conditions.iter().find(|c| c.type_ == READY).unwrap();
    assert_eq!(ready.last_transition_time, Time(t(60)));
    let verified = second.conditions.iter().find(|c| c.type_ == VERIFIED).unwrap();
    assert_eq!(verified.last_transition_time, Time(t(0)));
}

#[test]
fn a_recheck_keeps_what_was_known_for_this_generation() {
    // Settled: a loaded on both pods, b refused its bytes.
    let settled = build(
        &obs(vec![("a", PodLoad::Loaded), ("b", PodLoad::Loaded)]),
        &LoraAdapterStatus::default(),
        t(0),
    );
    // A new leader (nothing in memory) re-sends the loads: nothing changes while they run.
    let recheck = obs(vec![("a", PodLoad::InFlight), ("b", PodLoad::InFlight)]);
    assert_eq!(build(&recheck, &settled, t(10)), settled);
    // A new pod has no earlier entry: Loading.
    let scaled = build(
        &obs(vec![
            ("a", PodLoad::InFlight),
            ("b", PodLoad::InFlight),
            ("c", PodLoad::InFlight),
        ]),
        &settled,
        t(20),
    );
    assert_eq!(scaled.pods[2].state, AdapterPodPhase::Loading);
    assert_eq!(get(&scaled, VERIFIED), ("True".into(), "Verified".into()));
    // A new generation (spec changed): earlier entries no longer count.
    let mut next_gen = recheck.clone();
    next_gen.generation = 3;
    let s = build(&next_gen, &settled, t(30));
    assert!(s.pods.iter().all(|p| p.state == AdapterPodPhase::Loading));
    assert_eq!(get(&s, VERIFIED), ("Unknown".into(), "Pending".into()));

    // A refused adapter being re-tried keeps its verdict while the retry runs.
    let refused = build(
        &obs(vec![(
            "a",
            failed(Reason::DigestMismatch, "422 digest_mismatch: expected x, got y"),
        )]),
        &LoraAdapterStatus::default(),
        t(0),
    );
    assert_eq!(
        build(&obs(vec![("a", PodLoad::InFlight)]), &refused, t(600)),
        refused
    );
}

#[test]
fn deletion_lists_the_pods_still_to_unload() {
    let mut o = obs(vec![
        ("a", PodLoad::Unloading(None)),
        (
            "b",
            PodLoad::Unloading(Some("cannot connect to the admin API".into())),
        ),
        (
            "c",
            PodLoad::UnloadFailed("no answer from the admin API within 15s".into()),
        ),
    ]);
    o.deleting = true;
    let s = build(&o, &LoraAdapterStatus::default(), t(0));
    assert_eq!(get(&s, READY), ("False".into(), "Deleting".into()));
    assert_eq!(get(&s, RECONCILING), ("True".into(), "Deleting".into()));
    let states: Vec<AdapterPodPhase> = s.pods.iter().map(|p| p.state).collect();
    assert_eq!(
        states,
        [
            AdapterPodPhase::Unloading,
            AdapterPodPhase::Unloading,
            AdapterPodPhase::Failed
        ]
    );
    assert_eq!((s.loaded_replicas, s.desired_replicas), (3, 0));
}
