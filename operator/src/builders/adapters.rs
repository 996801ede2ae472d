//! The adapters `ConfigMap` (`<md>-adapters`, key `adapters.json`): the LoraAdapters a runtime pod loads
//! before `/ready` turns 200 (`serve --adapters-file`), so a new or restarted pod never takes traffic
//! without them. Running pods get later changes through the admin API, not through this file.
//!
//! Invariants: the content is a pure function of the entries, which arrive sorted by served name and
//! with sorted tenants, so an unchanged set of adapters gives byte-identical data (no rewrite); the
//! ConfigMap is owned by the ModelDeployment (garbage-collected with it); the pod template carries no
//! hash of it, so adding an adapter never restarts pods.

use super::owned_meta;
use crate::labels::adapters_configmap_name;
use k8s_openapi::api::core::v1::ConfigMap;
use modelfleet_crds::ModelDeployment;
use std::collections::BTreeMap;

/// Key of the adapter list inside the ConfigMap.
pub const ADAPTERS_KEY: &str = "adapters.json";

/// One adapter as the runtime's start-up file and its `POST /v1/adapters` body spell it (the type
/// the runtime reads them with).
pub use modelfleet_api::adapters::AdapterSpec;
use modelfleet_api::adapters::AdaptersFile;

/// The file's text for `entries` (already sorted by the caller).
pub fn adapters_json(entries: &[AdapterSpec]) -> String {
    AdaptersFile {
        adapters: entries.to_vec(),
    }
    .to_text()
}

/// The ConfigMap listing `entries` for `md`.
pub fn desired_adapters_configmap(md: &ModelDeployment, entries: &[AdapterSpec]) -> ConfigMap {
    let name = md.metadata.name.clone().unwrap_or_default();
    ConfigMap {
        metadata: owned_meta(md, adapters_configmap_name(&name)),
        data: Some(BTreeMap::from([(
            ADAPTERS_KEY.to_string(),
            adapters_json(entries),
        )])),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::builders::fixtures::minimal;

    fn entry(name: &str, tenants: &[&str]) -> AdapterSpec {
        AdapterSpec {
            name: name.into(),
            uri: format!("file:///adapters/{name}"),
            digest: format!("sha256:{}", "a".repeat(64)),
            tenants: tenants.iter().map(|t| t.to_string()).collect(),
        }
    }

    #[test]
    fn configmap_is_owned_named_and_holds_the_list() {
        let cm = desired_adapters_configmap(&minimal(), &[entry("sql", &[]), entry("tone", &["team-a"])]);
        assert_eq!(cm.metadata.name.as_deref(), Some("smollm2-adapters"));
        assert_eq!(cm.metadata.namespace.as_deref(), Some("serving"));
        let owner = &cm.metadata.owner_references.as_ref().unwrap()[0];
        assert_eq!(
            (owner.kind.as_str(), owner.controller),
            ("ModelDeployment", Some(true))
        );
        let text = &cm.data.as_ref().unwrap()[ADAPTERS_KEY];
        let parsed: serde_json::Value = serde_json::from_str(text).unwrap();
        assert_eq!(
            parsed,
            serde_json::json!({"adapters": [
                {"name": "sql", "uri": "file:///adapters/sql", "digest": format!("sha256:{}", "a".repeat(64)),
                 "tenants": []},
                {"name": "tone", "uri": "file:///adapters/tone", "digest": format!("sha256:{}", "a".repeat(64)),
                 "tenants": ["team-a"]},
            ]})
        );
    }

    #[test]
    fn content_is_deterministic_and_an_empty_list_is_still_a_file() {
        let entries = [entry("a", &["x", "y"]), entry("b", &[])];
        assert_eq!(adapters_json(&entries), adapters_json(&entries.clone()));
        assert_eq!(adapters_json(&[]), "{\n  \"adapters\": []\n}\n");
    }
}
