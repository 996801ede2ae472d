//! A request's structured-output constraint, compiled before anything is queued: the one constraint of
//! `response_format` / `structured_outputs` / `guided_*`, or the grammar of its tools, turned into the
//! engine's [`ConstraintSpec`] and compiled (or taken from the per-pod cache) on one of the compile
//! threads, whose stack is sized for the engine's depth limit.
//!
//! Invariants: an invalid schema, regex or grammar, an unsupported keyword, one nested past the depth
//! limit, or one that does not compile within [`COMPILE_BUDGET`] is a 400 naming the field it came in,
//! before the request is queued; when every compile thread is busy and their queue full the request
//! is refused at once (429 `compile_queue_full`), never absorbed; requests for a constraint already
//! being compiled wait for that compile (`inflight.rs`) instead of taking queue slots; compiling never runs
//! on an async
//! worker; the compiled grammar goes into the request's sampling parameters, shared by its `n`
//! choices (each starts its own state).

use super::inflight::{Inflight, Verdict};
use super::state::AppState;
use crate::api::error::{ApiError, ApiErrorKind};
use crate::api::structured::{Requested, RequestedConstraint, clash};
use modelfleet_engine::constraint::workers::{CompileThreads, Submit};
use modelfleet_engine::constraint::{CompiledGrammar, ConstraintSpec, GrammarLimits, Grammars};
use modelfleet_engine::{EngineError, ModelDir};
use std::sync::Arc;
use std::time::Duration;

/// How long a request waits for its constraint to compile (docs/api.md, "Structured output limits").
pub const COMPILE_BUDGET: Duration = Duration::from_millis(1500);
/// Compile threads per pod: compiling is CPU work beside the engine's, and cache hits need none.
const COMPILE_THREADS: usize = 2;
/// Constraints waiting for a compile thread before new ones are refused.
const COMPILE_QUEUE: usize = 16;

/// The model's grammar cache and the threads that compile into it.
pub struct Compiler {
    /// The trie, llguidance's factory and the cache of compiled grammars.
    pub grammars: Arc<Grammars>,
    threads: CompileThreads,
    /// Compiles under way: a request for one of them waits for it rather than queueing it again.
    inflight: Inflight,
}

/// Structured output on this server: the compiler, or why there is none.
pub type GrammarSupport = Result<Arc<Compiler>, String>;

/// Sets up structured output for the served model (the token trie and llguidance's factory, built once
/// off the async workers, and the compile threads); a tokenizer it cannot describe leaves the reason,
/// which constrained requests then get as their 400.
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
    let grammars = match built {
        Ok(Ok(g)) => g,
        Ok(Err(e)) => {
            tracing::warn!("structured output unavailable: {e}");
            return Err(e.to_string());
        }
        Err(e) => return Err(format!("structured output could not be set up: {e}")),
    };
    let threads = CompileThreads::start(COMPILE_THREADS, COMPILE_QUEUE)
        .map_err(|e| format!("structured output could not start its compile threads: {e}"))?;
    tracing::info!(
        index_ms = t0.elapsed().as_millis() as u64,
        "structured output ready"
    );
    Ok(Arc::new(Compiler {
        grammars: Arc::new(grammars),
        threads,
        inflight: Inflight::default(),
    }))
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

/// Compiles `c` (or takes it from the cache, or waits for the same constraint's compile under way) on a
/// compile thread; errors are 400s naming its field.
pub async fn compile(st: &AppState, c: RequestedConstraint) -> Result<Arc<CompiledGrammar>, ApiError> {
    let span = tracing::info_span!("constraint", cache = tracing::field::Empty);
    tracing::Instrument::instrument(compile_traced(st, c), span).await
}

/// [`compile`], inside its `constraint` span (whose `cache` says `hit`, `joined` or `compiled`).
async fn compile_traced(st: &AppState, c: RequestedConstraint) -> Result<Arc<CompiledGrammar>, ApiError> {
    let cache = |how: &str| {
        tracing::Span::current().record("cache", how);
    };
    let field = c.field;
    let compiler = st
        .grammars
        .as_ref()
        .map_err(|why| ApiError::invalid(&field, format!("`{field}`: {why}")))?
        .clone();
    let spec = spec(c.what);
    if let Some(hit) = compiler.grammars.lookup(&spec) {
        cache("hit");
        return Ok(hit);
    }
    let refused = |m: &str| ApiError::invalid(&field, format!("`{field}`: {m}"));
    let lead = match compiler.inflight.join(spec.key()) {
        Ok(lead) => Some(lead),
        Err(follow) => {
            cache("joined");
            // A little past the leader's own budget, so that its verdict, even "too slow", comes first.
            match follow.verdict(COMPILE_BUDGET + Duration::from_millis(250)).await {
                Some(Verdict::Ready(g)) => return Ok(g),
                Some(Verdict::Refused(m)) => return Err(refused(&m)),
                // The leader left without a verdict (refused as busy, or its client went away).
                None => match compiler.grammars.lookup(&spec) {
                    Some(hit) => return Ok(hit),
                    None => None,
                },
            }
        }
    };
    cache("compiled");
    match compile_now(&compiler, spec).await {
        Ok(g) => {
            if let Some(lead) = lead {
                lead.finish(Verdict::Ready(g.clone()));
            }
            Ok(g)
        }
        Err(Failed::Refused(m)) => {
            if let Some(lead) = lead {
                lead.finish(Verdict::Refused(m.clone()));
            }
            Err(refused(&m))
        }
        Err(Failed::Busy(e)) => Err(e),
    }
}

/// Why a compile gave no grammar.
enum Failed {
    /// The constraint itself (400): the message, without the field's name.
    Refused(String),
    /// No compile thread was free (429).
    Busy(ApiError),
}

/// Compiles `spec` on a compile thread, within [`COMPILE_BUDGET`].
async fn compile_now(compiler: &Compiler, spec: ConstraintSpec) -> Result<Arc<CompiledGrammar>, Failed> {
    let (tx, rx) = tokio::sync::oneshot::channel();
    let grammars = compiler.grammars.clone();
    let ticket = compiler
        .threads
        .submit(move || {
            let _ = tx.send(grammars.compile(&spec));
        })
        .map_err(|e| match e {
            Submit::Busy => Failed::Busy(ApiError {
                code: Some("compile_queue_full".into()),
                ..ApiError::new(
                    ApiErrorKind::RateLimited { retry_after_secs: 1 },
                    format!(
                        "every structured-output compile thread is busy and {COMPILE_QUEUE} constraints \
                         are waiting; retry shortly"
                    ),
                )
            }),
            Submit::Closed => Failed::Busy(ApiError::new(
                ApiErrorKind::Internal,
                "the compile threads are gone",
            )),
        })?;
    match tokio::time::timeout(COMPILE_BUDGET, rx).await {
        Ok(Ok(compiled)) => compiled.map_err(|e| match e {
            EngineError::Constraint(m) => Failed::Refused(m),
            other => Failed::Refused(other.to_string()),
        }),
        // The job ended without an answer: the compiler panicked on this input (and was caught).
        Ok(Err(_)) => Err(Failed::Refused(
            "the grammar compiler failed on this constraint".into(),
        )),
        Err(_) => {
            ticket.abandon();
            if ticket.started() {
                Err(Failed::Refused(format!(
                    "did not compile within {} s; simplify it (docs/api.md, structured output limits)",
                    COMPILE_BUDGET.as_secs_f64()
                )))
            } else {
                Err(Failed::Busy(ApiError {
                    code: Some("compile_queue_full".into()),
                    ..ApiError::new(
                        ApiErrorKind::RateLimited { retry_after_secs: 1 },
                        "the structured-output compile threads were busy for the whole compile budget",
                    )
                }))
            }
        }
    }
}

/// The request field its constraint came in (`tools` for the tools' grammar), for errors found later.
pub fn field_of(requested: Option<&RequestedConstraint>, tools: bool) -> Option<String> {
    requested
        .map(|r| r.field.clone())
        .or_else(|| tools.then(|| "tools".to_string()))
}

/// A constraint that gave out while decoding (`constraint_failed`) names the field it came in, as a
/// refusal at validation does.
pub fn name_field(mut e: ApiError, field: Option<&str>) -> ApiError {
    if let (Some(field), Some("constraint_failed"), None) = (field, e.code.as_deref(), &e.param) {
        e.message = format!("`{field}`: {}", e.message);
        e.param = Some(field.to_string());
    }
    e
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
