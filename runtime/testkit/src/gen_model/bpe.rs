//! A byte-level BPE tokenizer learned deterministically from a small embedded corpus, then padded with
//! synthetic merges to exactly the vocabulary size the model shape needs, and serialised with the
//! `tokenizers` crate into a standard `tokenizer.json`.
//!
//! Invariants: the same inputs give byte-identical output (pair counts break ties by the pair itself,
//! never by hash order); ids are `specials…, 256 byte symbols (by byte value), learned merges, synthetic
//! merges`, so every id below the vocabulary size decodes to text; any UTF-8 input encodes (byte-level).
//! Design: GPT-2's byte-to-unicode map and pre-tokenizer regex (via the crate's `ByteLevel`), and the
//! classic BPE training loop of Sennrich et al. (2016).

use std::collections::{BTreeMap, HashMap, HashSet};
use tokenizers::models::bpe::{BPE, Vocab};
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::processors::template::TemplateProcessing;
use tokenizers::{AddedToken, OffsetReferential, OffsetType, PreTokenizedString, PreTokenizer};

/// The text the merges are learned from.
const CORPUS: &str = include_str!("corpus.txt");

/// What the tokenizer should contain.
pub(crate) struct BpeSpec<'a> {
    /// Special tokens, given ids `0..specials.len()`.
    pub specials: &'a [&'a str],
    /// Plain added tokens (not special: they stay in decoded text), given the last ids.
    pub added: &'a [&'a str],
    /// Total vocabulary size (must be at least `specials + 256`).
    pub vocab_size: usize,
    /// A token the post-processor prepends to every encoded text (`add_special_tokens = true`).
    pub bos: Option<&'a str>,
}

/// GPT-2's map from bytes to printable characters.
fn byte_chars() -> Vec<char> {
    let mut printable: Vec<u32> = (b'!' as u32..=b'~' as u32)
        .chain(0xA1..=0xAC)
        .chain(0xAE..=0xFF)
        .collect();
    let mut chars: Vec<u32> = printable.clone();
    let mut n = 0;
    for b in 0..256u32 {
        if !printable.contains(&b) {
            printable.push(b);
            chars.push(256 + n);
            n += 1;
        }
    }
    let mut by_byte = vec!['\0'; 256];
    for (b, c) in printable.iter().zip(chars) {
        by_byte[*b as usize] = char::from_u32(c).expect("valid char");
    }
    by_byte
}

/// Learns up to `n` merges from the corpus (stopping when no pair occurs twice).
fn learn_merges(n: usize) -> Vec<(String, String)> {
    let mut pts = PreTokenizedString::from(CORPUS);
    ByteLevel::default()
        .add_prefix_space(false)
        .pre_tokenize(&mut pts)
        .expect("byte-level pre-tokenizer");
    let mut counts: BTreeMap<String, usize> = BTreeMap::new();
    for (word, _, _) in pts.get_splits(OffsetReferential::Original, OffsetType::Byte) {
        *counts.entry(word.to_string()).or_default() += 1;
    }
    let mut words: Vec<(Vec<String>, usize)> = counts
        .into_iter()
        .map(|(w, c)| (w.chars().map(String::from).collect(), c))
        .collect();
    let mut merges = Vec::new();
    while merges.len() < n {
        let mut pairs: HashMap<(&str, &str), usize> = HashMap::new();
        for (syms, c) in &words {
            for p in syms.windows(2) {
                *pairs.entry((&p[0], &p[1])).or_default() += c;
            }
        }
        // Highest count, then the smallest pair: deterministic whatever the hash order.
        let best = pairs.into_iter().max_by(|a, b| a.1.cmp(&b.1).then(b.0.cmp(&a.0)));
        let Some(((a, b), count)) = best else { break };
        if count < 2 {
            break;
        }
        let (a, b) = (a.to_string(), b.to_string());
        for (syms, _) in &mut words {
            let mut i = 0;
            while i + 1 < syms.len() {
                if syms[i] == a && syms[i + 1] == b {
                    syms[i] = format!("{a}{b}");
                    syms.remove(i + 1);
                }
                i += 1;
            }
        }
        merges.push((a, b));
    }
    merges
}

/// Builds the `tokenizer.json` document.
pub(crate) fn tokenizer_json(spec: &BpeSpec<'_>) -> Result<String, String> {
    let base = spec.specials.len() + 256;
    if spec.vocab_size < base + spec.added.len() {
        return Err(format!(
            "vocab_size {} is below {} (specials + bytes + added tokens)",
            spec.vocab_size,
            base + spec.added.len()
        ));
    }
    // The merges fill the vocabulary but the added tokens' ids, so the ids below them are the same
    // with or without them (merges are learned in a fixed order).
    let merged_size = spec.vocab_size - spec.added.len();
    let mut vocab: Vec<String> = spec.specials.iter().map(|s| s.to_string()).collect();
    vocab.extend(byte_chars().into_iter().map(String::from));
    let mut seen: HashSet<String> = vocab.iter().cloned().collect();
    let mut merges = Vec::new();
    for (a, b) in learn_merges(merged_size - base) {
        let t = format!("{a}{b}");
        if seen.insert(t.clone()) {
            vocab.push(t);
            merges.push((a, b));
        }
    }
    // Pad with synthetic merges of existing (non-special) tokens, shortest first, in id order.
    let mut round = 0;
    while vocab.len() < merged_size {
        // Learned tokens first, then printable ASCII bytes, then the other byte symbols.
        let mut pool: Vec<String> = vocab[base..].to_vec();
        pool.extend(
            vocab[spec.specials.len()..base]
                .iter()
                .filter(|t| t.chars().all(|c| c.is_ascii_graphic()))
                .cloned(),
        );
        pool.extend(
            vocab[spec.specials.len()..base]
                .iter()
                .filter(|t| !t.chars().all(|c| c.is_ascii_graphic()))
                .cloned(),
        );
        let (lo, hi) = (
            round * pool.len() / 4,
            ((round + 1) * pool.len() / 4).min(pool.len()),
        );
        'outer: for a in &pool[lo..hi] {
            for b in &pool {
                if vocab.len() >= merged_size {
                    break 'outer;
                }
                let t = format!("{a}{b}");
                if seen.insert(t.clone()) {
                    vocab.push(t);
                    merges.push((a.clone(), b.clone()));
                }
            }
        }
        round += 1;
    }
    for a in spec.added {
        if !seen.insert(a.to_string()) {
            return Err(format!("added token {a:?} is already in the vocabulary"));
        }
        vocab.push(a.to_string());
    }
    let map: Vocab = vocab
        .iter()
        .enumerate()
        .map(|(i, t)| (t.clone(), i as u32))
        .collect();
    let bpe = BPE::builder()
        .vocab_and_merges(map, merges)
        .build()
        .map_err(|e| e.to_string())?;
    let mut t = tokenizers::Tokenizer::new(bpe);
    t.with_pre_tokenizer(Some(ByteLevel::default().add_prefix_space(false)));
    t.with_decoder(Some(ByteLevel::default()));
    if let Some(bos) = spec.bos {
        let id = spec
            .specials
            .iter()
            .position(|s| s == &bos)
            .ok_or("bos is not a special token")? as u32;
        let post = TemplateProcessing::builder()
            .try_single(format!("{bos}:0 $A:0"))
            .and_then(|b| b.try_pair(format!("{bos}:0 $A:0 {bos}:1 $B:1")))
            .map_err(|e| e.to_string())?
            .special_tokens(vec![(bos.to_string(), id)])
            .build()
            .map_err(|e| e.to_string())?;
        t.with_post_processor(Some(post));
    }
    t.add_special_tokens(spec.specials.iter().map(|s| AddedToken::from(*s, true)))
        .map_err(|e| e.to_string())?;
    t.add_tokens(spec.added.iter().map(|s| AddedToken::from(*s, false)))
        .map_err(|e| e.to_string())?;
    t.to_string(false).map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vocabulary_is_exact_deterministic_and_round_trips() {
        let spec = BpeSpec {
            specials: &["<s>", "</s>"],
            added: &[],
            vocab_size: 700,
            bos: Some("<s>"),
        };
        let json = tokenizer_json(&spec).unwrap();
        assert_eq!(json, tokenizer_json(&spec).unwrap());
        let t: tokenizers::Tokenizer = json.parse().unwrap();
        assert_eq!(t.get_vocab_size(true), 700);
        let text = "The server answers: café 🚀 42!";
        let enc = t.encode(text, true).unwrap();
        assert_eq!(enc.get_ids()[0], 0, "BOS prepended");
        assert!(enc.get_ids().len() < text.len(), "merges compress the text");
        assert_eq!(t.decode(enc.get_ids(), true).unwrap(), text);
        for id in [3u32, 300, 699] {
            assert!(t.id_to_token(id).is_some(), "id {id} has a token");
        }
    }

    #[test]
    fn added_tokens_take_the_last_ids_and_leave_the_others_alone() {
        let spec = |added| BpeSpec {
            specials: &["<|endoftext|>"],
            added,
            vocab_size: 600,
            bos: None,
        };
        let plain: tokenizers::Tokenizer = tokenizer_json(&spec(&[])).unwrap().parse().unwrap();
        let with: tokenizers::Tokenizer = tokenizer_json(&spec(&["<think>", "</think>"]))
            .unwrap()
            .parse()
            .unwrap();
        assert_eq!(with.get_vocab_size(true), 600);
        for id in 0..598u32 {
            assert_eq!(plain.id_to_token(id), with.id_to_token(id), "id {id}");
        }
        let enc = with.encode("<think>a b</think>c", false).unwrap();
        assert_eq!(enc.get_ids()[0], 598);
        assert_eq!(enc.get_ids().iter().filter(|&&i| i == 599).count(), 1);
        assert_eq!(
            with.decode(enc.get_ids(), true).unwrap(),
            "<think>a b</think>c",
            "not special: kept when special tokens are skipped"
        );
    }
}
