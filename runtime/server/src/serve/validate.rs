//! One validation per request, before anything is rendered or tokenized (TGI's `Validation` is the
//! model): the model or adapter the caller may use, fan-out (prompts × `n`), tools, the structured-output
//! constraint (compiled, or taken from the cache), `timeout`, `cache_salt`, logprobs and every sampling
//! parameter. Only [`chat`] and [`completions`] build a [`Validated`], so a request that reaches the
//! template or the tokenizer has passed all of it; what depends on the prompt's length (the context and
//! KV checks, 413) comes after tokenizing, in `openai.rs`.
//!
//! Invariants: a bad request is refused here with a 400 naming its field and the limit, at the cost of
//! parsing its body and, at most, compiling its constraint; nothing here touches the engine.

use super::generate::JobSpec;
use super::params::{cache_salt_key, check_fanout, sampling_params};
use super::state::AppState;
use super::{structured, tools};
use crate::adapters::ModelChoice;
use crate::api::error::ApiError;
use crate::api::structured::{ToolPlan, tool_plan};
use crate::api::wire::{ChatCompletionRequest as ChatRequest, CompletionRequest, Prompt, Sampling};
use crate::tenants::Tenant;
use modelfleet_engine::sampling::SamplingParams;
use std::sync::Arc;
use std::time::Instant;

/// Most prompts in one `/v1/completions` batch.
pub const MAX_PROMPTS: usize = 16;

/// A request that passed validation.
pub struct Validated {
    /// Who, its `model`, priority, `cache_salt`, `timeout` and arrival (its adapter comes later).
    pub job: JobSpec,
    /// The base model or an adapter.
    pub choice: ModelChoice,
    /// Every choice's sampling parameters but the seed offset, the constraint compiled in.
    pub base: SamplingParams,
    /// Choices per prompt.
    pub n: u32,
    /// Top logprobs per token, when asked for.
    pub logprobs: Option<usize>,
    /// Answer as SSE.
    pub stream: bool,
    /// A final SSE chunk with `usage`.
    pub include_usage: bool,
    /// The field the constraint came in, to name in errors found while decoding.
    pub constraint_field: Option<String>,
}

/// What chat adds: the tool plan (how tools reach the template, and the grammar of calls).
pub struct ValidChat {
    /// The common part.
    pub v: Validated,
    /// The tools, `tool_choice` and `parallel_tool_calls`, resolved.
    pub plan: ToolPlan,
}

/// Validates a chat completion.
pub async fn chat(
    st: &AppState,
    tenant: Arc<Tenant>,
    req: &ChatRequest,
    arrival: Instant,
) -> Result<ValidChat, ApiError> {
    let choice = st.check_model(&req.model, &tenant)?;
    check_fanout(1, req.sampling.n, &st.limits)?;
    let plan = tool_plan(
        req.tools.as_deref(),
        req.tool_choice.as_ref(),
        req.parallel_tool_calls,
    )?;
    if st.model().chat_template.is_none() {
        return Err(ApiError::invalid(
            "messages",
            "this model has no chat template; use /v1/completions",
        ));
    }
    super::prompt::check_template_kwargs(req.chat_template_kwargs.as_ref())?;
    let logprobs = logprobs_count(req.logprobs, req.top_logprobs)?;
    let max_tokens = req.max_completion_tokens.or(req.max_tokens);
    let tools_grammar = tools::grammar::lark(&plan);
    let v = common(
        st,
        (tenant, choice, &req.model),
        &req.sampling,
        (max_tokens, logprobs),
        tools_grammar,
        arrival,
    )
    .await?;
    Ok(ValidChat { v, plan })
}

/// Validates a completion; `prompt` is counted, not yet tokenized.
pub async fn completions(
    st: &AppState,
    tenant: Arc<Tenant>,
    req: &CompletionRequest,
    arrival: Instant,
) -> Result<Validated, ApiError> {
    let choice = st.check_model(&req.model, &tenant)?;
    // Counts first: nothing is tokenized for a request that fans out too far.
    let count = count_prompts(&req.prompt)?;
    check_fanout(count, req.sampling.n, &st.limits)?;
    let logprobs = req.logprobs.map(|n| n as usize);
    common(
        st,
        (tenant, choice, &req.model),
        &req.sampling,
        (Some(req.max_tokens.unwrap_or(16)), logprobs),
        None,
        arrival,
    )
    .await
}

fn count_prompts(prompt: &Prompt) -> Result<usize, ApiError> {
    let count = super::prompt::count(prompt);
    if count > MAX_PROMPTS {
        return Err(ApiError::invalid(
            "prompt",
            format!("`prompt` may hold at most {MAX_PROMPTS} prompts, got {count}"),
        ));
    }
    Ok(count)
}

/// What both endpoints check: the job, the sampling parameters and the constraint.
async fn common(
    st: &AppState,
    (tenant, choice, model): (Arc<Tenant>, ModelChoice, &str),
    s: &Sampling,
    (max_tokens, logprobs): (Option<u32>, Option<usize>),
    tools_grammar: Option<String>,
    arrival: Instant,
) -> Result<Validated, ApiError> {
    let job = job(st, tenant, model, s, arrival)?;
    let requested = s.constraint_fields().resolve()?;
    let (mut base, n) = sampling_params(s, max_tokens, logprobs, st.model().config.vocab_size, &st.limits)?;
    let constraint_field = structured::field_of(requested.as_ref(), tools_grammar.is_some());
    base.constraint = structured::for_request(st, requested, tools_grammar).await?;
    Ok(Validated {
        job,
        choice,
        base,
        n,
        logprobs,
        stream: s.stream.unwrap_or(false),
        include_usage: s.stream_options.as_ref().is_some_and(|o| o.include_usage),
        constraint_field,
    })
}

fn job(
    st: &AppState,
    tenant: Arc<Tenant>,
    model: &str,
    s: &Sampling,
    arrival: Instant,
) -> Result<JobSpec, ApiError> {
    if let Some(t) = s.timeout
        && !(t.is_finite() && t > 0.0)
    {
        return Err(ApiError::invalid(
            "timeout",
            format!("`timeout` must be a positive number of seconds, got {t}"),
        ));
    }
    Ok(JobSpec {
        tenant,
        priority: s.priority.unwrap_or(0),
        cache_salt: cache_salt_key(s.cache_salt.as_deref(), &st.limits)?,
        timeout: s.timeout,
        arrival,
        model: model.to_owned(),
        adapter: None,
        first_token_by: None,
    })
}

fn logprobs_count(asked: Option<bool>, top: Option<u32>) -> Result<Option<usize>, ApiError> {
    match (asked.unwrap_or(false), top) {
        (true, t) => Ok(Some(t.unwrap_or(0) as usize)),
        (false, Some(_)) => Err(ApiError::invalid(
            "top_logprobs",
            "`top_logprobs` needs `logprobs: true`",
        )),
        (false, None) => Ok(None),
    }
}
