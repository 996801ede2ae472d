//! The gateway's view of the fleet: an immutable snapshot of every ModelDeployment in scope — its
//! served name, tenants, Ready pods, the ring over them, and its adapters with the pods they are
//! loaded on — rebuilt from the watched objects ([`build`]) and swapped whole, so a request reads one
//! consistent picture without locks.
//!
//! Invariants: a pod is listed only while it is Ready, has an IP and is not being deleted (a pod
//! leaves the rotation when its readiness turns false or its deletion starts, before its process
//! stops); a served name claimed by two deployments resolves to [`Resolution::Conflict`], never to
//! one of them; an adapter lists the pods whose per-pod status says `Loaded`; a pod's revision is its
//! `modelfleet.io/revision` label, or the stable revision when it has none.

pub mod build;

use crate::ring::Ring;
use modelfleet_api::tenants::{Tenant, Tenants};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt;
use std::sync::Arc;

/// A ModelDeployment's identity.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct DeploymentId {
    /// Its namespace.
    pub namespace: String,
    /// Its name.
    pub name: String,
}

impl fmt::Display for DeploymentId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

/// Who may call a deployment.
#[derive(Clone, Debug)]
pub enum Tenancy {
    /// No tenants Secret: keyless, single tenant (`default`), as the runtime runs it.
    Open,
    /// Keys from the referenced Secret.
    Keys(Arc<Tenants>),
    /// The Secret is referenced but could not be read or parsed yet (why, without any key).
    Unavailable(String),
}

/// A Ready runtime pod.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Pod {
    /// The pod's name (the `pod` metric label and the `x-modelfleet-pod` header).
    pub name: String,
    /// Its IP.
    pub ip: String,
    /// Its revision: its `modelfleet.io/revision` label, or the deployment's stable revision without
    /// one (empty when neither is known: no per-revision metrics then).
    pub revision: String,
}

/// A LoraAdapter as the gateway routes it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Adapter {
    /// The name clients put in `model`.
    pub served_name: String,
    /// Tenant ids allowed to use it; empty: every tenant of the deployment.
    pub tenants: Vec<String>,
    /// Pods (names) whose status says the adapter is loaded.
    pub loaded_on: BTreeSet<String>,
}

impl Adapter {
    /// Whether `tenant` may use the adapter.
    pub fn allows(&self, tenant: &str) -> bool {
        self.tenants.is_empty() || self.tenants.iter().any(|t| t == tenant)
    }
}

/// One ModelDeployment in scope.
#[derive(Clone, Debug)]
pub struct Deployment {
    /// Namespace and name.
    pub id: DeploymentId,
    /// The base model's served name.
    pub served_name: String,
    /// Who may call it.
    pub tenancy: Tenancy,
    /// Whether all its tenants share cached prefixes (`prefixCaching.scope: Deployment`).
    pub shared_prefix_cache: bool,
    /// Ready pods, sorted by name; `ring.pods()[i]` is `pods[i].name`.
    pub pods: Vec<Pod>,
    /// The CHWBL ring over `pods`.
    pub ring: Arc<Ring>,
    /// Its adapters by served name (owners only: one per name).
    pub adapters: BTreeMap<String, Adapter>,
    /// Creation time (Unix seconds), for `/v1/models`.
    pub created: u64,
    /// `spec.runtime.maxModelLen`, when set.
    pub max_model_len: Option<u64>,
    /// `spec.model.task`, when declared (the gateway then refuses the other task's endpoints itself).
    pub task: Option<modelfleet_crds::model_source::ModelTask>,
    /// Token prices from `spec.cost` (what tenants are charged).
    pub prices: crate::limits::Prices,
    /// The canary split while a rollout names a canary revision (`None`: every Ready pod serves).
    pub split: Option<crate::canary::Split>,
    /// `spec.fallback`: where requests it cannot start go ([`crate::fallback`]).
    pub fallback: Option<Arc<modelfleet_crds::FallbackSpec>>,
    /// The providers its fallback names, by name, with their keys as read ([`crate::provider`]).
    pub providers: BTreeMap<String, Arc<crate::provider::Provider>>,
}

impl Deployment {
    /// A deployment that declares its task answers only that task's endpoints: the other's are a 400 here,
    /// before the limits or a pod see them. Undeclared, the pods (which know their model) refuse alike.
    pub fn check_task(&self, path: &str) -> Result<(), modelfleet_api::error::ApiError> {
        use modelfleet_api::error::ApiError;
        use modelfleet_crds::model_source::ModelTask;
        let embeddings = path == "/v1/embeddings";
        match (self.task, embeddings) {
            (Some(ModelTask::Embed), false) => Err(ApiError::invalid(
                "model",
                format!(
                    "`{}` is an embedding model: it answers /v1/embeddings, not chat or completions",
                    self.served_name
                ),
            )),
            (Some(ModelTask::Generate), true) => Err(ApiError::invalid(
                "model",
                format!(
                    "`{}` is a generation model: it answers /v1/chat/completions and /v1/completions, not /v1/embeddings",
                    self.served_name
                ),
            )),
            _ => Ok(()),
        }
    }

    /// The tenant of a caller presenting `key`, or why not: `None` = the key is not one of this
    /// deployment's. Open deployments are single-tenant (`default`), whatever the key.
    pub fn tenant(&self, key: Option<&str>) -> Result<Option<Arc<Tenant>>, String> {
        match &self.tenancy {
            Tenancy::Open => Ok(Some(default_tenant())),
            Tenancy::Keys(t) => Ok(key.and_then(|k| t.authenticate(k))),
            Tenancy::Unavailable(why) => Err(why.clone()),
        }
    }
}

/// The single tenant of an open deployment.
pub fn default_tenant() -> Arc<Tenant> {
    Arc::new(Tenant {
        id: modelfleet_api::tenants::DEFAULT_TENANT.into(),
        max_concurrent_requests: None,
        max_queued_tokens: None,
        limits: Default::default(),
    })
}

/// What a served name means.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Claim {
    /// The base model of a deployment.
    Base(DeploymentId),
    /// An adapter of a deployment.
    Adapter(DeploymentId),
    /// More than one deployment claims it.
    Conflict(Vec<DeploymentId>),
}

/// What `model` resolves to.
#[derive(Clone, Debug)]
pub enum Resolution {
    /// Nothing in scope has this name.
    Unknown,
    /// Several deployments claim it (the operator marks them `ServedNameConflict`).
    Conflict(Vec<DeploymentId>),
    /// A deployment's base model.
    Base(Arc<Deployment>),
    /// An adapter (by served name) of a deployment.
    Adapter(Arc<Deployment>, String),
}

/// The snapshot.
#[derive(Clone, Debug, Default)]
pub struct Fleet {
    /// Every deployment in scope.
    pub deployments: BTreeMap<DeploymentId, Arc<Deployment>>,
    names: HashMap<String, Claim>,
    /// Whether every watch had listed its objects once when this was built.
    pub synced: bool,
}

impl Fleet {
    /// A snapshot of `deployments`, with the served-name index.
    pub fn new(deployments: Vec<Deployment>, synced: bool) -> Fleet {
        let mut names: HashMap<String, Claim> = HashMap::new();
        let mut claim = |name: &str, c: Claim, id: &DeploymentId| {
            let next = match names.remove(name) {
                None => c,
                Some(Claim::Base(other) | Claim::Adapter(other)) if &other == id => c,
                Some(Claim::Base(other) | Claim::Adapter(other)) => Claim::Conflict(vec![other, id.clone()]),
                Some(Claim::Conflict(mut ids)) => {
                    if !ids.contains(id) {
                        ids.push(id.clone());
                    }
                    Claim::Conflict(ids)
                }
            };
            names.insert(name.to_string(), next);
        };
        for d in &deployments {
            claim(&d.served_name, Claim::Base(d.id.clone()), &d.id);
            for a in d.adapters.keys() {
                claim(a, Claim::Adapter(d.id.clone()), &d.id);
            }
        }
        Fleet {
            deployments: deployments
                .into_iter()
                .map(|d| (d.id.clone(), Arc::new(d)))
                .collect(),
            names,
            synced,
        }
    }

    /// What `model` names.
    pub fn resolve(&self, model: &str) -> Resolution {
        match self.names.get(model) {
            None => Resolution::Unknown,
            Some(Claim::Conflict(ids)) => {
                let mut ids = ids.clone();
                ids.sort();
                Resolution::Conflict(ids)
            }
            Some(Claim::Base(id)) => Resolution::Base(self.deployments[id].clone()),
            Some(Claim::Adapter(id)) => Resolution::Adapter(self.deployments[id].clone(), model.to_string()),
        }
    }

    /// Whether a keyless deployment is in scope (then unknown keys are not refused at the edge).
    pub fn any_open(&self) -> bool {
        self.deployments
            .values()
            .any(|d| matches!(d.tenancy, Tenancy::Open))
    }

    /// Whether `key` belongs to a tenant of any deployment in scope.
    pub fn knows_key(&self, key: &str) -> bool {
        self.deployments.values().any(|d| match &d.tenancy {
            Tenancy::Keys(t) => t.authenticate(key).is_some(),
            _ => false,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_declared_task_refuses_the_other_tasks_endpoints() {
        use modelfleet_crds::model_source::ModelTask;
        let mut d = deployment("ns", "m", "minilm", &[]);
        for path in ["/v1/embeddings", "/v1/chat/completions", "/v1/completions"] {
            assert!(d.check_task(path).is_ok(), "undeclared: the pods decide ({path})");
        }
        d.task = Some(ModelTask::Embed);
        assert!(d.check_task("/v1/embeddings").is_ok());
        let e = d.check_task("/v1/chat/completions").unwrap_err();
        assert_eq!((e.status(), e.param.as_deref()), (400, Some("model")));
        assert!(
            e.message.contains("`minilm` is an embedding model"),
            "{}",
            e.message
        );
        d.task = Some(ModelTask::Generate);
        assert!(d.check_task("/v1/completions").is_ok());
        let e = d.check_task("/v1/embeddings").unwrap_err();
        assert!(e.message.contains("generation model"), "{}", e.message);
    }

    pub(crate) fn deployment(ns: &str, name: &str, served: &str, adapters: &[&str]) -> Deployment {
        Deployment {
            id: DeploymentId {
                namespace: ns.into(),
                name: name.into(),
            },
            served_name: served.into(),
            tenancy: Tenancy::Open,
            shared_prefix_cache: false,
            pods: vec![],
            ring: Arc::new(Ring::new::<String>(&[])),
            adapters: adapters
                .iter()
                .map(|a| {
                    (
                        a.to_string(),
                        Adapter {
                            served_name: a.to_string(),
                            tenants: vec![],
                            loaded_on: BTreeSet::new(),
                        },
                    )
                })
                .collect(),
            created: 0,
            max_model_len: None,
            task: None,
            prices: Default::default(),
            split: None,
            fallback: None,
            providers: Default::default(),
        }
    }

    #[test]
    fn names_resolve_and_conflicts_are_never_a_silent_pick() {
        let fleet = Fleet::new(
            vec![
                deployment("a", "one", "llama", &["llama-sql"]),
                deployment("b", "two", "qwen", &["shared"]),
                deployment("c", "three", "mistral", &["shared"]),
                deployment("d", "four", "llama-sql", &[]),
            ],
            true,
        );
        assert!(matches!(fleet.resolve("llama"), Resolution::Base(d) if d.id.name == "one"));
        assert!(matches!(fleet.resolve("qwen"), Resolution::Base(d) if d.id.name == "two"));
        assert!(matches!(fleet.resolve("nope"), Resolution::Unknown));
        for name in ["shared", "llama-sql"] {
            let Resolution::Conflict(ids) = fleet.resolve(name) else {
                panic!("{name} resolved to one deployment")
            };
            assert_eq!(ids.len(), 2);
        }
        let fleet = Fleet::new(vec![deployment("b", "two", "qwen", &["qwen-sql"])], true);
        assert!(
            matches!(fleet.resolve("qwen-sql"), Resolution::Adapter(d, a) if d.id.name == "two" && a == "qwen-sql")
        );
        assert!(fleet.any_open());
    }
}
