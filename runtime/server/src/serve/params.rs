//! From a parsed OpenAI request to the engine's [`SamplingParams`], with the server's limits: every
//! refusal names the field and the limit (400), and a prompt that cannot fit the context with its
//! `max_tokens` is a 413 before anything is queued.

use crate::api::error::{ApiError, ApiErrorKind};
use crate::api::wire::Sampling;
use modelfleet_engine::EngineError;
use modelfleet_engine::sampling::{SamplingParams, ValidSamplingParams};

/// Bounds on what one request may ask for.
#[derive(Clone, Copy, Debug)]
pub struct RequestLimits {
    /// Most choices per prompt (`n`).
    pub max_n: u32,
    /// Most stop strings.
    pub max_stop: usize,
    /// Longest stop string, in bytes.
    pub max_stop_len: usize,
    /// Most `logit_bias` entries.
    pub max_logit_bias: usize,
    /// Most `stop_token_ids`.
    pub max_stop_token_ids: usize,
    /// Longest allowed `timeout`, in seconds (also the default).
    pub max_timeout_secs: f64,
    /// Most engine sequences one request fans out to (prompts × `n`).
    pub max_sequences: usize,
    /// Longest `cache_salt`, in bytes.
    pub max_cache_salt_bytes: usize,
}

impl Default for RequestLimits {
    fn default() -> Self {
        Self {
            max_n: 8,
            max_stop: 8,
            max_stop_len: 256,
            max_logit_bias: 300,
            max_stop_token_ids: 64,
            max_timeout_secs: 600.0,
            max_sequences: 16,
            max_cache_salt_bytes: 256,
        }
    }
}

fn invalid(field: &str, message: String) -> ApiError {
    ApiError::invalid(field, format!("`{field}` {message}"))
}

/// The engine's error for a bad parameter, as a 400 naming it.
pub fn engine_param_error(e: EngineError) -> ApiError {
    match e {
        EngineError::InvalidParam { field, message } => invalid(field, message),
        other => ApiError::invalid("body", other.to_string()),
    }
}

/// Refuses a request that would fan out to more than `limits.max_sequences` engine sequences
/// (`prompts` × `n`), before anything is tokenized.
pub fn check_fanout(prompts: usize, n: Option<u32>, limits: &RequestLimits) -> Result<(), ApiError> {
    let n = n.unwrap_or(1) as usize;
    if prompts.saturating_mul(n) > limits.max_sequences {
        let field = if prompts > 1 { "prompt" } else { "n" };
        return Err(ApiError::invalid(
            field,
            format!(
                "prompts × `n` = {prompts} × {n} = {} sequences; at most {} per request \
                 (--max-sequences-per-request)",
                prompts * n,
                limits.max_sequences
            ),
        ));
    }
    Ok(())
}

/// Checks the `cache_salt` length and returns what the engine hashes into block keys: the salt's
/// SHA-256, computed once per request (not the salt itself once per block and choice).
pub fn cache_salt_key(salt: Option<&str>, limits: &RequestLimits) -> Result<Option<String>, ApiError> {
    use sha2::{Digest, Sha256};
    let Some(salt) = salt else { return Ok(None) };
    if salt.len() > limits.max_cache_salt_bytes {
        return Err(invalid(
            "cache_salt",
            format!(
                "may be at most {} bytes, got {}",
                limits.max_cache_salt_bytes,
                salt.len()
            ),
        ));
    }
    Ok(Some(hex::encode(Sha256::digest(salt.as_bytes()))))
}

/// Builds and validates the sampling parameters — every range the engine checks too, before anything
/// is tokenized (the context check, which needs the prompt's length, comes later in [`fit_context`]).
/// `max_tokens` is what the request asked for (either spelling), `logprobs` the number of alternatives
/// when logprobs were requested.
pub fn sampling_params(
    s: &Sampling,
    max_tokens: Option<u32>,
    logprobs: Option<usize>,
    vocab_size: usize,
    limits: &RequestLimits,
) -> Result<(SamplingParams, u32), ApiError> {
    let n = s.n.unwrap_or(1);
    if n == 0 || n > limits.max_n {
        return Err(invalid("n", format!("must be in [1, {}], got {n}", limits.max_n)));
    }
    let Lists {
        stop,
        logit_bias,
        stop_token_ids,
    } = lists(s, vocab_size, limits)?;
    let d = SamplingParams::default();
    let p = SamplingParams {
        temperature: s.temperature.unwrap_or(d.temperature),
        top_k: s.top_k.unwrap_or(d.top_k),
        top_p: s.top_p.unwrap_or(d.top_p),
        min_p: s.min_p.unwrap_or(d.min_p),
        seed: s.seed,
        repetition_penalty: s.repetition_penalty.unwrap_or(d.repetition_penalty),
        presence_penalty: s.presence_penalty.unwrap_or(d.presence_penalty),
        frequency_penalty: s.frequency_penalty.unwrap_or(d.frequency_penalty),
        logit_bias,
        allowed_token_ids: None,
        banned_token_ids: Vec::new(),
        min_tokens: s.min_tokens.unwrap_or(0) as usize,
        max_tokens: max_tokens.map(|m| m as usize),
        stop,
        stop_token_ids,
        ignore_eos: s.ignore_eos.unwrap_or(false),
        logprobs,
        skip_special_tokens: s.skip_special_tokens.unwrap_or(true),
        constraint: None,
    };
    // The engine's own checks now, so a bad value costs no tokenizing; `fit_context` checks again
    // once `max_tokens` is fixed against the prompt.
    p.clone().validate(vocab_size).map_err(engine_param_error)?;
    Ok((p, n))
}

/// A request's lists, each checked against its limit.
struct Lists {
    stop: Vec<String>,
    logit_bias: Vec<(u32, f32)>,
    stop_token_ids: Vec<u32>,
}

/// `stop`, `logit_bias` and `stop_token_ids`, each within its limit.
fn lists(s: &Sampling, vocab_size: usize, limits: &RequestLimits) -> Result<Lists, ApiError> {
    let stop = s.stop.clone().map(|s| s.into_vec()).unwrap_or_default();
    if stop.len() > limits.max_stop {
        return Err(invalid(
            "stop",
            format!("may hold at most {} strings, got {}", limits.max_stop, stop.len()),
        ));
    }
    if let Some(long) = stop.iter().find(|s| s.len() > limits.max_stop_len) {
        return Err(invalid(
            "stop",
            format!(
                "strings may be at most {} bytes, got one of {}",
                limits.max_stop_len,
                long.len()
            ),
        ));
    }
    let bias = s.logit_bias.as_ref();
    if let Some(bias) = bias.filter(|b| b.len() > limits.max_logit_bias) {
        return Err(invalid(
            "logit_bias",
            format!(
                "may hold at most {} entries, got {}",
                limits.max_logit_bias,
                bias.len()
            ),
        ));
    }
    let logit_bias = bias
        .into_iter()
        .flatten()
        .map(|(k, v)| {
            let id: u32 = k
                .parse()
                .map_err(|_| invalid("logit_bias", format!("keys must be token ids, got {k:?}")))?;
            Ok((id, *v))
        })
        .collect::<Result<Vec<_>, ApiError>>()?;
    let stop_token_ids = s.stop_token_ids.clone().unwrap_or_default();
    if stop_token_ids.len() > limits.max_stop_token_ids {
        return Err(invalid(
            "stop_token_ids",
            format!(
                "may hold at most {} ids, got {}",
                limits.max_stop_token_ids,
                stop_token_ids.len()
            ),
        ));
    }
    if let Some(&bad) = stop_token_ids.iter().find(|&&t| t as usize >= vocab_size) {
        return Err(invalid(
            "stop_token_ids",
            format!("ids must be < {vocab_size} (the vocabulary size), got {bad}"),
        ));
    }
    Ok(Lists {
        stop,
        logit_bias,
        stop_token_ids,
    })
}

/// The 413 for a prompt (or prompt + `max_tokens`) over the context.
pub fn context_error(param: &str, message: String) -> ApiError {
    ApiError {
        param: Some(param.into()),
        code: Some("context_length_exceeded".into()),
        ..ApiError::new(ApiErrorKind::ContextLength, message)
    }
}

/// Fixes `max_tokens` against the context: absent means "up to the context limit"; a prompt that
/// leaves no room, or an explicit `max_tokens` that does not fit, is a 413.
pub fn fit_context(
    mut p: SamplingParams,
    prompt_len: usize,
    max_model_len: usize,
    vocab_size: usize,
) -> Result<ValidSamplingParams, ApiError> {
    if prompt_len >= max_model_len {
        return Err(context_error(
            "messages",
            format!(
                "the prompt is {prompt_len} tokens; the context limit is {max_model_len} tokens \
                 and at least one must be left to generate"
            ),
        ));
    }
    let room = max_model_len - prompt_len;
    match p.max_tokens {
        Some(m) if m > room => {
            return Err(context_error(
                "max_tokens",
                format!(
                    "prompt ({prompt_len} tokens) + max_tokens ({m}) exceeds the context limit of \
                     {max_model_len} tokens"
                ),
            ));
        }
        Some(_) => {}
        None => p.max_tokens = Some(room),
    }
    p.validate(vocab_size).map_err(engine_param_error)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::wire::Stop;

    #[test]
    fn limits_name_the_field() {
        let l = RequestLimits::default();
        let bad = |s: Sampling| sampling_params(&s, Some(4), None, 100, &l).unwrap_err();
        let e = bad(Sampling {
            n: Some(9),
            ..Default::default()
        });
        assert_eq!((e.param.as_deref(), e.status()), (Some("n"), 400));
        assert!(e.message.contains("[1, 8]"));
        let e = bad(Sampling {
            stop: Some(Stop::Many(vec!["x".into(); 9])),
            ..Default::default()
        });
        assert!(e.message.contains("at most 8 strings"), "{}", e.message);
        let e = bad(Sampling {
            logit_bias: Some([("abc".to_string(), 1.0)].into()),
            ..Default::default()
        });
        assert_eq!(e.param.as_deref(), Some("logit_bias"));
        let e = bad(Sampling {
            stop_token_ids: Some(vec![100]),
            ..Default::default()
        });
        assert!(e.message.contains("< 100"));
    }

    #[test]
    fn fanout_and_salt_are_bounded() {
        let l = RequestLimits::default();
        assert!(check_fanout(16, Some(1), &l).is_ok());
        assert!(check_fanout(2, Some(8), &l).is_ok());
        let e = check_fanout(16, Some(8), &l).unwrap_err();
        assert_eq!((e.status(), e.param.as_deref()), (400, Some("prompt")));
        assert!(
            e.message.contains("128 sequences") && e.message.contains("at most 16"),
            "{}",
            e.message
        );
        assert_eq!(
            check_fanout(1, Some(17), &l).unwrap_err().param.as_deref(),
            Some("n")
        );
        let e = cache_salt_key(Some(&"x".repeat(257)), &l).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("cache_salt"));
        assert!(e.message.contains("at most 256 bytes, got 257"), "{}", e.message);
        let k = cache_salt_key(Some("s1"), &l).unwrap().unwrap();
        assert_eq!(k.len(), 64);
        assert_eq!(
            cache_salt_key(Some("s1"), &l).unwrap().unwrap(),
            k,
            "same salt, same key"
        );
        assert_ne!(cache_salt_key(Some("s2"), &l).unwrap().unwrap(), k);
        assert_eq!(cache_salt_key(None, &l).unwrap(), None);
    }

    #[test]
    fn context_is_checked_before_queueing() {
        let l = RequestLimits::default();
        let (p, _) = sampling_params(&Sampling::default(), Some(10), None, 100, &l).unwrap();
        let e = fit_context(p.clone(), 60, 64, 100).unwrap_err();
        assert_eq!((e.status(), e.param.as_deref()), (413, Some("max_tokens")));
        assert!(fit_context(p.clone(), 54, 64, 100).is_ok());
        assert_eq!(fit_context(p, 64, 64, 100).unwrap_err().status(), 413);
        let (p, _) = sampling_params(&Sampling::default(), None, None, 100, &l).unwrap();
        assert_eq!(fit_context(p, 50, 64, 100).unwrap().max_tokens, Some(14));
        // A bad range is refused before the prompt is tokenized, by `sampling_params` itself.
        let e = sampling_params(
            &Sampling {
                temperature: Some(-1.0),
                ..Default::default()
            },
            Some(1),
            None,
            100,
            &l,
        )
        .unwrap_err();
        assert_eq!((e.status(), e.param.as_deref()), (400, Some("temperature")));
    }
}
