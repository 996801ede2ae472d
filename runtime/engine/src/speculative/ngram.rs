//! The n-gram proposer (prompt lookup; vLLM's `method: "ngram"`): the request's own prompt and output
//! are the draft model. Find the most recent earlier occurrence of the sequence's last `n` tokens, for
//! the largest `n` in `[prompt_lookup_min, prompt_lookup_max]` that occurs, and propose the tokens that
//! followed it. Drafting costs a scan of the token history and no model pass; it pays where the output
//! repeats its context (editing, code, summaries that quote, retrieval-augmented answers).
//!
//! Its proposals are point masses: verification accepts a drafted token exactly when the token the
//! target samples at that position is the draft (see `speculative::verify`).

/// Up to `k` tokens continuing `tokens` (prompt then output), or none when no suffix of `min..=max`
/// tokens occurred earlier.
pub fn propose(tokens: &[u32], min: usize, max: usize, k: usize) -> Vec<u32> {
    let len = tokens.len();
    if k == 0 || min == 0 {
        return Vec::new();
    }
    for n in (min..=max.min(len.saturating_sub(1))).rev() {
        let suffix = &tokens[len - n..];
        // Match starts, most recent first; a match must leave at least one token after it.
        if let Some(start) = (0..len - n).rev().find(|&s| &tokens[s..s + n] == suffix) {
            let from = start + n;
            return tokens[from..(from + k).min(len)].to_vec();
        }
    }
    Vec::new()
}

#[cfg(test)]
mod tests {
    use super::propose;

    fn check(tokens: &[u32], min: usize, max: usize, k: usize, want: &[u32]) {
        assert_eq!(
            propose(tokens, min, max, k),
            want,
            "{tokens:?} n {min}..={max} k {k}"
        );
    }

    #[test]
    fn longest_suffix_most_recent_match() {
        // "1 2 3" occurs at 0; the suffix 2 3 matches there and at 4 (most recent: 4, followed by 9).
        check(&[1, 2, 3, 4, 2, 3, 9, 7, 2, 3], 1, 2, 3, &[9, 7, 2]);
        // With n = 3 the suffix 7 2 3 occurs nowhere earlier; n = 2 finds 2 3 at 4.
        check(&[1, 2, 3, 4, 2, 3, 9, 7, 2, 3], 3, 3, 3, &[]);
        // The longest n wins over a more recent shorter match: 1 2 3 → 4 (at 0), not 3 → 9.
        check(&[1, 2, 3, 4, 5, 3, 9, 1, 2, 3], 1, 3, 2, &[4, 5]);
        // Continuations stop at the end of the history.
        check(&[5, 6, 5], 1, 1, 4, &[6, 5]);
        check(&[5, 5, 5, 5], 2, 3, 2, &[5]);
    }

    #[test]
    fn nothing_to_propose() {
        check(&[], 1, 3, 4, &[]);
        check(&[1], 1, 3, 4, &[]);
        check(&[1, 2, 3], 1, 3, 4, &[]);
        check(&[1, 2, 1], 1, 3, 0, &[]);
    }
}
