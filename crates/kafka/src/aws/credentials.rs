//! AWS credentials from the standard chain, in the AWS SDKs' order: the environment, web identity (IRSA), the
//! container endpoint (ECS, EKS Pod Identity), the instance metadata service (IMDSv2). The first source that is
//! configured is used; one configured but failing is an error (not a silent fall-through to the next).
//!
//! Written over the hyper client the OAuth module uses instead of `aws-config`: docs/architecture.md
//! ("Hand-written protocols") has the measurement behind that.

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use serde::Deserialize;

use super::sigv4::parse_rfc3339_utc;
use crate::settings::Secret;

/// Bounds each request to STS or the container endpoint (connect, TLS, request, response).
const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);
/// Bounds each request to the instance metadata service, which answers in milliseconds where it exists (the SDKs
/// use 1 s).
const IMDS_TIMEOUT: Duration = Duration::from_secs(2);
/// Credential responses are a few KiB.
const MAX_RESPONSE_BYTES: usize = 64 << 10;
/// Credentials are fetched again this long before they expire, so a token is never signed with credentials about
/// to lapse.
pub const REFRESH_BEFORE_EXPIRY: Duration = Duration::from_secs(5 * 60);

const ECS_HOST: &str = "169.254.170.2";
const IMDS_ENDPOINT: &str = "http://169.254.169.254";

/// A set of AWS credentials. Debug shows the access key id and where they came from, never the secret parts.
#[derive(Clone, PartialEq, Eq)]
pub struct Credentials {
    pub access_key_id: String,
    pub secret_access_key: Secret,
    pub session_token: Option<Secret>,
    /// None: long-term keys, which do not expire.
    pub expires_at: Option<SystemTime>,
    /// `environment`, `web identity`, `container` or `instance metadata`.
    pub source: &'static str,
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Credentials")
            .field("access_key_id", &self.access_key_id)
            .field("secret_access_key", &self.secret_access_key)
            .field("session_token", &self.session_token)
            .field("expires_at", &self.expires_at)
            .field("source", &self.source)
            .finish()
    }
}

#[derive(Debug, thiserror::Error)]
pub enum CredentialsError {
    #[error(
        "no AWS credentials: none of AWS_ACCESS_KEY_ID, AWS_WEB_IDENTITY_TOKEN_FILE, AWS_CONTAINER_CREDENTIALS_RELATIVE_URI \
         or AWS_CONTAINER_CREDENTIALS_FULL_URI is set, and the instance metadata service {0}"
    )]
    NotFound(String),
    #[error("AWS credentials from {source_name}: {message}")]
    Source { source_name: &'static str, message: String },
}

fn err(source_name: &'static str, message: impl Into<String>) -> CredentialsError {
    CredentialsError::Source { source_name, message: message.into() }
}

/// The environment variables the chain reads, captured once: tests pass their own.
#[derive(Debug, Clone, Default)]
pub struct Environment(BTreeMap<String, String>);

impl Environment {
    pub fn process() -> Self {
        Self(std::env::vars().filter(|(k, _)| k.starts_with("AWS_")).collect())
    }

    pub fn from_pairs<'a>(pairs: impl IntoIterator<Item = (&'a str, &'a str)>) -> Self {
        Self(pairs.into_iter().map(|(k, v)| (k.to_owned(), v.to_owned())).collect())
    }

    /// A set, non-empty variable.
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).map(String::as_str).filter(|v| !v.trim().is_empty())
    }
}

/// The chain, for a region (STS's regional endpoint when `AWS_REGION` is not set).
#[derive(Debug, Clone)]
pub struct CredentialChain {
    env: Environment,
    region: String,
}

impl CredentialChain {
    pub fn new(env: Environment, region: &str) -> Self {
        Self { env, region: region.to_owned() }
    }

    /// Credentials from the first configured source.
    pub async fn fetch(&self) -> Result<Credentials, CredentialsError> {
        let env = &self.env;
        if let Some(id) = env.get("AWS_ACCESS_KEY_ID") {
            let secret = env
                .get("AWS_SECRET_ACCESS_KEY")
                .ok_or_else(|| err("environment", "AWS_ACCESS_KEY_ID is set, AWS_SECRET_ACCESS_KEY is not"))?;
            return Ok(Credentials {
                access_key_id: id.to_owned(),
                secret_access_key: Secret::new(secret.to_owned()),
                session_token: env.get("AWS_SESSION_TOKEN").map(|t| Secret::new(t.to_owned())),
                expires_at: None,
                source: "environment",
            });
        }
        if let Some(token_file) = env.get("AWS_WEB_IDENTITY_TOKEN_FILE") {
            return self.web_identity(token_file).await;
        }
        if env.get("AWS_CONTAINER_CREDENTIALS_RELATIVE_URI").is_some() || env.get("AWS_CONTAINER_CREDENTIALS_FULL_URI").is_some() {
            return self.container().await;
        }
        if env.get("AWS_EC2_METADATA_DISABLED").is_some_and(|v| v.eq_ignore_ascii_case("true")) {
            return Err(CredentialsError::NotFound("is disabled (AWS_EC2_METADATA_DISABLED)".into()));
        }
        self.imds().await
    }

    /// STS AssumeRoleWithWebIdentity with the token file's JWT (read at every fetch: the kubelet rotates it).
    async fn web_identity(&self, token_file: &str) -> Result<Credentials, CredentialsError> {
        const SOURCE: &str = "web identity";
        let role_arn =
            self.env.get("AWS_ROLE_ARN").ok_or_else(|| err(SOURCE, "AWS_WEB_IDENTITY_TOKEN_FILE is set, AWS_ROLE_ARN is not"))?;
        let jwt = std::fs::read_to_string(token_file)
            .map_err(|e| err(SOURCE, format!("cannot read AWS_WEB_IDENTITY_TOKEN_FILE {token_file}: {e}")))?;
        let jwt = jwt.trim();
        if jwt.is_empty() {
            return Err(err(SOURCE, format!("AWS_WEB_IDENTITY_TOKEN_FILE {token_file} is empty")));
        }
        let session_name = match self.env.get("AWS_ROLE_SESSION_NAME") {
            Some(n) => n.to_owned(),
            None => format!("hookline-{}", SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_millis()).unwrap_or(0)),
        };
        let region = self.env.get("AWS_REGION").unwrap_or(&self.region);
        let endpoint = match self.env.get("AWS_ENDPOINT_URL_STS") {
            Some(e) => e.trim_end_matches('/').to_owned(),
            None => format!("https://sts.{region}.amazonaws.com"),
        };
        let mut form = url::form_urlencoded::Serializer::new(String::new());
        form.append_pair("Action", "AssumeRoleWithWebIdentity")
            .append_pair("Version", "2011-06-15")
            .append_pair("RoleArn", role_arn)
            .append_pair("RoleSessionName", &session_name)
            .append_pair("WebIdentityToken", jwt);
        let request = http::Request::post(format!("{endpoint}/"))
            .header(http::header::CONTENT_TYPE, "application/x-www-form-urlencoded")
            .body(Full::new(Bytes::from(form.finish())))
            .map_err(|e| err(SOURCE, format!("{endpoint}: {e}")))?;
        let (status, body) = send(request, REQUEST_TIMEOUT).await.map_err(|e| err(SOURCE, format!("{endpoint}: {e}")))?;
        let text = String::from_utf8_lossy(&body);
        if !status.is_success() {
            let code = xml_text(&text, "Code").unwrap_or_default();
            let message = xml_text(&text, "Message").unwrap_or_default();
            return Err(err(SOURCE, format!("STS AssumeRoleWithWebIdentity for {role_arn} answered {status}: {code} {message}")));
        }
        let field = |name: &str| xml_text(&text, name).ok_or_else(|| err(SOURCE, format!("STS answer without {name}")));
        let expiration = field("Expiration")?;
        Ok(Credentials {
            access_key_id: field("AccessKeyId")?,
            secret_access_key: Secret::new(field("SecretAccessKey")?),
            session_token: Some(Secret::new(field("SessionToken")?)),
            expires_at: Some(
                parse_rfc3339_utc(&expiration).ok_or_else(|| err(SOURCE, format!("STS Expiration {expiration:?} is not a time")))?,
            ),
            source: SOURCE,
        })
    }

    /// The container credentials endpoint: ECS's (a path under 169.254.170.2) or a full URI (EKS Pod Identity's
    /// 169.254.170.23), with the authorization token from its file (read at every fetch: it is rotated) or variable.
    async fn container(&self) -> Result<Credentials, CredentialsError> {
        const SOURCE: &str = "container";
        let uri = match self.env.get("AWS_CONTAINER_CREDENTIALS_RELATIVE_URI") {
            Some(relative) => format!("http://{ECS_HOST}{relative}"),
            None => {
                let full = self.env.get("AWS_CONTAINER_CREDENTIALS_FULL_URI").unwrap_or_default().to_owned();
                check_full_uri(&full).map_err(|m| err(SOURCE, m))?;
                full
            }
        };
        let token = match self.env.get("AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE") {
            Some(path) => Some(
                std::fs::read_to_string(path)
                    .map_err(|e| err(SOURCE, format!("cannot read AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE {path}: {e}")))?
                    .trim()
                    .to_owned(),
            ),
            None => self.env.get("AWS_CONTAINER_AUTHORIZATION_TOKEN").map(str::to_owned),
        };
        let mut request = http::Request::get(&uri).header(http::header::ACCEPT, "application/json");
        if let Some(t) = token {
            request = request.header(http::header::AUTHORIZATION, t);
        }
        let request = request.body(Full::new(Bytes::new())).map_err(|e| err(SOURCE, format!("{uri}: {e}")))?;
        let (status, body) = send(request, REQUEST_TIMEOUT).await.map_err(|e| err(SOURCE, format!("{uri}: {e}")))?;
        if !status.is_success() {
            return Err(err(SOURCE, format!("{uri} answered {status}: {}", short(&body))));
        }
        credentials_json(&body, SOURCE).map_err(|m| err(SOURCE, format!("{uri}: {m}")))
    }

    /// IMDSv2: a session token (PUT), the instance role's name, then its credentials.
    async fn imds(&self) -> Result<Credentials, CredentialsError> {
        const SOURCE: &str = "instance metadata";
        let base = self.env.get("AWS_EC2_METADATA_SERVICE_ENDPOINT").unwrap_or(IMDS_ENDPOINT).trim_end_matches('/').to_owned();
        let not_found = |m: String| CredentialsError::NotFound(format!("at {base} did not answer: {m}"));
        let request = http::Request::put(format!("{base}/latest/api/token"))
            .header("x-aws-ec2-metadata-token-ttl-seconds", "21600")
            .body(Full::new(Bytes::new()))
            .map_err(|e| not_found(e.to_string()))?;
        // No answer at all: not on EC2 (or a hop limit of 1 in a container): say what was tried.
        let (status, token) = send(request, IMDS_TIMEOUT).await.map_err(not_found)?;
        if !status.is_success() {
            return Err(err(SOURCE, format!("{base}: the IMDSv2 token request answered {status}")));
        }
        let token = String::from_utf8_lossy(&token).trim().to_owned();
        let get = |path: String| {
            let token = token.clone();
            let base = base.clone();
            async move {
                let request = http::Request::get(format!("{base}{path}"))
                    .header("x-aws-ec2-metadata-token", token)
                    .body(Full::new(Bytes::new()))
                    .map_err(|e| err(SOURCE, e.to_string()))?;
                let (status, body) = send(request, IMDS_TIMEOUT).await.map_err(|e| err(SOURCE, format!("{base}{path}: {e}")))?;
                if !status.is_success() {
                    return Err(err(SOURCE, format!("{base}{path} answered {status} (does the instance have a role?)")));
                }
                Ok(body)
            }
        };
        const ROLES: &str = "/latest/meta-data/iam/security-credentials/";
        let roles = get(ROLES.to_owned()).await?;
        let roles = String::from_utf8_lossy(&roles);
        let role = roles.lines().map(str::trim).find(|l| !l.is_empty()).ok_or_else(|| err(SOURCE, "the instance has no IAM role"))?;
        if !role.chars().all(|c| c.is_ascii_alphanumeric() || "+=,.@_-".contains(c)) {
            return Err(err(SOURCE, format!("unexpected role name {role:?}")));
        }
        let body = get(format!("{ROLES}{role}")).await?;
        credentials_json(&body, SOURCE).map_err(|m| err(SOURCE, m))
    }
}

/// A full container URI must not send the authorization token off the machine in clear: https anywhere, http only to
/// a loopback address or the ECS and EKS Pod Identity link-local hosts (the SDKs' rule).
fn check_full_uri(full: &str) -> Result<(), String> {
    let uri: http::Uri = full.parse().map_err(|e| format!("AWS_CONTAINER_CREDENTIALS_FULL_URI {full:?} is not a URL: {e}"))?;
    let host = uri.host().unwrap_or_default().trim_start_matches('[').trim_end_matches(']');
    let allowed = host == "localhost"
        || host.parse::<std::net::IpAddr>().is_ok_and(|ip| {
            ip.is_loopback()
                || ip == std::net::IpAddr::from([169, 254, 170, 2])
                || ip == std::net::IpAddr::from([169, 254, 170, 23])
                || Ok(ip) == "fd00:ec2::23".parse::<std::net::IpAddr>()
        });
    match uri.scheme_str() {
        Some("https") => Ok(()),
        Some("http") if allowed => Ok(()),
        _ => Err(format!(
            "AWS_CONTAINER_CREDENTIALS_FULL_URI {full:?}: must be https, or http to a loopback address, 169.254.170.2, 169.254.170.23 or fd00:ec2::23"
        )),
    }
}

/// The JSON of the container endpoint and IMDS: `AccessKeyId`, `SecretAccessKey`, `Token`, `Expiration`.
fn credentials_json(body: &[u8], source: &'static str) -> Result<Credentials, String> {
    #[derive(Deserialize)]
    #[serde(rename_all = "PascalCase")]
    struct Answer {
        code: Option<String>,
        access_key_id: Option<String>,
        secret_access_key: Option<String>,
        token: Option<String>,
        expiration: Option<String>,
    }
    let a: Answer = serde_json::from_slice(body).map_err(|e| format!("the answer is not credentials JSON ({e})"))?;
    if let Some(code) = a.code.filter(|c| c != "Success") {
        return Err(format!("the answer's Code is {code:?}"));
    }
    let (Some(id), Some(secret)) = (a.access_key_id.filter(|s| !s.is_empty()), a.secret_access_key.filter(|s| !s.is_empty())) else {
        return Err("the answer has no AccessKeyId and SecretAccessKey".into());
    };
    let expires_at = match a.expiration {
        Some(e) => Some(parse_rfc3339_utc(&e).ok_or_else(|| format!("Expiration {e:?} is not a time"))?),
        None => None,
    };
    Ok(Credentials {
        access_key_id: id,
        secret_access_key: Secret::new(secret),
        session_token: a.token.filter(|t| !t.is_empty()).map(Secret::new),
        expires_at,
        source,
    })
}

/// The text of the first `<name>…</name>` in an STS answer, with XML's five entities decoded.
fn xml_text(xml: &str, name: &str) -> Option<String> {
    let open = format!("<{name}>");
    let start = xml.find(&open)? + open.len();
    let end = start + xml[start..].find(&format!("</{name}>"))?;
    let raw = xml[start..end].trim();
    Some(raw.replace("&lt;", "<").replace("&gt;", ">").replace("&quot;", "\"").replace("&apos;", "'").replace("&amp;", "&"))
}

fn short(body: &[u8]) -> String {
    String::from_utf8_lossy(body).chars().take(200).collect()
}

/// One request, bounded by `limit` as a whole, the response body capped.
async fn send(request: http::Request<Full<Bytes>>, limit: Duration) -> Result<(http::StatusCode, Bytes), String> {
    let exchange = async {
        let connector = hyper_rustls::HttpsConnectorBuilder::new()
            .with_provider_and_webpki_roots(std::sync::Arc::new(rustls::crypto::ring::default_provider()))
            .map_err(|e| e.to_string())?
            .https_or_http()
            .enable_http1()
            .build();
        let client: Client<_, Full<Bytes>> = Client::builder(TokioExecutor::new()).build(connector);
        let response = client.request(request).await.map_err(|e| format!("{e:#}"))?;
        let status = response.status();
        let body = Limited::new(response.into_body(), MAX_RESPONSE_BYTES)
            .collect()
            .await
            .map_err(|e| format!("reading the answer: {e}"))?
            .to_bytes();
        Ok((status, body))
    };
    tokio::time::timeout(limit, exchange).await.unwrap_or_else(|_| Err(format!("no answer within {limit:?}")))
}

/// Credentials kept until [`REFRESH_BEFORE_EXPIRY`] before they expire; one fetch at a time.
#[derive(Debug, Default)]
pub struct CredentialCache {
    cached: tokio::sync::Mutex<Option<Credentials>>,
}

impl CredentialCache {
    pub const fn new() -> Self {
        Self { cached: tokio::sync::Mutex::const_new(None) }
    }

    /// Cached credentials while they are fresh at `now`, otherwise new ones from `chain`. When a refresh fails and
    /// the cached ones have not expired yet, those are used (and the failure logged): a brief STS or IMDS outage
    /// then does not stop new connections.
    pub async fn get(&self, chain: &CredentialChain, now: SystemTime) -> Result<Credentials, CredentialsError> {
        let mut cached = self.cached.lock().await;
        if let Some(c) = cached.as_ref() {
            match c.expires_at {
                None => return Ok(c.clone()),
                Some(at) if at > now.checked_add(REFRESH_BEFORE_EXPIRY).unwrap_or(now) => return Ok(c.clone()),
                _ => {}
            }
        }
        match chain.fetch().await {
            Ok(fresh) => {
                tracing::debug!(source = fresh.source, access_key_id = %fresh.access_key_id, "AWS credentials fetched");
                *cached = Some(fresh.clone());
                Ok(fresh)
            }
            Err(e) => match cached.as_ref() {
                Some(c) if c.expires_at.is_some_and(|at| at > now) => {
                    tracing::warn!(error = %e, "refreshing the AWS credentials failed; using the current ones until they expire");
                    Ok(c.clone())
                }
                _ => Err(e),
            },
        }
    }
}
