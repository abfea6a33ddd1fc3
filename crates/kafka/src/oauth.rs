//! SASL/OAUTHBEARER tokens from an OIDC provider (the client-credentials grant), fetched in Rust through
//! rdkafka's refresh hook instead of librdkafka's own OIDC support, which would need libcurl.
//!
//! Every hookline client context calls [`generate`] when librdkafka asks for a token (at start, then at 80 % of
//! the token's lifetime). The OAuth settings reach the context through librdkafka's `sasl.oauthbearer.config`
//! property, which librdkafka hands to the hook unchanged: that way no context needs the settings passed in.

use std::path::PathBuf;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use base64::Engine;
use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use rdkafka::client::OAuthToken;
use serde::{Deserialize, Serialize};

use crate::settings::{read_secret, KafkaSettings};

/// The whole fetch (connect, TLS, request, response) is bounded by this.
const FETCH_TIMEOUT: Duration = Duration::from_secs(10);
/// A token response is a few KiB; anything far larger is not one.
const MAX_RESPONSE_BYTES: usize = 64 << 10;

#[derive(Debug, thiserror::Error)]
pub enum TokenError {
    #[error("{0}")]
    Secret(String),
    #[error("OAuth token endpoint {endpoint}: {message}")]
    Request { endpoint: String, message: String },
    #[error("OAuth token endpoint {endpoint} refused the client credentials ({status}): {body} (check kafka.oauth.client_id and kafka.oauth.client_secret_file)")]
    Refused { endpoint: String, status: u16, body: String },
    #[error("OAuth token endpoint {endpoint} answered {status}: {body}")]
    Status { endpoint: String, status: u16, body: String },
    #[error("OAuth token endpoint {endpoint}: the response is not a token: {reason}")]
    BadResponse { endpoint: String, reason: String },
}

/// What a client context needs to fetch tokens, carried in `sasl.oauthbearer.config` as JSON.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OAuthClient {
    pub token_endpoint: String,
    pub client_id: String,
    pub client_secret_file: PathBuf,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub scope: Option<String>,
}

/// A fetched token.
#[derive(Debug)]
pub struct Token {
    pub access_token: crate::settings::Secret,
    /// Milliseconds since the Unix epoch.
    pub expires_at_ms: i64,
    /// The JWT's `sub` claim when the token is a JWT, otherwise the client id.
    pub principal: String,
}

impl OAuthClient {
    /// The client described by `kafka.oauth.*`, checked: an error names the key.
    pub fn from_settings(settings: &KafkaSettings) -> Result<Self, String> {
        let o = &settings.oauth;
        let endpoint = o.token_endpoint.as_deref().filter(|s| !s.trim().is_empty());
        let endpoint = endpoint.ok_or("kafka.oauth.token_endpoint: required with kafka.sasl.mechanism = \"oauthbearer\"")?;
        let uri: http::Uri = endpoint.parse().map_err(|e| format!("kafka.oauth.token_endpoint: {endpoint:?} is not a URL: {e}"))?;
        let host = uri.host().unwrap_or_default();
        let loopback = host == "localhost"
            || host.trim_start_matches('[').trim_end_matches(']').parse::<std::net::IpAddr>().is_ok_and(|ip| ip.is_loopback());
        match uri.scheme_str() {
            Some("https") if !host.is_empty() => {}
            // The client secret goes in the request body: plain http only where it cannot leave the machine.
            Some("http") if loopback => {}
            _ => {
                return Err(format!(
                    "kafka.oauth.token_endpoint: must be an https:// URL (http only to a loopback address), got {endpoint:?}"
                ))
            }
        }
        let client_id = o.client_id.clone().filter(|s| !s.trim().is_empty());
        let client_id = client_id.ok_or("kafka.oauth.client_id: required with kafka.sasl.mechanism = \"oauthbearer\"")?;
        let client_secret_file =
            o.client_secret_file.clone().ok_or("kafka.oauth.client_secret_file: required with kafka.sasl.mechanism = \"oauthbearer\"")?;
        Ok(Self { token_endpoint: endpoint.to_owned(), client_id, client_secret_file, scope: o.scope.clone() })
    }

    /// Whether the secret file can be read now (at start, so a missing Secret mount fails the start).
    pub fn check_secret(&self) -> Result<(), String> {
        read_secret("kafka.oauth.client_secret_file", &self.client_secret_file).map(drop)
    }

    /// One client-credentials request: `grant_type=client_credentials`, `client_id`, `client_secret` and `scope`
    /// in a form body, answered with `access_token` and `expires_in`.
    pub async fn fetch(&self) -> Result<Token, TokenError> {
        match tokio::time::timeout(FETCH_TIMEOUT, self.fetch_unbounded()).await {
            Ok(r) => r,
            Err(_) => Err(self.request_error(format!("no answer within {FETCH_TIMEOUT:?}"))),
        }
    }

    fn request_error(&self, message: String) -> TokenError {
        TokenError::Request { endpoint: self.token_endpoint.clone(), message }
    }

    async fn fetch_unbounded(&self) -> Result<Token, TokenError> {
        let secret = read_secret("kafka.oauth.client_secret_file", &self.client_secret_file).map_err(TokenError::Secret)?;
        let mut form = url::form_urlencoded::Serializer::new(String::new());
        form.append_pair("grant_type", "client_credentials")
            .append_pair("client_id", &self.client_id)
            .append_pair("client_secret", secret.expose());
        if let Some(scope) = &self.scope {
            form.append_pair("scope", scope);
        }
        let request = http::Request::post(&self.token_endpoint)
            .header(http::header::CONTENT_TYPE, "application/x-www-form-urlencoded")
            .header(http::header::ACCEPT, "application/json")
            .body(Full::new(Bytes::from(form.finish())))
            .map_err(|e| self.request_error(e.to_string()))?;
        let connector = hyper_rustls::HttpsConnectorBuilder::new()
            .with_provider_and_webpki_roots(std::sync::Arc::new(rustls::crypto::ring::default_provider()))
            .map_err(|e| self.request_error(e.to_string()))?
            .https_or_http()
            .enable_http1()
            .build();
        let client: Client<_, Full<Bytes>> = Client::builder(TokioExecutor::new()).build(connector);
        let response = client.request(request).await.map_err(|e| self.request_error(format!("{e:#}")))?;
        let status = response.status();
        let body = Limited::new(response.into_body(), MAX_RESPONSE_BYTES)
            .collect()
            .await
            .map_err(|e| self.request_error(format!("reading the response: {e}")))?
            .to_bytes();
        if !status.is_success() {
            // An OAuth error body is `{"error": "invalid_client", ...}`: short, and it never holds a credential.
            let body: String = String::from_utf8_lossy(&body).chars().take(300).collect();
            let endpoint = self.token_endpoint.clone();
            return Err(if matches!(status.as_u16(), 400 | 401 | 403) {
                TokenError::Refused { endpoint, status: status.as_u16(), body }
            } else {
                TokenError::Status { endpoint, status: status.as_u16(), body }
            });
        }
        self.parse(&body)
    }

    fn parse(&self, body: &[u8]) -> Result<Token, TokenError> {
        let bad = |reason: String| TokenError::BadResponse { endpoint: self.token_endpoint.clone(), reason };
        let v: serde_json::Value = serde_json::from_slice(body).map_err(|e| bad(format!("not JSON ({e})")))?;
        let access_token = v.get("access_token").and_then(|t| t.as_str()).filter(|t| !t.is_empty());
        let access_token = access_token.ok_or_else(|| bad("no access_token".into()))?;
        // Some providers send expires_in as a string.
        let expires_in = match v.get("expires_in") {
            Some(serde_json::Value::Number(n)) => n.as_u64(),
            Some(serde_json::Value::String(s)) => s.parse().ok(),
            _ => None,
        };
        let expires_in = expires_in.filter(|s| *s > 0).ok_or_else(|| bad("no positive expires_in".into()))?;
        let now_ms = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_millis() as i64).unwrap_or(0);
        let expires_at_ms = now_ms.saturating_add(i64::try_from(expires_in).unwrap_or(i64::MAX).saturating_mul(1000));
        let principal = jwt_subject(access_token).unwrap_or_else(|| self.client_id.clone());
        Ok(Token { access_token: crate::settings::Secret::new(access_token.to_owned()), expires_at_ms, principal })
    }

    /// [`OAuthClient::fetch`] from synchronous code (librdkafka's hook): on a thread of its own with its own
    /// runtime, so it works on a runtime worker, a blocking thread or a plain thread alike.
    pub fn fetch_blocking(&self) -> Result<Token, TokenError> {
        block_on_own_runtime(|| self.fetch()).unwrap_or_else(|why| Err(self.request_error(format!("the token fetch {why}"))))
    }
}

/// Runs the future `make` returns from synchronous code (librdkafka's token hook) on a thread of its own with its
/// own runtime, so it works on a runtime worker, a blocking thread or a plain thread alike. `Err` says why it did
/// not run to its end.
pub(crate) fn block_on_own_runtime<T: Send, F: std::future::Future<Output = T>>(make: impl FnOnce() -> F + Send) -> Result<T, String> {
    let run = || {
        std::thread::scope(|s| {
            s.spawn(|| {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .map_err(|e| format!("could not start a runtime: {e}"))?;
                Ok(rt.block_on(make()))
            })
            .join()
            .unwrap_or_else(|_| Err("panicked".to_owned()))
        })
    };
    // On a multi-threaded runtime's worker, hand its other tasks to another thread while this one waits.
    match tokio::runtime::Handle::try_current().map(|h| h.runtime_flavor()) {
        Ok(tokio::runtime::RuntimeFlavor::MultiThread) => tokio::task::block_in_place(run),
        _ => run(),
    }
}

/// The `sub` claim of a JWT, without checking it (the broker does).
fn jwt_subject(token: &str) -> Option<String> {
    let payload = token.split('.').nth(1)?;
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD.decode(payload.trim_end_matches('=')).ok()?;
    let v: serde_json::Value = serde_json::from_slice(&bytes).ok()?;
    v.get("sub")?.as_str().filter(|s| !s.is_empty()).map(str::to_owned)
}

/// Sets a first token on a client that is never polled for librdkafka's refresh event (the admin client): without
/// one it cannot connect. The token is not refreshed, so such a client must be short-lived (`topics create`).
pub(crate) fn prime<C: rdkafka::ClientContext>(
    client: &rdkafka::client::Client<C>,
    settings: &KafkaSettings,
) -> rdkafka::error::KafkaResult<()> {
    use rdkafka::error::KafkaError;
    let Some(source) = TokenSource::from_settings(settings).map_err(KafkaError::ClientCreation)? else {
        return Ok(());
    };
    let token = source.token().map_err(|e| KafkaError::ClientCreation(e.to_string()))?;
    let nul = |_| KafkaError::ClientCreation("the OAuth token holds a NUL byte".into());
    let value = std::ffi::CString::new(token.token).map_err(nul)?;
    let principal = std::ffi::CString::new(token.principal_name).map_err(nul)?;
    let mut errstr = [0 as std::ffi::c_char; 512];
    // SAFETY: the client handle lives as long as the borrow; librdkafka copies both strings before returning and
    // writes at most `errstr.len()` bytes, NUL-terminated, into `errstr`; no extensions are passed.
    let code = unsafe {
        rdkafka::bindings::rd_kafka_oauthbearer_set_token(
            client.native_ptr(),
            value.as_ptr(),
            token.lifetime_ms,
            principal.as_ptr(),
            std::ptr::null_mut(),
            0,
            errstr.as_mut_ptr(),
            errstr.len(),
        )
    };
    if code != rdkafka::bindings::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR {
        // SAFETY: librdkafka NUL-terminated what it wrote; the buffer was zeroed, so it is terminated regardless.
        let message = unsafe { std::ffi::CStr::from_ptr(errstr.as_ptr()) }.to_string_lossy().into_owned();
        return Err(KafkaError::ClientCreation(format!("setting the OAuth token: {message}")));
    }
    Ok(())
}

/// Where the OAUTHBEARER tokens come from, carried to every client context in `sasl.oauthbearer.config` as JSON
/// (librdkafka hands that property to the hook unchanged, so no context needs the settings passed in).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum TokenSource {
    /// `kafka.sasl.mechanism = "aws_msk_iam"`: `{"aws_msk_iam": {"region": ...}}`.
    AwsMskIam { aws_msk_iam: crate::aws::MskIamClient },
    /// `kafka.sasl.mechanism = "oauthbearer"`: the OIDC client, as is.
    Oidc(OAuthClient),
}

impl TokenSource {
    /// The source `settings` name; None when they use no OAUTHBEARER tokens.
    pub fn from_settings(settings: &KafkaSettings) -> Result<Option<Self>, String> {
        use crate::settings::SaslMechanism;
        if !settings.security_protocol.sasl() {
            return Ok(None);
        }
        match settings.sasl.mechanism {
            Some(SaslMechanism::OAuthBearer) => Ok(Some(Self::Oidc(OAuthClient::from_settings(settings)?))),
            Some(SaslMechanism::AwsMskIam) => Ok(Some(Self::AwsMskIam { aws_msk_iam: crate::aws::MskIamClient::from_settings(settings)? })),
            _ => Ok(None),
        }
    }

    /// The `sasl.oauthbearer.config` value.
    pub(crate) fn encode(&self) -> String {
        serde_json::to_string(self).expect("plain strings serialise")
    }

    /// A token now (blocking: librdkafka's hook is synchronous).
    fn token(&self) -> Result<OAuthToken, Box<dyn std::error::Error>> {
        match self {
            Self::Oidc(client) => {
                let t = client.fetch_blocking()?;
                tracing::debug!(principal = %t.principal, expires_at_ms = t.expires_at_ms, "OAuth token fetched");
                Ok(OAuthToken { token: t.access_token.expose().to_owned(), principal_name: t.principal, lifetime_ms: t.expires_at_ms })
            }
            Self::AwsMskIam { aws_msk_iam } => {
                let t = aws_msk_iam.token_blocking()?;
                tracing::debug!(principal = %t.principal, expires_at_ms = t.expires_at_ms, "MSK IAM token signed");
                Ok(OAuthToken { token: t.token.expose().to_owned(), principal_name: t.principal, lifetime_ms: t.expires_at_ms })
            }
        }
    }
}

/// What every hookline client context's `generate_oauth_token` does.
pub fn generate(oauthbearer_config: Option<&str>) -> Result<OAuthToken, Box<dyn std::error::Error>> {
    let config = oauthbearer_config.ok_or("no OAUTHBEARER settings (kafka.oauth.* or kafka.aws.*) reached the client")?;
    let source: TokenSource = serde_json::from_str(config).map_err(|e| format!("unreadable OAUTHBEARER settings: {e}"))?;
    source.token().inspect_err(|e| {
        metrics::counter!("hookline_kafka_oauth_token_errors_total").increment(1);
        match source {
            TokenSource::Oidc(_) => tracing::error!(error = %e, "fetching an OAuth token for Kafka failed"),
            TokenSource::AwsMskIam { .. } => tracing::error!(error = %e, "making an MSK IAM token for Kafka failed"),
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_subject_of_a_jwt_is_the_principal() {
        let b64 = |s: &str| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(s);
        let jwt = format!("{}.{}.sig", b64(r#"{"alg":"RS256"}"#), b64(r#"{"sub":"svc-hookline","exp":1}"#));
        assert_eq!(jwt_subject(&jwt).as_deref(), Some("svc-hookline"));
        assert_eq!(jwt_subject("opaque-token"), None);
        assert_eq!(jwt_subject("a.!!!.c"), None);
    }
}
