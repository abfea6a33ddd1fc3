//! Amazon MSK IAM authentication (`kafka.sasl.mechanism = "aws_msk_iam"`): SASL/OAUTHBEARER whose token is a
//! SigV4-presigned URL ([`sigv4`]), signed with credentials from the standard AWS chain ([`credentials`]), through
//! the same librdkafka refresh hook as the OIDC tokens (`crate::oauth`).

pub mod credentials;
pub mod sigv4;

use std::time::SystemTime;

use serde::{Deserialize, Serialize};

use crate::settings::{KafkaSettings, Secret};
use credentials::{CredentialCache, CredentialChain, CredentialsError, Environment};

/// The User-Agent query parameter of hookline's tokens (informational: it is not signed).
pub const USER_AGENT: &str = concat!("hookline/", env!("CARGO_PKG_VERSION"));

/// What a client context needs to sign tokens, carried in `sasl.oauthbearer.config` as JSON.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MskIamClient {
    pub region: String,
}

/// One process, one AWS identity: every client's hook shares the credentials.
static CREDENTIALS: CredentialCache = CredentialCache::new();

/// A signed token, ready for librdkafka.
#[derive(Debug)]
pub struct Token {
    pub token: Secret,
    /// Milliseconds since the epoch: the URL's expiry, or the credentials' if they expire sooner (librdkafka then
    /// asks again at 80 % of that, with fresh credentials).
    pub expires_at_ms: i64,
    /// The access key id (an identifier, not a secret): what librdkafka logs as the principal.
    pub principal: String,
}

impl MskIamClient {
    /// `kafka.aws.*`, checked: an error names the key.
    pub fn from_settings(settings: &KafkaSettings) -> Result<Self, String> {
        let region = settings.aws.region.as_deref().map(str::trim).filter(|r| !r.is_empty());
        let region = region
            .ok_or("kafka.aws.region: required with kafka.sasl.mechanism = \"aws_msk_iam\" (the cluster's region, e.g. \"eu-west-1\")")?;
        // It becomes the host name kafka.REGION.amazonaws.com and part of the signature's scope.
        let legal = region.len() <= 32
            && region.starts_with(|c: char| c.is_ascii_lowercase())
            && region.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
            && !region.ends_with('-');
        if !legal {
            return Err(format!("kafka.aws.region: {region:?} is not an AWS region name (like \"eu-west-1\")"));
        }
        Ok(Self { region: region.to_owned() })
    }

    /// A token signed now with the chain's credentials (cached, refreshed before they expire).
    pub async fn token(&self, env: Environment, cache: &CredentialCache, now: SystemTime) -> Result<Token, CredentialsError> {
        let credentials = cache.get(&CredentialChain::new(env, &self.region), now).await?;
        let signed = sigv4::msk_iam_token(&credentials, &self.region, now, USER_AGENT);
        let credentials_expire_ms = credentials
            .expires_at
            .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
            .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX));
        let expires_at_ms = credentials_expire_ms.map_or(signed.expires_at_ms, |c| c.min(signed.expires_at_ms));
        Ok(Token { token: signed.token, expires_at_ms, principal: credentials.access_key_id })
    }

    /// [`MskIamClient::token`] from librdkafka's synchronous hook, with the process's environment and credential
    /// cache, on a thread and runtime of its own (as the OIDC fetch).
    pub fn token_blocking(&self) -> Result<Token, CredentialsError> {
        crate::oauth::block_on_own_runtime(|| self.token(Environment::process(), &CREDENTIALS, SystemTime::now()))
            .unwrap_or_else(|why| Err(CredentialsError::Source { source_name: "hookline", message: format!("the credential fetch {why}") }))
    }
}
