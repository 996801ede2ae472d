//! `POST /v1/chat/completions` and `POST /v1/completions`: authenticate, parse strictly, render the
//! chat template and tokenize, check the context, submit every choice (or answer 429/503), then
//! answer with one JSON body or an SSE stream.

use super::generate::{self, ChoiceOut, ChoiceSpec, JobSpec, Running};
use super::params::{cache_salt_key, check_fanout, fit_context, sampling_params};
use super::state::AppState;
use super::{body, prompt, structured, tools};
use crate::api::error::{ApiError, ApiErrorKind};
use crate::api::response::*;
use crate::api::structured::{ToolMode, tool_plan};
use crate::api::wire::{self, Prompt, Sampling};
use axum::body::Body;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::sse::{Event, Sse};
use axum::response::{IntoResponse, Response};
use futures::StreamExt;
use modelfleet_engine::sampling::SampleOutput;
use modelfleet_engine::sched::RequestEvent;
use modelfleet_engine::stop::FinishReason;
use std::convert::Infallible;
use std::sync::Arc;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

/// Most prompts in one `/v1/completions` batch.
const MAX_PROMPTS: usize = 16;

fn unix_now() -> u64 {
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

fn job(
    st: &AppState,
    tenant: Arc<crate::tenants::Tenant>,
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

/// `POST /v1/chat/completions`.
pub async fn chat(State(st): State<Arc<AppState>>, headers: HeaderMap, raw: Body) -> Response {
    match chat_inner(st, headers, raw).await {
        Ok(r) => r,
        Err(e) => e.into_response(),
    }
}

async fn chat_inner(st: Arc<AppState>, headers: HeaderMap, raw: Body) -> Result<Response, ApiError> {
    let arrival = Instant::now();
    // The key is checked from the headers before a byte of the body is read.
    let tenant = st.authenticate(&headers)?;
    st.check_open(&tenant)?;
    let bytes = body::read(raw, st.body).await?;
    st.faults.check(&bytes, st.termination_log.as_deref());
    let req = prompt::parse(&st, bytes, wire::parse_chat).await?;
    let choice = st.check_model(&req.model, &tenant)?;
    check_fanout(1, req.sampling.n, &st.limits)?;
    let plan = tool_plan(
        req.tools.as_deref(),
        req.tool_choice.as_ref(),
        req.parallel_tool_calls,
    )?;
    let requested = req.sampling.constraint_fields().resolve()?;
    let md = st.model().clone();
    let template = md.chat_template.as_ref().ok_or_else(|| {
        ApiError::invalid("messages", "this model has no chat template; use /v1/completions")
    })?;
    let (messages, tools_value) = tools::messages(&plan, &req.messages, template.renders_tools());
    let mut job = job(&st, tenant, &req.model, &req.sampling, arrival)?;
    let prompt = prompt::chat(
        &st,
        messages,
        tools_value,
        req.add_generation_prompt.unwrap_or(true),
    )
    .await?;
    let logprobs = logprobs_count(req.logprobs, req.top_logprobs)?;
    let max_tokens = req.max_completion_tokens.or(req.max_tokens);
    let (mut base, n) = sampling_params(
        &req.sampling,
        max_tokens,
        logprobs,
        md.config.vocab_size,
        &st.limits,
    )?;
    let tools_grammar = tools::grammar::lark(&plan);
    let constraint_field = structured::field_of(requested.as_ref(), tools_grammar.is_some());
    base.constraint = structured::for_request(&st, requested, tools_grammar).await?;
    let specs = choice_specs(&st, vec![prompt], base, n)?;
    job.adapter = generate::acquire_adapter(&st, &choice, &job).await?;
    let running = generate::submit(&st, &job, specs)?;
    let id = format!("chatcmpl-{}", running[0].stream.id);
    let stream = req.sampling.stream.unwrap_or(false);
    let include_usage = req
        .sampling
        .stream_options
        .as_ref()
        .is_some_and(|o| o.include_usage);
    let with_logprobs = logprobs.is_some();
    let with_tools = plan.mode != ToolMode::None;
    if stream {
        return stream_response(
            st,
            (job.tenant.id.clone(), job.model.clone()),
            running,
            Flavor::Chat {
                id,
                with_logprobs,
                with_tools,
            },
            include_usage,
        )
        .await
        .map_err(|e| structured::name_field(e, constraint_field.as_deref()));
    }
    let done = generate::collect(&st, &job.tenant.id, running)
        .await
        .map_err(|e| structured::name_field(e, constraint_field.as_deref()))?;
    let choices = done
        .keys
        .iter()
        .zip(&done.outs)
        .map(|(&(_, index), o)| {
            let (message, finish_reason) = tools::answer(with_tools, &o.text, &id, index, o.finish_reason());
            ChatChoice {
                index,
                message,
                logprobs: with_logprobs.then(|| chat_logprobs(&st, &o.logprobs)),
                finish_reason,
            }
        })
        .collect();
    let usage = done.usage();
    Ok(axum::Json(ChatCompletion {
        id,
        object: "chat.completion",
        created: unix_now(),
        model: job.model.clone(),
        choices,
        usage,
    })
    .into_response())
}

fn chat_logprobs(st: &AppState, lps: &[SampleOutput]) -> ChatLogprobs {
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

fn completion_logprobs(st: &AppState, lps: &[SampleOutput], offset0: usize) -> CompletionLogprobs {
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

/// `POST /v1/completions`.
pub async fn completions(State(st): State<Arc<AppState>>, headers: HeaderMap, raw: Body) -> Response {
    match completions_inner(st, headers, raw).await {
        Ok(r) => r,
        Err(e) => e.into_response(),
    }
}

async fn completions_inner(st: Arc<AppState>, headers: HeaderMap, raw: Body) -> Result<Response, ApiError> {
    let arrival = Instant::now();
    // The key is checked from the headers before a byte of the body is read.
    let tenant = st.authenticate(&headers)?;
    st.check_open(&tenant)?;
    let bytes = body::read(raw, st.body).await?;
    st.faults.check(&bytes, st.termination_log.as_deref());
    let mut req = prompt::parse(&st, bytes, wire::parse_completion).await?;
    let choice = st.check_model(&req.model, &tenant)?;
    // Counts first: nothing is tokenized for a request that fans out too far.
    let count = prompt::count(&req.prompt);
    if count > MAX_PROMPTS {
        return Err(ApiError::invalid(
            "prompt",
            format!("`prompt` may hold at most {MAX_PROMPTS} prompts, got {count}"),
        ));
    }
    check_fanout(count, req.sampling.n, &st.limits)?;
    let mut job = job(&st, tenant, &req.model, &req.sampling, arrival)?;
    let md = st.model().clone();
    let wire_prompt = std::mem::replace(&mut req.prompt, Prompt::Texts(Vec::new()));
    let prompts = prompt::completion(&st, wire_prompt, true).await?;
    if prompts.iter().any(Vec::is_empty) {
        return Err(ApiError::invalid(
            "prompt",
            "`prompt` must not tokenize to nothing",
        ));
    }
    let logprobs = req.logprobs.map(|n| n as usize);
    let (mut base, n) = sampling_params(
        &req.sampling,
        Some(req.max_tokens.unwrap_or(16)),
        logprobs,
        md.config.vocab_size,
        &st.limits,
    )?;
    let requested = req.sampling.constraint_fields().resolve()?;
    let constraint_field = structured::field_of(requested.as_ref(), false);
    base.constraint = structured::for_request(&st, requested, None).await?;
    let echo: Vec<String> = if req.echo.unwrap_or(false) {
        prompts
            .iter()
            .map(|p| md.tokenizer.decode(p, false).unwrap_or_default())
            .collect()
    } else {
        vec![String::new(); prompts.len()]
    };
    let specs = choice_specs(&st, prompts, base, n)?;
    job.adapter = generate::acquire_adapter(&st, &choice, &job).await?;
    let running = generate::submit(&st, &job, specs)?;
    let id = format!("cmpl-{}", running[0].stream.id);
    let include_usage = req
        .sampling
        .stream_options
        .as_ref()
        .is_some_and(|o| o.include_usage);
    let with_logprobs = logprobs.is_some();
    if req.sampling.stream.unwrap_or(false) {
        let flavor = Flavor::Completion {
            id,
            with_logprobs,
            echo: running.iter().map(|r| echo[r.prompt_index].clone()).collect(),
        };
        let who = (job.tenant.id.clone(), job.model.clone());
        return stream_response(st, who, running, flavor, include_usage)
            .await
            .map_err(|e| structured::name_field(e, constraint_field.as_deref()));
    }
    let done = generate::collect(&st, &job.tenant.id, running)
        .await
        .map_err(|e| structured::name_field(e, constraint_field.as_deref()))?;
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
    Ok(axum::Json(Completion {
        id,
        object: "text_completion",
        created: unix_now(),
        model: job.model.clone(),
        choices,
        usage: Some(usage),
    })
    .into_response())
}

/// Which endpoint a stream answers, and what its chunks carry.
enum Flavor {
    Chat {
        id: String,
        with_logprobs: bool,
        /// Parse tool calls into `delta.tool_calls`.
        with_tools: bool,
    },
    Completion {
        id: String,
        with_logprobs: bool,
        echo: Vec<String>,
    },
}

fn sse_json<T: serde::Serialize>(v: &T) -> Event {
    Event::default().data(serde_json::to_string(v).expect("response bodies serialise"))
}

/// Streams the choices as SSE. The first event is awaited first, so a request that times out or fails
/// before producing anything gets a proper status code instead of a stream.
async fn stream_response(
    st: Arc<AppState>,
    (tenant, model): (String, String),
    running: Vec<Running>,
    flavor: Flavor,
    include_usage: bool,
) -> Result<Response, ApiError> {
    let keys: Vec<(usize, u32)> = running.iter().map(|r| (r.prompt_index, r.index)).collect();
    let mut events = generate::merged(running);
    let first = events.next().await;
    if keys.len() == 1
        && let Some((_, RequestEvent::Finished(f))) = &first
        && let Some(e) = generate::early_failure(&st, f)
    {
        return Err(e);
    }
    let (tx, rx) = tokio::sync::mpsc::channel::<Event>(64);
    let created = unix_now();
    tokio::spawn(async move {
        let mut outs: Vec<ChoiceOut> = keys.iter().map(|_| ChoiceOut::default()).collect();
        let mut parsers = tools::stream_parsers(&flavor_tools(&flavor), &keys);
        // Opening chunks.
        for (i, &(_, index)) in keys.iter().enumerate() {
            let ev = match &flavor {
                Flavor::Chat { id, .. } => sse_json(&ChatCompletionChunk {
                    id: id.clone(),
                    object: "chat.completion.chunk",
                    created,
                    model: model.clone(),
                    choices: vec![ChatChunkChoice {
                        index,
                        delta: ChatDelta {
                            role: Some("assistant"),
                            content: Some(String::new()),
                            tool_calls: None,
                        },
                        logprobs: None,
                        finish_reason: None,
                    }],
                    usage: None,
                }),
                Flavor::Completion { echo, .. } if !echo[i].is_empty() => {
                    completion_chunk(&flavor, created, &model, index, echo[i].clone(), None, None)
                }
                Flavor::Completion { .. } => continue,
            };
            if tx.send(ev).await.is_err() {
                return; // client gone: dropping `events` aborts every choice
            }
        }
        let mut failure: Option<ApiError> = None;
        let mut next = first;
        while let Some((i, ev)) = next {
            let text = outs[i].apply(&st, &tenant, &ev);
            let index = keys[i].1;
            let (lp, finish) = match &ev {
                RequestEvent::Token(t) => (t.logprobs.clone(), None),
                RequestEvent::Finished(f) => {
                    if f.reason == FinishReason::Error && failure.is_none() {
                        failure = Some(ApiError::new(
                            ApiErrorKind::Internal,
                            f.message.clone().unwrap_or_else(|| "generation failed".into()),
                        ));
                    }
                    (None, Some(f.reason.as_str().to_owned()))
                }
            };
            let delta = match &flavor {
                Flavor::Chat { .. } => {
                    Some(tools::stream_delta(parsers[i].as_mut(), &text, finish.is_some()))
                }
                Flavor::Completion { .. } => None,
            };
            let empty = delta.as_ref().map_or(text.is_empty(), |d| {
                d.tool_calls.is_none() && d.content.as_deref().is_none_or(str::is_empty)
            });
            if empty && lp.is_none() && finish.is_none() {
                next = events.next().await;
                continue;
            }
            let chunk = match &flavor {
                Flavor::Chat {
                    id, with_logprobs, ..
                } => sse_json(&ChatCompletionChunk {
                    id: id.clone(),
                    object: "chat.completion.chunk",
                    created,
                    model: model.clone(),
                    choices: vec![ChatChunkChoice {
                        index,
                        delta: delta.unwrap_or_default(),
                        logprobs: (*with_logprobs && lp.is_some()).then(|| chat_logprobs(&st, lp.as_slice())),
                        finish_reason: finish.map(|f| tools::finish_reason(parsers[i].as_ref(), f)),
                    }],
                    usage: None,
                }),
                Flavor::Completion { with_logprobs, .. } => {
                    let lps = (*with_logprobs && lp.is_some()).then(|| {
                        let before = outs[i].text.len() - text.len();
                        completion_logprobs(&st, lp.as_slice(), before)
                    });
                    completion_chunk(&flavor, created, &model, index, text, lps, finish)
                }
            };
            if tx.send(chunk).await.is_err() {
                return;
            }
            next = events.next().await;
        }
        if let Some(e) = failure {
            let _ = tx.send(Event::default().data(e.body())).await;
        }
        if include_usage {
            let usage = generate::usage(keys.iter().map(|k| k.0).zip(&outs));
            let ev = match &flavor {
                Flavor::Chat { id, .. } => sse_json(&ChatCompletionChunk {
                    id: id.clone(),
                    object: "chat.completion.chunk",
                    created,
                    model: model.clone(),
                    choices: vec![],
                    usage: Some(usage),
                }),
                Flavor::Completion { id, .. } => sse_json(&Completion {
                    id: id.clone(),
                    object: "text_completion",
                    created,
                    model: model.clone(),
                    choices: vec![],
                    usage: Some(usage),
                }),
            };
            let _ = tx.send(ev).await;
        }
        let _ = tx.send(Event::default().data("[DONE]")).await;
    });
    let body = futures::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|e| (Ok::<_, Infallible>(e), rx))
    });
    Ok(Sse::new(body).into_response())
}

/// The id prefix of tool calls, when a chat stream parses them.
fn flavor_tools(flavor: &Flavor) -> Option<String> {
    match flavor {
        Flavor::Chat {
            id, with_tools: true, ..
        } => Some(id.clone()),
        _ => None,
    }
}

fn completion_chunk(
    flavor: &Flavor,
    created: u64,
    model: &str,
    index: u32,
    text: String,
    logprobs: Option<CompletionLogprobs>,
    finish_reason: Option<String>,
) -> Event {
    let id = match flavor {
        Flavor::Chat { id, .. } | Flavor::Completion { id, .. } => id.clone(),
    };
    sse_json(&Completion {
        id,
        object: "text_completion",
        created,
        model: model.to_owned(),
        choices: vec![CompletionChoice {
            index,
            text,
            logprobs,
            finish_reason,
        }],
        usage: None,
    })
}
