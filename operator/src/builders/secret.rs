//! The admin-token `Secret` the operator generates for each ModelDeployment: the runtime's admin API
//! (adapters) accepts only this bearer token, and the operator reads it to call that API.
//!
//! The token is generated once and then kept: the builder takes the existing token (if any) so applying
//! the desired Secret never rotates it by accident.

use super::owned_meta;
use crate::labels::admin_secret_name;
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use modelfleet_crds::ModelDeployment;
use std::collections::BTreeMap;

/// Key of the token inside the Secret.
pub const TOKEN_KEY: &str = "token";

/// The admin Secret holding `token`.
pub fn desired_admin_secret(md: &ModelDeployment, token: &str) -> Secret {
    let name = md.metadata.name.clone().unwrap_or_default();
    Secret {
        metadata: owned_meta(md, admin_secret_name(&name)),
        type_: Some("Opaque".into()),
        data: Some(BTreeMap::from([(
            TOKEN_KEY.to_string(),
            ByteString(token.as_bytes().to_vec()),
        )])),
        ..Default::default()
    }
}

/// A fresh random token: 32 bytes from the OS RNG, hex-encoded.
pub fn new_token() -> String {
    let mut bytes = [0u8; 32];
    getrandom::fill(&mut bytes).expect("the OS random number generator is available");
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The token stored in an existing admin Secret, if it has a usable one.
pub fn existing_token(secret: &Secret) -> Option<String> {
    let bytes = secret.data.as_ref()?.get(TOKEN_KEY)?;
    let token = String::from_utf8(bytes.0.clone()).ok()?;
    (token.len() >= 32).then_some(token)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::builders::fixtures::minimal;

    #[test]
    fn token_round_trips_and_is_random() {
        let a = new_token();
        assert_eq!(a.len(), 64);
        assert_ne!(a, new_token());
        let secret = desired_admin_secret(&minimal(), &a);
        assert_eq!(secret.metadata.name.as_deref(), Some("smollm2-admin-token"));
        assert_eq!(existing_token(&secret).as_deref(), Some(a.as_str()));
        assert_eq!(existing_token(&desired_admin_secret(&minimal(), "short")), None);
    }
}
