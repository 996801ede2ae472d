//! Incremental detokenization: turns a growing list of token ids into text deltas without ever
//! emitting a broken UTF-8 character, and without the spacing errors of decoding tokens one by one.
//!
//! Invariants: the concatenation of all deltas plus [`IncrementalDetokenizer::flush`] equals
//! `decode(all ids)` (up to the prompt context, which is never emitted); a delta never ends inside a
//! multi-byte character split across tokens — such text is held until the character completes (its
//! partial decode ends in U+FFFD) or the sequence ends, for at most [`MAX_HELD`] tokens: bytes that never
//! form a character then come out as U+FFFD, so the decoded window (and the cost per token) stays
//! bounded.
//!
//! Design: the prefix/read offsets of Hugging Face TGI and vLLM (`detokenize_incrementally`): decode a
//! small window `ids[prefix..]` and emit what extends `decode(ids[prefix..read])`. Seeding the window
//! with the last prompt tokens makes tokenizers that strip a leading space on the first token
//! (SentencePiece) render the first generated word correctly.

use super::Tokenizer;
use crate::error::Result;

/// Prompt tokens kept as left context (vLLM's `INITIAL_INCREMENTAL_DETOKENIZATION_OFFSET`).
const CONTEXT: usize = 5;

/// Most tokens held back waiting for a character to complete. A UTF-8 character is at most 4 bytes and
/// every token carries at least one, so a longer wait means bytes that will never form a character (a
/// `logit_bias` can force lone continuation bytes): they come out as U+FFFD and the window starts
/// afresh, so each token costs the same however long the output grows.
const MAX_HELD: usize = 8;

/// One sequence's detokenizer.
#[derive(Clone, Debug)]
pub struct IncrementalDetokenizer {
    ids: Vec<u32>,
    prefix_offset: usize,
    read_offset: usize,
    skip_special_tokens: bool,
}

impl IncrementalDetokenizer {
    /// A detokenizer whose window starts with the tail of `prompt` as context.
    pub fn new(prompt: &[u32], skip_special_tokens: bool) -> Self {
        let ids = prompt[prompt.len().saturating_sub(CONTEXT)..].to_vec();
        let n = ids.len();
        Self {
            ids,
            prefix_offset: 0,
            read_offset: n,
            skip_special_tokens,
        }
    }

    /// Adds a generated token and returns the text it completes (possibly empty).
    pub fn push(&mut self, tokenizer: &Tokenizer, id: u32) -> Result<String> {
        self.ids.push(id);
        let prefix = tokenizer.decode(
            &self.ids[self.prefix_offset..self.read_offset],
            self.skip_special_tokens,
        )?;
        let full = tokenizer.decode(&self.ids[self.prefix_offset..], self.skip_special_tokens)?;
        let extends = full.len() > prefix.len() && full.is_char_boundary(prefix.len());
        if extends && !full.ends_with('\u{FFFD}') {
            self.prefix_offset = self.read_offset;
            self.read_offset = self.ids.len();
            return Ok(full[prefix.len()..].to_string());
        }
        if self.ids.len() - self.read_offset < MAX_HELD {
            return Ok(String::new());
        }
        // Held too long: what never became a character is given up on (U+FFFD), the window restarts.
        self.prefix_offset = self.read_offset;
        self.read_offset = self.ids.len();
        Ok(if extends {
            full[prefix.len()..].to_string()
        } else {
            String::new()
        })
    }

    /// Whatever text is still held back (an incomplete character at the end of generation).
    pub fn flush(&mut self, tokenizer: &Tokenizer) -> Result<String> {
        let prefix = tokenizer.decode(
            &self.ids[self.prefix_offset..self.read_offset],
            self.skip_special_tokens,
        )?;
        let full = tokenizer.decode(&self.ids[self.prefix_offset..], self.skip_special_tokens)?;
        self.prefix_offset = self.read_offset;
        self.read_offset = self.ids.len();
        Ok(match full.get(prefix.len()..) {
            Some(rest) if full.starts_with(&prefix) => rest.to_string(),
            _ => String::new(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tokenizer::test_tokenizer::tokenizer;

    #[test]
    fn multibyte_characters_split_over_tokens_are_never_broken() {
        let t = tokenizer();
        let text = "hello wörld 😀!";
        let ids = t.encode(text, false).unwrap();
        assert!(
            ids.len() > text.chars().count() - 4,
            "byte-level: the emoji spans several tokens"
        );
        let prompt = t.encode("<|start|>", false).unwrap();
        let mut d = IncrementalDetokenizer::new(&prompt, true);
        let mut out = String::new();
        for &id in &ids {
            let delta = d.push(&t, id).unwrap();
            assert!(!delta.contains('\u{FFFD}'), "broken UTF-8 emitted: {delta:?}");
            out.push_str(&delta);
        }
        out.push_str(&d.flush(&t).unwrap());
        assert_eq!(out, text);
    }

    #[test]
    fn lone_continuation_bytes_are_given_up_on_and_the_window_stays_bounded() {
        let t = tokenizer();
        // "é" is two byte tokens; the second alone is a continuation byte that starts no character.
        let cont = t.encode("é", false).unwrap()[1];
        let mut d = IncrementalDetokenizer::new(&[], true);
        let mut out = String::new();
        for _ in 0..10_000 {
            out.push_str(&d.push(&t, cont).unwrap());
            assert!(
                d.ids.len() - d.prefix_offset <= 2 * MAX_HELD,
                "the decoded window stays bounded"
            );
        }
        out.push_str(&d.flush(&t).unwrap());
        assert!(out.chars().all(|c| c == '\u{FFFD}'), "{out:?}");
        assert!(
            out.chars().count() >= 10_000 / MAX_HELD,
            "nothing silently vanished"
        );
        // A real character split over tokens still comes out whole, after such garbage too.
        for id in t.encode("é!", false).unwrap() {
            out.push_str(&d.push(&t, id).unwrap());
        }
        out.push_str(&d.flush(&t).unwrap());
        assert!(
            out.ends_with("é!"),
            "{:?}",
            out.chars().rev().take(4).collect::<String>()
        );
    }

    #[test]
    fn truncated_character_is_flushed_at_the_end() {
        let t = tokenizer();
        let ids = t.encode("é", false).unwrap();
        assert_eq!(ids.len(), 2);
        let mut d = IncrementalDetokenizer::new(&[], true);
        assert_eq!(d.push(&t, ids[0]).unwrap(), "");
        assert_eq!(d.flush(&t).unwrap(), "\u{FFFD}");
    }
}
