//! Which namespaces the operator manages (`run --namespaces`): every namespace, through cluster-wide
//! watches and the chart's ClusterRole, or a list, through one set of watches per namespace and the
//! Role the chart creates in each — so the operator holds no cluster-wide rights on Secrets,
//! ConfigMaps, Deployments or Pods at all.
//!
//! Invariant: with a list, every API call the controllers make names one of its namespaces (the
//! watches, and the per-object calls, which use the object's own namespace).

use kube::api::Api;
use kube::{Client, Resource};

/// The namespaces in scope.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Scope {
    /// Every namespace.
    All,
    /// These namespaces (sorted, without duplicates).
    Namespaces(Vec<String>),
}

impl Scope {
    /// From the flag's values: none means every namespace.
    pub fn parse(values: &[String]) -> Scope {
        let mut listed: Vec<String> = values
            .iter()
            .map(|v| v.trim().to_string())
            .filter(|v| !v.is_empty())
            .collect();
        listed.sort();
        listed.dedup();
        if listed.is_empty() {
            Scope::All
        } else {
            Scope::Namespaces(listed)
        }
    }

    /// One entry per set of watches: `None` for cluster-wide, else a namespace.
    pub fn partitions(&self) -> Vec<Option<String>> {
        match self {
            Scope::All => vec![None],
            Scope::Namespaces(list) => list.iter().cloned().map(Some).collect(),
        }
    }
}

/// The API of `K` for one partition of the scope.
pub fn api<K>(client: Client, partition: &Option<String>) -> Api<K>
where
    K: Resource<Scope = k8s_openapi::NamespaceResourceScope>,
    <K as Resource>::DynamicType: Default,
{
    match partition {
        None => Api::all(client),
        Some(ns) => Api::namespaced(client, ns),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_flag() {
        let parse = |v: &[&str]| Scope::parse(&v.iter().map(|s| s.to_string()).collect::<Vec<_>>());
        assert_eq!(parse(&[]), Scope::All);
        assert_eq!(parse(&[" ", ""]), Scope::All);
        assert_eq!(
            parse(&["b", "a", "b"]),
            Scope::Namespaces(vec!["a".into(), "b".into()])
        );
        assert_eq!(parse(&[]).partitions(), vec![None]);
        assert_eq!(
            parse(&["b", "a"]).partitions(),
            vec![Some("a".to_string()), Some("b".to_string())]
        );
    }
}
