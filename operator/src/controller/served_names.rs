//! `ServedNameConflict`: two ModelDeployments behind one gateway claiming one name in `model`. A
//! deployment claims its base model's served name and its LoraAdapters' served names; two deployments
//! in one scope (every namespace the operator sees, or one namespace when each has its own gateway —
//! `--served-name-scope`) that claim a common name both get the condition, naming the other. The
//! gateway routes such a name to neither (it never silently picks one).
//!
//! Pure: computed from the controller's caches of ModelDeployments and LoraAdapters; one being deleted
//! claims nothing. Invariant: the relation is symmetric — if A conflicts with B, B conflicts with A — so the condition appears on
//! both; a deployment whose conflicts changed asks for its peers to be reconciled again.

use crate::config::ServedNameScope;
use kube::ResourceExt;
use modelfleet_crds::{LoraAdapter, ModelDeployment};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

/// One shared name: the name, and the other deployment (`namespace/name`).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Clash {
    /// The served name both claim.
    pub name: String,
    /// The other ModelDeployment, `namespace/name`.
    pub other: String,
}

fn base_name(md: &ModelDeployment) -> String {
    md.spec.model.served_name.clone().unwrap_or_else(|| md.name_any())
}

/// Every name `md` claims: its base model's and its adapters'.
fn claims(md: &ModelDeployment, adapters: &BTreeMap<(String, String), Vec<String>>) -> BTreeSet<String> {
    let key = (md.namespace().unwrap_or_default(), md.name_any());
    let mut names: BTreeSet<String> = adapters.get(&key).into_iter().flatten().cloned().collect();
    names.insert(base_name(md));
    names
}

/// The names `md` shares with other deployments in its scope.
pub fn clashes(
    md: &ModelDeployment,
    scope: ServedNameScope,
    all: &[Arc<ModelDeployment>],
    adapters: &[Arc<LoraAdapter>],
) -> Vec<Clash> {
    let mut by_md: BTreeMap<(String, String), Vec<String>> = BTreeMap::new();
    for a in adapters {
        by_md
            .entry((
                a.namespace().unwrap_or_default(),
                a.spec.model_deployment_ref.name.clone(),
            ))
            .or_default()
            .push(a.spec.served_name.clone().unwrap_or_else(|| a.name_any()));
    }
    // A ModelDeployment being deleted claims nothing (so a namespace torn down does not hold a name).
    if md.metadata.deletion_timestamp.is_some() {
        return Vec::new();
    }
    let me = (md.namespace().unwrap_or_default(), md.name_any());
    let mine = claims(md, &by_md);
    let mut out: Vec<Clash> = all
        .iter()
        .filter(|o| {
            let key = (o.namespace().unwrap_or_default(), o.name_any());
            key != me
                && o.metadata.deletion_timestamp.is_none()
                && (scope == ServedNameScope::Cluster || key.0 == me.0)
        })
        .flat_map(|o| {
            let other = format!("{}/{}", o.namespace().unwrap_or_default(), o.name_any());
            claims(o, &by_md)
                .intersection(&mine)
                .map(|name| Clash {
                    name: name.clone(),
                    other: other.clone(),
                })
                .collect::<Vec<_>>()
        })
        .collect();
    out.sort();
    out
}

/// The condition's message for `clashes` (None: no conflict).
pub fn message(clashes: &[Clash]) -> Option<String> {
    if clashes.is_empty() {
        return None;
    }
    let listed: Vec<String> = clashes
        .iter()
        .take(8)
        .map(|c| format!("`{}` (also {})", c.name, c.other))
        .collect();
    let more = clashes.len().saturating_sub(8);
    Some(format!(
        "served names claimed by another ModelDeployment behind the same gateway: {}{}; the gateway routes \
         none of them until one is renamed (or each namespace gets its own gateway)",
        listed.join(", "),
        if more > 0 {
            format!(" and {more} more")
        } else {
            String::new()
        }
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use modelfleet_crds::lora_adapter::{LoraAdapterSpec, ModelDeploymentRef};

    const D: &str = "sha256:1111111111111111111111111111111111111111111111111111111111111111";

    fn md(ns: &str, name: &str, served: Option<&str>) -> Arc<ModelDeployment> {
        let mut spec = serde_json::json!({"model": {"uri": "file:///m", "digest": D}});
        if let Some(s) = served {
            spec["model"]["servedName"] = s.into();
        }
        let mut m = ModelDeployment::new(name, serde_json::from_value(spec).unwrap());
        m.metadata.namespace = Some(ns.into());
        Arc::new(m)
    }

    fn adapter(ns: &str, name: &str, base: &str) -> Arc<LoraAdapter> {
        let mut a = LoraAdapter::new(
            name,
            LoraAdapterSpec {
                model_deployment_ref: ModelDeploymentRef { name: base.into() },
                served_name: None,
                uri: "file:///a".into(),
                digest: D.into(),
                tenants: vec![],
            },
        );
        a.metadata.namespace = Some(ns.into());
        Arc::new(a)
    }

    fn names(c: &[Clash]) -> Vec<(String, String)> {
        c.iter().map(|c| (c.name.clone(), c.other.clone())).collect()
    }

    #[test]
    fn shared_names_are_conflicts_on_both_sides() {
        let all = [
            md("a", "chat", Some("llama")),
            md("b", "chat", Some("llama")),
            md("b", "other", Some("qwen")),
            md("c", "sql-base", Some("sql")),
        ];
        let adapters = [adapter("b", "sql", "other")];
        let cluster = ServedNameScope::Cluster;
        assert_eq!(
            names(&clashes(&all[0], cluster, &all, &adapters)),
            [("llama".into(), "b/chat".into())]
        );
        assert_eq!(
            names(&clashes(&all[1], cluster, &all, &adapters)),
            [("llama".into(), "a/chat".into())]
        );
        // An adapter's name against another deployment's base name.
        assert_eq!(
            names(&clashes(&all[2], cluster, &all, &adapters)),
            [("sql".into(), "c/sql-base".into())]
        );
        assert_eq!(
            names(&clashes(&all[3], cluster, &all, &adapters)),
            [("sql".into(), "b/other".into())]
        );
        // A gateway per namespace: only same-namespace names clash.
        let ns = ServedNameScope::Namespace;
        assert!(clashes(&all[0], ns, &all, &adapters).is_empty());
        assert!(clashes(&all[2], ns, &all, &adapters).is_empty());
        let m = message(&clashes(&all[0], cluster, &all, &adapters)).unwrap();
        assert!(m.contains("`llama` (also b/chat)"), "{m}");
        assert_eq!(message(&[]), None);
    }

    #[test]
    fn a_deployment_being_deleted_claims_nothing() {
        let mut going = (*md("a", "chat", Some("llama"))).clone();
        going.metadata.deletion_timestamp = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
            k8s_openapi::jiff::Timestamp::now(),
        ));
        let all = [Arc::new(going), md("b", "chat", Some("llama"))];
        let cluster = ServedNameScope::Cluster;
        assert!(clashes(&all[1], cluster, &all, &[]).is_empty());
        assert!(clashes(&all[0], cluster, &all, &[]).is_empty(), "symmetric");
    }
}
