//! Thinking models (Qwen3, DeepSeek-R1 distills): the leading `<think>…</think>` block of a chat answer
//! is split out as `reasoning_content`, the rest is `content` (and tool calls), whole or streamed — as
//! vLLM's reasoning parsers do.
//!
//! - Detection ([`detect`], once at start-up): the chat template mentions `<think>` and the tokenizer
//!   has both `<think>` and `</think>`.
//! - Where the answer starts ([`start_of`], from the rendered prompt): a generation prompt that opened
//!   `<think>` (some templates do) means the answer starts inside the reasoning; one that ends with a
//!   closed block (Qwen3 with `enable_thinking: false` writes an empty one) means it is all content;
//!   otherwise the answer is reasoning only if it begins with `<think>` itself.
//! - Splitting ([`Splitter`]): driven character by character, so any cut of the text into stream
//!   pieces gives the same reasoning and content as the whole text; text that may still become
//!   `<think>` or `</think>` is held back until decided. Whitespace between `</think>` and the content
//!   is dropped (so a tool call right after the reasoning still parses). An answer cut short inside the
//!   block is all reasoning.
//! - Constraints: `response_format`, `structured_outputs`, `guided_*` and the tools' grammar apply from
//!   the first generated token, so a constrained answer cannot think unless the constraint itself
//!   allows a leading `<think>…</think>`; it is therefore never taken to start inside the reasoning.
//!
//! Invariants: a model that is not a thinking model gets exactly what it got before (no
//! `reasoning_content` anywhere); the streamed `reasoning_content` and `content` deltas of a choice
//! concatenate to the `reasoning_content` and `content` of the same text answered whole.

use super::tools::{self, parse::CallParser};
use crate::api::response::{AssistantMessage, ChatDelta};
use modelfleet_engine::ModelDir;

/// Opens the reasoning.
pub const OPEN: &str = "<think>";
/// Closes it.
pub const CLOSE: &str = "</think>";

/// Whether the served model is a thinking model (see the module header).
pub fn detect(md: &ModelDir) -> bool {
    let Some(t) = md.chat_template.as_ref() else {
        return false;
    };
    t.source().contains(OPEN)
        && [OPEN, CLOSE]
            .iter()
            .all(|s| md.tokenizer.token_to_id(s).is_some())
}

/// Where a thinking model's answer starts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Start {
    /// Reasoning if the answer opens with `<think>`, else content.
    MayOpen,
    /// Inside the reasoning: the prompt opened `<think>`.
    Inside,
    /// After it: the prompt closed the block (thinking turned off); all content.
    After,
}

impl Start {
    /// Under a constraint the answer is the constraint's from its first token: never inside a block.
    pub fn constrained(self, constrained: bool) -> Start {
        match self {
            Start::Inside if constrained => Start::MayOpen,
            s => s,
        }
    }
}

/// Where the answer to `prompt` (a rendered chat prompt) starts.
pub fn start_of(prompt: &str) -> Start {
    let tail_is_blank = |at: usize| prompt[at..].trim().is_empty();
    match (prompt.rfind(OPEN), prompt.rfind(CLOSE)) {
        (Some(o), c) if c.is_none_or(|c| c < o) && tail_is_blank(o + OPEN.len()) => Start::Inside,
        (_, Some(c)) if tail_is_blank(c + CLOSE.len()) => Start::After,
        _ => Start::MayOpen,
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    /// Nothing decided: what is held may still be `<think>`.
    Start,
    /// Inside the block: what is held may still be `</think>`.
    Reasoning,
    /// After `</think>`: whitespace is dropped.
    Gap,
    /// Everything is content.
    Content,
}

/// New reasoning and content.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Split {
    /// Text inside the block.
    pub reasoning: String,
    /// Text after it (or all of it, without a block).
    pub content: String,
}

/// Splits one answer (see the module header).
pub struct Splitter {
    state: State,
    held: String,
}

impl Splitter {
    /// A splitter for an answer starting at `start`.
    pub fn new(start: Start) -> Self {
        let state = match start {
            Start::MayOpen => State::Start,
            Start::Inside => State::Reasoning,
            Start::After => State::Content,
        };
        Self {
            state,
            held: String::new(),
        }
    }

    /// Feeds generated text; returns what is decided.
    pub fn push(&mut self, text: &str) -> Split {
        let mut out = Split::default();
        for c in text.chars() {
            self.push_char(c, &mut out);
        }
        out
    }

    fn push_char(&mut self, c: char, out: &mut Split) {
        match self.state {
            State::Content => out.content.push(c),
            State::Gap if c.is_whitespace() => {}
            State::Gap => {
                self.state = State::Content;
                out.content.push(c);
            }
            State::Start => {
                self.held.push(c);
                if self.held == OPEN {
                    self.held.clear();
                    self.state = State::Reasoning;
                } else if !OPEN.starts_with(&self.held) {
                    self.state = State::Content;
                    out.content.push_str(&std::mem::take(&mut self.held));
                }
            }
            State::Reasoning => {
                self.held.push(c);
                if self.held == CLOSE {
                    self.held.clear();
                    self.state = State::Gap;
                    return;
                }
                // Keep only the longest tail that may still be `</think>`.
                while !CLOSE.starts_with(&self.held) {
                    out.reasoning.push(self.held.remove(0));
                }
            }
        }
    }

    /// Ends the answer: what was held back is what it was heading for (content before a block was
    /// decided, reasoning inside one).
    pub fn finish(&mut self) -> Split {
        let held = std::mem::take(&mut self.held);
        match self.state {
            State::Reasoning => Split {
                reasoning: held,
                content: String::new(),
            },
            _ => Split {
                reasoning: String::new(),
                content: held,
            },
        }
    }
}

/// A whole answer's message and `finish_reason`: the reasoning split out (`start` is `None` for a
/// model that does not think), then content and calls as [`tools::answer`] reads them.
pub fn answer(
    start: Option<Start>,
    with_tools: bool,
    text: &str,
    (response_id, choice): (&str, u32),
    reason: String,
) -> (AssistantMessage, String) {
    let Some(start) = start else {
        return tools::answer(with_tools, text, response_id, choice, reason);
    };
    let mut s = Splitter::new(start);
    let mut split = s.push(text);
    let rest = s.finish();
    split.reasoning.push_str(&rest.reasoning);
    split.content.push_str(&rest.content);
    let (mut m, reason) = tools::answer(with_tools, &split.content, response_id, choice, reason);
    if !split.reasoning.is_empty() {
        if m.content.as_deref() == Some("") {
            m.content = None;
        }
        m.reasoning_content = Some(split.reasoning);
    }
    (m, reason)
}

/// One splitter per streamed choice when the model thinks.
pub fn stream_splitters(start: Option<Start>, choices: usize) -> Vec<Option<Splitter>> {
    (0..choices).map(|_| start.map(Splitter::new)).collect()
}

/// The delta for a streamed choice's new text (`finishing`: its last event): reasoning first, then
/// the content as [`tools::stream_delta`] reports it.
pub fn stream_delta(
    splitter: Option<&mut Splitter>,
    parser: Option<&mut CallParser>,
    text: &str,
    finishing: bool,
) -> ChatDelta {
    let Some(s) = splitter else {
        return tools::stream_delta(parser, text, finishing);
    };
    let mut split = s.push(text);
    if finishing {
        let rest = s.finish();
        split.reasoning.push_str(&rest.reasoning);
        split.content.push_str(&rest.content);
    }
    let mut d = tools::stream_delta(parser, &split.content, finishing);
    if !split.reasoning.is_empty() {
        if d.content.as_deref() == Some("") {
            d.content = None;
        }
        d.reasoning_content = Some(split.reasoning);
    }
    d
}

#[cfg(test)]
#[path = "reasoning_tests.rs"]
mod tests;
