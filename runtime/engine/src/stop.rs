//! Stop strings matched across token boundaries, with a hold-back buffer, and the finish reasons.
//!
//! Invariants: text that could still be the beginning of a stop string is never emitted before the
//! match is decided; a matched stop string and everything after it are dropped (OpenAI's behaviour);
//! the concatenation of everything emitted plus [`StopStrings::flush`] equals the input text up to the
//! first stop string. Because nothing that might start a match is ever emitted, every possible match lies
//! inside the held-back buffer, so only it is searched.
//!
//! Design: vLLM's `StopChecker` and TGI's `StopSequenceCriteria`, specialised to incremental text.

/// Why a sequence finished (the API's `finish_reason`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FinishReason {
    /// EOS, a stop token id or a stop string.
    Stop,
    /// `max_tokens` or the context limit.
    Length,
    /// Aborted by the server (client gone, shutdown).
    Cancelled,
    /// The deadline passed mid-generation.
    Timeout,
    /// An internal error ended it.
    Error,
}

impl FinishReason {
    /// The API string.
    pub fn as_str(self) -> &'static str {
        match self {
            FinishReason::Stop => "stop",
            FinishReason::Length => "length",
            FinishReason::Cancelled => "cancelled",
            FinishReason::Timeout => "timeout",
            FinishReason::Error => "error",
        }
    }
}

/// Result of feeding text to [`StopStrings`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StopOutcome {
    /// Text now safe to emit.
    pub emit: String,
    /// A stop string matched; `emit` ends right before it.
    pub stopped: bool,
}

/// The hold-back buffer for one sequence's stop strings.
#[derive(Clone, Debug, Default)]
pub struct StopStrings {
    stops: Vec<String>,
    pending: String,
}

impl StopStrings {
    /// A matcher for `stops` (non-empty strings; see validation).
    pub fn new(stops: Vec<String>) -> Self {
        Self {
            stops,
            pending: String::new(),
        }
    }

    /// Feeds newly decoded text.
    pub fn push(&mut self, text: &str) -> StopOutcome {
        if self.stops.is_empty() {
            return StopOutcome {
                emit: text.to_string(),
                stopped: false,
            };
        }
        self.pending.push_str(text);
        if let Some(pos) = self
            .stops
            .iter()
            .filter_map(|s| self.pending.find(s.as_str()))
            .min()
        {
            let emit = self.pending[..pos].to_string();
            self.pending.clear();
            return StopOutcome { emit, stopped: true };
        }
        let hold = self.hold_from();
        let rest = self.pending.split_off(hold);
        let emit = std::mem::replace(&mut self.pending, rest);
        StopOutcome { emit, stopped: false }
    }

    /// The earliest char boundary from which the buffer's tail is a proper prefix of a stop string.
    fn hold_from(&self) -> usize {
        let p = &self.pending;
        let longest = self.stops.iter().map(String::len).max().unwrap_or(0);
        let lo = p.len().saturating_sub(longest.saturating_sub(1));
        (lo..p.len())
            .filter(|&i| p.is_char_boundary(i))
            .find(|&i| self.stops.iter().any(|s| s.starts_with(&p[i..])))
            .unwrap_or(p.len())
    }

    /// The held-back text, at the end of generation for any reason other than a stop string.
    pub fn flush(&mut self) -> String {
        std::mem::take(&mut self.pending)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Feeds `chunks`, returning what was emitted at each step and whether it stopped.
    fn check(stops: &[&str], chunks: &[&str], want: &[&str], want_stop: bool, want_flush: &str) {
        let mut s = StopStrings::new(stops.iter().map(|s| s.to_string()).collect());
        let mut got = Vec::new();
        let mut stopped = false;
        for c in chunks {
            let o = s.push(c);
            got.push(o.emit);
            if o.stopped {
                stopped = true;
                break;
            }
        }
        assert_eq!(got, want, "stops {stops:?}, chunks {chunks:?}");
        assert_eq!(stopped, want_stop);
        assert_eq!(s.flush(), want_flush);
    }

    #[test]
    fn stop_strings_across_token_boundaries() {
        check(&[], &["ab", "c"], &["ab", "c"], false, "");
        check(
            &["END"],
            &["hello E", "N", "D more"],
            &["hello ", "", ""],
            true,
            "",
        );
        check(
            &["END"],
            &["hello E", "N", "x"],
            &["hello ", "", "ENx"],
            false,
            "",
        );
        check(&["END"], &["xEN"], &["x"], false, "EN");
        check(&["\n\n"], &["a\n", "\nb"], &["a", ""], true, "");
        check(&["ab", "b"], &["xab"], &["x"], true, "");
        check(&["bc", "abcd"], &["xab", "c"], &["x", "a"], true, "");
        check(&["é!"], &["café", "!"], &["caf", ""], true, "");
        check(&["stop"], &["no match here"], &["no match here"], false, "");
    }
}
