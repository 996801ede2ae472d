//! `POST /v1/chat/completions` and `POST /v1/completions`: authenticate, parse strictly, validate
//! everything that does not depend on the prompt (validate.rs), render the chat template and tokenize,
//! check the context, submit every choice (or answer 429/503), then answer with one JSON body or an SSE
//! stream.

use super::generate::{self, ChoiceSpec};
use super::params::fit_context;
use super::state::AppState;
use super::stream::{Flavor, UsageOut, report, stream_response};
use super::validate::{self, ValidChat};
use super::{body, prompt, reasoning, structured, tools};
use crate::api::error::ApiError;
use crate::api::response::*;
use crate::api::structured::ToolMode;
use crate::api::wire::{self, Prompt};
use axum::body::Body;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use modelfleet_api::deadline;
use modelfleet_api::limits::USAGE_HEADER;
use modelfleet_engine::sampling::SampleOutput;
use std::sync::Arc;
use std::time::{Instant, SystemTime, UNIX_EPOCH};
use tracing::{Instrument, info_span};

pub(super) fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

fn token_text(st: &AppState, id: u32) -> String {
    st.model().tokenizer.decode(&[id], false).unwrap_or_default()
}

/// Per-choice parameters: with a seed, choice `j` uses `seed + j`, so `n` seeded choices differ but
/// reproduce.
fn choice_specs(
    st: &AppState,
    prompts: Vec<Vec<u32>>,
    base: modelfleet_engine::sampling::SamplingParams,
    n: u32,
) -> Result<Vec<ChoiceSpec>, ApiError> {
    let md = st.model();
    let vocab = md.config.vocab_size;
    let mut out = Vec::new();
    for (pi, prompt) in prompts.into_iter().enumerate() {
        if let Some(&bad) = prompt.iter().find(|&&t| t as usize >= vocab) {
            return Err(ApiError::invalid(
                "prompt",
                format!("`prompt` token ids must be < {vocab} (the vocabulary size), got {bad}"),
            ));
        }
        for j in 0..n {
            let mut p = base.clone();
            p.seed = p.seed.map(|s| s.wrapping_add(j as u64));
            // A request must fit the context and the KV pool (which is at least one context unless
            // `--num-kv-blocks` made it smaller).
            let limit = st.engine.max_model_len().min(st.engine.kv_capacity_tokens());
            let params = fit_context(p, prompt.len(), limit, vocab)?;
            out.push(ChoiceSpec {
                index: pi as u32 * n + j,
                prompt_index: pi,
                prompt: prompt.clone(),
                params,
            });
        }
    }
    Ok(out)
}

/// A request as read: who asks, the parsed body, when it arrived, and when its first token is due
/// (the `x-modelfleet-first-token-deadline-ms` header, if sent).
struct Read<T> {
    tenant: Arc<crate::tenants::Tenant>,
    req: T,
    arrival: Instant,
    first_token_by: Option<Instant>,
}

/// Who is asking and what: the key checked from the headers before a byte of the body is read, then
/// the body (bounded) parsed strictly off the async workers; with its arrival time.
async fn read_request<T: Send + 'static>(
    st: &Arc<AppState>,
    headers: &HeaderMap,
    raw: Body,
    parse: fn(&[u8]) -> Result<T, ApiError>,
) -> Result<Read<T>, ApiError> {
    let arrival = Instant::now();
    let tenant = st.authenticate(headers)?;
    super::trace::tenant(&tenant.id);
    st.check_open(&tenant)?;
    let first_token_by = deadline::from_headers(headers)?.map(|d| arrival + d);
    let bytes = body::read(raw, st.body).await?;
    st.faults.check(&bytes, st.termination_log.as_deref());
    st.faults.degrade(arrival, first_token_by).await?;
    let req = prompt::parse(st, bytes, parse).await?;
    Ok(Read {
        tenant,
        req,
        arrival,
        first_token_by,
    })
}

/// The SSE answer; a choice's constraint that gave out before its first token names its field.
async fn streamed(
    st: Arc<AppState>,
    job: &generate::JobSpec,
    running: Vec<generate::Running>,
    flavor: Flavor,
    usage: UsageOut,
    field: Option<&str>,
) -> Result<Response, ApiError> {
    let who = (job.tenant.id.clone(), job.model.clone(), job.first_token_by);
    stream_response(st, who, running, flavor, usage)
        .await
        .map_err(|e| structured::name_field(e, field))
}

/// Every choice to its end; a constraint that gave out before the first token names its field.
async fn collected(
    st: &AppState,
    job: &generate::JobSpec,
    running: Vec<generate::Running>,
    field: Option<&str>,
) -> Result<generate::Collected, ApiError> {
    generate::collect(st, job, running)
        .await
        .map_err(|e| structured::name_field(e, field))
}

/// `POST /v1/chat/completions`: validate, render the template and tokenize, submit, answer.
pub async fn chat(
    State(st): State<Arc<AppState>>,
    headers: HeaderMap,
    raw: Body,
) -> Result<Response, ApiError> {
    let Read {
        tenant,
        req,
        arrival,
        first_token_by,
    } = read_request(&st, &headers, raw, wire::parse_chat).await?;
    let ValidChat { v, plan } = validate::chat(&st, tenant, &req, arrival)
        .instrument(info_span!("validate"))
        .await?;
    let md = st.model().clone();
    let renders_tools = md.chat_template.as_ref().is_some_and(|t| t.renders_tools());
    let (messages, tools_value) = tools::messages(&plan, &req.messages, renders_tools);
    let input = prompt::ChatInput {
        messages,
        tools: tools_value,
        add_generation_prompt: req.add_generation_prompt.unwrap_or(true),
        kwargs: req.chat_template_kwargs.clone(),
    };
    let prompt::ChatPrompt { ids, start } = prompt::chat(&st, input)
        .instrument(info_span!("tokenize"))
        .await?;
    // A constrained answer is the constraint's from its first token (serve/reasoning.rs).
    let start = start.map(|s| s.constrained(v.base.constraint.is_some()));
    let specs = choice_specs(&st, vec![ids], v.base, v.n)?;
    let mut job = v.job;
    job.first_token_by = first_token_by;
    job.adapter = generate::acquire_adapter(&st, &v.choice, &job)
        .instrument(info_span!("adapter"))
        .await?;
    let running = generate::submit(&st, &job, specs)?;
    let id = format!("chatcmpl-{}", running[0].stream.id);
    let (with_logprobs, with_tools) = (v.logprobs.is_some(), plan.mode != ToolMode::None);
    let field = v.constraint_field;
    if v.stream {
        let flavor = Flavor::Chat {
            id,
            with_logprobs,
            with_tools,
            reasoning: start,
        };
        let usage = UsageOut {
            chunk: v.include_usage,
            report: headers.contains_key(USAGE_HEADER),
        };
        return streamed(st, &job, running, flavor, usage, field.as_deref()).await;
    }
    let done = collected(&st, &job, running, field.as_deref()).await?;
    let choices = done
        .keys
        .iter()
        .zip(&done.outs)
        .map(|(&(_, index), o)| {
            let (message, finish_reason) =
                reasoning::answer(start, with_tools, &o.text, (&id, index), o.finish_reason());
            ChatChoice {
                index,
                message,
                logprobs: with_logprobs.then(|| chat_logprobs(&st, &o.logprobs)),
                finish_reason,
            }
        })
        .collect();
    let usage = done.usage();
    let reported = report(&usage);
    let answer = axum::Json(ChatCompletion {
        id,
        object: "chat.completion",
        created: unix_now(),
        model: job.model.clone(),
        choices,
        usage,
    });
    Ok(([(USAGE_HEADER, reported)], answer).into_response())
}

pub(super) fn chat_logprobs(st: &AppState, lps: &[SampleOutput]) -> ChatLogprobs {
    let entry = |id: u32, lp: f32| {
        let token = token_text(st, id);
        TopLogprob {
            bytes: token.as_bytes().to_vec(),
            token,
            logprob: lp,
        }
    };
    ChatLogprobs {
        content: lps
            .iter()
            .map(|o| {
                let c = entry(o.chosen.token, o.chosen.logprob);
                ChatTokenLogprob {
                    token: c.token,
                    logprob: c.logprob,
                    bytes: c.bytes,
                    top_logprobs: o.top.iter().map(|t| entry(t.token, t.logprob)).collect(),
                }
            })
            .collect(),
    }
}

pub(super) fn completion_logprobs(st: &AppState, lps: &[SampleOutput], offset0: usize) -> CompletionLogprobs {
    let mut out = CompletionLogprobs::default();
    let mut offset = offset0;
    for o in lps {
        let t = token_text(st, o.chosen.token);
        out.text_offset.push(offset);
        offset += t.len();
        out.tokens.push(t);
        out.token_logprobs.push(o.chosen.logprob);
        out.top_logprobs.push(
            o.top
                .iter()
                .map(|a| (token_text(st, a.token), a.logprob))
                .collect(),
        );
    }
    out
}

/// `POST /v1/completions`: validate, tokenize, submit, answer.
pub async fn completions(
    State(st): State<Arc<AppState>>,
    headers: HeaderMap,
    raw: Body,
) -> Result<Response, ApiError> {
    let Read {
        tenant,
        mut req,
        arrival,
        first_token_by,
    } = read_request(&st, &headers, raw, wire::parse_completion).await?;
    let v = validate::completions(&st, tenant, &req, arrival)
        .instrument(info_span!("validate"))
        .await?;
    let wire_prompt = std::mem::replace(&mut req.prompt, Prompt::Texts(Vec::new()));
    let prompts = prompt::completion(&st, wire_prompt, true)
        .instrument(info_span!("tokenize"))
        .await?;
    if prompts.iter().any(Vec::is_empty) {
        return Err(ApiError::invalid(
            "prompt",
            "`prompt` must not tokenize to nothing",
        ));
    }
    let echo: Vec<String> = match req.echo.unwrap_or(false) {
        true => prompts
            .iter()
            .map(|p| st.model().tokenizer.decode(p, false).unwrap_or_default())
            .collect(),
        false => vec![String::new(); prompts.len()],
    };
    let specs = choice_specs(&st, prompts, v.base, v.n)?;
    let mut job = v.job;
    job.first_token_by = first_token_by;
    job.adapter = generate::acquire_adapter(&st, &v.choice, &job)
        .instrument(info_span!("adapter"))
        .await?;
    let running = generate::submit(&st, &job, specs)?;
    let id = format!("cmpl-{}", running[0].stream.id);
    let (with_logprobs, field) = (v.logprobs.is_some(), v.constraint_field);
    if v.stream {
        let flavor = Flavor::Completion {
            id,
            with_logprobs,
            echo: running.iter().map(|r| echo[r.prompt_index].clone()).collect(),
        };
        let usage = UsageOut {
            chunk: v.include_usage,
            report: headers.contains_key(USAGE_HEADER),
        };
        return streamed(st, &job, running, flavor, usage, field.as_deref()).await;
    }
    let done = collected(&st, &job, running, field.as_deref()).await?;
    let choices = done
        .keys
        .iter()
        .zip(&done.outs)
        .map(|(&(pi, index), o)| CompletionChoice {
            index,
            text: format!("{}{}", echo[pi], o.text),
            logprobs: with_logprobs.then(|| completion_logprobs(&st, &o.logprobs, echo[pi].len())),
            finish_reason: Some(o.finish_reason()),
        })
        .collect();
    let usage = done.usage();
    let reported = report(&usage);
    let answer = axum::Json(Completion {
        id,
        object: "text_completion",
        created: unix_now(),
        model: job.model.clone(),
        choices,
        usage: Some(usage),
    });
    Ok(([(USAGE_HEADER, reported)], answer).into_response())
}
