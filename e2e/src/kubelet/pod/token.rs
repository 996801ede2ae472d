//! ServiceAccount tokens of one pod, from the TokenRequest API, refreshed before they expire.
//!
//! Each distinct `(audience, expirationSeconds)` gets one token bound to the pod (so it dies with
//! the pod). The pod's kubeconfig uses the default audience and 3600 s; projected
//! `serviceAccountToken` sources use what they ask for.
//!
//! Invariant: a token is refreshed once 80 % of its lifetime has passed, as the kubelet does.

use std::collections::HashMap;
use std::time::Duration;

use k8s_openapi::api::authentication::v1::{BoundObjectReference, TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::ServiceAccount;
use kube::api::{Api, PostParams};
use tokio::time::Instant;

use crate::kubelet::error::Result;

/// Which token: audience (`None` = the API server's default) and requested lifetime.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct TokenKey {
    /// Audience, `None` for the API server's default audiences.
    pub audience: Option<String>,
    /// Requested lifetime in seconds.
    pub expiration_seconds: i64,
}

impl TokenKey {
    /// The token written into the pod's kubeconfig.
    pub fn kubeconfig() -> Self {
        TokenKey {
            audience: None,
            expiration_seconds: 3600,
        }
    }
}

#[derive(Debug, Clone)]
struct Token {
    value: String,
    refresh_at: Instant,
}

/// Tokens of one pod.
#[derive(Debug, Default)]
pub struct TokenCache {
    tokens: HashMap<TokenKey, Token>,
}

impl TokenCache {
    /// The current token for `key`.
    pub fn get(&self, key: &TokenKey) -> Option<&str> {
        self.tokens.get(key).map(|t| t.value.as_str())
    }

    /// Stores a token that lives `lifetime` from now.
    pub fn insert(&mut self, key: TokenKey, value: String, lifetime: Duration) {
        let refresh_at = Instant::now() + lifetime.mul_f64(0.8);
        self.tokens.insert(key, Token { value, refresh_at });
    }

    /// Whether `key` is missing or due for a refresh.
    pub fn due(&self, key: &TokenKey) -> bool {
        self.tokens
            .get(key)
            .is_none_or(|t| Instant::now() >= t.refresh_at)
    }

    /// When the next token needs a refresh.
    pub fn next_refresh(&self) -> Option<Instant> {
        self.tokens.values().map(|t| t.refresh_at).min()
    }
}

/// The pod a token is bound to.
pub struct TokenOwner<'a> {
    /// ServiceAccount name.
    pub service_account: &'a str,
    /// Pod name.
    pub pod_name: &'a str,
    /// Pod UID.
    pub pod_uid: &'a str,
}

/// Requests a token; returns it with its lifetime.
pub async fn request(
    api: &Api<ServiceAccount>,
    owner: &TokenOwner<'_>,
    key: &TokenKey,
) -> Result<(String, Duration)> {
    let request = TokenRequest {
        spec: TokenRequestSpec {
            audiences: key.audience.iter().cloned().collect(),
            expiration_seconds: Some(key.expiration_seconds),
            bound_object_ref: Some(BoundObjectReference {
                api_version: Some("v1".into()),
                kind: Some("Pod".into()),
                name: Some(owner.pod_name.to_string()),
                uid: Some(owner.pod_uid.to_string()),
            }),
        },
        ..Default::default()
    };
    let response = api
        .create_token_request(owner.service_account, &PostParams::default(), &request)
        .await?;
    let status = response
        .status
        .ok_or_else(|| crate::kubelet::error::Error::Config("TokenRequest returned no status".into()))?;
    let now = k8s_openapi::jiff::Timestamp::now();
    let lifetime = status
        .expiration_timestamp
        .0
        .duration_since(now)
        .try_into()
        .unwrap_or(Duration::from_secs(key.expiration_seconds.max(60) as u64));
    Ok((status.token, lifetime))
}
