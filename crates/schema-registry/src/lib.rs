//! A client of a Confluent-compatible Schema Registry (`GET /schemas/ids/{id}`, references through
//! `GET /subjects/{subject}/versions/{version}`), a bounded cache of the schemas it fetched, and the Avro and
//! Protobuf decoders that turn Schema Registry framed payloads into JSON for `hookline_core::event_decode`.
//!
//! Schemas by id are immutable, so each id is fetched once and kept (up to `cache_max_schemas`, the oldest
//! dropped first); an id the registry does not have is remembered as such too. A registry that does not answer
//! is never a verdict on the event: [`Registry::resolve`] retries with capped backoff until it answers.

mod avro;
mod protobuf;
mod settings;

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use hookline_core::registry_framing::{message_indexes, Framed, PayloadDecoder, Resolved};
use hookline_core::vocabulary::DeadLetterReason as Reason;
use http_body_util::{BodyExt, Empty, Limited};
use hyper_util::client::legacy::{connect::HttpConnector, Client};
use hyper_util::rt::TokioExecutor;
use tokio_util::sync::CancellationToken;

pub use avro::{AvroError, AvroSchema};
pub use protobuf::{ProtoError, ProtoSchema};
pub use settings::{SchemaRegistrySettings, SetupError};

/// Largest registry answer read (a schema with its metadata).
const MAX_RESPONSE_BYTES: usize = 4 << 20;
/// Most references one schema may pull in, over all levels, and how deep they may nest.
const MAX_REFERENCES: usize = 64;
const MAX_REFERENCE_DEPTH: usize = 8;
/// First wait before asking a registry that did not answer again (doubling up to `retry_max_ms`).
const RETRY_MIN: Duration = Duration::from_millis(200);

/// What a schema id is known to be.
#[derive(Debug, Clone)]
pub enum Known {
    Avro(Arc<AvroSchema>),
    Protobuf(Arc<ProtoSchema>),
    /// JSON Schema: the payload is JSON already.
    Json,
    /// The registry answered 404.
    NotFound,
    /// The registry has it, and hookline cannot use it (it does not compile, or an unknown `schemaType`).
    Unusable(String),
}

/// Why one fetch got no answer to go by: asked again later.
#[derive(Debug, thiserror::Error)]
pub enum FetchError {
    #[error("the registry did not answer within {0} ms")]
    Timeout(u64),
    #[error("the registry could not be reached: {0}")]
    Connect(String),
    #[error("the registry answered {status} for {path}")]
    Status { status: u16, path: String },
    #[error("the registry's answer for {path} is not a schema: {detail}")]
    Body { path: String, detail: String },
}

type HttpClient = Client<hyper_rustls::HttpsConnector<HttpConnector>, Empty<Bytes>>;

pub struct Registry {
    base: url::Url,
    client: HttpClient,
    authorization: Option<http::HeaderValue>,
    timeout: Duration,
    retry_max: Duration,
    cache: Mutex<Cache>,
}

struct Cache {
    max: usize,
    known: HashMap<u32, Known>,
    /// Insertion order, for dropping the oldest when full.
    order: VecDeque<u32>,
}

impl Cache {
    fn insert(&mut self, id: u32, k: Known) {
        if self.known.insert(id, k).is_none() {
            self.order.push_back(id);
        }
        while self.known.len() > self.max {
            let Some(old) = self.order.pop_front() else { break };
            self.known.remove(&old);
        }
    }
}

#[derive(serde::Deserialize)]
struct SchemaAnswer {
    schema: String,
    #[serde(rename = "schemaType")]
    schema_type: Option<String>,
    #[serde(default)]
    references: Vec<Reference>,
}

#[derive(serde::Deserialize)]
struct Reference {
    name: String,
    subject: String,
    version: i64,
}

impl Registry {
    /// The client `settings` describe (credential and CA files are read now); `None` when no URL is set.
    pub fn from_settings(settings: &SchemaRegistrySettings) -> Result<Option<Arc<Self>>, SetupError> {
        let Some(base) = settings.base_url()? else { return Ok(None) };
        let tls = settings.tls_config()?;
        let mut http = HttpConnector::new();
        http.enforce_http(false);
        http.set_connect_timeout(Some(Duration::from_millis(settings.request_timeout_ms)));
        let https = hyper_rustls::HttpsConnectorBuilder::new().with_tls_config(tls).https_or_http().enable_http1().wrap_connector(http);
        let client = Client::builder(TokioExecutor::new()).pool_idle_timeout(Duration::from_secs(30)).build(https);
        Ok(Some(Arc::new(Self {
            base,
            client,
            authorization: settings.authorization()?,
            timeout: Duration::from_millis(settings.request_timeout_ms),
            retry_max: Duration::from_millis(settings.retry_max_ms),
            cache: Mutex::new(Cache { max: settings.cache_max_schemas, known: HashMap::new(), order: VecDeque::new() }),
        })))
    }

    /// The registry's URL, for logs and dead-letter details.
    pub fn url(&self) -> &str {
        self.base.as_str()
    }

    pub fn cached(&self, id: u32) -> Option<Known> {
        self.cache.lock().unwrap_or_else(|e| e.into_inner()).known.get(&id).cloned()
    }

    /// Until `id` is known (or `shutdown`): fetched once when not cached, asked again with capped backoff while
    /// the registry does not answer, each failure counted (`hookline_schema_registry_requests_total`) and logged.
    pub async fn resolve(&self, id: u32, shutdown: &CancellationToken) -> Option<Known> {
        let mut wait = RETRY_MIN;
        let mut failures = 0u64;
        loop {
            if let Some(k) = self.cached(id) {
                return Some(k);
            }
            match self.fetch(id).await {
                Ok(k) => {
                    let outcome = if matches!(k, Known::NotFound) { "not_found" } else { "found" };
                    metrics::counter!("hookline_schema_registry_requests_total", "outcome" => outcome).increment(1);
                    if failures > 0 {
                        tracing::info!(schema_id = id, failures, registry = %self.base, "the schema registry answers again");
                    }
                    self.cache.lock().unwrap_or_else(|e| e.into_inner()).insert(id, k.clone());
                    return Some(k);
                }
                Err(e) => {
                    metrics::counter!("hookline_schema_registry_requests_total", "outcome" => "error").increment(1);
                    failures = failures.saturating_add(1);
                    tracing::warn!(schema_id = id, error = %e, retry_in_ms = wait.as_millis() as u64, failures, registry = %self.base,
                        "the schema registry did not answer; the events waiting for this schema are held, in order, until it does");
                    tokio::select! {
                        _ = shutdown.cancelled() => return None,
                        _ = tokio::time::sleep(wait) => {}
                    }
                    wait = wait.saturating_mul(2).min(self.retry_max);
                }
            }
        }
    }

    /// One fetch of `id` with its references: a definitive answer, or why there is none yet.
    pub async fn fetch(&self, id: u32) -> Result<Known, FetchError> {
        let Some(root) = self.get_json(&["schemas", "ids", &id.to_string()]).await? else { return Ok(Known::NotFound) };
        let kind = root.schema_type.clone().unwrap_or_else(|| "AVRO".into());
        let mut refs = Vec::new();
        let mut queue: Vec<(Reference, usize)> = root.references.into_iter().map(|r| (r, 1)).collect();
        while let Some((r, depth)) = queue.pop() {
            if refs.len() >= MAX_REFERENCES || depth > MAX_REFERENCE_DEPTH {
                return Ok(Known::Unusable(format!("more than {MAX_REFERENCES} references, or nested deeper than {MAX_REFERENCE_DEPTH}")));
            }
            let version = r.version.to_string();
            let Some(a) = self.get_json(&["subjects", &r.subject, "versions", &version]).await? else {
                return Ok(Known::Unusable(format!(
                    "its reference {:?} (subject {:?} version {version}) is not in the registry",
                    r.name, r.subject
                )));
            };
            queue.extend(a.references.into_iter().map(|r| (r, depth + 1)));
            refs.push((r.name, a.schema));
        }
        Ok(compile(&kind, &root.schema, refs))
    }

    /// GETs `segments` under the base URL; `None` on 404.
    async fn get_json(&self, segments: &[&str]) -> Result<Option<SchemaAnswer>, FetchError> {
        let mut url = self.base.clone();
        if let Ok(mut p) = url.path_segments_mut() {
            p.pop_if_empty().extend(segments);
        }
        let path = url.path().to_owned();
        let mut req =
            http::Request::get(url.as_str()).header(http::header::ACCEPT, "application/vnd.schemaregistry.v1+json, application/json");
        if let Some(a) = &self.authorization {
            req = req.header(http::header::AUTHORIZATION, a.clone());
        }
        let req = req.body(Empty::new()).map_err(|e| FetchError::Connect(e.to_string()))?;
        let timeout_ms = u64::try_from(self.timeout.as_millis()).unwrap_or(u64::MAX);
        let exchange = async {
            let resp = self.client.request(req).await.map_err(|e| FetchError::Connect(error_chain(&e)))?;
            let status = resp.status().as_u16();
            let body = Limited::new(resp.into_body(), MAX_RESPONSE_BYTES)
                .collect()
                .await
                .map_err(|e| FetchError::Body { path: path.clone(), detail: e.to_string() })?
                .to_bytes();
            Ok::<_, FetchError>((status, body))
        };
        let (status, body) = tokio::time::timeout(self.timeout, exchange).await.map_err(|_| FetchError::Timeout(timeout_ms))??;
        match status {
            200 => serde_json::from_slice(&body).map(Some).map_err(|e| FetchError::Body { path, detail: e.to_string() }),
            404 => Ok(None),
            // 401/403 (credentials), 5xx, a proxy's 502: not a verdict on the schema; asked again.
            status => Err(FetchError::Status { status, path }),
        }
    }
}

fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut src = e.source();
    while let Some(c) = src {
        s.push_str(": ");
        s.push_str(&c.to_string());
        src = c.source();
    }
    s
}

/// A fetched schema made ready to decode with.
pub fn compile(kind: &str, schema: &str, references: Vec<(String, String)>) -> Known {
    match kind {
        "AVRO" => {
            let texts: Vec<String> = references.into_iter().map(|(_, t)| t).collect();
            AvroSchema::parse(schema, &texts).map_or_else(|e| Known::Unusable(e.to_string()), |s| Known::Avro(Arc::new(s)))
        }
        "PROTOBUF" => {
            ProtoSchema::compile(schema, &references).map_or_else(|e| Known::Unusable(e.to_string()), |s| Known::Protobuf(Arc::new(s)))
        }
        "JSON" => Known::Json,
        other => Known::Unusable(format!("schemaType {other:?} is not one hookline reads (AVRO, PROTOBUF, JSON)")),
    }
}

/// A framed payload through a known schema.
pub fn decode(known: &Known, framed: Framed<'_>, registry_url: &str) -> Resolved {
    match known {
        Known::Avro(s) => match s.to_json(framed.payload) {
            Ok(v) => Resolved::Json(serde_json::to_vec(&v).unwrap_or_default()),
            Err(e) => Resolved::Rejected(Reason::EventInvalidFraming, e.to_string()),
        },
        Known::Protobuf(s) => match message_indexes(framed.schema_id, framed.payload) {
            Ok((indexes, message)) => match s.to_json(&indexes, message) {
                Ok(j) => Resolved::Json(j),
                Err(e) => Resolved::Rejected(Reason::EventInvalidFraming, e.to_string()),
            },
            Err(e) => Resolved::Rejected(Reason::EventInvalidFraming, e.to_string()),
        },
        Known::Json => Resolved::Rejected(Reason::EventInvalidFraming, "a JSON Schema, but the payload is not a JSON object".into()),
        Known::NotFound => {
            Resolved::Rejected(Reason::EventSchemaNotFound, format!("the registry at {registry_url} does not have this schema id (404)"))
        }
        Known::Unusable(why) => Resolved::Rejected(Reason::EventSchemaUnsupported, why.clone()),
    }
}

impl PayloadDecoder for Registry {
    fn to_json(&self, framed: Framed<'_>) -> Resolved {
        match self.cached(framed.schema_id) {
            Some(k) => decode(&k, framed, self.url()),
            None => Resolved::Pending,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cache_keeps_at_most_its_bound_dropping_the_oldest() {
        let mut c = Cache { max: 2, known: HashMap::new(), order: VecDeque::new() };
        for id in [1, 2, 2, 3] {
            c.insert(id, Known::Json);
        }
        assert_eq!(c.known.len(), 2);
        assert!(!c.known.contains_key(&1) && c.known.contains_key(&2) && c.known.contains_key(&3));
    }

    #[test]
    fn unknown_schema_types_and_bad_schemas_are_unusable_with_a_reason() {
        assert!(matches!(compile("XML", "", vec![]), Known::Unusable(w) if w.contains("XML")));
        assert!(matches!(compile("AVRO", "{", vec![]), Known::Unusable(_)));
        assert!(matches!(compile("PROTOBUF", "message {", vec![]), Known::Unusable(_)));
        let f = Framed { schema_id: 9, payload: b"\x01" };
        assert!(
            matches!(decode(&Known::NotFound, f, "http://r"), Resolved::Rejected(Reason::EventSchemaNotFound, d) if d.contains("http://r"))
        );
    }
}
