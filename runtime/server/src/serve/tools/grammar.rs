//! The Lark grammar that constrains a tool-calling answer (llguidance's dialect).
//!
//! ```text
//! start: calls                      (required, named)     start: TEXT | calls   (auto)
//! calls: call ("\n" call){0,7}      (parallel; else `calls: call`; named: one call)
//! call: "<tool_call>" body "</tool_call>"
//! body: %json {anyOf: [{name: {const: f}, arguments: <f's parameters>}, …]}   (compact JSON)
//! TEXT: /(?s:.+)/ & ~/(?s:.*)<tool_call>(?s:.*)/
//! ```
//!
//! Each function's parameters schema is placed under `$defs/tool<i>` of the call schema, and its own
//! local references (`#`, `#/$defs/…`, `#/properties/…`) are rewritten to point inside that entry, so
//! pydantic-style schemas with `$defs` keep resolving. Property order is `name` then `arguments`.

use super::{CLOSE, MAX_CALLS, OPEN};
use crate::api::structured::{FunctionDef, ToolMode, ToolPlan};
use serde_json::{Map, Value, json};

/// Rewrites local `$ref`s of a schema moved to `#/$defs/<at>`. Values that are data, not schemas
/// (`const`, `enum`, `default`, `examples`), are left alone.
fn relocate(schema: &mut Value, at: &str) {
    match schema {
        Value::Object(map) => {
            for (k, v) in map.iter_mut() {
                match (k.as_str(), v) {
                    ("$ref", Value::String(r)) => {
                        if r == "#" {
                            *r = format!("#/$defs/{at}");
                        } else if let Some(path) = r.strip_prefix("#/") {
                            *r = format!("#/$defs/{at}/{path}");
                        }
                    }
                    ("const" | "enum" | "default" | "examples", _) => {}
                    (_, v) => relocate(v, at),
                }
            }
        }
        Value::Array(items) => items.iter_mut().for_each(|v| relocate(v, at)),
        _ => {}
    }
}

/// The schema of one call of `f`, whose parameters live at `#/$defs/<at>`.
fn call_schema(f: &FunctionDef, at: &str) -> Value {
    json!({
        "type": "object",
        "properties": {"name": {"const": f.name}, "arguments": {"$ref": format!("#/$defs/{at}")}},
        "required": ["name", "arguments"],
        "additionalProperties": false
    })
}

/// The JSON schema of one call body, over the functions `mode` allows.
pub fn body_schema(plan: &ToolPlan) -> Value {
    let allowed: Vec<&FunctionDef> = match &plan.mode {
        ToolMode::Named(n) => plan.tools.iter().filter(|f| &f.name == n).collect(),
        _ => plan.tools.iter().collect(),
    };
    let mut defs = Map::new();
    let mut calls = Vec::new();
    for (i, f) in allowed.iter().enumerate() {
        let at = format!("tool{i}");
        let mut params = f
            .parameters
            .clone()
            .unwrap_or_else(|| json!({"type": "object", "properties": {}, "additionalProperties": false}));
        relocate(&mut params, &at);
        defs.insert(at.clone(), params);
        calls.push(call_schema(f, &at));
    }
    let mut schema = if calls.len() == 1 {
        calls.pop().expect("one call")
    } else {
        json!({"anyOf": calls})
    };
    schema["$defs"] = Value::Object(defs);
    schema["x-guidance"] = json!({"whitespace_flexible": false});
    schema
}

/// The grammar for `plan`, or `None` when nothing is constrained (`none`).
pub fn lark(plan: &ToolPlan) -> Option<String> {
    if plan.mode == ToolMode::None {
        return None;
    }
    let lit = |s: &str| Value::from(s).to_string();
    let calls = if plan.parallel && !matches!(plan.mode, ToolMode::Named(_)) {
        format!("calls: call (\"\\n\" call){{0,{}}}\n", MAX_CALLS - 1)
    } else {
        "calls: call\n".to_owned()
    };
    let start = match plan.mode {
        ToolMode::Auto => "start: TEXT | calls\n",
        _ => "start: calls\n",
    };
    let mut g = String::from("%llguidance {}\n");
    g.push_str(start);
    g.push_str(&calls);
    g.push_str(&format!("call: {} body {}\n", lit(OPEN), lit(CLOSE)));
    g.push_str(&format!("body: %json {}\n", body_schema(plan)));
    if plan.mode == ToolMode::Auto {
        g.push_str(&format!("TEXT: /(?s:.+)/ & ~/(?s:.*){}(?s:.*)/\n", OPEN));
    }
    Some(g)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::structured::{Tool, ToolChoice, tool_plan};

    fn plan(choice: Value, parallel: Option<bool>) -> ToolPlan {
        let tools: Vec<Tool> = serde_json::from_value(json!([
            {"type": "function", "function": {"name": "a", "parameters": {"type": "object",
                "properties": {"p": {"$ref": "#/$defs/P"}, "q": {"const": {"$ref": "#/x"}}}, "$defs": {"P": {"type": "integer"}}}}},
            {"type": "function", "function": {"name": "b"}}
        ]))
        .unwrap();
        let c: Option<ToolChoice> = (!choice.is_null()).then(|| serde_json::from_value(choice).unwrap());
        tool_plan(Some(&tools), c.as_ref(), parallel).unwrap()
    }

    #[test]
    fn references_are_relocated_and_calls_listed() {
        let s = body_schema(&plan(json!("required"), None));
        assert_eq!(
            s["$defs"]["tool0"]["properties"]["p"]["$ref"],
            "#/$defs/tool0/$defs/P"
        );
        assert_eq!(
            s["$defs"]["tool0"]["properties"]["q"]["const"]["$ref"], "#/x",
            "data untouched"
        );
        assert_eq!(s["anyOf"][1]["properties"]["name"]["const"], "b");
        assert_eq!(
            s["$defs"]["tool1"]["additionalProperties"], false,
            "no parameters: {{}} only"
        );
        let named = body_schema(&plan(
            json!({"type": "function", "function": {"name": "b"}}),
            None,
        ));
        assert_eq!(named["properties"]["name"]["const"], "b");
        assert!(named.get("anyOf").is_none());
    }

    #[test]
    fn modes_shape_the_grammar() {
        assert!(lark(&plan(json!("none"), None)).is_none());
        let auto = lark(&plan(Value::Null, None)).unwrap();
        assert!(auto.contains("start: TEXT | calls") && auto.contains("{0,7}") && auto.contains("~/"));
        let one = lark(&plan(json!("required"), Some(false))).unwrap();
        assert!(one.contains("start: calls\ncalls: call\n"), "{one}");
        assert!(!one.contains("TEXT"));
    }
}
