//! What a request constrains its output to ([`ConstraintSpec`]), turned into llguidance's grammar input
//! and a canonical key for the compiled-grammar cache.
//!
//! JSON is generated compact: every JSON schema gets llguidance's `whitespace_flexible: false`, so no
//! whitespace may appear between tokens and a small model cannot pad a valid object until
//! `max_tokens`. A caller's own `x-guidance` options are refused (the server decides them).
//!
//! The key is SHA-256 over the kind and the spec's canonical text: JSON re-serialised without
//! insignificant whitespace, keys in their given order (property order is the order of generation, so
//! two schemas differing only in it are different grammars).

use crate::error::{EngineError, Result};
use llguidance::api::TopLevelGrammar;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

/// A structured-output constraint.
#[derive(Clone, Debug, PartialEq)]
pub enum ConstraintSpec {
    /// Output is one JSON value valid against this JSON schema (an object).
    JsonSchema(Value),
    /// Output is one JSON object (any).
    JsonObject,
    /// Output matches this regular expression (whole output, Rust `regex` syntax).
    Regex(String),
    /// Output is exactly one of these strings.
    Choice(Vec<String>),
    /// Output is a sentence of this Lark grammar (llguidance's dialect; `%json {…}` embeds schemas).
    Lark(String),
}

/// llguidance's JSON options for every schema: no free whitespace.
fn json_options() -> Value {
    json!({"whitespace_flexible": false})
}

/// A JSON schema with our options, or why it cannot be one.
pub(crate) fn with_json_options(schema: &Value) -> Result<Value> {
    let Value::Object(map) = schema else {
        return Err(EngineError::Constraint(format!(
            "a JSON schema must be an object, got {}",
            kind_of(schema)
        )));
    };
    if map.contains_key("x-guidance") {
        return Err(EngineError::Constraint(
            "`x-guidance` is not accepted in a schema (JSON is generated compact; see docs/api.md)".into(),
        ));
    }
    let mut map = map.clone();
    map.insert("x-guidance".into(), json_options());
    Ok(Value::Object(map))
}

fn kind_of(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

impl ConstraintSpec {
    /// The cache key: hex SHA-256 of the kind and the canonical text.
    pub fn key(&self) -> String {
        let (kind, text) = match self {
            ConstraintSpec::JsonSchema(v) => ("json_schema", v.to_string()),
            ConstraintSpec::JsonObject => ("json_object", String::new()),
            ConstraintSpec::Regex(r) => ("regex", r.clone()),
            ConstraintSpec::Choice(c) => ("choice", Value::from(c.clone()).to_string()),
            ConstraintSpec::Lark(g) => ("lark", g.clone()),
        };
        let mut h = Sha256::new();
        h.update(kind.as_bytes());
        h.update([0]);
        h.update(text.as_bytes());
        hex::encode(h.finalize())
    }

    /// llguidance's input for this constraint (checks what can be checked before compiling).
    pub(crate) fn grammar(&self) -> Result<TopLevelGrammar> {
        Ok(match self {
            ConstraintSpec::JsonSchema(schema) => {
                TopLevelGrammar::from_json_schema(with_json_options(schema)?)
            }
            ConstraintSpec::JsonObject => {
                TopLevelGrammar::from_json_schema(with_json_options(&json!({"type": "object"}))?)
            }
            ConstraintSpec::Regex(rx) => TopLevelGrammar::from_regex(rx),
            ConstraintSpec::Choice(choices) => {
                if choices.is_empty() {
                    return Err(EngineError::Constraint(
                        "a choice needs at least one option".into(),
                    ));
                }
                if choices.iter().any(String::is_empty) {
                    return Err(EngineError::Constraint(
                        "choices must not be empty strings".into(),
                    ));
                }
                // Lark string literals are JSON strings, so JSON escaping quotes them exactly.
                let alternatives: Vec<String> = choices
                    .iter()
                    .map(|c| Value::from(c.as_str()).to_string())
                    .collect();
                TopLevelGrammar::from_lark(format!("start: {}\n", alternatives.join(" | ")))
            }
            ConstraintSpec::Lark(g) => {
                if g.contains("::=") && !g.contains("%llguidance") {
                    return Err(EngineError::Constraint(
                        "this looks like GBNF (`::=`); grammars are accepted in Lark syntax only".into(),
                    ));
                }
                TopLevelGrammar::from_lark(g.clone())
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_ignore_whitespace_but_not_property_order() {
        let a: Value = serde_json::from_str(r#"{"type":"object","properties":{"a":{},"b":{}}}"#).unwrap();
        let a2: Value =
            serde_json::from_str("{ \"type\" : \"object\",\n \"properties\": {\"a\": {}, \"b\": {}} }")
                .unwrap();
        let b: Value = serde_json::from_str(r#"{"type":"object","properties":{"b":{},"a":{}}}"#).unwrap();
        let k = |v: &Value| ConstraintSpec::JsonSchema(v.clone()).key();
        assert_eq!(k(&a), k(&a2));
        assert_ne!(k(&a), k(&b));
        assert_ne!(
            ConstraintSpec::Regex("a".into()).key(),
            ConstraintSpec::Lark("a".into()).key(),
            "the kind is part of the key"
        );
    }

    #[test]
    fn refusals_say_why() {
        let e = |s: ConstraintSpec| s.grammar().err().unwrap().to_string();
        assert!(e(ConstraintSpec::JsonSchema(json!([1]))).contains("must be an object, got an array"));
        assert!(e(ConstraintSpec::JsonSchema(json!({"x-guidance": {}}))).contains("x-guidance"));
        assert!(e(ConstraintSpec::Choice(vec![])).contains("at least one"));
        assert!(e(ConstraintSpec::Choice(vec!["".into()])).contains("empty"));
        assert!(e(ConstraintSpec::Lark("root ::= \"a\"".into())).contains("GBNF"));
    }
}
