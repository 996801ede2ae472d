//! A provider's token usage, in the form the gateway's meter reads (`limits::meter`): an
//! OpenAI-compatible API reports `usage` in a JSON answer's body, and — asked with
//! `stream_options.include_usage` — in a last stream chunk whose `choices` is empty. The gateway
//! always asks; [`StreamUsage`] turns that chunk into the runtime's `: modelfleet-usage …` comment
//! line (which SSE clients skip), and drops the chunk itself unless the caller asked for it.
//!
//! Invariants: every other byte passes unchanged and in order; memory is bounded — an event longer
//! than [`MAX_EVENT`] is passed on as it comes, unread; a usage that does not parse is ignored.

use modelfleet_api::limits::{USAGE_COMMENT, usage_report};

/// The longest stream event kept whole to be read.
pub const MAX_EVENT: usize = 256 << 10;

/// The report (`prompt=P cached=C completion=N`) of an OpenAI `usage` object, if it is one.
pub fn report(usage: &serde_json::Value) -> Option<String> {
    let prompt = usage.get("prompt_tokens")?.as_u64()?;
    let completion = usage.get("completion_tokens")?.as_u64()?;
    let cached = usage
        .pointer("/prompt_tokens_details/cached_tokens")
        .and_then(|v| v.as_u64())
        .unwrap_or(0)
        .min(prompt);
    Some(usage_report(prompt, cached, completion))
}

/// The report of a JSON answer's `usage`.
pub fn of_json(body: &[u8]) -> Option<String> {
    let v: serde_json::Value = serde_json::from_slice(body).ok()?;
    report(v.get("usage")?)
}

/// Rewrites a provider's SSE stream as it passes (see the module header).
#[derive(Debug)]
pub struct StreamUsage {
    /// Whether the caller asked for the usage chunk (`stream_options.include_usage`).
    keep_chunk: bool,
    /// The event being read (up to its blank line), while it is short enough to read.
    event: Vec<u8>,
    /// The current event outgrew [`MAX_EVENT`]: its bytes pass on as they come, until its end.
    passing: bool,
    /// While passing: the last byte passed was a line feed.
    after_newline: bool,
}

impl StreamUsage {
    /// A rewriter; `keep_chunk`: the caller asked for the usage chunk.
    pub fn new(keep_chunk: bool) -> StreamUsage {
        StreamUsage {
            keep_chunk,
            event: Vec::new(),
            passing: false,
            after_newline: false,
        }
    }

    /// The next bytes from the provider; returns what goes to the client now.
    pub fn feed(&mut self, chunk: &[u8]) -> Vec<u8> {
        let mut out = Vec::with_capacity(chunk.len() + 64);
        for &b in chunk {
            if self.passing {
                out.push(b);
                // A blank line ends the event (`\r` before a line feed does not count).
                if b == b'\n' {
                    self.passing = !self.after_newline;
                    self.after_newline = true;
                } else if b != b'\r' {
                    self.after_newline = false;
                }
                continue;
            }
            self.event.push(b);
            if self.event.ends_with(b"\n\n") || self.event.ends_with(b"\r\n\r\n") {
                let event = std::mem::take(&mut self.event);
                self.ended(event, &mut out);
            } else if self.event.len() > MAX_EVENT {
                self.after_newline = self.event.ends_with(b"\n");
                out.append(&mut self.event);
                self.passing = true;
            }
        }
        out
    }

    /// The provider's stream ended: whatever was held back (an event without its blank line).
    pub fn finish(&mut self) -> Vec<u8> {
        std::mem::take(&mut self.event)
    }

    /// One whole event: passed on, with the usage comment in front of it if it reports usage.
    fn ended(&mut self, event: Vec<u8>, out: &mut Vec<u8>) {
        let Some(v) = data_json(&event) else {
            out.extend_from_slice(&event);
            return;
        };
        let Some(report) = v.get("usage").and_then(report) else {
            out.extend_from_slice(&event);
            return;
        };
        out.extend_from_slice(format!(": {USAGE_COMMENT} {report}\n\n").as_bytes());
        let usage_only = v
            .get("choices")
            .and_then(|c| c.as_array())
            .is_none_or(|c| c.is_empty());
        if self.keep_chunk || !usage_only {
            out.extend_from_slice(&event);
        }
    }
}

/// The JSON of an event's `data:` lines, if it has any and they parse.
fn data_json(event: &[u8]) -> Option<serde_json::Value> {
    let text = std::str::from_utf8(event).ok()?;
    let mut data = String::new();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("data:") {
            data.push_str(rest.strip_prefix(' ').unwrap_or(rest));
        }
    }
    serde_json::from_str(&data).ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limits::meter::Meter;

    const CHUNK: &str = r#"data: {"choices":[{"index":0,"delta":{"content":"hi"}}]}"#;
    const USAGE: &str = r#"data: {"choices":[],"usage":{"prompt_tokens":9,"completion_tokens":2,"prompt_tokens_details":{"cached_tokens":4}}}"#;

    fn stream() -> String {
        format!("{CHUNK}\n\n{CHUNK}\n\n{USAGE}\n\ndata: [DONE]\n\n")
    }

    fn run(keep: bool, input: &str, cuts: &[usize]) -> String {
        let mut r = StreamUsage::new(keep);
        let mut out = Vec::new();
        let mut at = 0;
        for &c in cuts.iter().chain([input.len()].iter()) {
            out.extend(r.feed(&input.as_bytes()[at..c]));
            at = c;
        }
        out.extend(r.finish());
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn the_usage_chunk_becomes_the_meters_comment_wherever_the_stream_is_cut() {
        let input = stream();
        for cuts in [
            vec![],
            vec![1],
            vec![5, 70, 71, 200],
            (1..input.len()).collect::<Vec<_>>(),
        ] {
            let dropped = run(false, &input, &cuts);
            let comment = ": modelfleet-usage prompt=9 cached=4 completion=2\n\n";
            assert_eq!(
                dropped,
                format!("{CHUNK}\n\n{CHUNK}\n\n{comment}data: [DONE]\n\n")
            );
            let kept = run(true, &input, &cuts);
            assert_eq!(
                kept,
                format!("{CHUNK}\n\n{CHUNK}\n\n{comment}{USAGE}\n\ndata: [DONE]\n\n")
            );
            let mut m = Meter::default();
            m.feed(dropped.as_bytes());
            assert_eq!(m.events, 2);
            let u = m.usage.expect("the meter reads the report");
            assert_eq!((u.prompt, u.cached, u.completion), (9, 4, 2));
        }
    }

    #[test]
    fn long_and_odd_events_pass_unchanged() {
        let long = format!("data: {{\"x\":\"{}\"}}\n\n", "y".repeat(MAX_EVENT + 10));
        let odd =
            ": keep-alive\n\ndata: not json\n\nevent: x\ndata: {\"usage\":{\"prompt_tokens\":\"no\"}}\n\n";
        let input = format!("{long}{odd}{CHUNK}\n\n");
        assert_eq!(run(false, &input, &[10, MAX_EVENT / 2, MAX_EVENT + 3]), input);
        // An unterminated tail is given back at the end.
        assert_eq!(run(false, "data: {\"a\":1}", &[3]), "data: {\"a\":1}");
    }

    #[test]
    fn a_json_answers_usage_reads_as_the_runtimes_report() {
        let body = br#"{"choices":[],"usage":{"prompt_tokens":12,"completion_tokens":30,"total_tokens":42}}"#;
        assert_eq!(of_json(body).as_deref(), Some("prompt=12 cached=0 completion=30"));
        assert_eq!(of_json(b"{\"usage\":null}"), None);
        assert_eq!(of_json(b"[]"), None);
    }
}
