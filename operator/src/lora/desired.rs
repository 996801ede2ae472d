//! What should be loaded where, as pure functions of the LoraAdapters of one ModelDeployment and its
//! pods: the effective served name, who wins a served-name conflict, the start-up list of the adapters
//! ConfigMap, and which pods get loads (ready ones) or unloads (running ones).
//!
//! Invariants: among adapters of one deployment sharing a served name, the earliest (creationTimestamp,
//! then name) wins — deleting ones included, so a later adapter never loads a name that an earlier
//! one's finalizer is about to `DELETE` by name; only a winner ever loads or unloads that name.

use crate::builders::adapters::AdapterSpec;
use crate::labels::RUNTIME_CONTAINER;
use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use modelfleet_crds::LoraAdapter;
use modelfleet_crds::condition_types::VERIFIED;

/// The name clients put in `model`: `spec.servedName`, else the object's name.
pub fn served_name(a: &LoraAdapter) -> String {
    a.spec.served_name.clone().unwrap_or_else(|| a.name_any())
}

/// Tenants as a set: sorted, without duplicates (the order in the spec carries no meaning).
pub fn normalized_tenants(a: &LoraAdapter) -> Vec<String> {
    let mut t = a.spec.tenants.clone();
    t.sort();
    t.dedup();
    t
}

/// What the runtime is asked to load for `a`.
pub fn entry(a: &LoraAdapter) -> AdapterSpec {
    AdapterSpec {
        name: served_name(a),
        uri: a.spec.uri.clone(),
        digest: a.spec.digest.clone(),
        tenants: normalized_tenants(a),
    }
}

/// Whether `a` belongs to ModelDeployment `md` in namespace `ns`.
pub fn references(a: &LoraAdapter, ns: &str, md: &str) -> bool {
    a.namespace().as_deref() == Some(ns) && a.spec.model_deployment_ref.name == md
}

fn precedes(a: &LoraAdapter, b: &LoraAdapter) -> bool {
    let key = |x: &LoraAdapter| (x.metadata.creation_timestamp.clone(), x.name_any());
    key(a) < key(b)
}

/// The adapter that owns served name `name` among `siblings` (the adapters of one deployment).
pub fn owner_of<'a>(siblings: &'a [LoraAdapter], name: &str) -> Option<&'a LoraAdapter> {
    siblings
        .iter()
        .filter(|s| served_name(s) == name)
        .reduce(|best, s| if precedes(s, best) { s } else { best })
}

/// The name of the adapter that took `a`'s served name before it, if any.
pub fn conflicting_owner(a: &LoraAdapter, siblings: &[LoraAdapter]) -> Option<String> {
    let owner = owner_of(siblings, &served_name(a))?;
    (owner.name_any() != a.name_any()).then(|| owner.name_any())
}

/// Why an adapter may not use its served name.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Conflict {
    /// Another adapter of the deployment took the name first.
    Adapter {
        /// The served name.
        name: String,
        /// The LoraAdapter that owns it.
        owner: String,
    },
    /// The base model is served under that name.
    BaseModel {
        /// The served name.
        name: String,
    },
}

impl Conflict {
    /// The condition message.
    pub fn message(&self, deployment: &str) -> String {
        match self {
            Conflict::Adapter { name, owner } => format!(
                "served name {name:?} is already used by LoraAdapter {owner:?} of ModelDeployment {deployment:?}, \
                 created first"
            ),
            Conflict::BaseModel { name } => {
                format!("served name {name:?} is the base model's name in ModelDeployment {deployment:?}")
            }
        }
    }
}

/// The conflict `a` is in, given its siblings and the base model's served name (if the base exists).
pub fn conflict(a: &LoraAdapter, siblings: &[LoraAdapter], base_name: Option<&str>) -> Option<Conflict> {
    let name = served_name(a);
    if base_name == Some(name.as_str()) {
        return Some(Conflict::BaseModel { name });
    }
    conflicting_owner(a, siblings).map(|owner| Conflict::Adapter { name, owner })
}

/// Whether `a`'s current spec was found bad (`Verified=False` for this generation): such an adapter is
/// left out of the start-up list so it cannot keep failing on every new pod.
pub fn known_bad(a: &LoraAdapter) -> bool {
    let generation = a.metadata.generation;
    a.status.as_ref().is_some_and(|s| {
        s.conditions
            .iter()
            .any(|c| c.type_ == VERIFIED && c.status == "False" && c.observed_generation == generation)
    })
}

/// The start-up list of a deployment whose model is served as `base_name`: its adapters that are not
/// being deleted, not in conflict and not known bad, sorted by served name.
pub fn startup_entries(siblings: &[LoraAdapter], base_name: &str) -> Vec<AdapterSpec> {
    let mut entries: Vec<AdapterSpec> = siblings
        .iter()
        .filter(|a| a.metadata.deletion_timestamp.is_none())
        .filter(|a| conflict(a, siblings, Some(base_name)).is_none())
        .filter(|a| !known_bad(a))
        .map(entry)
        .collect();
    entries.sort_by(|x, y| x.name.cmp(&y.name));
    entries
}

/// A runtime pod as the controller sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PodTarget {
    /// Pod name (status is keyed by it).
    pub name: String,
    /// Pod UID (a re-created pod of the same name is a new pod).
    pub uid: String,
    /// Pod IP.
    pub ip: String,
    /// Restarts of the runtime container: a restarted runtime is asked again.
    pub restarts: i32,
    /// Ready and not being deleted: takes traffic, so it gets loads.
    pub ready: bool,
}

/// The pods with an IP and a running runtime container (the ones with an admin API), sorted by name.
pub fn pod_targets(pods: &[Pod]) -> Vec<PodTarget> {
    let mut out: Vec<PodTarget> = pods
        .iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .filter_map(|p| {
            let status = p.status.as_ref()?;
            let ip = status.pod_ip.clone().filter(|ip| !ip.is_empty())?;
            let runtime = status
                .container_statuses
                .iter()
                .flatten()
                .find(|c| c.name == RUNTIME_CONTAINER)?;
            runtime.state.as_ref()?.running.as_ref()?;
            let ready = modelfleet_crds::pods::ready_condition(p);
            Some(PodTarget {
                name: p.metadata.name.clone()?,
                uid: p.metadata.uid.clone()?,
                ip,
                restarts: runtime.restart_count,
                ready,
            })
        })
        .collect();
    out.sort_by(|a, b| a.name.cmp(&b.name));
    out
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{
        ContainerState, ContainerStateRunning, ContainerStatus, PodCondition, PodStatus,
    };
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
    use k8s_openapi::jiff::Timestamp;
    use modelfleet_crds::lora_adapter::LoraAdapterStatus;

    pub const DIGEST: &str = "sha256:2222222222222222222222222222222222222222222222222222222222222222";

    /// A LoraAdapter of deployment `smollm2` in `serving`, created at `created` (seconds).
    pub fn adapter(name: &str, served: Option<&str>, created: i64) -> LoraAdapter {
        let mut v = serde_json::json!({
            "apiVersion": "modelfleet.io/v1alpha1", "kind": "LoraAdapter",
            "metadata": {"name": name, "namespace": "serving", "uid": format!("uid-{name}"), "generation": 1,
                         "creationTimestamp": Timestamp::from_second(1_800_000_000 + created).unwrap().to_string()},
            "spec": {"modelDeploymentRef": {"name": "smollm2"}, "uri": format!("file:///adapters/{name}"),
                     "digest": DIGEST, "tenants": ["team-b", "team-a", "team-b"]}
        });
        if let Some(s) = served {
            v["spec"]["servedName"] = s.into();
        }
        serde_json::from_value(v).unwrap()
    }

    fn verified(mut a: LoraAdapter, status: &str, generation: i64) -> LoraAdapter {
        a.status = Some(LoraAdapterStatus {
            conditions: vec![Condition {
                type_: VERIFIED.into(),
                status: status.into(),
                reason: "DigestMismatch".into(),
                message: String::new(),
                observed_generation: Some(generation),
                last_transition_time: Time(Timestamp::UNIX_EPOCH),
            }],
            ..Default::default()
        });
        a
    }

    #[test]
    fn served_name_defaults_and_tenants_form_a_set() {
        let a = adapter("sql", None, 0);
        assert_eq!(served_name(&a), "sql");
        assert_eq!(served_name(&adapter("sql", Some("sql-v2"), 0)), "sql-v2");
        assert_eq!(normalized_tenants(&a), ["team-a", "team-b"]);
        assert!(references(&a, "serving", "smollm2"));
        assert!(!references(&a, "other", "smollm2"));
        assert!(!references(&a, "serving", "other"));
    }

    #[test]
    fn the_earlier_adapter_owns_a_served_name() {
        // (adapters, adapter asked about, expected conflicting owner)
        let cases: Vec<(Vec<LoraAdapter>, &str, Option<&str>)> = vec![
            (vec![adapter("a", None, 0)], "a", None),
            // Same served name: the older wins, whatever the order of the list.
            (
                vec![adapter("old", Some("x"), 0), adapter("new", Some("x"), 5)],
                "new",
                Some("old"),
            ),
            (
                vec![adapter("new", Some("x"), 5), adapter("old", Some("x"), 0)],
                "new",
                Some("old"),
            ),
            (
                vec![adapter("new", Some("x"), 5), adapter("old", Some("x"), 0)],
                "old",
                None,
            ),
            // Same creation time: the name breaks the tie.
            (
                vec![adapter("b", Some("x"), 1), adapter("a", Some("x"), 1)],
                "b",
                Some("a"),
            ),
            // A served name equal to another adapter's default name conflicts too.
            (
                vec![adapter("x", None, 0), adapter("y", Some("x"), 1)],
                "y",
                Some("x"),
            ),
            // Different names never conflict.
            (vec![adapter("a", None, 0), adapter("b", None, 1)], "b", None),
        ];
        for (siblings, asked, expected) in cases {
            let a = siblings.iter().find(|s| s.name_any() == asked).unwrap();
            assert_eq!(
                conflicting_owner(a, &siblings).as_deref(),
                expected,
                "{asked} among {:?}",
                siblings.iter().map(|s| s.name_any()).collect::<Vec<_>>()
            );
        }
    }

    #[test]
    fn the_base_models_name_is_taken() {
        let a = adapter("shadow", Some("smollm2"), 0);
        let siblings = vec![a.clone()];
        assert_eq!(
            conflict(&a, &siblings, Some("smollm2")),
            Some(Conflict::BaseModel {
                name: "smollm2".into()
            })
        );
        assert_eq!(conflict(&a, &siblings, None), None, "no base, no base name");
        assert_eq!(
            conflict(&a, &siblings, Some("smollm2"))
                .unwrap()
                .message("smollm2"),
            "served name \"smollm2\" is the base model's name in ModelDeployment \"smollm2\""
        );
        let later = adapter("later", Some("smollm2"), 5);
        let siblings = vec![a.clone(), later.clone()];
        assert_eq!(
            conflict(&later, &siblings, Some("other")),
            Some(Conflict::Adapter {
                name: "smollm2".into(),
                owner: "shadow".into()
            })
        );
    }

    #[test]
    fn a_deleting_owner_still_holds_its_name() {
        let mut old = adapter("old", Some("x"), 0);
        old.metadata.deletion_timestamp = Some(Time(Timestamp::from_second(1_800_000_100).unwrap()));
        let siblings = vec![old, adapter("new", Some("x"), 5)];
        assert_eq!(conflicting_owner(&siblings[1], &siblings).as_deref(), Some("old"));
        assert!(
            startup_entries(&siblings, "smollm2").is_empty(),
            "neither is listed while the old one unloads"
        );
    }

    #[test]
    fn startup_entries_skip_conflicts_deletions_and_known_bad_and_are_sorted() {
        let mut gone = adapter("gone", None, 0);
        gone.metadata.deletion_timestamp = Some(Time(Timestamp::from_second(1_800_000_100).unwrap()));
        let siblings = vec![
            adapter("zeta", None, 3),
            adapter("alpha", None, 4),
            adapter("dup", Some("zeta"), 9),
            gone,
            verified(adapter("bad", None, 1), "False", 1),
            // Verified=False for an older generation: the spec changed since, so it is tried again.
            verified(adapter("fixed", None, 1), "False", 0),
            verified(adapter("good", None, 1), "True", 1),
            // The base model's own name.
            adapter("shadow", Some("smollm2"), 0),
        ];
        let names: Vec<String> = startup_entries(&siblings, "smollm2")
            .into_iter()
            .map(|e| e.name)
            .collect();
        assert_eq!(names, ["alpha", "fixed", "good", "zeta"]);
        let e = &startup_entries(&siblings, "smollm2")[0];
        assert_eq!(
            (e.uri.as_str(), e.digest.as_str(), e.tenants.clone()),
            (
                "file:///adapters/alpha",
                DIGEST,
                vec!["team-a".to_string(), "team-b".to_string()]
            )
        );
        // The input order does not matter.
        let mut reversed = siblings.clone();
        reversed.reverse();
        assert_eq!(
            startup_entries(&reversed, "smollm2"),
            startup_entries(&siblings, "smollm2")
        );
    }

    pub fn pod(name: &str, ip: Option<&str>, running: bool, ready: bool, restarts: i32) -> Pod {
        let mut p = Pod::default();
        p.metadata.name = Some(name.into());
        p.metadata.uid = Some(format!("uid-{name}"));
        p.status = Some(PodStatus {
            pod_ip: ip.map(String::from),
            container_statuses: Some(vec![ContainerStatus {
                name: RUNTIME_CONTAINER.into(),
                restart_count: restarts,
                state: Some(ContainerState {
                    running: running.then(ContainerStateRunning::default),
                    ..Default::default()
                }),
                ..Default::default()
            }]),
            conditions: Some(vec![PodCondition {
                type_: "Ready".into(),
                status: if ready { "True" } else { "False" }.into(),
                ..Default::default()
            }]),
            ..Default::default()
        });
        p
    }

    #[test]
    fn pod_targets_are_running_runtimes_with_an_ip() {
        let mut deleting = pod("d", Some("127.1.0.4"), true, true, 0);
        deleting.metadata.deletion_timestamp = Some(Time(Timestamp::UNIX_EPOCH));
        let pods = [
            pod("c", Some("127.1.0.3"), true, false, 2),
            pod("a", Some("127.1.0.1"), true, true, 0),
            pod("pending", None, false, false, 0),
            pod("init", Some("127.1.0.5"), false, false, 0),
            deleting,
        ];
        let targets = pod_targets(&pods);
        let seen: Vec<(&str, bool, i32)> = targets
            .iter()
            .map(|t| (t.name.as_str(), t.ready, t.restarts))
            .collect();
        assert_eq!(seen, [("a", true, 0), ("c", false, 2)]);
        assert_eq!(targets[0].ip, "127.1.0.1");
        assert_eq!(targets[0].uid, "uid-a");
    }
}
