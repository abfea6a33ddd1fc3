//! `/v1/tenants`: tenants (create with an id of the caller's choosing, list, get, update, delete with everything
//! of theirs), their API keys (shown once, kept as a digest, revocable) and portal links. Written to the
//! compacted `tenants` and `api-keys` topics; like subscriptions, every write waits until this replica's table
//! has applied it, so a client reads its own writes.

use std::sync::Arc;

use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use hookline_core::credential::{self, PortalGrant};
use hookline_core::model::{ApiKey, Tenant};
use hookline_kafka::table::TableHandle;
use prost::Message as _;
use rand::Rng;
use serde::Deserialize;
use serde_json::{json, Value};

use super::auth::Principal;
use super::{ApiError, ApiJson, ApiQuery, ApiState};

pub const MAX_TENANT_NAME_BYTES: usize = 256;
pub const MAX_KEY_NAME_BYTES: usize = 100;
/// Live API keys one tenant may have (enough to rotate through; bounds the table).
pub const MAX_KEYS_PER_TENANT: usize = 100;
/// Subscription tombstones in flight at once while a tenant is deleted.
const DELETE_BATCH: usize = 100;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CreateTenant {
    id: String,
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    publish_rate_per_s: Option<u32>,
    #[serde(default)]
    publish_burst: Option<u32>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UpdateTenant {
    name: Option<String>,
    /// Events per second through `POST /v1/events` (0: back to `ingest.publish_rate_per_s`).
    publish_rate_per_s: Option<u32>,
    publish_burst: Option<u32>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ListQuery {
    limit: Option<usize>,
    /// The last id of the previous page.
    after: Option<String>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct CreateKey {
    #[serde(default)]
    name: Option<String>,
    /// The key's own publish quota, within its tenant's (0 or absent: none of its own).
    #[serde(default)]
    publish_rate_per_s: Option<u32>,
    #[serde(default)]
    publish_burst: Option<u32>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct CreateLink {
    /// Seconds the link is valid (default `ingest.portal.link_ttl_s`).
    #[serde(default)]
    ttl_s: Option<u64>,
    #[serde(default)]
    read_only: Option<bool>,
}

fn view(t: &Tenant) -> Value {
    json!({
        "id": t.id, "name": t.name, "created_at_ms": t.created_at_ms, "updated_at_ms": t.updated_at_ms,
        "publish_rate_per_s": t.publish_rate_per_s, "publish_burst": t.publish_burst,
    })
}

/// A publish quota's fields: each within its range, a burst only with a rate.
fn quota_fields(per_s: u32, burst: u32) -> Result<(), ApiError> {
    use hookline_core::rate_limit::{MAX_PUBLISH_BURST, MAX_PUBLISH_PER_S};
    if per_s > MAX_PUBLISH_PER_S {
        return Err(ApiError::field("publish_rate_per_s", format!("at most {MAX_PUBLISH_PER_S}, got {per_s}")));
    }
    if burst > MAX_PUBLISH_BURST {
        return Err(ApiError::field("publish_burst", format!("at most {MAX_PUBLISH_BURST}, got {burst}")));
    }
    if burst > 0 && per_s == 0 {
        return Err(ApiError::field("publish_burst", "a burst needs a rate: set publish_rate_per_s"));
    }
    Ok(())
}

fn not_found(id: &str) -> ApiError {
    ApiError::new(StatusCode::NOT_FOUND, "not_found", format!("no tenant {id}")).with_field("id")
}

/// The tenant `id`, if this credential may see it (another tenant's answers 404, as a missing one does).
fn find(s: &ApiState, who: &Principal, id: &str) -> Result<Arc<Tenant>, ApiError> {
    if !who.sees(id) {
        return Err(not_found(id));
    }
    s.tenants.get(id).ok_or_else(|| not_found(id))
}

fn name_within(name: &str) -> Result<(), ApiError> {
    if name.len() > MAX_TENANT_NAME_BYTES {
        return Err(ApiError::field("name", format!("at most {MAX_TENANT_NAME_BYTES} bytes, got {}", name.len())));
    }
    Ok(())
}

pub async fn create(
    State(s): State<Arc<ApiState>>,
    Extension(who): Extension<Principal>,
    ApiJson(req): ApiJson<CreateTenant>,
) -> Result<(StatusCode, Json<Value>), ApiError> {
    who.require_admin()?;
    if req.id.is_empty() {
        return Err(ApiError::field("id", "is required (the tenant id events and subscriptions name)"));
    }
    hookline_core::filter::validate_tenant(&req.id).map_err(|e| ApiError::field("id", e))?;
    let name = req.name.unwrap_or_default();
    name_within(&name)?;
    if s.tenants.contains(&req.id) {
        return Err(ApiError::new(StatusCode::CONFLICT, "tenant_exists", format!("tenant {} already exists", req.id)).with_field("id"));
    }
    let (publish_rate_per_s, publish_burst) = (req.publish_rate_per_s.unwrap_or(0), req.publish_burst.unwrap_or(0));
    quota_fields(publish_rate_per_s, publish_burst)?;
    let now = crate::now_ms();
    let t = Tenant { id: req.id, name, created_at_ms: now, updated_at_ms: now, publish_rate_per_s, publish_burst };
    write(&s, s.topics.tenants(), &s.tenants_reader, &t.id, Some(t.encode_to_vec())).await?;
    Ok((StatusCode::CREATED, Json(view(&t))))
}

pub async fn list(
    State(s): State<Arc<ApiState>>,
    Extension(who): Extension<Principal>,
    ApiQuery(q): ApiQuery<ListQuery>,
) -> Result<Json<Value>, ApiError> {
    who.require_admin()?;
    let limit = q.limit.unwrap_or(50);
    if !(1..=500).contains(&limit) {
        return Err(ApiError::field("limit", "must be between 1 and 500"));
    }
    let (items, more) = s.tenants.page(q.after.as_deref(), limit);
    let next = if more { items.last().map(|t| t.id.clone()) } else { None };
    Ok(Json(json!({"items": items.iter().map(|t| view(t)).collect::<Vec<_>>(), "next_after": next})))
}

pub async fn get(
    State(s): State<Arc<ApiState>>,
    Extension(who): Extension<Principal>,
    Path(id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    let t = find(&s, &who, &id)?;
    Ok(Json(view(&t)))
}

pub async fn update(
    State(s): State<Arc<ApiState>>,
    Extension(who): Extension<Principal>,
    Path(id): Path<String>,
    ApiJson(req): ApiJson<UpdateTenant>,
) -> Result<Json<Value>, ApiError> {
    who.require_admin()?;
    let mut t = (*find(&s, &who, &id)?).clone();
    if let Some(name) = req.name {
        name_within(&name)?;
        t.name = name;
    }
    if let Some(v) = req.publish_rate_per_s {
        t.publish_rate_per_s = v;
        // A new rate without a burst of its own takes one second's worth.
        if req.publish_burst.is_none() {
            t.publish_burst = 0;
        }
    }
    if let Some(v) = req.publish_burst {
        t.publish_burst = v;
    }
    quota_fields(t.publish_rate_per_s, t.publish_burst)?;
    t.updated_at_ms = crate::now_ms();
    write(&s, s.topics.tenants(), &s.tenants_reader, &t.id, Some(t.encode_to_vec())).await?;
    Ok(Json(view(&t)))
}

/// Deletes the tenant's subscriptions, then its API keys, then the tenant: a delete cut short leaves the tenant
/// in place, so repeating it finishes the job.
pub async fn delete(
    State(s): State<Arc<ApiState>>,
    Extension(who): Extension<Principal>,
    Path(id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    who.require_admin()?;
    find(&s, &who, &id)?;
    let subs = s.subs.ids_of_tenant(&id);
    for chunk in subs.chunks(DELETE_BATCH) {
        let writes = chunk.iter().map(|sub| write(&s, s.topics.subscriptions(), &s.subs_reader, sub, None));
        futures::future::try_join_all(writes).await?;
    }
    let keys = s.keys.of_tenant(&id);
    for (k, _) in &keys {
        revoke_key(&s, &k.id).await?;
    }
    write(&s, s.topics.tenants(), &s.tenants_reader, &id, None).await?;
    Ok(Json(json!({"id": id, "deleted_subscriptions": subs.len(), "revoked_api_keys": keys.len()})))
}

fn key_view(k: &ApiKey, last_used: Option<i64>) -> Value {
    json!({
        "id": k.id, "tenant": k.tenant, "name": k.name, "prefix": k.prefix,
        "created_at_ms": k.created_at_ms, "last_used_at_ms": last_used,
        "publish_rate_per_s": k.publish_rate_per_s, "publish_burst": k.publish_burst,
    })
}

/// A new API key for the tenant, shown once in `key`; only its SHA-256 is kept.
pub async fn create_key(
    State(s): State<Arc<ApiState>>,
    Extension(who): Extension<Principal>,
    Path(id): Path<String>,
    body: Result<axum::body::Bytes, axum::extract::rejection::BytesRejection>,
) -> Result<(StatusCode, Json<Value>), ApiError> {
    who.require_admin()?;
    let req: CreateKey = crate::optional_body(&body.map_err(super::body_unreadable)?)?;
    find(&s, &who, &id)?;
    let name = req.name.unwrap_or_default();
    if name.len() > MAX_KEY_NAME_BYTES {
        return Err(ApiError::field("name", format!("at most {MAX_KEY_NAME_BYTES} bytes, got {}", name.len())));
    }
    if s.keys.of_tenant(&id).len() >= MAX_KEYS_PER_TENANT {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            "too_many_api_keys",
            format!("tenant {id} has {MAX_KEYS_PER_TENANT} API keys; revoke one first"),
        ));
    }
    let (publish_rate_per_s, publish_burst) = (req.publish_rate_per_s.unwrap_or(0), req.publish_burst.unwrap_or(0));
    quota_fields(publish_rate_per_s, publish_burst)?;
    let secret = credential::generate_api_key(&mut rand::rng());
    let key = ApiKey {
        id: format!("key_{}", hex_id()),
        tenant: id,
        sha256: credential::api_key_digest(&secret),
        prefix: secret.chars().take(credential::SHOWN_PREFIX_LEN).collect(),
        name,
        created_at_ms: crate::now_ms(),
        publish_rate_per_s,
        publish_burst,
    };
    write(&s, s.topics.api_keys(), &s.keys_reader, &key.id, Some(key.encode_to_vec())).await?;
    let mut v = key_view(&key, None);
    v["key"] = json!(secret);
    Ok((StatusCode::CREATED, Json(v)))
}

pub async fn list_keys(
    State(s): State<Arc<ApiState>>,
    Extension(who): Extension<Principal>,
    Path(id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    who.require_admin()?;
    find(&s, &who, &id)?;
    let items: Vec<Value> = s.keys.of_tenant(&id).iter().map(|(k, used)| key_view(k, *used)).collect();
    Ok(Json(json!({"items": items})))
}

pub async fn delete_key(
    State(s): State<Arc<ApiState>>,
    Extension(who): Extension<Principal>,
    Path((id, key_id)): Path<(String, String)>,
) -> Result<StatusCode, ApiError> {
    who.require_admin()?;
    find(&s, &who, &id)?;
    if s.keys.get(&key_id).is_none_or(|k| k.tenant != id) {
        return Err(ApiError::new(StatusCode::NOT_FOUND, "not_found", format!("tenant {id} has no API key {key_id}")).with_field("key_id"));
    }
    revoke_key(&s, &key_id).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// The key's tombstone (waited for: the key stops working here before the answer), then its usage record's.
async fn revoke_key(s: &ApiState, key_id: &str) -> Result<(), ApiError> {
    write(s, s.topics.api_keys(), &s.keys_reader, key_id, None).await?;
    let usage = format!("{key_id}{}", crate::tenant_tables::USAGE_SUFFIX);
    write(s, s.topics.api_keys(), &s.keys_reader, &usage, None).await
}

/// A link that opens the portal for this tenant only: `<public_url>/portal/#token=hlp_…`. The token is in the
/// fragment, which browsers never send to a server, so it stays out of access logs and `Referer` headers.
pub async fn create_link(
    State(s): State<Arc<ApiState>>,
    Extension(who): Extension<Principal>,
    Path(id): Path<String>,
    headers: HeaderMap,
    body: Result<axum::body::Bytes, axum::extract::rejection::BytesRejection>,
) -> Result<Response, ApiError> {
    who.require_admin()?;
    let req: CreateLink = crate::optional_body(&body.map_err(super::body_unreadable)?)?;
    find(&s, &who, &id)?;
    let Some(secret) = s.portal.link_secret.as_deref() else {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            "portal_links_disabled",
            "portal links need ingest.portal.link_secret (HOOKLINE_INGEST__PORTAL__LINK_SECRET) on every ingest replica",
        ));
    };
    let ttl_s = req.ttl_s.unwrap_or(s.portal.link_ttl_s);
    let max = hookline_service::config::MAX_PORTAL_LINK_TTL_S;
    if !(1..=max).contains(&ttl_s) {
        return Err(ApiError::field("ttl_s", format!("must be 1 to {max}")));
    }
    let now = crate::now_ms();
    let expires_at_ms = now.saturating_add(i64::try_from(ttl_s).unwrap_or(i64::MAX).saturating_mul(1000));
    let read_only = req.read_only.unwrap_or(false);
    let grant = PortalGrant { tenant: id, expires_at_ms, read_only, nonce: hex_id() };
    let token = credential::sign_portal_token(&grant, secret.as_bytes());
    let base = match &s.portal.public_url {
        Some(u) => u.trim_end_matches('/').to_owned(),
        None => {
            let host = headers.get(axum::http::header::HOST).and_then(|h| h.to_str().ok()).unwrap_or("localhost");
            format!("http://{host}")
        }
    };
    let body = json!({"url": format!("{base}/portal/#token={token}"), "tenant": grant.tenant, "expires_at_ms": expires_at_ms, "read_only": read_only});
    Ok((StatusCode::CREATED, Json(body)).into_response())
}

/// Produces to a compacted topic and waits until `reader` has applied it.
pub(crate) async fn write(s: &ApiState, topic: &str, reader: &TableHandle, key: &str, value: Option<Vec<u8>>) -> Result<(), ApiError> {
    let record = rdkafka::producer::FutureRecord::<str, [u8]>::to(topic).key(key);
    let record = match &value {
        Some(v) => record.payload(v.as_slice()),
        None => record,
    };
    let (p, o) = s
        .producer
        .send(record, std::time::Duration::from_secs(10))
        .await
        .map(|d| (d.partition, d.offset))
        .map_err(|(e, _)| ApiError::unavailable(e))?;
    reader.wait_for(p, o + 1).await;
    Ok(())
}

fn hex_id() -> String {
    let bytes: [u8; 12] = rand::rng().random();
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}
