//! Authentication and admission at the edge, in two steps.
//!
//! 1. [`admit`], before the body is read: unless a keyless deployment is in scope, a request whose
//!    `Authorization: Bearer` key belongs to no tenant of any deployment in scope is a 401 — an
//!    unauthenticated client cannot make the gateway read (or buffer) a body.
//! 2. [`authorize`], once `model` is known: the deployment's own tenants decide. A name the caller may
//!    not use — an unknown model, another deployment's model, an adapter not listed for its tenant —
//!    is the same 404, so the answer reveals nothing about what exists (the runtime does the same).
//!
//! Then [`crate::limits`] applies the tenant's limits over the whole fleet (requests in flight,
//! requests and tokens per minute, spend budgets).
//! Invariants: the tenant comes from the key, never from the body; keys are never logged or echoed.

use crate::fleet::{Deployment, Fleet, Resolution};
use modelfleet_api::error::{ApiError, ApiErrorKind};
use modelfleet_api::tenants::Tenant;
use std::sync::Arc;

fn missing_key() -> ApiError {
    ApiError::new(
        ApiErrorKind::Authentication,
        "missing API key: send `Authorization: Bearer <key>`",
    )
}

fn invalid_key() -> ApiError {
    ApiError::new(ApiErrorKind::Authentication, "invalid API key")
}

/// The one answer for a model the caller may not use or that does not exist.
pub fn not_found(model: &str) -> ApiError {
    ApiError {
        param: Some("model".into()),
        code: Some("model_not_found".into()),
        ..ApiError::new(
            ApiErrorKind::NotFound,
            format!("the model `{model}` does not exist (GET /v1/models lists the models you may use)"),
        )
    }
}

/// Step 1: may this request's body be read at all?
pub fn admit(fleet: &Fleet, key: Option<&str>) -> Result<(), ApiError> {
    if fleet.any_open() {
        return Ok(());
    }
    match key {
        None => Err(missing_key()),
        Some(k) if fleet.knows_key(k) => Ok(()),
        Some(_) => Err(invalid_key()),
    }
}

/// Where an authorized request goes.
#[derive(Clone, Debug)]
pub struct Authorized {
    /// The deployment.
    pub deployment: Arc<Deployment>,
    /// The caller's tenant in it.
    pub tenant: Arc<Tenant>,
    /// The adapter's served name, when `model` names one.
    pub adapter: Option<String>,
}

/// Step 2: `model` for the caller presenting `key` (already past [`admit`]). A model the key does not
/// open — including a keyed deployment's when the caller has no key for it — is the same 404 as one
/// that does not exist.
pub fn authorize(fleet: &Fleet, model: &str, key: Option<&str>) -> Result<Authorized, ApiError> {
    let (d, adapter) = match fleet.resolve(model) {
        Resolution::Unknown => return Err(not_found(model)),
        Resolution::Conflict(_) => {
            return Err(ApiError {
                param: Some("model".into()),
                code: Some("served_name_conflict".into()),
                ..ApiError::new(
                    ApiErrorKind::NotFound,
                    format!(
                        "the model `{model}` is claimed by more than one ModelDeployment behind this \
                         gateway (their status shows ServedNameConflict); no request is routed until one \
                         is renamed"
                    ),
                )
            });
        }
        Resolution::Base(d) => (d, None),
        Resolution::Adapter(d, a) => (d, Some(a)),
    };
    match d.tenant(key) {
        Err(why) => Err(ApiError::new(
            ApiErrorKind::Unavailable,
            format!("`{model}` cannot authenticate callers right now: {why}"),
        )),
        Ok(None) => Err(not_found(model)),
        Ok(Some(tenant)) => finish(d, tenant, adapter, model),
    }
}

fn finish(
    deployment: Arc<Deployment>,
    tenant: Arc<Tenant>,
    adapter: Option<String>,
    model: &str,
) -> Result<Authorized, ApiError> {
    if let Some(a) = &adapter
        && !deployment.adapters[a].allows(&tenant.id)
    {
        return Err(not_found(model));
    }
    Ok(Authorized {
        deployment,
        tenant,
        adapter,
    })
}

/// The names a caller presenting `key` may use, per deployment: (deployment, base name, adapters).
pub fn visible(fleet: &Fleet, key: Option<&str>) -> Vec<(Arc<Deployment>, Vec<String>)> {
    fleet
        .deployments
        .values()
        .filter_map(|d| {
            let tenant = d.tenant(key).ok().flatten()?;
            let adapters = d
                .adapters
                .values()
                .filter(|a| a.allows(&tenant.id))
                .map(|a| a.served_name.clone())
                .collect();
            Some((d.clone(), adapters))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fleet::{Adapter, DeploymentId, Tenancy};
    use crate::ring::Ring;
    use modelfleet_api::tenants::Tenants;
    use std::collections::{BTreeMap, BTreeSet};

    fn deployment(
        name: &str,
        served: &str,
        tenancy: Tenancy,
        adapter: Option<(&str, &[&str])>,
    ) -> Deployment {
        Deployment {
            id: DeploymentId {
                namespace: "ns".into(),
                name: name.into(),
            },
            served_name: served.into(),
            tenancy,
            shared_prefix_cache: false,
            pods: vec![],
            ring: Arc::new(Ring::new::<String>(&[])),
            adapters: adapter
                .into_iter()
                .map(|(a, tenants)| {
                    (
                        a.to_string(),
                        Adapter {
                            served_name: a.into(),
                            tenants: tenants.iter().map(|t| t.to_string()).collect(),
                            loaded_on: BTreeSet::new(),
                        },
                    )
                })
                .collect::<BTreeMap<_, _>>(),
            created: 0,
            max_model_len: None,
            task: None,
            prices: Default::default(),
            split: None,
            fallback: None,
            providers: Default::default(),
        }
    }

    fn keys(text: &str) -> Tenancy {
        Tenancy::Keys(Arc::new(Tenants::parse(text).unwrap()))
    }

    fn keyed_fleet() -> Fleet {
        let two = "tenants:\n- id: a\n  apiKeys: [sk-tenant-a]\n- id: b\n  apiKeys: [sk-tenant-b]\n";
        let other = "tenants:\n- id: c\n  apiKeys: [sk-tenant-c]\n";
        Fleet::new(
            vec![
                deployment("chat", "llama", keys(two), Some(("a-only", &["a"]))),
                deployment("other", "qwen", keys(other), None),
            ],
            true,
        )
    }

    fn status(r: Result<Authorized, ApiError>) -> Result<(String, Option<String>), (u16, String)> {
        r.map(|a| (a.tenant.id.clone(), a.adapter.clone()))
            .map_err(|e| (e.status(), e.code.unwrap_or_default()))
    }

    #[test]
    fn edge_refuses_unknown_keys_unless_an_open_deployment_is_in_scope() {
        let f = keyed_fleet();
        assert_eq!(admit(&f, None).unwrap_err().status(), 401);
        assert_eq!(admit(&f, Some("sk-nobody-1")).unwrap_err().status(), 401);
        assert!(admit(&f, Some("sk-tenant-c")).is_ok());
        let open = Fleet::new(
            vec![
                deployment(
                    "chat",
                    "llama",
                    keys("tenants:\n- id: a\n  apiKeys: [sk-tenant-a]\n"),
                    None,
                ),
                deployment("open", "free", Tenancy::Open, None),
            ],
            true,
        );
        assert!(admit(&open, None).is_ok());
        assert!(admit(&open, Some("sk-nobody-1")).is_ok());
        // Past the edge, the keyed deployment still wants its own key — without it, it looks like a
        // name that does not exist; the open one takes anyone.
        let nf = Err((404, "model_not_found".to_string()));
        assert_eq!(status(authorize(&open, "llama", None)), nf);
        assert_eq!(status(authorize(&open, "llama", Some("sk-nobody-1"))), nf);
        assert_eq!(status(authorize(&open, "nothing", Some("sk-nobody-1"))), nf);
        assert_eq!(
            status(authorize(&open, "free", None)),
            Ok(("default".into(), None))
        );
        assert_eq!(
            status(authorize(&open, "llama", Some("sk-tenant-a"))),
            Ok(("a".into(), None))
        );
    }

    #[test]
    fn no_existence_oracle() {
        let f = keyed_fleet();
        let nf = Err((404, "model_not_found".to_string()));
        assert_eq!(
            status(authorize(&f, "llama", Some("sk-tenant-a"))),
            Ok(("a".into(), None))
        );
        assert_eq!(
            status(authorize(&f, "a-only", Some("sk-tenant-a"))),
            Ok(("a".into(), Some("a-only".into())))
        );
        // Tenant b: the adapter it may not use, a model of another deployment, and a name that does
        // not exist all get the same answer.
        assert_eq!(status(authorize(&f, "a-only", Some("sk-tenant-b"))), nf);
        assert_eq!(status(authorize(&f, "qwen", Some("sk-tenant-b"))), nf);
        assert_eq!(status(authorize(&f, "nothing", Some("sk-tenant-b"))), nf);
        assert_eq!(
            authorize(&f, "a-only", Some("sk-tenant-b")).unwrap_err().message,
            authorize(&f, "nothing", Some("sk-tenant-b"))
                .unwrap_err()
                .message
                .replace("nothing", "a-only")
        );
        let seen: Vec<(String, Vec<String>)> = visible(&f, Some("sk-tenant-b"))
            .into_iter()
            .map(|(d, a)| (d.served_name.clone(), a))
            .collect();
        assert_eq!(seen, [("llama".to_string(), vec![])]);
        let seen: Vec<Vec<String>> = visible(&f, Some("sk-tenant-a"))
            .into_iter()
            .map(|(_, a)| a)
            .collect();
        assert_eq!(seen, [vec!["a-only".to_string()]]);
    }

    #[test]
    fn conflicts_and_unreadable_secrets() {
        let f = Fleet::new(
            vec![
                deployment(
                    "x",
                    "same",
                    keys("tenants:\n- id: a\n  apiKeys: [sk-tenant-a]\n"),
                    None,
                ),
                deployment(
                    "y",
                    "same",
                    Tenancy::Unavailable("the Secret is missing".into()),
                    None,
                ),
                deployment(
                    "z",
                    "broken",
                    Tenancy::Unavailable("the Secret is missing".into()),
                    None,
                ),
            ],
            true,
        );
        assert_eq!(
            status(authorize(&f, "same", Some("sk-tenant-a"))),
            Err((404, "served_name_conflict".into()))
        );
        assert_eq!(
            status(authorize(&f, "broken", Some("sk-tenant-a"))),
            Err((503, String::new()))
        );
    }
}
