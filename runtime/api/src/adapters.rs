//! The adapter list the operator writes and the runtime reads: one [`AdapterSpec`] per LoraAdapter —
//! the body of the admin API's `POST /v1/adapters`, and an entry of the start-up file
//! (`serve --adapters-file`, the `<md>-adapters` ConfigMap), which is [`AdaptersFile`]. One type, so the
//! two sides cannot drift; what the runtime checks before fetching (names, digests, where a URI may
//! point) is the runtime's (`adapters/spec.rs`).

use serde::{Deserialize, Serialize};

/// One adapter to load.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize, Serialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct AdapterSpec {
    /// The name clients put in `model` (the LoraAdapter's `servedName`).
    pub name: String,
    /// `file:///…`, `https://…`, `hf://org/repo@revision` (as the runtime's policy allows).
    pub uri: String,
    /// The canonical digest the adapter's bytes must have (`sha256:<64 hex>`).
    pub digest: String,
    /// Tenant ids that may use it; empty means every tenant of the server. The operator writes them
    /// sorted and without duplicates.
    #[serde(default)]
    pub tenants: Vec<String>,
}

/// The start-up file: `{"adapters": [{"name", "uri", "digest", "tenants"}]}`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct AdaptersFile {
    /// Adapters to load, sorted by name (as the operator writes them).
    #[serde(default)]
    pub adapters: Vec<AdapterSpec>,
}

impl AdaptersFile {
    /// The file's text: pretty JSON and a final newline, a pure function of the entries (an unchanged
    /// list gives byte-identical text).
    pub fn to_text(&self) -> String {
        let mut text = serde_json::to_string_pretty(self).expect("adapter entries serialise");
        text.push('\n');
        text
    }

    /// Parses the file's text (empty text: no adapters).
    pub fn parse(text: &str) -> Result<Self, serde_json::Error> {
        if text.trim().is_empty() {
            return Ok(AdaptersFile::default());
        }
        serde_json::from_str(text)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_file_round_trips_and_refuses_unknown_fields() {
        let file = AdaptersFile {
            adapters: vec![AdapterSpec {
                name: "sql".into(),
                uri: "hf://acme/sql@v1".into(),
                digest: format!("sha256:{}", "a".repeat(64)),
                tenants: vec!["team-a".into()],
            }],
        };
        let text = file.to_text();
        assert!(text.ends_with("}\n"));
        assert_eq!(AdaptersFile::parse(&text).unwrap(), file);
        assert_eq!(AdaptersFile::parse(" \n").unwrap(), AdaptersFile::default());
        assert!(AdaptersFile::parse(r#"{"adapters": [], "extra": 1}"#).is_err());
        assert!(
            AdaptersFile::parse(r#"{"adapters": [{"name": "x", "uri": "u", "digest": "d", "x": 1}]}"#)
                .is_err()
        );
    }
}
