//! Builds a [`Fleet`] from the watched objects — ModelDeployments, LoraAdapters, runtime Pods — and the
//! tenants tables read from the referenced Secrets. Pure, table-tested without a cluster.
//!
//! The rules mirror the operator's: a pod belongs to the ModelDeployment named by its
//! `modelfleet.io/model-deployment` label; it is routable while Ready, with an IP, and not being
//! deleted; an adapter's served name is `spec.servedName` or its name, owned by the earliest adapter
//! claiming it (creationTimestamp, then name), never the base model's name; an adapter is loaded on the
//! pods its per-pod status lists as `Loaded`; a pod's revision is its `modelfleet.io/revision` label or,
//! without one, the stable revision of `status.rollout`; the canary split comes from `status.rollout`
//! ([`crate::canary`]). Rings are reused from the previous snapshot when a
//! deployment's pod set did not change.

use super::{Adapter, Deployment, DeploymentId, Fleet, Pod, Tenancy};
use crate::canary::Split;
use crate::provider::Provider;
use crate::ring::Ring;
use k8s_openapi::api::core::v1::Pod as KubePod;
use kube::ResourceExt;
use modelfleet_api::tenants::Tenants;
use modelfleet_crds::lora_adapter::AdapterPodPhase;
use modelfleet_crds::model_deployment::PrefixCacheScope;
use modelfleet_crds::rollout::REVISION_LABEL;
use modelfleet_crds::{LoraAdapter, ModelDeployment};
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

/// The label naming the ModelDeployment a runtime pod serves (the operator's `labels.rs`).
pub const MODEL_DEPLOYMENT_LABEL: &str = "modelfleet.io/model-deployment";
/// `app.kubernetes.io/name` of runtime pods: the gateway watches only these.
pub const RUNTIME_APP_NAME: &str = "modelfleet-runtime";

/// A referenced tenants Secret key: (namespace, Secret name, key).
pub type SecretRef = (String, String, String);

/// What reading a tenants Secret gave.
pub type TenantsRead = Result<Arc<Tenants>, String>;

/// What reading a provider's key gave.
pub type KeyRead = Result<Arc<str>, String>;

/// The Secret keys of the providers `md`'s fallback names.
pub fn provider_key_refs(md: &ModelDeployment) -> Vec<SecretRef> {
    let ns = md.namespace().unwrap_or_default();
    let targets = md.spec.fallback.iter().flat_map(|f| &f.targets);
    targets
        .filter_map(|t| t.provider.as_ref()?.api_key_secret_ref.as_ref())
        .map(|r| (ns.clone(), r.name.clone(), r.key.clone()))
        .collect()
}

/// The providers `md`'s fallback names, with their keys as read.
fn providers_of(md: &ModelDeployment, keys: &HashMap<SecretRef, KeyRead>) -> BTreeMap<String, Arc<Provider>> {
    let ns = md.namespace().unwrap_or_default();
    let currency = md.spec.cost.as_ref().map_or("USD", |c| c.currency.as_str());
    let targets = md.spec.fallback.iter().flat_map(|f| &f.targets);
    targets
        .filter_map(|t| t.provider.as_ref())
        .map(|p| {
            let key = match &p.api_key_secret_ref {
                None => Ok(None),
                Some(r) => match keys.get(&(ns.clone(), r.name.clone(), r.key.clone())) {
                    Some(Ok(k)) => Ok(Some(k.clone())),
                    Some(Err(why)) => Err(why.clone()),
                    None => Err(format!(
                        "the provider key Secret {ns}/{} has not been read yet",
                        r.name
                    )),
                },
            };
            (p.name.clone(), Arc::new(Provider::new(p, key, currency)))
        })
        .collect()
}

/// The Secret key `md` keeps its tenants in, if it has any.
pub fn tenants_ref(md: &ModelDeployment) -> Option<SecretRef> {
    let t = md.spec.tenants.as_ref()?;
    Some((
        md.namespace().unwrap_or_default(),
        t.secret_ref.name.clone(),
        t.secret_ref.key.clone(),
    ))
}

/// Whether `pod` may take requests now.
pub fn routable(pod: &KubePod) -> bool {
    modelfleet_crds::pods::routable_ip(pod).is_some()
}

fn served_name(md: &ModelDeployment) -> String {
    md.spec.model.served_name.clone().unwrap_or_else(|| md.name_any())
}

fn adapter_name(a: &LoraAdapter) -> String {
    a.spec.served_name.clone().unwrap_or_else(|| a.name_any())
}

/// The adapters of one deployment, one per served name (the owner's), the base name excluded.
fn adapters_of(base: &str, siblings: &[&LoraAdapter]) -> BTreeMap<String, Adapter> {
    let mut owners: BTreeMap<String, &LoraAdapter> = BTreeMap::new();
    for a in siblings {
        let name = adapter_name(a);
        if name == base {
            continue;
        }
        let key = |x: &LoraAdapter| (x.metadata.creation_timestamp.clone(), x.name_any());
        match owners.get(&name) {
            Some(best) if key(best) <= key(a) => {}
            _ => {
                owners.insert(name, a);
            }
        }
    }
    owners
        .into_iter()
        .map(|(name, a)| {
            let loaded_on = a
                .status
                .iter()
                .flat_map(|s| &s.pods)
                .filter(|p| p.state == AdapterPodPhase::Loaded)
                .map(|p| p.pod.clone())
                .collect();
            let adapter = Adapter {
                served_name: name.clone(),
                tenants: a.spec.tenants.clone(),
                loaded_on,
            };
            (name, adapter)
        })
        .collect()
}

/// The routable pods of every deployment, by (namespace, name); each pod's revision is its label's
/// (empty without one, filled in with the stable revision by [`fleet`]).
fn pods_by_deployment(pods: &[Arc<KubePod>]) -> HashMap<(String, String), Vec<Pod>> {
    let mut pods_by_md: HashMap<(String, String), Vec<Pod>> = HashMap::new();
    for p in pods.iter().filter(|p| routable(p)) {
        let Some(md) = p.labels().get(MODEL_DEPLOYMENT_LABEL) else {
            continue;
        };
        let ip = p
            .status
            .as_ref()
            .and_then(|s| s.pod_ip.clone())
            .unwrap_or_default();
        pods_by_md
            .entry((p.namespace().unwrap_or_default(), md.clone()))
            .or_default()
            .push(Pod {
                name: p.name_any(),
                ip,
                revision: p.labels().get(REVISION_LABEL).cloned().unwrap_or_default(),
            });
    }
    pods_by_md
}

fn tenancy_of(md: &ModelDeployment, tenants: &HashMap<SecretRef, TenantsRead>) -> Tenancy {
    match tenants_ref(md) {
        None => Tenancy::Open,
        Some(r) => match tenants.get(&r) {
            Some(Ok(t)) => Tenancy::Keys(t.clone()),
            Some(Err(why)) => Tenancy::Unavailable(why.clone()),
            None => Tenancy::Unavailable(format!(
                "the tenants Secret {}/{} has not been read yet",
                r.0, r.1
            )),
        },
    }
}

/// The snapshot of everything watched.
pub fn fleet(
    mds: &[Arc<ModelDeployment>],
    adapters: &[Arc<LoraAdapter>],
    pods: &[Arc<KubePod>],
    tenants: &HashMap<SecretRef, TenantsRead>,
    keys: &HashMap<SecretRef, KeyRead>,
    previous: &Fleet,
    synced: bool,
) -> Fleet {
    let mut pods_by_md = pods_by_deployment(pods);
    let mut adapters_by_md: HashMap<(String, String), Vec<&LoraAdapter>> = HashMap::new();
    for a in adapters {
        adapters_by_md
            .entry((
                a.namespace().unwrap_or_default(),
                a.spec.model_deployment_ref.name.clone(),
            ))
            .or_default()
            .push(a);
    }
    let deployments = mds
        .iter()
        .map(|md| {
            let id = DeploymentId {
                namespace: md.namespace().unwrap_or_default(),
                name: md.name_any(),
            };
            let key = (id.namespace.clone(), id.name.clone());
            let rollout = md.status.as_ref().and_then(|s| s.rollout.as_ref());
            let stable = rollout.map(|r| r.stable_revision.as_str()).unwrap_or_default();
            let mut pods = pods_by_md.remove(&key).unwrap_or_default();
            pods.sort_by(|a, b| a.name.cmp(&b.name));
            for p in pods.iter_mut().filter(|p| p.revision.is_empty()) {
                p.revision = stable.to_string();
            }
            let names: Vec<&str> = pods.iter().map(|p| p.name.as_str()).collect();
            let ring = match previous.deployments.get(&id) {
                Some(d) if d.ring.pods().iter().map(String::as_str).eq(names.iter().copied()) => {
                    d.ring.clone()
                }
                _ => Arc::new(Ring::new(&names)),
            };
            let runtime = md.spec.runtime.as_ref();
            let base = served_name(md);
            let siblings = adapters_by_md.remove(&key).unwrap_or_default();
            Deployment {
                adapters: adapters_of(&base, &siblings),
                id,
                served_name: base,
                tenancy: tenancy_of(md, tenants),
                shared_prefix_cache: runtime
                    .and_then(|r| r.prefix_caching.as_ref())
                    .is_some_and(|p| p.scope == PrefixCacheScope::Deployment),
                pods,
                ring,
                created: md
                    .metadata
                    .creation_timestamp
                    .as_ref()
                    .map_or(0, |t| t.0.as_second().max(0) as u64),
                max_model_len: runtime.and_then(|r| r.max_model_len).map(|v| v.max(0) as u64),
                task: md.spec.model.task,
                prices: crate::limits::Prices::from_spec(md.spec.cost.as_ref()),
                split: Split::from_status(rollout),
                fallback: md.spec.fallback.clone().map(Arc::new),
                providers: providers_of(md, keys),
            }
        })
        .collect();
    Fleet::new(deployments, synced)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fleet::Resolution;
    use k8s_openapi::api::core::v1::{PodCondition, PodStatus};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    use k8s_openapi::jiff::Timestamp;
    use modelfleet_crds::lora_adapter::{
        LoraAdapterSpec, LoraAdapterStatus, ModelDeploymentRef, PodAdapterState,
    };

    const D: &str = "sha256:1111111111111111111111111111111111111111111111111111111111111111";

    fn md(ns: &str, name: &str, served: Option<&str>, tenants: Option<&str>) -> Arc<ModelDeployment> {
        let mut spec = serde_json::json!({"model": {"uri": "file:///m", "digest": D}});
        if let Some(s) = served {
            spec["model"]["servedName"] = s.into();
        }
        if let Some(t) = tenants {
            spec["tenants"] = serde_json::json!({"secretRef": {"name": t}});
        }
        let mut m = ModelDeployment::new(name, serde_json::from_value(spec).unwrap());
        m.metadata.namespace = Some(ns.into());
        Arc::new(m)
    }

    fn pod(ns: &str, name: &str, md: &str, ready: bool, deleting: bool) -> Arc<KubePod> {
        let mut p = KubePod::default();
        p.metadata.name = Some(name.into());
        p.metadata.namespace = Some(ns.into());
        p.metadata.labels = Some([(MODEL_DEPLOYMENT_LABEL.to_string(), md.to_string())].into());
        if deleting {
            p.metadata.deletion_timestamp = Some(Time(Timestamp::UNIX_EPOCH));
        }
        p.status = Some(PodStatus {
            pod_ip: Some(format!("127.1.0.{}", name.len())),
            conditions: Some(vec![PodCondition {
                type_: "Ready".into(),
                status: if ready { "True" } else { "False" }.into(),
                ..Default::default()
            }]),
            ..Default::default()
        });
        Arc::new(p)
    }

    fn adapter(
        name: &str,
        md: &str,
        served: Option<&str>,
        created: i64,
        loaded: &[&str],
    ) -> Arc<LoraAdapter> {
        let mut a = LoraAdapter::new(
            name,
            LoraAdapterSpec {
                model_deployment_ref: ModelDeploymentRef { name: md.into() },
                served_name: served.map(Into::into),
                uri: "file:///a".into(),
                digest: D.into(),
                tenants: vec!["team-a".into()],
            },
        );
        a.metadata.namespace = Some("ns".into());
        a.metadata.creation_timestamp = Some(Time(Timestamp::from_second(created).unwrap()));
        a.status = Some(LoraAdapterStatus {
            pods: loaded
                .iter()
                .map(|p| PodAdapterState {
                    pod: p.to_string(),
                    state: AdapterPodPhase::Loaded,
                    message: None,
                    last_transition_time: None,
                })
                .chain(std::iter::once(PodAdapterState {
                    pod: "loading-pod".into(),
                    state: AdapterPodPhase::Loading,
                    message: None,
                    last_transition_time: None,
                }))
                .collect(),
            ..Default::default()
        });
        Arc::new(a)
    }

    #[test]
    fn pods_tenancy_and_adapters() {
        let mds = [
            md("ns", "chat", Some("llama"), Some("keys")),
            md("ns", "open", None, None),
        ];
        let pods = [
            pod("ns", "chat-b", "chat", true, false),
            pod("ns", "chat-a", "chat", true, false),
            pod("ns", "chat-notready", "chat", false, false),
            pod("ns", "chat-leaving", "chat", true, true),
            pod("other", "chat-x", "chat", true, false),
            pod("ns", "open-a", "open", true, false),
        ];
        let adapters = [
            adapter("sql-late", "chat", Some("sql"), 20, &["chat-b"]),
            adapter("sql", "chat", None, 10, &["chat-a"]),
            adapter("shadow", "chat", Some("llama"), 5, &["chat-a"]),
        ];
        let table = Arc::new(Tenants::parse("tenants:\n- id: team-a\n  apiKeys: [sk-team-a-1]\n").unwrap());
        let tenants = HashMap::from([(("ns".into(), "keys".into(), "tenants.yaml".into()), Ok(table))]);
        let f = fleet(
            &mds,
            &adapters,
            &pods,
            &tenants,
            &HashMap::new(),
            &Fleet::default(),
            true,
        );
        let Resolution::Base(chat) = f.resolve("llama") else {
            panic!("llama is the base of chat")
        };
        let names: Vec<&str> = chat.pods.iter().map(|p| p.name.as_str()).collect();
        assert_eq!(names, ["chat-a", "chat-b"]);
        assert_eq!(chat.ring.pods(), ["chat-a", "chat-b"]);
        assert!(matches!(chat.tenancy, Tenancy::Keys(_)));
        assert_eq!(chat.tenant(Some("sk-team-a-1")).unwrap().unwrap().id, "team-a");
        assert!(chat.tenant(Some("sk-other-1")).unwrap().is_none());
        // The earliest adapter owns `sql`; the one shadowing the base name is ignored.
        assert_eq!(chat.adapters.len(), 1);
        let sql = &chat.adapters["sql"];
        assert_eq!(sql.loaded_on.iter().collect::<Vec<_>>(), ["chat-a"]);
        assert!(sql.allows("team-a") && !sql.allows("team-b"));
        assert!(matches!(f.resolve("open"), Resolution::Base(d) if d.pods.len() == 1));
        assert!(f.any_open() && f.knows_key("sk-team-a-1") && !f.knows_key("sk-nope-123"));

        // Unchanged pods keep the ring; a missing Secret makes the deployment unavailable, not open.
        let g = fleet(&mds, &adapters, &pods, &HashMap::new(), &HashMap::new(), &f, true);
        let Resolution::Base(again) = g.resolve("llama") else {
            panic!()
        };
        assert!(Arc::ptr_eq(&again.ring, &chat.ring));
        assert!(matches!(&again.tenancy, Tenancy::Unavailable(why) if why.contains("ns/keys")));
        assert!(!g.any_open() || g.resolve("open").is_open());
    }

    impl Resolution {
        fn is_open(&self) -> bool {
            matches!(self, Resolution::Base(d) if matches!(d.tenancy, Tenancy::Open))
        }
    }

    #[test]
    fn revisions_come_from_the_label_or_stable_and_the_split_from_the_status() {
        let rolling = md("ns", "chat", None, None);
        let mut rolling = (*rolling).clone();
        rolling.status = Some(
            serde_json::from_value(serde_json::json!({"rollout": {
                "stableRevision": "r1", "canaryRevision": "r2", "phase": "Progressing",
                "weight": 25, "mirrorPercent": 0
            }}))
            .unwrap(),
        );
        let mds = [Arc::new(rolling), md("ns", "plain", None, None)];
        let labelled = |name: &str, md_name: &str, rev: &str| {
            let mut p = (*pod("ns", name, md_name, true, false)).clone();
            let labels = p.metadata.labels.get_or_insert_default();
            labels.insert(REVISION_LABEL.into(), rev.into());
            Arc::new(p)
        };
        let pods = [
            pod("ns", "chat-old", "chat", true, false),
            labelled("chat-new", "chat", "r2"),
            pod("ns", "plain-a", "plain", true, false),
            labelled("plain-b", "plain", "r7"),
        ];
        let f = fleet(
            &mds,
            &[],
            &pods,
            &HashMap::new(),
            &HashMap::new(),
            &Fleet::default(),
            true,
        );
        let revs = |served: &str| {
            let Resolution::Base(d) = f.resolve(served) else {
                panic!("{served}")
            };
            let revs: Vec<(String, String)> = d
                .pods
                .iter()
                .map(|p| (p.name.clone(), p.revision.clone()))
                .collect();
            (revs, d.split.clone())
        };
        let (chat, split) = revs("chat");
        assert_eq!(
            chat,
            [("chat-new".into(), "r2".into()), ("chat-old".into(), "r1".into())]
        );
        let split = split.unwrap();
        assert_eq!(
            (split.stable.as_str(), split.canary.as_str(), split.weight),
            ("r1", "r2", 25)
        );
        // No rollout status: no split, and a pod without the label has no known revision.
        let (plain, split) = revs("plain");
        assert_eq!(
            plain,
            [("plain-a".into(), "".into()), ("plain-b".into(), "r7".into())]
        );
        assert_eq!(split, None);
    }
}
