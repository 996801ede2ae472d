//! Reads a tool-calling answer, whole or as it streams, into content and calls.
//!
//! The parser is driven character by character, so how the text is cut into pieces never changes the
//! result: the `ToolCallDelta`s of a stream concatenate (per call index) to the calls of the same text
//! parsed at once. An answer is either text (it did not start with `<tool_call>`) or calls in the fixed
//! format `<tool_call>{"name":"…","arguments":{…}}</tool_call>`, newline-separated; the grammar makes
//! it so. Text that could still be the start of `<tool_call>` is held back until it is decided.
//! Anything off the format (only possible when generation was cut short) ends parsing: the rest is
//! kept as content, and a call cut short keeps the arguments it had.

use super::{CLOSE, OPEN};
use crate::api::response::{ChatDelta, FunctionCall, FunctionCallDelta, ToolCall, ToolCallDelta};

const HEAD: &str = "{\"name\":";
const ARGS: &str = ",\"arguments\":";

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    /// Nothing decided yet (what is held may still be `<tool_call>`).
    Start,
    /// Plain text: everything is content.
    Text,
    /// Reading `<tool_call>` (after the first call: `\n<tool_call>`).
    Open,
    /// Reading `{"name":"…","arguments":`.
    Head,
    /// Inside the arguments' JSON.
    Args,
    /// Reading `}</tool_call>`.
    Close,
    /// Off the format: the rest is content.
    Broken,
}

/// The calls and content parsed so far, and the pieces not yet reported.
pub struct CallParser {
    state: State,
    /// Characters of the current literal or head read so far.
    held: String,
    /// The opening literal of the call being read (content again if its head breaks off).
    opened: String,
    /// JSON depth inside the arguments, and string/escape state.
    depth: u32,
    in_string: bool,
    escaped: bool,
    calls: Vec<ToolCall>,
    content: String,
    id_prefix: String,
    /// Pieces since the last [`CallParser::take_delta`].
    pending: ChatDelta,
}

impl CallParser {
    /// A parser; calls get ids `<id_prefix><index>`.
    pub fn new(id_prefix: &str) -> Self {
        Self {
            state: State::Start,
            held: String::new(),
            opened: String::new(),
            depth: 0,
            in_string: false,
            escaped: false,
            calls: Vec::new(),
            content: String::new(),
            id_prefix: id_prefix.to_owned(),
            pending: ChatDelta::default(),
        }
    }

    fn emit_content(&mut self, s: &str) {
        if s.is_empty() {
            return;
        }
        self.content.push_str(s);
        self.pending.content.get_or_insert_with(String::new).push_str(s);
    }

    fn emit_args(&mut self, c: char) {
        let index = self.calls.len() as u32 - 1;
        self.calls.last_mut().expect("a call").function.arguments.push(c);
        let pieces = self.pending.tool_calls.get_or_insert_with(Vec::new);
        match pieces.last_mut() {
            Some(p) if p.index == index => p.function.arguments.get_or_insert_with(String::new).push(c),
            _ => pieces.push(ToolCallDelta {
                index,
                id: None,
                type_: None,
                function: FunctionCallDelta {
                    name: None,
                    arguments: Some(c.to_string()),
                },
            }),
        }
    }

    fn start_call(&mut self, name: String) {
        let index = self.calls.len() as u32;
        let id = format!("{}{index}", self.id_prefix);
        self.pending
            .tool_calls
            .get_or_insert_with(Vec::new)
            .push(ToolCallDelta {
                index,
                id: Some(id.clone()),
                type_: Some("function"),
                function: FunctionCallDelta {
                    name: Some(name.clone()),
                    arguments: Some(String::new()),
                },
            });
        self.calls.push(ToolCall {
            id,
            type_: "function",
            function: FunctionCall {
                name,
                arguments: String::new(),
            },
        });
    }

    /// Gives up on the format: what was held becomes content, and so does the rest.
    fn broken(&mut self) {
        let opened = std::mem::take(&mut self.opened);
        if self.state == State::Head {
            self.emit_content(&opened);
        }
        self.state = State::Broken;
        let held = std::mem::take(&mut self.held);
        self.emit_content(&held);
    }

    /// Feeds generated text.
    pub fn push(&mut self, text: &str) {
        for c in text.chars() {
            self.push_char(c);
        }
    }

    fn push_char(&mut self, c: char) {
        match self.state {
            State::Text | State::Broken => self.emit_content(&c.to_string()),
            State::Start | State::Open => {
                self.held.push(c);
                let want = if self.state == State::Open && !self.calls.is_empty() {
                    format!("\n{OPEN}")
                } else {
                    OPEN.to_owned()
                };
                if self.held == want {
                    self.held.clear();
                    self.opened = want;
                    self.state = State::Head;
                } else if !want.starts_with(&self.held) {
                    if self.state == State::Start {
                        self.state = State::Text;
                        let held = std::mem::take(&mut self.held);
                        self.emit_content(&held);
                    } else {
                        self.broken();
                    }
                }
            }
            State::Head => {
                self.held.push(c);
                if let Some(name) = head_name(&self.held) {
                    self.held.clear();
                    self.start_call(name);
                    self.state = State::Args;
                    self.depth = 0;
                    self.in_string = false;
                    self.escaped = false;
                } else if !head_may_continue(&self.held) {
                    self.broken();
                }
            }
            State::Args => {
                if self.depth == 0 && c != '{' {
                    self.broken();
                    self.emit_content(&c.to_string());
                    return;
                }
                self.emit_args(c);
                if self.in_string {
                    match (self.escaped, c) {
                        (true, _) => self.escaped = false,
                        (false, '\\') => self.escaped = true,
                        (false, '"') => self.in_string = false,
                        _ => {}
                    }
                    return;
                }
                match c {
                    '"' => self.in_string = true,
                    '{' | '[' => self.depth += 1,
                    '}' | ']' => {
                        self.depth -= 1;
                        if self.depth == 0 {
                            self.state = State::Close;
                        }
                    }
                    _ => {}
                }
            }
            State::Close => {
                self.held.push(c);
                let want = format!("}}{CLOSE}");
                if self.held == want {
                    self.held.clear();
                    self.state = State::Open;
                } else if !want.starts_with(&self.held) {
                    self.broken();
                }
            }
        }
    }

    /// The pieces since the last call (a chunk's delta, without `role`).
    pub fn take_delta(&mut self) -> Option<ChatDelta> {
        let d = std::mem::take(&mut self.pending);
        (d.content.is_some() || d.tool_calls.is_some()).then_some(d)
    }

    /// Ends the text: anything held back that did not become a call is content.
    pub fn finish(&mut self) {
        if matches!(
            self.state,
            State::Start | State::Head | State::Close | State::Open
        ) && !self.held.is_empty()
        {
            // A cut-short head or closing is not content a client could use, but it is what was
            // generated; keep it rather than drop it.
            self.broken();
        }
    }

    /// The calls parsed.
    pub fn calls(&self) -> &[ToolCall] {
        &self.calls
    }

    /// The content (text that was not part of a call).
    pub fn content(&self) -> &str {
        &self.content
    }
}

/// The function name once the held head is complete: `{"name":"<name>","arguments":`.
fn head_name(held: &str) -> Option<String> {
    let rest = held.strip_prefix(HEAD)?.strip_suffix(ARGS)?;
    serde_json::from_str::<String>(rest).ok()
}

/// Whether the held head can still become one.
fn head_may_continue(held: &str) -> bool {
    if held.len() <= HEAD.len() {
        return HEAD.starts_with(held);
    }
    let Some(rest) = held.strip_prefix(HEAD) else {
        return false;
    };
    // A JSON string (names have no escapes to speak of: letters, digits, `_`, `-`), then `ARGS`.
    let Some(body) = rest.strip_prefix('"') else {
        return false;
    };
    match body.find('"') {
        None => true,
        Some(end) => ARGS.starts_with(&body[end + 1..]),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn whole(text: &str) -> (String, Vec<(String, String)>) {
        let mut p = CallParser::new("call_");
        p.push(text);
        p.finish();
        let calls = p
            .calls()
            .iter()
            .map(|c| (c.function.name.clone(), c.function.arguments.clone()))
            .collect();
        (p.content().to_owned(), calls)
    }

    /// Feeds `text` in pieces of `n` characters and reassembles the deltas as a client would.
    fn streamed(text: &str, n: usize) -> (String, Vec<(String, String)>) {
        let mut p = CallParser::new("call_");
        let chars: Vec<char> = text.chars().collect();
        let mut deltas = Vec::new();
        for piece in chars.chunks(n) {
            p.push(&piece.iter().collect::<String>());
            deltas.extend(p.take_delta());
        }
        p.finish();
        deltas.extend(p.take_delta());
        let mut content = String::new();
        let mut calls: Vec<(String, String)> = Vec::new();
        for d in deltas {
            content.push_str(d.content.as_deref().unwrap_or(""));
            for t in d.tool_calls.unwrap_or_default() {
                if let Some(name) = t.function.name {
                    assert_eq!(t.index as usize, calls.len());
                    assert_eq!(t.id.as_deref(), Some(format!("call_{}", t.index).as_str()));
                    calls.push((name, String::new()));
                }
                calls[t.index as usize]
                    .1
                    .push_str(t.function.arguments.as_deref().unwrap_or(""));
            }
        }
        (content, calls)
    }

    fn check(text: &str, content: &str, calls: &[(&str, &str)]) {
        let want: Vec<(String, String)> = calls
            .iter()
            .map(|(a, b)| (a.to_string(), b.to_string()))
            .collect();
        assert_eq!(whole(text), (content.to_owned(), want.clone()), "{text:?}");
        for n in [1, 2, 3, 7, 1000] {
            assert_eq!(
                streamed(text, n),
                (content.to_owned(), want.clone()),
                "{text:?} in pieces of {n}"
            );
        }
    }

    #[test]
    fn answers_parse_the_same_whole_or_streamed() {
        check(
            "Just text, <b>not</b> a call.",
            "Just text, <b>not</b> a call.",
            &[],
        );
        check("<tool", "<tool", &[]);
        check(
            r#"<tool_call>{"name":"get_weather","arguments":{"city":"Paris","n":[1,{"x":"}]"}]}}</tool_call>"#,
            "",
            &[("get_weather", r#"{"city":"Paris","n":[1,{"x":"}]"}]}"#)],
        );
        check(
            "<tool_call>{\"name\":\"a\",\"arguments\":{\"s\":\"q\\\"}\"}}</tool_call>\n<tool_call>{\"name\":\"b\",\"arguments\":{}}</tool_call>",
            "",
            &[("a", r#"{"s":"q\"}"}"#), ("b", "{}")],
        );
        // Cut short inside the arguments: the call keeps what it had.
        check(
            r#"<tool_call>{"name":"a","arguments":{"city":"Pa"#,
            "",
            &[("a", r#"{"city":"Pa"#)],
        );
        // Cut short inside the head: kept as content.
        check(r#"<tool_call>{"name":"a"#, r#"<tool_call>{"name":"a"#, &[]);
        check(
            "<tool_call>{\"name\":\"a\",\"arguments\":{}}</tool_call>\n<tool_call>{\"nom",
            "\n<tool_call>{\"nom",
            &[("a", "{}")],
        );
    }
}
