//! `[ingest.schema_registry]`: where the registry is and how to authenticate to it.

use std::path::PathBuf;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

/// Longest accepted `request_timeout_ms` and `retry_max_ms`.
const MAX_MS: u64 = 300_000;
/// Most schemas `cache_max_schemas` may keep.
const MAX_CACHE: usize = 1_000_000;

#[derive(Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields, default)]
pub struct SchemaRegistrySettings {
    /// The registry's base URL (`http(s)://host:port[/path]`; Apicurio's Confluent API is under
    /// `/apis/ccompat/v7`). Unset: no registry; Avro and Protobuf framed events are dead-lettered.
    pub url: Option<String>,
    /// Basic authentication: the user, with its password in `password_file`.
    pub username: Option<String>,
    pub password_file: Option<PathBuf>,
    /// Bearer authentication: a file holding the token (instead of basic).
    pub bearer_token_file: Option<PathBuf>,
    /// A PEM file of the CA certificates to trust for an `https` URL instead of the public roots.
    pub ca_file: Option<PathBuf>,
    /// Bound of one request (connect, answer and body).
    pub request_timeout_ms: u64,
    /// Longest wait between two tries while the registry does not answer (from 200 ms, doubling).
    pub retry_max_ms: u64,
    /// Schemas kept by id (the oldest dropped past it; a dropped one is fetched again when next seen).
    pub cache_max_schemas: usize,
}

impl Default for SchemaRegistrySettings {
    fn default() -> Self {
        Self {
            url: None,
            username: None,
            password_file: None,
            bearer_token_file: None,
            ca_file: None,
            request_timeout_ms: 5_000,
            retry_max_ms: 30_000,
            cache_max_schemas: 10_000,
        }
    }
}

impl std::fmt::Debug for SchemaRegistrySettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The URL may carry credentials (`https://user:pass@host`): only its host is shown.
        let host = self.url.as_deref().and_then(|u| url::Url::parse(u).ok()).and_then(|u| u.host_str().map(str::to_owned));
        f.debug_struct("SchemaRegistrySettings")
            .field("url_host", &host)
            .field("username", &self.username)
            .field("password_file", &self.password_file)
            .field("bearer_token_file", &self.bearer_token_file)
            .field("ca_file", &self.ca_file)
            .field("request_timeout_ms", &self.request_timeout_ms)
            .field("retry_max_ms", &self.retry_max_ms)
            .field("cache_max_schemas", &self.cache_max_schemas)
            .finish()
    }
}

/// A setting that cannot be used; the message names the key (`ingest.schema_registry.…`).
#[derive(Debug, thiserror::Error)]
#[error("ingest.schema_registry.{key}: {detail}")]
pub struct SetupError {
    pub key: &'static str,
    pub detail: String,
}

fn bad(key: &'static str, detail: impl Into<String>) -> SetupError {
    SetupError { key, detail: detail.into() }
}

impl SchemaRegistrySettings {
    /// Checks what can be checked without reading files.
    pub fn validate(&self) -> Result<(), SetupError> {
        self.base_url()?;
        if self.username.is_some() != self.password_file.is_some() {
            return Err(bad("username", "basic authentication needs both username and password_file"));
        }
        if self.username.is_some() && self.bearer_token_file.is_some() {
            return Err(bad("bearer_token_file", "choose basic (username, password_file) or bearer authentication, not both"));
        }
        if self.url.is_none() && (self.username.is_some() || self.bearer_token_file.is_some() || self.ca_file.is_some()) {
            return Err(bad("url", "credentials or a CA are set without a registry url"));
        }
        for (key, v) in [("request_timeout_ms", self.request_timeout_ms), ("retry_max_ms", self.retry_max_ms)] {
            if !(1..=MAX_MS).contains(&v) {
                return Err(bad(key, format!("must be 1 to {MAX_MS}, got {v}")));
            }
        }
        if !(1..=MAX_CACHE).contains(&self.cache_max_schemas) {
            return Err(bad("cache_max_schemas", format!("must be 1 to {MAX_CACHE}, got {}", self.cache_max_schemas)));
        }
        Ok(())
    }

    pub(crate) fn base_url(&self) -> Result<Option<url::Url>, SetupError> {
        let Some(raw) = self.url.as_deref().filter(|u| !u.trim().is_empty()) else { return Ok(None) };
        let u = url::Url::parse(raw).map_err(|e| bad("url", format!("{e}: must be an http(s) URL such as https://registry:8081")))?;
        if !matches!(u.scheme(), "http" | "https") || u.host_str().is_none() {
            return Err(bad("url", "must be an http(s) URL such as https://registry:8081"));
        }
        if u.query().is_some() || u.fragment().is_some() {
            return Err(bad("url", "must have no query or fragment"));
        }
        Ok(Some(u))
    }

    /// The `Authorization` header, from the credential files (read once, at start).
    pub(crate) fn authorization(&self) -> Result<Option<http::HeaderValue>, SetupError> {
        use base64::Engine as _;
        let read = |key: &'static str, p: &PathBuf| -> Result<String, SetupError> {
            let s = std::fs::read_to_string(p).map_err(|e| bad(key, format!("{}: {e}", p.display())))?;
            // A trailing newline is the file's, not the secret's.
            Ok(s.trim_end_matches(['\r', '\n']).to_owned())
        };
        let value = match (&self.username, &self.password_file, &self.bearer_token_file) {
            (Some(user), Some(pf), _) => {
                let pass = read("password_file", pf)?;
                format!("Basic {}", base64::engine::general_purpose::STANDARD.encode(format!("{user}:{pass}")))
            }
            (_, _, Some(tf)) => {
                let token = read("bearer_token_file", tf)?;
                if token.is_empty() {
                    return Err(bad("bearer_token_file", "the file is empty"));
                }
                format!("Bearer {token}")
            }
            _ => return Ok(None),
        };
        let mut v = http::HeaderValue::from_str(&value).map_err(|_| bad("password_file", "credentials must be printable text"))?;
        v.set_sensitive(true);
        Ok(Some(v))
    }

    /// TLS for an `https` URL: the CA file's certificates, or the public (webpki) roots.
    pub(crate) fn tls_config(&self) -> Result<rustls::ClientConfig, SetupError> {
        use rustls::pki_types::pem::PemObject;
        use rustls::pki_types::CertificateDer;
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let builder = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| bad("ca_file", e.to_string()))?;
        let mut roots = rustls::RootCertStore::empty();
        match &self.ca_file {
            Some(p) => {
                let certs = CertificateDer::pem_file_iter(p).map_err(|e| bad("ca_file", format!("{}: {e}", p.display())))?;
                for c in certs {
                    let c = c.map_err(|e| bad("ca_file", format!("{}: {e}", p.display())))?;
                    roots.add(c).map_err(|e| bad("ca_file", format!("{}: {e}", p.display())))?;
                }
                if roots.is_empty() {
                    return Err(bad("ca_file", format!("{}: no certificate in it", p.display())));
                }
            }
            None => roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned()),
        }
        Ok(builder.with_root_certificates(roots).with_no_client_auth())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_name_the_key() {
        let base = SchemaRegistrySettings { url: Some("http://r:8081".into()), ..Default::default() };
        assert!(base.validate().is_ok());
        assert!(SchemaRegistrySettings::default().validate().is_ok(), "no registry");
        for (s, key) in [
            (SchemaRegistrySettings { url: Some("ftp://r".into()), ..base.clone() }, "ingest.schema_registry.url"),
            (SchemaRegistrySettings { url: Some("r:8081".into()), ..base.clone() }, "ingest.schema_registry.url"),
            (SchemaRegistrySettings { username: Some("u".into()), ..base.clone() }, "ingest.schema_registry.username"),
            (SchemaRegistrySettings { request_timeout_ms: 0, ..base.clone() }, "ingest.schema_registry.request_timeout_ms"),
            (SchemaRegistrySettings { retry_max_ms: 400_000, ..base.clone() }, "ingest.schema_registry.retry_max_ms"),
            (SchemaRegistrySettings { cache_max_schemas: 0, ..base.clone() }, "ingest.schema_registry.cache_max_schemas"),
            (SchemaRegistrySettings { url: None, ca_file: Some("/x".into()), ..base.clone() }, "ingest.schema_registry.url"),
        ] {
            let e = s.validate().unwrap_err().to_string();
            assert!(e.starts_with(key), "{e}");
        }
    }

    #[test]
    fn credentials_come_from_files_and_never_show_in_debug() {
        let dir = std::env::temp_dir().join(format!("hookline-sr-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let pf = dir.join("pass");
        std::fs::write(&pf, "s3cret\n").unwrap();
        let s = SchemaRegistrySettings {
            url: Some("https://user:inline@r:8081".into()),
            username: Some("u".into()),
            password_file: Some(pf.clone()),
            ..Default::default()
        };
        let auth = s.authorization().unwrap().unwrap();
        assert_eq!(auth.to_str().unwrap(), "Basic dTpzM2NyZXQ=");
        assert!(!format!("{s:?}").contains("inline"));
        let tf = dir.join("token");
        std::fs::write(&tf, "tok\n").unwrap();
        let b = SchemaRegistrySettings { url: Some("https://r".into()), bearer_token_file: Some(tf), ..Default::default() };
        assert_eq!(b.authorization().unwrap().unwrap().to_str().unwrap(), "Bearer tok");
        let missing = SchemaRegistrySettings { password_file: Some(dir.join("nope")), ..s };
        assert!(missing.authorization().unwrap_err().to_string().starts_with("ingest.schema_registry.password_file"));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
