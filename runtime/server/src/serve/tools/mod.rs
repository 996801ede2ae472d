//! Tool calling (OpenAI's `tools`, `tool_choice`, `parallel_tool_calls`).
//!
//! - The call format is fixed: `<tool_call>{"name":"…","arguments":{…}}</tool_call>`, one per call,
//!   several separated by a newline (Hermes/Qwen's format, compact JSON).
//! - Prompt ([`messages`]): a template that renders `tools` (Hugging Face's convention) gets them, and
//!   the history's `tool_calls` and `tool` messages, as they are. One that does not (SmolLM2's and the
//!   generated models' ChatML templates) gets a system-prompt section describing the tools and the
//!   format, calls in the history written in that format, and tool results as `<tool_response>` user
//!   turns.
//! - Grammar ([`grammar::lark`]): `required` and a named function allow only calls whose arguments
//!   follow the function's schema; `auto` allows either text that never contains `<tool_call>` or
//!   calls — so even a model that never saw the format cannot emit a malformed call.
//! - Parsing ([`parse::CallParser`]): the same character-driven parser reads a whole answer into
//!   `message.tool_calls` and a stream into OpenAI-shaped `delta.tool_calls` pieces, so the pieces of a
//!   stream reassemble to the calls of the same answer unstreamed.
//!
//! Invariants: with `tool_choice: none` (or no tools) nothing is described, constrained or parsed;
//! every call of a complete answer was produced under the grammar, so its arguments validate.

pub mod grammar;
pub mod parse;

use crate::api::response::{AssistantMessage, ChatDelta};
use crate::api::structured::{FunctionDef, ToolMode, ToolPlan};
use crate::api::wire::{ChatMessage as WireMessage, MessageContent};
use modelfleet_engine::tokenizer::{ChatMessage, ToolCallMessage};
use parse::CallParser;
use serde_json::{Value, json};

/// Opens a call.
pub const OPEN: &str = "<tool_call>";
/// Closes a call.
pub const CLOSE: &str = "</tool_call>";
/// Most calls in one answer (with `parallel_tool_calls`).
pub const MAX_CALLS: usize = 8;

/// A function as the prompt shows it.
fn function_json(f: &FunctionDef) -> Value {
    let mut v = json!({"name": f.name});
    if let Some(d) = &f.description {
        v["description"] = d.as_str().into();
    }
    v["parameters"] = f
        .parameters
        .clone()
        .unwrap_or_else(|| json!({"type": "object", "properties": {}}));
    v
}

/// The `tools` list handed to a template that renders tools.
fn template_tools(plan: &ToolPlan) -> Value {
    plan.tools
        .iter()
        .map(|f| json!({"type": "function", "function": function_json(f)}))
        .collect()
}

/// The system-prompt section for templates that do not render tools.
fn tool_section(plan: &ToolPlan) -> String {
    let mut s = String::from(
        "# Tools\n\nYou can call functions. Each is described by its name and a JSON schema of its arguments:\n<tools>\n",
    );
    for f in &plan.tools {
        s.push_str(&function_json(f).to_string());
        s.push('\n');
    }
    s.push_str("</tools>\n\nTo call a function, answer with the call alone, in exactly this format");
    if plan.parallel && !matches!(plan.mode, ToolMode::Named(_)) {
        s.push_str(" (several calls: one per line)");
    }
    s.push_str(":\n<tool_call>{\"name\":\"<function name>\",\"arguments\":<arguments as a JSON object>}</tool_call>\n");
    match &plan.mode {
        ToolMode::Required => s.push_str("You must call at least one function.\n"),
        ToolMode::Named(n) => s.push_str(&format!("You must call the function {n}.\n")),
        _ => s.push_str("If no function helps, answer in plain text.\n"),
    }
    s
}

/// A call written in the fixed format (for the history of templates without tool support).
pub fn format_call(name: &str, arguments: &str) -> String {
    let args = serde_json::from_str::<Value>(arguments)
        .map(|v| v.to_string())
        .unwrap_or_else(|_| arguments.to_owned());
    format!(
        "{OPEN}{{\"name\":{},\"arguments\":{args}}}{CLOSE}",
        Value::from(name)
    )
}

fn text(m: &WireMessage) -> String {
    m.content.as_ref().map(MessageContent::text).unwrap_or_default()
}

/// The messages and `tools` a request renders its prompt from (see the module header).
pub fn messages(
    plan: &ToolPlan,
    wire: &[WireMessage],
    renders_tools: bool,
) -> (Vec<ChatMessage>, Option<Value>) {
    let describe = plan.mode != ToolMode::None;
    if renders_tools {
        let msgs = wire
            .iter()
            .map(|m| {
                let role = if m.role == "developer" { "system" } else { &m.role };
                let mut c = ChatMessage::new(role, text(m));
                c.tool_calls = m
                    .tool_calls
                    .iter()
                    .flatten()
                    .map(|t| ToolCallMessage {
                        id: t.id.clone(),
                        name: t.function.name.clone(),
                        arguments: serde_json::from_str(&t.function.arguments)
                            .unwrap_or_else(|_| Value::from(t.function.arguments.as_str())),
                    })
                    .collect();
                c.tool_call_id = m.tool_call_id.clone();
                c
            })
            .collect();
        return (msgs, describe.then(|| template_tools(plan)));
    }
    let mut out: Vec<ChatMessage> = Vec::with_capacity(wire.len() + 1);
    for m in wire {
        let role = if m.role == "developer" {
            "system"
        } else {
            m.role.as_str()
        };
        match role {
            "tool" => {
                let response = format!("<tool_response>\n{}\n</tool_response>", text(m));
                match out.last_mut() {
                    // Results of one turn's calls go together in one user turn.
                    Some(prev) if prev.role == "user" && prev.content.ends_with("</tool_response>") => {
                        prev.content.push('\n');
                        prev.content.push_str(&response);
                    }
                    _ => out.push(ChatMessage::new("user", response)),
                }
            }
            "assistant" if m.tool_calls.as_ref().is_some_and(|c| !c.is_empty()) => {
                let mut content = text(m);
                for c in m.tool_calls.iter().flatten() {
                    if !content.is_empty() {
                        content.push('\n');
                    }
                    content.push_str(&format_call(&c.function.name, &c.function.arguments));
                }
                out.push(ChatMessage::new("assistant", content));
            }
            _ => out.push(ChatMessage::new(role, text(m))),
        }
    }
    if describe {
        let section = tool_section(plan);
        match out.first_mut() {
            Some(first) if first.role == "system" => {
                first.content = format!("{}\n\n{section}", first.content);
            }
            _ => out.insert(0, ChatMessage::new("system", section)),
        }
    }
    (out, None)
}

/// The id prefix of a choice's calls: `call_<response id>_<choice>_` (then the call's index).
fn id_prefix(response_id: &str, choice: u32) -> String {
    let id = response_id.strip_prefix("chatcmpl-").unwrap_or(response_id);
    format!("call_{id}_{choice}_")
}

/// `finish_reason` of a choice: `tool_calls` when an answer that ended normally made calls.
pub fn finish_reason(parser: Option<&CallParser>, reason: String) -> String {
    match parser {
        Some(p) if reason == "stop" && !p.calls().is_empty() => "tool_calls".into(),
        _ => reason,
    }
}

/// A whole answer's message and `finish_reason`: content and calls parsed when the request has tools.
pub fn answer(
    with_tools: bool,
    text: &str,
    response_id: &str,
    choice: u32,
    reason: String,
) -> (AssistantMessage, String) {
    if !with_tools {
        let m = AssistantMessage {
            role: "assistant",
            content: Some(text.to_owned()),
            reasoning_content: None,
            tool_calls: None,
        };
        return (m, reason);
    }
    let mut p = CallParser::new(&id_prefix(response_id, choice));
    p.push(text);
    p.finish();
    let calls = p.calls().to_vec();
    let content = (calls.is_empty() || !p.content().is_empty()).then(|| p.content().to_owned());
    let reason = finish_reason(Some(&p), reason);
    let m = AssistantMessage {
        role: "assistant",
        content,
        reasoning_content: None,
        tool_calls: (!calls.is_empty()).then_some(calls),
    };
    (m, reason)
}

/// One call parser per streamed choice (`keys`: (prompt, choice index)) when `tools_id` is set.
pub fn stream_parsers(tools_id: &Option<String>, keys: &[(usize, u32)]) -> Vec<Option<CallParser>> {
    keys.iter()
        .map(|&(_, index)| tools_id.as_ref().map(|id| CallParser::new(&id_prefix(id, index))))
        .collect()
}

/// The delta for a streamed choice's new text (`finishing`: its last event). Without tools, the text
/// itself (`content` absent only in an empty last chunk); with tools, what the call parser reports.
pub fn stream_delta(parser: Option<&mut CallParser>, text: &str, finishing: bool) -> ChatDelta {
    match parser {
        None => ChatDelta {
            content: (!text.is_empty() || !finishing).then(|| text.to_owned()),
            ..ChatDelta::default()
        },
        Some(p) => {
            p.push(text);
            if finishing {
                p.finish();
            }
            p.take_delta().unwrap_or_default()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::structured::{ToolChoice, tool_plan};
    use crate::api::wire::ChatMessage as Wire;

    fn plan(choice: Option<&str>) -> ToolPlan {
        let tools = serde_json::from_value::<Vec<crate::api::structured::Tool>>(json!([{"type": "function",
            "function": {"name": "get_weather", "description": "Weather now",
                         "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]))
        .unwrap();
        let c = choice.map(|c| ToolChoice::Mode(c.into()));
        tool_plan(Some(&tools), c.as_ref(), None).unwrap()
    }

    fn wire(v: Value) -> Vec<Wire> {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn chatml_templates_get_a_section_and_calls_in_the_fixed_format() {
        let history = wire(json!([
            {"role": "user", "content": "Weather in Paris?"},
            {"role": "assistant", "content": null, "tool_calls": [{"id": "c1", "type": "function",
                "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
            {"role": "tool", "tool_call_id": "c1", "content": "18C"},
            {"role": "tool", "tool_call_id": "c2", "content": "sunny"}
        ]));
        let (msgs, tools) = messages(&plan(None), &history, false);
        assert!(tools.is_none());
        assert_eq!(msgs[0].role, "system");
        assert!(
            msgs[0]
                .content
                .contains("{\"name\":\"get_weather\",\"description\":\"Weather now\"")
        );
        assert!(msgs[0].content.contains("plain text"));
        assert_eq!(
            msgs[2].content,
            "<tool_call>{\"name\":\"get_weather\",\"arguments\":{\"city\":\"Paris\"}}</tool_call>"
        );
        assert_eq!(
            (msgs[3].role.as_str(), msgs[3].content.as_str()),
            (
                "user",
                "<tool_response>\n18C\n</tool_response>\n<tool_response>\nsunny\n</tool_response>"
            )
        );
        assert_eq!(msgs.len(), 4);
        let (msgs, _) = messages(&plan(Some("none")), &history[..1], false);
        assert_eq!(msgs.len(), 1, "tool_choice none describes nothing");
    }

    #[test]
    fn templates_that_render_tools_get_them_as_is() {
        let history = wire(json!([{"role": "developer", "content": "be brief"},
            {"role": "assistant", "tool_calls": [{"id": "c1", "type": "function",
                "function": {"name": "get_weather", "arguments": "{\"city\":\"Oslo\"}"}}]}]));
        let (msgs, tools) = messages(&plan(Some("required")), &history, true);
        assert_eq!(msgs[0].role, "system");
        assert_eq!(msgs[1].tool_calls[0].arguments, json!({"city": "Oslo"}));
        assert_eq!(tools.unwrap()[0]["function"]["name"], "get_weather");
    }
}
