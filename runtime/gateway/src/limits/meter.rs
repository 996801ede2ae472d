//! Reading a response's token usage as it passes, without changing a byte of it.
//!
//! The runtime reports what a request used, exactly, when the gateway asks (request header
//! `x-modelfleet-usage: 1`): a JSON answer carries the response header `x-modelfleet-usage: prompt=P
//! cached=C completion=N`; a stream ends with the SSE comment line `: modelfleet-usage prompt=P cached=C
//! completion=N` before `data: [DONE]` (clients ignore comment lines, as the SSE format requires). Until
//! then, each `data:` event of a stream counts as one completion token (an estimate, corrected at the
//! end).
//!
//! Invariants: memory is bounded (a line is kept up to [`MAX_LINE`] bytes; only short lines matter); a
//! malformed report is ignored, never trusted in part.

use super::Usage;

pub use modelfleet_api::limits::USAGE_HEADER;
/// The stream comment's line prefix.
const USAGE_LINE: &str = ": modelfleet-usage ";
/// Bytes of a line kept (the report is far shorter; `data:` lines need only their start).
const MAX_LINE: usize = 256;

/// `prompt=P cached=C completion=N` (any order, each once), or None.
pub fn parse_usage(s: &str) -> Option<Usage> {
    let (mut p, mut c, mut n) = (None, None, None);
    for part in s.split_whitespace() {
        let (k, v) = part.split_once('=')?;
        let v: u64 = v.parse().ok()?;
        let slot = match k {
            "prompt" => &mut p,
            "cached" => &mut c,
            "completion" => &mut n,
            _ => return None,
        };
        if slot.replace(v).is_some() {
            return None;
        }
    }
    let u = Usage {
        prompt: p?,
        cached: c?,
        completion: n?,
    };
    (u.cached <= u.prompt).then_some(u)
}

/// A stream's usage so far.
#[derive(Debug, Default)]
pub struct Meter {
    line: Vec<u8>,
    /// `data:` events other than `[DONE]` seen so far.
    pub events: u64,
    /// The runtime's report, once seen (or from the JSON answer's header).
    pub usage: Option<Usage>,
}

impl Meter {
    /// Reads the next bytes of an SSE stream.
    pub fn feed(&mut self, chunk: &[u8]) {
        for &b in chunk {
            if b == b'\n' {
                self.line_ended();
            } else if self.line.len() < MAX_LINE {
                self.line.push(b);
            }
        }
    }

    fn line_ended(&mut self) {
        let line = self.line.strip_suffix(b"\r").unwrap_or(&self.line);
        if line.starts_with(b"data:") && !line.ends_with(b"[DONE]") {
            self.events += 1;
        } else if let Some(rest) = line.strip_prefix(USAGE_LINE.as_bytes())
            && let Ok(text) = std::str::from_utf8(rest)
        {
            self.usage = parse_usage(text);
        }
        self.line.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reports_parse_strictly() {
        let u = Usage {
            prompt: 12,
            cached: 8,
            completion: 30,
        };
        let report = modelfleet_api::limits::usage_report(u.prompt, u.cached, u.completion);
        assert_eq!(parse_usage(&report), Some(u));
        assert_eq!(
            format!(": {} {report}", modelfleet_api::limits::USAGE_COMMENT),
            format!("{USAGE_LINE}{report}")
        );
        assert_eq!(parse_usage("completion=30 prompt=12 cached=8"), Some(u));
        for bad in [
            "prompt=12 cached=8",
            "prompt=12 cached=13 completion=1",
            "prompt=12 prompt=1 cached=0 completion=1",
            "prompt=x cached=0 completion=1",
            "prompt=1 cached=0 completion=1 extra=2",
        ] {
            assert_eq!(parse_usage(bad), None, "{bad}");
        }
    }

    #[test]
    fn a_stream_split_anywhere_reads_the_same() {
        let stream = format!(
            "data: {{\"a\":1}}\n\ndata: {{\"b\":\"{}\"}}\n\ndata: {{\"c\":3}}\r\n\r\n{USAGE_LINE}prompt=5 cached=0 completion=2\n\ndata: [DONE]\n\n",
            "x".repeat(1000)
        );
        for cut in [1, 7, 50, 300, 1100, stream.len() - 3] {
            let mut m = Meter::default();
            let (a, b) = stream.as_bytes().split_at(cut);
            m.feed(a);
            m.feed(b);
            assert_eq!(m.events, 3, "cut at {cut}");
            assert_eq!(
                m.usage,
                Some(Usage {
                    prompt: 5,
                    cached: 0,
                    completion: 2
                }),
                "cut at {cut}"
            );
        }
    }
}
