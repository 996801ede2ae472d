//! Structured output: JSON schema, regex, choice and Lark grammars enforced while decoding, with
//! llguidance (the constraint engine behind several major servers) over a token trie built from our
//! own tokenizer's bytes.
//!
//! - [`Grammars`] (one per model, held by the server): the trie and llguidance's parser factory, and a
//!   bounded LRU cache of compiled grammars keyed by the constraint's canonical hash, so a schema is
//!   compiled once per pod. Compiling happens on the caller's thread, before the request is queued, so
//!   a bad schema or grammar is the caller's 400 and never reaches the step loop.
//! - [`CompiledGrammar`]: what a request carries in its `SamplingParams`; every sequence (each of `n`
//!   choices) starts its own [`GrammarState`] from it.
//! - [`GrammarState`]: the per-sequence matcher the `Sequence` advances with each committed token; its
//!   mask is applied with the other logits processors, before sampling (greedy too), so the output is
//!   valid by construction.
//!
//! Invariants: a grammar's vocabulary is exactly the model's (`vocab_size` logits); compile errors and
//! limit breaches are [`EngineError::Constraint`] with llguidance's reason; a cached grammar is never
//! mutated (states start from shallow clones sharing its lexer caches); nothing here does I/O.
//!
//! Design: vLLM's structured-output manager (grammar compiled per request, bitmask applied before
//! sampling, grammar advanced on accepted tokens, rollback for speculation) with llguidance's
//! `Matcher`, the interface it offers for servers.

mod bounds;
mod cache;
mod spec;
mod state;
mod vocab;
pub mod workers;

pub use bounds::{MAX_COMPILE_DEPTH, depth as compile_depth};
pub use spec::ConstraintSpec;
pub use state::{GrammarState, TokenMask};

use crate::error::{EngineError, Result};
use crate::tokenizer::Tokenizer;
use cache::Lru;
use llguidance::api::ParserLimits;
use llguidance::{Matcher, ParserFactory, TokenParser};
use state::LiveGuard;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

/// Bounds on compiling and enforcing grammars.
#[derive(Clone, Copy, Debug)]
pub struct GrammarLimits {
    /// Compiled grammars kept (LRU).
    pub cache_entries: usize,
    /// Most symbols in a compiled grammar (llguidance's `max_grammar_size`).
    pub max_grammar_size: usize,
    /// Lexer work allowed while compiling (llguidance's `initial_lexer_fuel`, ~50k per ms).
    pub initial_lexer_fuel: u64,
    /// Lexer work allowed per token mask (llguidance's `step_lexer_fuel`, ~14k per ms).
    pub step_lexer_fuel: u64,
}

impl Default for GrammarLimits {
    fn default() -> Self {
        Self {
            cache_entries: 256,
            max_grammar_size: 200_000,
            initial_lexer_fuel: 1_000_000,
            step_lexer_fuel: 200_000,
        }
    }
}

/// A compiled grammar, shared by the requests that use it.
pub struct CompiledGrammar {
    key: String,
    /// A fresh parser; states start from its clones.
    parser: TokenParser,
    vocab_size: usize,
    live: Arc<AtomicUsize>,
}

impl CompiledGrammar {
    /// The canonical key (hex SHA-256) of the constraint it was compiled from.
    pub fn key(&self) -> &str {
        &self.key
    }

    /// The vocabulary size it masks.
    pub fn vocab_size(&self) -> usize {
        self.vocab_size
    }

    /// A new sequence's state at the start of the grammar.
    pub fn start(&self) -> GrammarState {
        GrammarState::new(Matcher::new(Ok(self.parser.clone())), LiveGuard::new(&self.live))
    }
}

impl std::fmt::Debug for CompiledGrammar {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "CompiledGrammar({})", self.key)
    }
}

impl PartialEq for CompiledGrammar {
    fn eq(&self, other: &Self) -> bool {
        self.key == other.key && self.vocab_size == other.vocab_size
    }
}

/// How [`Grammars::compile`] got its grammar, for metrics and benchmarks.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GrammarCounters {
    /// Grammars compiled.
    pub compiled: u64,
    /// Requests served from the cache.
    pub hits: u64,
    /// Compilations refused (bad input or over a limit).
    pub errors: u64,
}

/// The model's grammar compiler and its cache (one per model; shared across handler threads).
pub struct Grammars {
    factory: ParserFactory,
    vocab_size: usize,
    cache: Mutex<Lru<Arc<CompiledGrammar>>>,
    live: Arc<AtomicUsize>,
    compiled: AtomicU64,
    hits: AtomicU64,
    errors: AtomicU64,
}

impl Grammars {
    /// Builds the token trie of `tokenizer` for `vocab_size` logits, ending at `eos`. Fails (with a
    /// reason) for tokenizers the trie cannot describe; the server then refuses constraints.
    pub fn new(tokenizer: &Tokenizer, vocab_size: usize, eos: &[u32], limits: GrammarLimits) -> Result<Self> {
        let vocab = vocab::Vocab::new(tokenizer, vocab_size, eos)?;
        let env: llguidance::toktrie::TokEnv = Arc::new(vocab);
        let mut factory = ParserFactory::new_simple(&env)
            .map_err(|e| EngineError::Constraint(format!("cannot set up structured output: {e}")))?;
        factory.quiet();
        *factory.limits_mut() = ParserLimits {
            max_grammar_size: limits.max_grammar_size,
            initial_lexer_fuel: limits.initial_lexer_fuel,
            step_lexer_fuel: limits.step_lexer_fuel,
            verbose_errors: false,
            ..ParserLimits::default()
        };
        Ok(Self {
            factory,
            vocab_size,
            cache: Mutex::new(Lru::new(limits.cache_entries)),
            live: Arc::new(AtomicUsize::new(0)),
            compiled: AtomicU64::new(0),
            hits: AtomicU64::new(0),
            errors: AtomicU64::new(0),
        })
    }

    /// The compiled grammar for `spec`, from the cache or compiled now (which may take milliseconds
    /// to seconds for a large schema: call it off the async workers).
    pub fn compile(&self, spec: &ConstraintSpec) -> Result<Arc<CompiledGrammar>> {
        let key = spec.key();
        if let Some(g) = self.lock().get(&key) {
            self.hits.fetch_add(1, Ordering::Relaxed);
            return Ok(g);
        }
        let compiled = self.compile_new(spec, key);
        match &compiled {
            Ok(g) => {
                self.compiled.fetch_add(1, Ordering::Relaxed);
                self.lock().insert(g.key.clone(), g.clone());
            }
            Err(_) => {
                self.errors.fetch_add(1, Ordering::Relaxed);
            }
        }
        compiled
    }

    /// The compiled grammar for `spec` if the cache holds it (counted as a hit): no compiling, so a
    /// caller needs no compile thread for it.
    pub fn lookup(&self, spec: &ConstraintSpec) -> Option<Arc<CompiledGrammar>> {
        let hit = self.lock().get(&spec.key());
        if hit.is_some() {
            self.hits.fetch_add(1, Ordering::Relaxed);
        }
        hit
    }

    fn compile_new(&self, spec: &ConstraintSpec, key: String) -> Result<Arc<CompiledGrammar>> {
        bounds::check(spec)?;
        let grammar = spec.grammar()?;
        let parser = self
            .factory
            .create_parser(grammar)
            .map_err(|e| EngineError::Constraint(shorten(&e.to_string())))?;
        let g = CompiledGrammar {
            key,
            parser,
            vocab_size: self.vocab_size,
            live: self.live.clone(),
        };
        // A grammar that admits nothing, or whose lexer gives out on the first mask, fails here rather
        // than on the request's first token. Two fresh states: the first mask can leave the lexer
        // that the clones share in its error state (out of fuel) while still answering, and every
        // later state then fails.
        for _ in 0..2 {
            g.start()
                .allows(0)
                .map_err(|e| EngineError::Constraint(over_budget(&shorten(&e.to_string()))))?;
        }
        Ok(Arc::new(g))
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Lru<Arc<CompiledGrammar>>> {
        self.cache.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Grammar states alive (sequences holding one).
    pub fn live_states(&self) -> usize {
        self.live.load(Ordering::Relaxed)
    }

    /// Grammars in the cache.
    pub fn cached(&self) -> usize {
        self.lock().len()
    }

    /// Compile and cache counters since start.
    pub fn counters(&self) -> GrammarCounters {
        GrammarCounters {
            compiled: self.compiled.load(Ordering::Relaxed),
            hits: self.hits.load(Ordering::Relaxed),
            errors: self.errors.load(Ordering::Relaxed),
        }
    }

    /// Times one compilation of `spec`, bypassing the cache (benchmarks).
    pub fn time_compile(&self, spec: &ConstraintSpec) -> Result<std::time::Duration> {
        let t0 = Instant::now();
        self.compile_new(spec, spec.key())?;
        Ok(t0.elapsed())
    }
}

/// Says what an exhausted lexer budget means for the caller.
fn over_budget(message: &str) -> String {
    if message.contains("too many expressions") || message.contains("too many states") {
        format!(
            "is too expensive to match token by token (its regular expressions expand past the lexer's \
             budget per token; bounded repetitions such as `{{1000}}` nested in one another are the usual \
             cause): {message}"
        )
    } else {
        message.to_owned()
    }
}

/// llguidance's messages can quote whole grammars; keep the first 400 characters.
fn shorten(message: &str) -> String {
    const MAX: usize = 400;
    match message.char_indices().nth(MAX) {
        Some((cut, _)) => format!("{}…", &message[..cut]),
        None => message.to_owned(),
    }
}

#[cfg(test)]
mod tests;
