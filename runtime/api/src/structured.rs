//! Structured output and tools on the wire: OpenAI's `response_format`, `tools`, `tool_choice` and
//! `parallel_tool_calls`; vLLM's `structured_outputs` object and its older top-level `guided_json`,
//! `guided_regex`, `guided_choice` and `guided_grammar`.
//!
//! Invariants: at most one constraint per request — two of them (say `response_format` and
//! `guided_regex`) are a 400 naming both; what is parsed here is only shape and size (the grammar
//! engine judges schemas, regexes and grammars when it compiles them, still before anything is
//! queued); sizes are bounded here so a request cannot hand the compiler megabytes.

use crate::error::ApiError;
use serde::Deserialize;
use serde_json::Value;

/// Longest schema, regex or grammar accepted, in bytes of its JSON text.
pub const MAX_CONSTRAINT_BYTES: usize = 64 * 1024;
/// Most options of a choice constraint.
pub const MAX_CHOICES: usize = 256;
/// Most tools in one request.
pub const MAX_TOOLS: usize = 64;

/// `response_format`.
#[derive(Deserialize, schemars::JsonSchema, Clone, Debug, PartialEq)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
pub enum ResponseFormat {
    /// Free text (the default).
    Text {},
    /// Any JSON object.
    JsonObject {},
    /// A JSON value valid against a schema.
    JsonSchema {
        /// The schema and its name.
        json_schema: JsonSchemaFormat,
    },
}

/// `response_format.json_schema`.
#[derive(Deserialize, schemars::JsonSchema, Clone, Debug, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct JsonSchemaFormat {
    /// The schema's name (letters, digits, `_` and `-`, at most 64).
    pub name: String,
    /// What the format is for (accepted, unused).
    #[serde(default)]
    pub description: Option<String>,
    /// The JSON schema (an object); absent means any JSON object.
    #[serde(default)]
    pub schema: Option<Value>,
    /// OpenAI's strict mode. The schema is always enforced while decoding, strict or not.
    #[serde(default)]
    pub strict: Option<bool>,
}

/// vLLM's `structured_outputs`: exactly one of its constraint fields.
#[derive(Deserialize, schemars::JsonSchema, Clone, Debug, Default, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct StructuredOutputs {
    /// A JSON schema (an object, or its JSON text).
    #[serde(default)]
    pub json: Option<Value>,
    /// A regular expression the whole output matches.
    #[serde(default)]
    pub regex: Option<String>,
    /// The output is exactly one of these strings.
    #[serde(default)]
    pub choice: Option<Vec<String>>,
    /// A Lark grammar (llguidance's dialect).
    #[serde(default)]
    pub grammar: Option<String>,
    /// Any JSON object.
    #[serde(default)]
    pub json_object: Option<bool>,
}

/// One tool the model may call.
#[derive(Deserialize, schemars::JsonSchema, Clone, Debug, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Tool {
    /// Must be `function`.
    #[serde(rename = "type")]
    pub type_: String,
    /// The function.
    pub function: FunctionDef,
}

/// A callable function.
#[derive(Deserialize, schemars::JsonSchema, Clone, Debug, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct FunctionDef {
    /// Its name (letters, digits, `_` and `-`, at most 64).
    pub name: String,
    /// What it does (shown to the model).
    #[serde(default)]
    pub description: Option<String>,
    /// A JSON schema of its arguments (an object schema); absent means no arguments.
    #[serde(default)]
    pub parameters: Option<Value>,
    /// OpenAI's strict mode. Arguments are always enforced while decoding, strict or not.
    #[serde(default)]
    pub strict: Option<bool>,
}

/// `tool_choice`: `none`, `auto`, `required`, or one named function.
#[derive(Deserialize, schemars::JsonSchema, Clone, Debug, PartialEq)]
#[serde(untagged)]
pub enum ToolChoice {
    /// `none`, `auto` or `required`.
    Mode(String),
    /// `{"type": "function", "function": {"name": …}}`.
    Named(NamedToolChoice),
}

/// A named `tool_choice`.
#[derive(Deserialize, schemars::JsonSchema, Clone, Debug, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct NamedToolChoice {
    /// Must be `function`.
    #[serde(rename = "type")]
    pub type_: String,
    /// Which function.
    pub function: FunctionName,
}

/// A function's name.
#[derive(Deserialize, schemars::JsonSchema, Clone, Debug, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct FunctionName {
    /// The name.
    pub name: String,
}

/// A call in an assistant message of the history.
#[derive(Deserialize, schemars::JsonSchema, Clone, Debug, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ToolCallIn {
    /// The call's id (a later `tool` message answers it).
    pub id: String,
    /// Must be `function`.
    #[serde(rename = "type")]
    pub type_: String,
    /// The function and its arguments.
    pub function: FunctionCallIn,
}

/// A called function in the history.
#[derive(Deserialize, schemars::JsonSchema, Clone, Debug, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct FunctionCallIn {
    /// The function's name.
    pub name: String,
    /// Its arguments as JSON text.
    pub arguments: String,
}

/// The constraint a request asks for, whichever field it came in.
#[derive(Clone, Debug, PartialEq)]
pub enum Requested {
    /// A JSON schema (an object).
    JsonSchema(Value),
    /// Any JSON object.
    JsonObject,
    /// A regular expression.
    Regex(String),
    /// One of these strings.
    Choice(Vec<String>),
    /// A Lark grammar.
    Grammar(String),
}

/// A requested constraint and the field it came from (errors name it).
#[derive(Clone, Debug, PartialEq)]
pub struct RequestedConstraint {
    /// The field, e.g. `response_format.json_schema.schema` or `guided_regex`.
    pub field: String,
    /// The constraint.
    pub what: Requested,
}

/// The constraint fields of a request body, as parsed.
#[derive(Clone, Copy, Debug, Default)]
pub struct ConstraintFields<'a> {
    /// `response_format`.
    pub response_format: Option<&'a ResponseFormat>,
    /// `structured_outputs`.
    pub structured_outputs: Option<&'a StructuredOutputs>,
    /// `guided_json`.
    pub guided_json: Option<&'a Value>,
    /// `guided_regex`.
    pub guided_regex: Option<&'a String>,
    /// `guided_choice`.
    pub guided_choice: Option<&'a Vec<String>>,
    /// `guided_grammar`.
    pub guided_grammar: Option<&'a String>,
}

fn too_large(field: &str, bytes: usize) -> ApiError {
    ApiError::invalid(
        field,
        format!("`{field}` is {bytes} bytes; the limit is {MAX_CONSTRAINT_BYTES}"),
    )
}

/// A schema given as an object or as its JSON text.
fn schema_of(field: &str, v: &Value) -> Result<Value, ApiError> {
    let v = match v {
        Value::String(s) => serde_json::from_str(s)
            .map_err(|e| ApiError::invalid(field, format!("`{field}` is not valid JSON: {e}")))?,
        other => other.clone(),
    };
    if !v.is_object() {
        return Err(ApiError::invalid(
            field,
            format!("`{field}` must be a JSON schema object"),
        ));
    }
    let bytes = v.to_string().len();
    if bytes > MAX_CONSTRAINT_BYTES {
        return Err(too_large(field, bytes));
    }
    Ok(v)
}

fn text_of(field: &str, s: &str) -> Result<String, ApiError> {
    if s.is_empty() {
        return Err(ApiError::invalid(field, format!("`{field}` must not be empty")));
    }
    if s.len() > MAX_CONSTRAINT_BYTES {
        return Err(too_large(field, s.len()));
    }
    Ok(s.to_owned())
}

fn choice_of(field: &str, c: &[String]) -> Result<Vec<String>, ApiError> {
    if c.is_empty() || c.len() > MAX_CHOICES {
        return Err(ApiError::invalid(
            field,
            format!("`{field}` must hold 1 to {MAX_CHOICES} strings, got {}", c.len()),
        ));
    }
    if c.iter().any(String::is_empty) {
        return Err(ApiError::invalid(
            field,
            format!("`{field}` strings must not be empty"),
        ));
    }
    let bytes: usize = c.iter().map(String::len).sum();
    if bytes > MAX_CONSTRAINT_BYTES {
        return Err(too_large(field, bytes));
    }
    Ok(c.to_vec())
}

/// A function or schema name: OpenAI's rule (letters, digits, `_`, `-`; 1 to 64).
pub fn check_name(field: &str, name: &str) -> Result<(), ApiError> {
    let ok = !name.is_empty()
        && name.len() <= 64
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
    if ok {
        Ok(())
    } else {
        Err(ApiError::invalid(
            field,
            format!("`{field}` must be 1 to 64 letters, digits, `_` or `-`, got {name:?}"),
        ))
    }
}

impl ConstraintFields<'_> {
    /// The one constraint asked for, if any; two are a 400 naming both fields.
    pub fn resolve(&self) -> Result<Option<RequestedConstraint>, ApiError> {
        let mut found: Vec<RequestedConstraint> = Vec::new();
        fn add(found: &mut Vec<RequestedConstraint>, field: &str, what: Requested) {
            found.push(RequestedConstraint {
                field: field.to_owned(),
                what,
            })
        }
        match self.response_format {
            None | Some(ResponseFormat::Text {}) => {}
            Some(ResponseFormat::JsonObject {}) => add(&mut found, "response_format", Requested::JsonObject),
            Some(ResponseFormat::JsonSchema { json_schema }) => {
                check_name("response_format.json_schema.name", &json_schema.name)?;
                let field = "response_format.json_schema.schema";
                match &json_schema.schema {
                    Some(s) => add(&mut found, field, Requested::JsonSchema(schema_of(field, s)?)),
                    None => add(&mut found, field, Requested::JsonObject),
                }
            }
        }
        if let Some(so) = self.structured_outputs {
            let before = found.len();
            if let Some(j) = &so.json {
                add(
                    &mut found,
                    "structured_outputs.json",
                    Requested::JsonSchema(schema_of("structured_outputs.json", j)?),
                );
            }
            if let Some(r) = &so.regex {
                add(
                    &mut found,
                    "structured_outputs.regex",
                    Requested::Regex(text_of("structured_outputs.regex", r)?),
                );
            }
            if let Some(c) = &so.choice {
                add(
                    &mut found,
                    "structured_outputs.choice",
                    Requested::Choice(choice_of("structured_outputs.choice", c)?),
                );
            }
            if let Some(g) = &so.grammar {
                add(
                    &mut found,
                    "structured_outputs.grammar",
                    Requested::Grammar(text_of("structured_outputs.grammar", g)?),
                );
            }
            if so.json_object == Some(true) {
                add(
                    &mut found,
                    "structured_outputs.json_object",
                    Requested::JsonObject,
                );
            }
            if found.len() == before {
                return Err(ApiError::invalid(
                    "structured_outputs",
                    "`structured_outputs` must set one of `json`, `regex`, `choice`, `grammar`, `json_object`",
                ));
            }
        }
        if let Some(j) = self.guided_json {
            add(
                &mut found,
                "guided_json",
                Requested::JsonSchema(schema_of("guided_json", j)?),
            );
        }
        if let Some(r) = self.guided_regex {
            add(
                &mut found,
                "guided_regex",
                Requested::Regex(text_of("guided_regex", r)?),
            );
        }
        if let Some(c) = self.guided_choice {
            add(
                &mut found,
                "guided_choice",
                Requested::Choice(choice_of("guided_choice", c)?),
            );
        }
        if let Some(g) = self.guided_grammar {
            add(
                &mut found,
                "guided_grammar",
                Requested::Grammar(text_of("guided_grammar", g)?),
            );
        }
        match found.len() {
            0 | 1 => Ok(found.pop()),
            _ => Err(clash(&found[0].field, &found[1].field)),
        }
    }
}

/// What the tools of a chat request ask of the output.
#[derive(Clone, Debug, PartialEq)]
pub enum ToolMode {
    /// No tools, or `tool_choice: none`: free text, tools not described.
    None,
    /// `auto`: text or calls, the model chooses.
    Auto,
    /// `required`: at least one call.
    Required,
    /// Exactly one call of this function.
    Named(String),
}

/// The checked tools of a chat request: what may be called, and how.
#[derive(Clone, Debug, PartialEq)]
pub struct ToolPlan {
    /// The functions (names unique, parameters an object schema).
    pub tools: Vec<FunctionDef>,
    /// What `tool_choice` asks.
    pub mode: ToolMode,
    /// Whether several calls may come in one answer.
    pub parallel: bool,
}

/// Checks `tools`, `tool_choice` and `parallel_tool_calls` together.
pub fn tool_plan(
    tools: Option<&[Tool]>,
    choice: Option<&ToolChoice>,
    parallel: Option<bool>,
) -> Result<ToolPlan, ApiError> {
    let tools = tools.unwrap_or_default();
    if tools.len() > MAX_TOOLS {
        return Err(ApiError::invalid(
            "tools",
            format!(
                "`tools` may hold at most {MAX_TOOLS} functions, got {}",
                tools.len()
            ),
        ));
    }
    let mut defs: Vec<FunctionDef> = Vec::with_capacity(tools.len());
    let mut bytes = 0;
    for (i, t) in tools.iter().enumerate() {
        if t.type_ != "function" {
            return Err(ApiError::invalid(
                format!("tools[{i}].type"),
                format!("`tools[{i}].type` must be \"function\", got {:?}", t.type_),
            ));
        }
        check_name(&format!("tools[{i}].function.name"), &t.function.name)?;
        if defs.iter().any(|d| d.name == t.function.name) {
            return Err(ApiError::invalid(
                format!("tools[{i}].function.name"),
                format!("`tools[{i}].function.name` {:?} is given twice", t.function.name),
            ));
        }
        if let Some(p) = &t.function.parameters {
            let field = format!("tools[{i}].function.parameters");
            if !p.is_object() {
                return Err(ApiError::invalid(
                    &field,
                    format!("`{field}` must be a JSON schema object"),
                ));
            }
            bytes += p.to_string().len();
        }
        bytes += t.function.description.as_deref().map_or(0, str::len);
        defs.push(t.function.clone());
    }
    if bytes > MAX_CONSTRAINT_BYTES {
        return Err(too_large("tools", bytes));
    }
    let mode = match choice {
        None if defs.is_empty() => ToolMode::None,
        None => ToolMode::Auto,
        Some(ToolChoice::Mode(m)) => match m.as_str() {
            "none" => ToolMode::None,
            "auto" => ToolMode::Auto,
            "required" => ToolMode::Required,
            other => {
                return Err(ApiError::invalid(
                    "tool_choice",
                    format!("`tool_choice` must be none, auto, required or a named function, got {other:?}"),
                ));
            }
        },
        Some(ToolChoice::Named(n)) => {
            if n.type_ != "function" {
                return Err(ApiError::invalid(
                    "tool_choice.type",
                    format!("`tool_choice.type` must be \"function\", got {:?}", n.type_),
                ));
            }
            if !defs.iter().any(|d| d.name == n.function.name) {
                return Err(ApiError::invalid(
                    "tool_choice.function.name",
                    format!(
                        "`tool_choice.function.name` {:?} is not one of `tools`",
                        n.function.name
                    ),
                ));
            }
            ToolMode::Named(n.function.name.clone())
        }
    };
    if defs.is_empty() && !matches!(mode, ToolMode::None) {
        return Err(ApiError::invalid("tool_choice", "`tool_choice` needs `tools`"));
    }
    Ok(ToolPlan {
        tools: defs,
        mode,
        parallel: parallel.unwrap_or(true),
    })
}

/// Longest `arguments` of a call in the history, in bytes.
const MAX_ARGUMENTS_BYTES: usize = MAX_CONSTRAINT_BYTES;

/// A message's tool fields: calls only on assistant messages, `tool_call_id` exactly on tool ones.
pub(crate) fn check_message_tools(i: usize, m: &crate::wire::ChatMessage) -> Result<(), ApiError> {
    if let Some(calls) = &m.tool_calls {
        if m.role != "assistant" {
            return Err(ApiError::invalid(
                format!("messages[{i}].tool_calls"),
                format!("`messages[{i}].tool_calls` is only for assistant messages"),
            ));
        }
        for (j, c) in calls.iter().enumerate() {
            let field = format!("messages[{i}].tool_calls[{j}]");
            if c.type_ != "function" {
                return Err(ApiError::invalid(
                    format!("{field}.type"),
                    format!("`{field}.type` must be \"function\", got {:?}", c.type_),
                ));
            }
            check_name(&format!("{field}.function.name"), &c.function.name)?;
            if c.function.arguments.len() > MAX_ARGUMENTS_BYTES {
                return Err(too_large(
                    &format!("{field}.function.arguments"),
                    c.function.arguments.len(),
                ));
            }
        }
    }
    match (m.role.as_str(), &m.tool_call_id) {
        ("tool", None) => Err(ApiError::invalid(
            format!("messages[{i}].tool_call_id"),
            format!("`messages[{i}].tool_call_id` is required in a tool message"),
        )),
        ("tool", Some(_)) | (_, None) => Ok(()),
        (_, Some(_)) => Err(ApiError::invalid(
            format!("messages[{i}].tool_call_id"),
            format!("`messages[{i}].tool_call_id` is only for tool messages"),
        )),
    }
}

/// The 400 for two constraints in one request.
pub fn clash(a: &str, b: &str) -> ApiError {
    ApiError::invalid(
        b,
        format!("`{a}` and `{b}` both constrain the output; a request may have at most one constraint"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn resolve(body: Value) -> Result<Option<RequestedConstraint>, ApiError> {
        let rf: Option<ResponseFormat> = body
            .get("response_format")
            .map(|v| serde_json::from_value(v.clone()).unwrap());
        let so: Option<StructuredOutputs> = body
            .get("structured_outputs")
            .map(|v| serde_json::from_value(v.clone()).unwrap());
        let gr = body.get("guided_regex").map(|v| v.as_str().unwrap().to_string());
        let gc: Option<Vec<String>> = body
            .get("guided_choice")
            .map(|v| serde_json::from_value(v.clone()).unwrap());
        ConstraintFields {
            response_format: rf.as_ref(),
            structured_outputs: so.as_ref(),
            guided_json: body.get("guided_json"),
            guided_regex: gr.as_ref(),
            guided_choice: gc.as_ref(),
            guided_grammar: None,
        }
        .resolve()
    }

    #[test]
    fn each_field_resolves_and_two_clash() {
        let s = json!({"type": "object"});
        let got = resolve(json!({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": s, "strict": true}}}))
            .unwrap()
            .unwrap();
        assert_eq!(got.field, "response_format.json_schema.schema");
        assert_eq!(got.what, Requested::JsonSchema(s.clone()));
        assert_eq!(
            resolve(json!({"response_format": {"type": "text"}})).unwrap(),
            None
        );
        assert_eq!(
            resolve(json!({"guided_json": "{\"type\":\"object\"}"}))
                .unwrap()
                .unwrap()
                .what,
            Requested::JsonSchema(s)
        );
        assert_eq!(
            resolve(json!({"structured_outputs": {"choice": ["a", "b"]}}))
                .unwrap()
                .unwrap()
                .what,
            Requested::Choice(vec!["a".into(), "b".into()])
        );
        let e =
            resolve(json!({"response_format": {"type": "json_object"}, "guided_regex": "a+"})).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("guided_regex"));
        assert!(
            e.message.contains("`response_format` and `guided_regex`"),
            "{}",
            e.message
        );
        let e = resolve(json!({"structured_outputs": {"regex": "a", "choice": ["b"]}})).unwrap_err();
        assert!(e.message.contains("at most one"), "{}", e.message);
    }

    #[test]
    fn tool_plans_check_choice_against_tools() {
        let tools: Vec<Tool> = serde_json::from_value(json!([
            {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}},
            {"type": "function", "function": {"name": "noop"}}
        ]))
        .unwrap();
        let plan = |c: Value| {
            let c: Option<ToolChoice> = (!c.is_null()).then(|| serde_json::from_value(c).unwrap());
            tool_plan(Some(&tools), c.as_ref(), None)
        };
        assert_eq!(plan(Value::Null).unwrap().mode, ToolMode::Auto);
        assert_eq!(plan(json!("required")).unwrap().mode, ToolMode::Required);
        assert_eq!(plan(json!("none")).unwrap().mode, ToolMode::None);
        assert_eq!(
            plan(json!({"type": "function", "function": {"name": "noop"}}))
                .unwrap()
                .mode,
            ToolMode::Named("noop".into())
        );
        let e = plan(json!({"type": "function", "function": {"name": "nope"}})).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("tool_choice.function.name"));
        assert!(plan(json!("sometimes")).is_err());
        let e = tool_plan(None, Some(&ToolChoice::Mode("required".into())), None).unwrap_err();
        assert!(e.message.contains("needs `tools`"));
        let dup: Vec<Tool> = vec![tools[0].clone(), tools[0].clone()];
        assert!(
            tool_plan(Some(&dup), None, None)
                .unwrap_err()
                .message
                .contains("twice")
        );
        let bad: Vec<Tool> = serde_json::from_value(
            json!([{"type": "function", "function": {"name": "a", "parameters": [1]}}]),
        )
        .unwrap();
        let e = tool_plan(Some(&bad), None, None).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("tools[0].function.parameters"));
    }

    #[test]
    fn shapes_and_sizes_are_checked() {
        let e = resolve(json!({"guided_json": "{not json"})).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("guided_json"));
        let e = resolve(json!({"guided_json": [1]})).unwrap_err();
        assert!(e.message.contains("schema object"));
        let e = resolve(json!({"guided_choice": []})).unwrap_err();
        assert!(e.message.contains("1 to 256"));
        let e = resolve(json!({"guided_regex": "a".repeat(MAX_CONSTRAINT_BYTES + 1)})).unwrap_err();
        assert!(e.message.contains("the limit is 65536"), "{}", e.message);
        let e = resolve(json!({"structured_outputs": {}})).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("structured_outputs"));
        let e = resolve(json!({"response_format": {"type": "json_schema", "json_schema": {"name": "a b"}}}))
            .unwrap_err();
        assert_eq!(e.param.as_deref(), Some("response_format.json_schema.name"));
        assert!(serde_json::from_value::<ResponseFormat>(json!({"type": "json_object", "x": 1})).is_err());
    }
}
