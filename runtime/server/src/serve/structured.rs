//! A request's structured-output constraint, compiled before anything is queued: the one constraint of
//! `response_format` / `structured_outputs` / `guided_*`, or the grammar of its tools, turned into the
//! engine's [`ConstraintSpec`] and compiled (or taken from the per-pod cache) on a blocking thread.
//!
//! Invariants: an invalid schema, regex or grammar, an unsupported keyword, or one over a limit is a
//! 400 naming the field it came in, before the request is queued; the compiled grammar goes into the
//! request's sampling parameters, shared by its `n` choices (each starts its own state).

use super::state::AppState;
use crate::api::error::{ApiError, ApiErrorKind};
use crate::api::structured::{Requested, RequestedConstraint, clash};
use modelfleet_engine::constraint::{CompiledGrammar, ConstraintSpec, GrammarLimits, Grammars};
use modelfleet_engine::{EngineError, ModelDir};
use std::sync::Arc;

/// Structured output on this server: the model's grammar compiler, or why there is none.
pub type GrammarSupport = Result<Arc<Grammars>, String>;

/// Sets up structured output for the served model (the token trie and llguidance's factory, built once
/// off the async workers); a tokenizer it cannot describe leaves the reason, which constrained
/// requests then get as their 400.
pub async fn grammars(md: &Arc<ModelDir>) -> GrammarSupport {
    let md = md.clone();
    let t0 = std::time::Instant::now();
    let built = tokio::task::spawn_blocking(move || {
        Grammars::new(
            &md.tokenizer,
            md.config.vocab_size,
            &md.eos_token_ids,
            GrammarLimits::default(),
        )
    })
    .await;
    match built {
        Ok(Ok(g)) => {
            eprintln!(
                "serve: structured output ready ({} ms to index the vocabulary)",
                t0.elapsed().as_millis()
            );
            Ok(Arc::new(g))
        }
        Ok(Err(e)) => {
            eprintln!("serve: structured output unavailable: {e}");
            Err(e.to_string())
        }
        Err(e) => Err(format!("structured output could not be set up: {e}")),
    }
}

/// The constraint to compile: the request's own, or its tools' grammar (never both).
pub fn choose(
    requested: Option<RequestedConstraint>,
    tools_grammar: Option<String>,
) -> Result<Option<RequestedConstraint>, ApiError> {
    match (requested, tools_grammar) {
        (Some(r), Some(_)) => Err(clash("tools", &r.field)),
        (r, None) => Ok(r),
        (None, Some(g)) => Ok(Some(RequestedConstraint {
            field: "tools".into(),
            what: Requested::Grammar(g),
        })),
    }
}

fn spec(what: Requested) -> ConstraintSpec {
    match what {
        Requested::JsonSchema(s) => ConstraintSpec::JsonSchema(s),
        Requested::JsonObject => ConstraintSpec::JsonObject,
        Requested::Regex(r) => ConstraintSpec::Regex(r),
        Requested::Choice(c) => ConstraintSpec::Choice(c),
        Requested::Grammar(g) => ConstraintSpec::Lark(g),
    }
}

/// Compiles `c` (or takes it from the cache) off the async workers; errors are 400s naming its field.
pub async fn compile(st: &AppState, c: RequestedConstraint) -> Result<Arc<CompiledGrammar>, ApiError> {
    let field = c.field;
    let grammars = st
        .grammars
        .as_ref()
        .map_err(|why| ApiError::invalid(&field, format!("`{field}`: {why}")))?
        .clone();
    let spec = spec(c.what);
    let compiled = tokio::task::spawn_blocking(move || grammars.compile(&spec))
        .await
        .map_err(|e| ApiError::new(ApiErrorKind::Internal, format!("compiling `{field}` failed: {e}")))?;
    compiled.map_err(|e| match e {
        EngineError::Constraint(m) => ApiError::invalid(&field, format!("`{field}`: {m}")),
        other => ApiError::invalid(&field, format!("`{field}`: {other}")),
    })
}

/// The compiled grammar for a request, if it asks for one.
pub async fn for_request(
    st: &AppState,
    requested: Option<RequestedConstraint>,
    tools_grammar: Option<String>,
) -> Result<Option<Arc<CompiledGrammar>>, ApiError> {
    match choose(requested, tools_grammar)? {
        Some(c) => Ok(Some(compile(st, c).await?)),
        None => Ok(None),
    }
}
