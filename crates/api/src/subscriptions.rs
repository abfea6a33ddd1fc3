//! Subscriptions: create, get, list, update, delete, pause, resume. Written to the compacted `subscriptions`
//! topic; reads come from the in-memory table, and every write waits until the table has applied it, so a
//! client reads its own writes.

use std::collections::HashMap;
use std::sync::Arc;

use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use hookline_core::egress::{EgressGuard, TargetHost};
use hookline_core::model::{Secret, Subscription};
use hookline_core::policy;
use hookline_core::subscription::activity;
use hookline_kafka::state::SubscriptionEntry;
use prost::Message as _;
use rand::Rng;
use serde::Deserialize;
use serde_json::{json, Value};

use super::auth::Principal;
use super::{ApiError, ApiJson, ApiQuery, ApiState};

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CreateSubscription {
    url: String,
    event_types: Vec<String>,
    #[serde(default)]
    policy: Option<String>,
    #[serde(default)]
    policy_toml: Option<String>,
    #[serde(default)]
    secret: Option<String>,
    #[serde(default)]
    description: Option<String>,
    #[serde(default, deserialize_with = "crate::unique_map")]
    metadata: Option<HashMap<String, String>>,
    #[serde(default)]
    enabled: Option<bool>,
    #[serde(default)]
    owner_email: Option<String>,
    #[serde(default)]
    tenant: Option<String>,
    #[serde(default, deserialize_with = "crate::unique_map")]
    headers: Option<HashMap<String, String>>,
    /// Custom headers whose values the delivery log may show (every other value is recorded redacted).
    #[serde(default)]
    shown_headers: Option<Vec<String>>,
    #[serde(default)]
    filter: Option<Value>,
    #[serde(default)]
    rate_limit_per_s: Option<u32>,
    #[serde(default)]
    burst: Option<u32>,
    /// "none" (default) | "key" | "strict".
    #[serde(default)]
    ordering: Option<String>,
    /// The event field that keys `"ordering": "key"`.
    #[serde(default)]
    ordering_key: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UpdateSubscription {
    url: Option<String>,
    event_types: Option<Vec<String>>,
    policy: Option<String>,
    policy_toml: Option<String>,
    description: Option<String>,
    #[serde(default, deserialize_with = "crate::unique_map")]
    metadata: Option<HashMap<String, String>>,
    enabled: Option<bool>,
    owner_email: Option<String>,
    /// Replaces every custom header (`{}` removes them all).
    #[serde(default, deserialize_with = "crate::unique_map")]
    headers: Option<HashMap<String, String>>,
    /// Replaces the names of custom headers whose values the delivery log may show.
    shown_headers: Option<Vec<String>>,
    /// Replaces the payload filter; `null` removes it.
    #[serde(default, deserialize_with = "crate::present")]
    filter: Option<Value>,
    /// 0 = back to the policy's default (or none).
    rate_limit_per_s: Option<u32>,
    burst: Option<u32>,
    /// "none" | "key" | "strict"; anything but "key" also clears `ordering_key` unless the request sets it.
    ordering: Option<String>,
    ordering_key: Option<String>,
}

/// The stored mode for the API's word.
fn ordering_mode(word: &str) -> Result<i32, ApiError> {
    hookline_core::ordering::Ordering::mode(word)
        .map(|m| m as i32)
        .ok_or_else(|| ApiError::field("ordering", format!("one of \"none\", \"key\", \"strict\"; got {word:?}")))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ListQuery {
    limit: Option<usize>,
    /// The last id of the previous page.
    after: Option<String>,
    /// Only this tenant's subscriptions (a tenant credential always gets only its own).
    tenant: Option<String>,
    /// `success_24h`: add each item's last 24 h of outcomes (one delivery-log query for the page, a count per
    /// state in a window). Off by default: a plain page asks the log only for the last success of endpoints without
    /// a state (one index probe each).
    include: Option<Include>,
}

#[derive(Deserialize, Clone, Copy, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum Include {
    #[serde(rename = "success_24h")]
    Success24h,
}

/// The header that makes a create safe to retry.
const IDEMPOTENCY_KEY: &str = "idempotency-key";

/// The `Idempotency-Key` header, if present: 1-255 visible ASCII characters.
fn idempotency_key(headers: &HeaderMap) -> Result<Option<String>, ApiError> {
    let Some(v) = headers.get(IDEMPOTENCY_KEY) else { return Ok(None) };
    let key = v.to_str().ok().filter(|k| (1..=255).contains(&k.len()) && k.bytes().all(|b| b.is_ascii_graphic()));
    key.map(|k| Some(k.to_owned())).ok_or_else(|| ApiError::field("Idempotency-Key", "must be 1 to 255 visible ASCII characters"))
}

/// A digest of everything a create request asks for (the secret only as its own digest).
fn fingerprint(req: &CreateSubscription) -> String {
    let metadata: std::collections::BTreeMap<_, _> = req.metadata.iter().flatten().collect();
    let headers: Option<std::collections::BTreeMap<_, _>> = req.headers.as_ref().map(|h| h.iter().collect());
    let canonical = json!({
        "headers": headers, "shown_headers": req.shown_headers, "filter": req.filter, "rate_limit_per_s": req.rate_limit_per_s, "burst": req.burst,
        "ordering": req.ordering, "ordering_key": req.ordering_key,
        "url": req.url, "event_types": req.event_types, "policy": req.policy, "policy_toml": req.policy_toml,
        "secret": req.secret.as_deref().map(|x| hookline_core::model::sha256_hex(x.as_bytes())),
        "description": req.description, "metadata": metadata, "enabled": req.enabled,
        "owner_email": req.owner_email, "tenant": req.tenant,
    });
    hookline_core::model::sha256_hex(canonical.to_string().as_bytes())
}

/// With an `Idempotency-Key`, the subscription's id comes from the key: a retry finds what the first request made
/// and gets it back (200, `Idempotent-Replayed: true`, with its current secret), and the same key with a
/// different request is refused (409). Without one, every create makes a new subscription.
pub async fn create(
    State(s): State<Arc<ApiState>>,
    Extension(who): Extension<Principal>,
    headers: HeaderMap,
    ApiJson(req): ApiJson<CreateSubscription>,
) -> Result<Response, ApiError> {
    who.require_write()?;
    let tenant = who.tenant_for(req.tenant.as_deref(), "tenant")?;
    let key = idempotency_key(&headers)?;
    let fingerprint = key.as_ref().map(|_| fingerprint(&req)).unwrap_or_default();
    let id = match (&key, who.tenant()) {
        (Some(k), None) => hookline_core::model::keyed_subscription_id(k),
        // A tenant's keys name ids of their own: the same key from two tenants makes two subscriptions.
        (Some(k), Some(t)) => hookline_core::model::keyed_subscription_id(&format!("{t}\0{k}")),
        (None, _) => format!("sub_{}", hex_id()),
    };
    if key.is_some() {
        if let Some(existing) = s.subs.get(&id) {
            if !who.sees(&existing.sub.tenant) {
                return Err(ApiError::new(StatusCode::CONFLICT, "idempotency_conflict", "this Idempotency-Key is already in use")
                    .with_field("Idempotency-Key"));
            }
            return replayed(&s, &existing, &fingerprint).await;
        }
    }
    let now = crate::now_ms();
    let mut sub = Subscription {
        id,
        create_fingerprint: fingerprint,
        url: req.url,
        event_types: req.event_types,
        policy: req.policy.unwrap_or_else(|| "standard".into()),
        policy_toml: req.policy_toml.unwrap_or_default(),
        description: req.description.unwrap_or_default(),
        metadata: req.metadata.unwrap_or_default(),
        enabled: req.enabled.unwrap_or(true),
        created_at_ms: now,
        updated_at_ms: now,
        tenant: tenant.unwrap_or_default(),
        owner_email: req.owner_email.unwrap_or_default(),
        headers: req.headers.unwrap_or_default(),
        shown_headers: req.shown_headers.unwrap_or_default(),
        filter_json: stored_filter(req.filter.as_ref())?,
        rate_limit_per_s: req.rate_limit_per_s.unwrap_or(0),
        burst: req.burst.unwrap_or(0),
        ordering: req.ordering.as_deref().map(ordering_mode).transpose()?.unwrap_or(0),
        ordering_key: req.ordering_key.unwrap_or_default(),
        ..Default::default()
    };
    let secret = match req.secret {
        Some(secret) => {
            at_most("secret", &secret, MAX_SECRET_BYTES)?;
            hookline_core::sign::standard_signature(&secret, "probe", 0, b"").map_err(|e| ApiError::field("secret", e.to_string()))?;
            secret
        }
        None => hookline_core::sign::generate_secret(&mut rand::rng()),
    };
    sub.secrets = vec![Secret { value: secret.clone(), expires_at_ms: 0, ..Default::default() }];
    super::event_types::check_subscribed::<&str>(&s, &sub.event_types, &[])?;
    validate_shown_headers(&mut sub)?;
    let pol = validate(&s, &sub).await?;
    // Written once, with the challenge's result: until then the subscription does not exist, so nothing is sent.
    if super::verify::needs_challenge(&mut sub, None, &pol) {
        super::verify::challenge(&s, &mut sub, &pol).await;
    }
    write(&s, &sub).await?;
    let mut view = view(&s, &SubscriptionEntry::new(sub));
    // The only time the secret is shown (and on a retry with the same Idempotency-Key).
    view["secret"] = json!(secret);
    Ok((StatusCode::CREATED, Json(view)).into_response())
}

/// A create retried with the Idempotency-Key of an existing subscription.
async fn replayed(s: &ApiState, existing: &SubscriptionEntry, fingerprint: &str) -> Result<Response, ApiError> {
    if existing.sub.create_fingerprint() != fingerprint {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            "idempotency_conflict",
            format!("this Idempotency-Key already created {} from a different request", existing.sub.id),
        )
        .with_field("Idempotency-Key"));
    }
    let mut view = shown(s, existing).await;
    // The secret that signs now: a rotation puts the new one first, without an expiry.
    let current = existing.sub.secrets.iter().find(|x| x.expires_at_ms == 0).or(existing.sub.secrets.first());
    view["secret"] = json!(current.map(|x| &*x.value).unwrap_or(""));
    let mut resp = (StatusCode::OK, Json(view)).into_response();
    resp.headers_mut().insert("idempotent-replayed", axum::http::HeaderValue::from_static("true"));
    Ok(resp)
}

pub async fn get(
    State(s): State<Arc<ApiState>>,
    Extension(who): Extension<Principal>,
    Path(id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    let entry = find(&s, &who, &id)?;
    Ok(Json(shown(&s, &entry).await))
}

/// A page in id order, through the table's ordered index (of one tenant, or of all for an admin).
pub async fn list(
    State(s): State<Arc<ApiState>>,
    Extension(who): Extension<Principal>,
    ApiQuery(q): ApiQuery<ListQuery>,
) -> Result<Json<Value>, ApiError> {
    let limit = q.limit.unwrap_or(50);
    if !(1..=500).contains(&limit) {
        return Err(ApiError::field("limit", "must be between 1 and 500"));
    }
    // `?tenant=` (empty: the subscriptions without a tenant) for an admin; a tenant credential's own otherwise.
    let tenant = match (who.tenant(), q.tenant) {
        (None, t) => t,
        (Some(own), None) => Some(own.to_owned()),
        (Some(own), Some(t)) if t == own => Some(t),
        (Some(_), Some(_)) => {
            return Err(super::auth::forbidden("this credential lists only its own tenant's subscriptions").with_field("tenant"))
        }
    };
    let page = s.subs.page(tenant.as_deref(), q.after.as_deref(), limit);
    let mut items: Vec<Value> = page.items.iter().map(|e| view(&s, e)).collect();
    add_last_success(&s, &mut items).await;
    if q.include == Some(Include::Success24h) {
        add_success_24h(&s, &mut items, &page.items).await;
    }
    let next = if page.more { page.items.last().map(|e| e.sub.id.to_string()) } else { None };
    Ok(Json(json!({"items": items, "next_after": next})))
}

/// The window of a list item's `success_24h`.
const SUCCESS_WINDOW_MS: i64 = 24 * 3_600_000;

/// Each item's `success_24h`: its deliveries first attempted in the last 24 h by outcome, from the delivery log
/// store in one query for the page. `null` when the store did not answer: the list stays usable without it.
async fn add_success_24h(s: &ApiState, items: &mut [Value], page: &[Arc<SubscriptionEntry>]) {
    let ids: Vec<String> = page.iter().map(|e| e.sub.id.to_string()).collect();
    let now = crate::now_ms();
    let stats = match s.log.stats_of_subscriptions(&ids, now.saturating_sub(SUCCESS_WINDOW_MS), now.saturating_add(1)).await {
        Ok(stats) => Some(stats),
        Err(e) => {
            tracing::warn!(error = %e, "delivery log query failed; the list has no success rates");
            None
        }
    };
    for (item, id) in items.iter_mut().zip(&ids) {
        item["success_24h"] = match &stats {
            None => Value::Null,
            Some(stats) => success_view(stats.get(id)),
        };
    }
}

/// `last_success_at_ms` of views whose endpoint state has none, from the delivery log: its latest succeeded delivery.
/// The dispatcher writes no state for an endpoint whose deliveries only succeeded (`health::Material`), so without
/// this an endpoint that never failed would show no success at all. One query for the page; `null` when the store
/// does not answer.
async fn add_last_success(s: &ApiState, items: &mut [Value]) {
    let ids: Vec<String> =
        items.iter().filter(|v| v["last_success_at_ms"].is_null()).filter_map(|v| v["id"].as_str().map(str::to_owned)).collect();
    if ids.is_empty() {
        return;
    }
    match s.log.last_successes(&ids).await {
        Ok(found) => {
            for item in items.iter_mut().filter(|v| v["last_success_at_ms"].is_null()) {
                if let Some(at) = item["id"].as_str().and_then(|id| found.get(id)) {
                    item["last_success_at_ms"] = json!(at);
                }
            }
        }
        Err(e) => tracing::warn!(error = %e, "delivery log query failed; views without an endpoint state show no last success"),
    }
}

/// [`view`] with its `last_success_at_ms` completed from the delivery log (see [`add_last_success`]).
pub(super) async fn shown(s: &ApiState, e: &SubscriptionEntry) -> Value {
    let mut v = view(s, e);
    add_last_success(s, std::slice::from_mut(&mut v)).await;
    v
}

/// `{"succeeded", "failed", "pending", "rate"}`: `failed` counts the deliveries that ended `failed` or `dead`;
/// `rate` is succeeded / (succeeded + failed), `null` while none has ended either way.
fn success_view(stats: Option<&hookline_log::Stats>) -> Value {
    use hookline_log::DeliveryState as D;
    let count = |want: &[D]| stats.map_or(0, |st| st.by_state.iter().filter(|(d, _)| want.contains(d)).map(|(_, n)| *n).sum::<u64>());
    let (ok, failed, pending) = (count(&[D::Succeeded]), count(&[D::Failed, D::Dead]), count(&[D::Pending]));
    let ended = ok.saturating_add(failed);
    let rate = (ended > 0).then(|| ok as f64 / ended as f64);
    json!({"succeeded": ok, "failed": failed, "pending": pending, "rate": rate})
}

pub async fn update(
    State(s): State<Arc<ApiState>>,
    Extension(who): Extension<Principal>,
    Path(id): Path<String>,
    ApiJson(req): ApiJson<UpdateSubscription>,
) -> Result<Json<Value>, ApiError> {
    who.require_write()?;
    let entry = find(&s, &who, &id)?;
    let mut sub = entry.sub.to_subscription();
    if let Some(v) = req.url {
        sub.url = v;
    }
    if let Some(v) = req.event_types {
        sub.event_types = v;
    }
    if let Some(v) = req.policy {
        sub.policy = v;
        sub.policy_toml.clear();
    }
    if let Some(v) = req.policy_toml {
        sub.policy_toml = v;
    }
    if let Some(v) = req.description {
        sub.description = v;
    }
    if let Some(v) = req.metadata {
        sub.metadata = v;
    }
    if let Some(v) = req.owner_email {
        sub.owner_email = v;
    }
    if let Some(v) = req.headers {
        sub.headers = v;
    }
    if let Some(v) = req.shown_headers {
        sub.shown_headers = v;
    }
    if let Some(v) = req.filter {
        sub.filter_json = stored_filter(Some(&v))?;
    }
    if let Some(v) = req.rate_limit_per_s {
        sub.rate_limit_per_s = v;
    }
    if let Some(v) = req.burst {
        sub.burst = v;
    }
    if let Some(word) = &req.ordering {
        sub.ordering = ordering_mode(word)?;
        if sub.ordering != hookline_core::model::OrderingMode::Key as i32 && req.ordering_key.is_none() {
            sub.ordering_key.clear();
        }
    }
    if let Some(v) = req.ordering_key {
        sub.ordering_key = v;
    }
    // A key's head and parked deliveries are found by the key they were given: the keying may not change under them.
    if (sub.ordering, sub.ordering_key.as_str()) != (entry.sub.ordering(), entry.sub.ordering_key()) {
        let out = s.states.get(&id).map_or(0, |st| st.ordering_heads.len());
        if out > 0 {
            let field = if sub.ordering != entry.sub.ordering() { "ordering" } else { "ordering_key" };
            return Err(ApiError::field(
                field,
                format!("cannot change while {out} keys hold deliveries (`ordering_keys_out`); retry once it is 0"),
            ));
        }
    }
    if let Some(enabled) = req.enabled {
        // Gauge: `PATCH {"enabled": true}` switches an endpoint back on and clears `disabled_reason`.
        if enabled && !activity(&sub, s.states.get(&id).as_ref()).is_active() {
            sub.resume_generation += 1;
            sub.paused = false;
        }
        sub.enabled = enabled;
    }
    sub.updated_at_ms = crate::now_ms();
    super::event_types::check_subscribed(&s, &sub.event_types, &entry.sub.event_types)?;
    validate_shown_headers(&mut sub)?;
    let pol = validate(&s, &sub).await?;
    // A new URL is challenged before it is saved: until it passes, deliveries wait (held) rather than reach it.
    if super::verify::needs_challenge(&mut sub, Some(&entry.sub.to_subscription()), &pol) {
        super::verify::challenge(&s, &mut sub, &pol).await;
    }
    write(&s, &sub).await?;
    Ok(Json(shown(&s, &SubscriptionEntry::new(sub)).await))
}

pub async fn delete(
    State(s): State<Arc<ApiState>>,
    Extension(who): Extension<Principal>,
    Path(id): Path<String>,
) -> Result<StatusCode, ApiError> {
    who.require_write()?;
    find(&s, &who, &id)?;
    let (p, o) = produce(&s, &id, None).await?;
    s.subs_reader.wait_for(p, o + 1).await;
    Ok(StatusCode::NO_CONTENT)
}

pub async fn pause(
    State(s): State<Arc<ApiState>>,
    Extension(who): Extension<Principal>,
    Path(id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    who.require_write()?;
    let mut sub = find(&s, &who, &id)?.sub.to_subscription();
    sub.paused = true;
    sub.updated_at_ms = crate::now_ms();
    write(&s, &sub).await?;
    Ok(Json(shown(&s, &SubscriptionEntry::new(sub)).await))
}

/// Resumes a paused subscription, including one the policy paused automatically (LuciBook's auto-pause).
pub async fn resume(
    State(s): State<Arc<ApiState>>,
    Extension(who): Extension<Principal>,
    Path(id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    who.require_write()?;
    let mut sub = find(&s, &who, &id)?.sub.to_subscription();
    if !sub.enabled {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            "subscription_disabled",
            "the subscription is disabled; enable it with PATCH {\"enabled\": true}",
        )
        .with_field("id"));
    }
    sub.paused = false;
    sub.resume_generation += 1;
    sub.updated_at_ms = crate::now_ms();
    write(&s, &sub).await?;
    Ok(Json(shown(&s, &SubscriptionEntry::new(sub)).await))
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct RotateSecret {
    /// How long the old secret keeps signing next to the new one (default one day).
    overlap_s: Option<u64>,
    /// The new secret; generated when absent.
    secret: Option<String>,
}

/// Rotates the signing secret: the new one signs from now on; older ones keep signing (a second signature in
/// the same header) until the overlap ends, so receivers can switch without a gap. The new secret is shown once.
pub async fn rotate_secret(
    State(s): State<Arc<ApiState>>,
    Extension(who): Extension<Principal>,
    Path(id): Path<String>,
    body: Result<axum::body::Bytes, axum::extract::rejection::BytesRejection>,
) -> Result<Json<Value>, ApiError> {
    who.require_write()?;
    // The body is optional: an empty POST rotates with the defaults.
    let req: RotateSecret = crate::optional_body(&body.map_err(super::body_unreadable)?)?;
    let overlap_s = req.overlap_s.unwrap_or(86_400);
    if overlap_s > 30 * 86_400 {
        return Err(ApiError::field("overlap_s", "at most 30 days (2592000 s)"));
    }
    let mut sub = find(&s, &who, &id)?.sub.to_subscription();
    let now = crate::now_ms();
    let secret = match req.secret {
        Some(secret) => {
            at_most("secret", &secret, MAX_SECRET_BYTES)?;
            hookline_core::sign::standard_signature(&secret, "probe", 0, b"").map_err(|e| ApiError::field("secret", e.to_string()))?;
            secret
        }
        None => hookline_core::sign::generate_secret(&mut rand::rng()),
    };
    let until = now + (overlap_s as i64) * 1000;
    for old in sub.secrets.iter_mut() {
        if old.expires_at_ms == 0 || old.expires_at_ms > until {
            old.expires_at_ms = until;
        }
    }
    sub.secrets.retain(|x| x.expires_at_ms > now);
    sub.secrets.insert(0, Secret { value: secret.clone(), expires_at_ms: 0, ..Default::default() });
    sub.updated_at_ms = now;
    write(&s, &sub).await?;
    let mut v = shown(&s, &SubscriptionEntry::new(sub)).await;
    v["secret"] = json!(secret);
    v["previous_secrets_expire_at_ms"] = json!(until);
    Ok(Json(v))
}

/// The subscription `id`, if this credential may see it: another tenant's answers 404, as a missing one does.
pub(crate) fn find(s: &ApiState, who: &Principal, id: &str) -> Result<Arc<SubscriptionEntry>, ApiError> {
    s.subs
        .get(id)
        .filter(|e| who.sees(&e.sub.tenant))
        .ok_or_else(|| ApiError::new(StatusCode::NOT_FOUND, "not_found", format!("no subscription {id}")).with_field("id"))
}

/// Size limits of a subscription's fields (bytes of UTF-8), checked before anything else so an oversized
/// subscription is refused as such rather than failing later as a Kafka record too large (docs/api.md).
pub const MAX_URL_BYTES: usize = 2048;
pub const MAX_DESCRIPTION_BYTES: usize = 4096;
/// RFC 5321's limit on a forward path.
pub const MAX_OWNER_EMAIL_BYTES: usize = 254;
pub const MAX_EVENT_TYPES: usize = 100;
pub const MAX_EVENT_TYPE_BYTES: usize = 255;
pub const MAX_METADATA_ENTRIES: usize = 50;
pub const MAX_METADATA_KEY_BYTES: usize = 100;
pub const MAX_METADATA_VALUE_BYTES: usize = 1000;
pub const MAX_POLICY_NAME_BYTES: usize = 100;
pub const MAX_POLICY_TOML_BYTES: usize = 64 << 10;
pub const MAX_TENANT_BYTES: usize = hookline_core::filter::MAX_TENANT_LEN;
pub const MAX_SECRET_BYTES: usize = 512;

/// A payload filter as stored: parsed (a 422 naming the place in the filter, e.g. `filter.all[1].path`) and
/// written back canonically; `None` or `null` = no filter.
fn stored_filter(filter: Option<&Value>) -> Result<String, ApiError> {
    match filter {
        None | Some(Value::Null) => Ok(String::new()),
        Some(v) => {
            let parsed = hookline_core::payload_filter::Filter::parse(v).map_err(|e| ApiError::field(&e.location, e.message))?;
            let text = parsed.to_json().to_string();
            at_most("filter", &text, hookline_core::payload_filter::MAX_FILTER_BYTES)?;
            Ok(text)
        }
    }
}

/// One plain address (`owner@example.com`): one `@` between a local part and a dotted domain, no spaces or control
/// characters (a CR or LF would make a mail header of it), no display name. Refused on save, so mail that could
/// never go is not silently dropped later.
fn email_address(a: &str) -> Result<(), String> {
    if a.chars().any(|c| c.is_control() || c.is_whitespace()) {
        return Err("an e-mail address has no spaces, line breaks or control characters".into());
    }
    let Some((local, domain)) = a.split_once('@') else { return Err(format!("{a:?} is not an e-mail address (name@domain)")) };
    let bad_domain = domain.is_empty()
        || domain.contains('@')
        || domain.starts_with('.')
        || domain.ends_with('.')
        || domain.contains("..")
        || !domain.chars().all(|c| c.is_alphanumeric() || c == '.' || c == '-');
    if local.is_empty() || bad_domain || a.contains(['<', '>', ',', ';', '"']) {
        return Err(format!("{a:?} is not an e-mail address (name@domain)"));
    }
    Ok(())
}

fn at_most(field: &str, value: &str, max: usize) -> Result<(), ApiError> {
    if value.len() > max {
        return Err(ApiError::field(field, format!("at most {max} bytes, got {}", value.len())));
    }
    Ok(())
}

/// Every field within its size limit.
fn bounds(sub: &Subscription) -> Result<(), ApiError> {
    at_most("url", &sub.url, MAX_URL_BYTES)?;
    at_most("description", &sub.description, MAX_DESCRIPTION_BYTES)?;
    at_most("owner_email", &sub.owner_email, MAX_OWNER_EMAIL_BYTES)?;
    if !sub.owner_email.is_empty() {
        email_address(&sub.owner_email).map_err(|e| ApiError::field("owner_email", e))?;
    }
    at_most("policy", &sub.policy, MAX_POLICY_NAME_BYTES)?;
    at_most("policy_toml", &sub.policy_toml, MAX_POLICY_TOML_BYTES)?;
    at_most("tenant", &sub.tenant, MAX_TENANT_BYTES)?;
    if sub.event_types.len() > MAX_EVENT_TYPES {
        return Err(ApiError::field(
            "event_types",
            format!("at most {MAX_EVENT_TYPES} event types (use a pattern such as \"order.*\"), got {}", sub.event_types.len()),
        ));
    }
    for (i, t) in sub.event_types.iter().enumerate() {
        at_most(&format!("event_types[{i}]"), t, MAX_EVENT_TYPE_BYTES)?;
    }
    if sub.metadata.len() > MAX_METADATA_ENTRIES {
        return Err(ApiError::field("metadata", format!("at most {MAX_METADATA_ENTRIES} entries, got {}", sub.metadata.len())));
    }
    // Sorted, so the same request always names the same key.
    let mut keys: Vec<&String> = sub.metadata.keys().collect();
    keys.sort();
    for k in keys {
        if k.len() > MAX_METADATA_KEY_BYTES {
            return Err(ApiError::field("metadata", format!("keys are at most {MAX_METADATA_KEY_BYTES} bytes, got one of {}", k.len())));
        }
        at_most(&format!("metadata.{k}"), &sub.metadata[k], MAX_METADATA_VALUE_BYTES)?;
    }
    Ok(())
}

/// Checks a subscription about to be saved; returns its policy.
async fn validate(s: &ApiState, sub: &Subscription) -> Result<policy::Policy, ApiError> {
    bounds(sub)?;
    if sub.event_types.is_empty() {
        return Err(ApiError::field("event_types", "at least one event type (or \"*\") is required"));
    }
    for (i, t) in sub.event_types.iter().enumerate() {
        hookline_core::filter::validate(t).map_err(|e| ApiError::field(&format!("event_types[{i}]"), e))?;
    }
    hookline_core::filter::validate_tenant(&sub.tenant).map_err(|e| ApiError::field("tenant", e))?;
    let pol = policy::resolve(&sub.policy, &sub.policy_toml).map_err(|e| {
        let field = if sub.policy_toml.is_empty() { "policy" } else { "policy_toml" };
        ApiError::field(field, e.to_string())
    })?;
    hookline_core::custom_headers::validate(&sub.headers, &pol).map_err(|e| {
        let field = if e.name.is_empty() { "headers".to_owned() } else { format!("headers.{}", e.name) };
        ApiError::field(&field, e.message)
    })?;
    hookline_core::rate_limit::validate(sub.rate_limit_per_s, sub.burst, &pol).map_err(|(field, e)| ApiError::field(field, e))?;
    hookline_core::ordering::Ordering::from_fields(sub.ordering, &sub.ordering_key).map_err(|e| ApiError::field(e.field, e.message))?;
    let guard = EgressGuard::new(&s.egress, &pol.egress).map_err(|e| ApiError::field("policy_toml", e.to_string()))?;
    let target = guard.check_url(&sub.url).map_err(|r| ApiError::field("url", r.reason))?;
    // Resolved now as well as on every attempt: a name that points inside is refused when it is saved.
    let addrs = match &target.host {
        TargetHost::Ip(ip) => vec![*ip],
        TargetHost::Name(name) => tokio::net::lookup_host((name.as_str(), target.port))
            .await
            .map_err(|e| ApiError::field("url", format!("cannot resolve {name}: {e}")))?
            .map(|a| a.ip())
            .collect(),
    };
    guard.check_resolved(&target, &addrs).map_err(|r| ApiError::field("url", r.reason))?;
    Ok(pol)
}

/// Writes `sub` with its signing secrets sealed (with the keyring's write key: a rewrite also re-seals what an
/// older key sealed).
pub(crate) async fn write(s: &ApiState, sub: &Subscription) -> Result<(), ApiError> {
    let mut sealed = sub.clone();
    hookline_core::seal::seal_secrets(&mut sealed, &s.keyring, &mut rand::rng());
    let (p, o) = produce(s, &sub.id, Some(sealed.encode_to_vec())).await?;
    s.subs_reader.wait_for(p, o + 1).await;
    Ok(())
}

async fn produce(s: &ApiState, id: &str, value: Option<Vec<u8>>) -> Result<(i32, i64), ApiError> {
    let topic = s.topics.subscriptions();
    let record = rdkafka::producer::FutureRecord::<str, [u8]>::to(topic).key(id);
    let record = match &value {
        Some(v) => record.payload(v.as_slice()),
        None => record,
    };
    s.producer
        .send(record, std::time::Duration::from_secs(10))
        .await
        .map(|d| (d.partition, d.offset))
        .map_err(|(e, _)| ApiError::unavailable(e))
}

/// The API's view: never the secret.
pub(super) fn view(s: &ApiState, e: &SubscriptionEntry) -> Value {
    // The API's reads are not the delivery path: the record is rebuilt from its held form for the view.
    let sub = &e.sub.to_subscription();
    let state = s.states.get(&sub.id);
    let act = activity(sub, state.as_ref());
    let st = state.unwrap_or_default();
    let auto_reason = match act {
        hookline_core::subscription::Activity::AutoPaused(ref r) | hookline_core::subscription::Activity::AutoDisabled(ref r) => {
            Some(r.clone())
        }
        _ => None,
    };
    json!({
        "id": sub.id,
        "url": sub.url,
        "event_types": sub.event_types,
        "policy": if sub.policy_toml.is_empty() { json!(sub.policy) } else { json!("inline") },
        "policy_error": e.policy.as_ref().err(),
        "description": sub.description,
        "metadata": sub.metadata,
        "enabled": sub.enabled && !matches!(act, hookline_core::subscription::Activity::AutoDisabled(_)),
        "paused": sub.paused || matches!(act, hookline_core::subscription::Activity::AutoPaused(_)),
        "state": act.word(),
        "disabled_reason": auto_reason,
        "consecutive_failures": st.consecutive_failures,
        "first_failure_at_ms": (st.first_failure_at_ms > 0).then_some(st.first_failure_at_ms),
        "last_success_at_ms": (st.last_success_at_ms > 0).then_some(st.last_success_at_ms),
        "endpoint_condition": hookline_core::vocabulary::endpoint_condition(st.condition),
        // The portal's badge: switched off (by its owner or policy) first, then failing or healthy.
        "health": hookline_core::subscription::health(&act, Some(&st)).word(),
        // The policy's `[concurrency]`: concurrent requests the endpoint gets now (null: not adaptive).
        "concurrency_limit": (st.concurrency_limit > 0).then_some(st.concurrency_limit),
        // The policy's `[breaker]`: open while the endpoint gets no requests after repeated connect errors.
        "circuit_breaker": match st.breaker_open_until_ms {
            0 => json!({"state": "closed", "open_until_ms": null}),
            until if until > crate::now_ms() => json!({"state": "open", "open_until_ms": until}),
            // Past its cool-off: the next delivery is the probe.
            until => json!({"state": "probing", "open_until_ms": until}),
        },
        "owner_email": sub.owner_email,
        "tenant": sub.tenant,
        // Values are write-only (they often carry credentials), as the secret is.
        "header_names": header_names(sub),
        "shown_headers": sub.shown_headers,
        "rate_limit_per_s": (sub.rate_limit_per_s > 0).then_some(sub.rate_limit_per_s),
        "burst": (sub.burst > 0).then_some(sub.burst),
        // What the dispatcher enforces: these fields over the policy's `[rate_limit]` defaults.
        "rate_limit": e.rate_limit.map(|r| json!({"per_s": r.per_s, "burst": r.burst})),
        "ordering": hookline_core::ordering::Ordering::word(sub.ordering),
        "ordering_key": (!sub.ordering_key.is_empty()).then_some(&sub.ordering_key),
        // Keys holding deliveries: a head out (sending or on the retry ladder) or deliveries parked behind it.
        "ordering_keys_out": st.ordering_heads.len(),
        "verification": hookline_core::vocabulary::verification_state(sub.verification),
        "verification_error": (!sub.verification_error.is_empty()).then_some(&sub.verification_error),
        "verified_at_ms": (sub.verified_at_ms > 0).then_some(sub.verified_at_ms),
        // What a CloudEvents handshake's `WebHook-Allowed-Rate` granted (null: no limit, none stated, no handshake).
        "verification_allowed_rate_per_min": (sub.verification_allowed_rate_per_min > 0).then_some(sub.verification_allowed_rate_per_min),
        "filter": match &e.filter {
            Ok(Some(f)) => f.to_json(),
            _ => Value::Null,
        },
        "created_at_ms": sub.created_at_ms,
        "updated_at_ms": sub.updated_at_ms,
    })
}

/// `shown_headers` names custom headers the subscription has, each once (compared without case); stored in lower
/// case, as the request sends header names.
fn validate_shown_headers(sub: &mut Subscription) -> Result<(), ApiError> {
    let mut seen = std::collections::BTreeSet::new();
    for (i, name) in sub.shown_headers.iter().enumerate() {
        let field = format!("shown_headers[{i}]");
        if !sub.headers.keys().any(|h| h.eq_ignore_ascii_case(name)) {
            return Err(ApiError::field(&field, format!("{name:?} is not one of the subscription's custom headers")));
        }
        if !seen.insert(name.to_ascii_lowercase()) {
            return Err(ApiError::field(&field, format!("{name:?} is listed twice")));
        }
    }
    sub.shown_headers = seen.into_iter().collect();
    Ok(())
}

fn header_names(sub: &Subscription) -> Vec<&str> {
    let mut v: Vec<&str> = sub.headers.keys().map(String::as_str).collect();
    v.sort_unstable();
    v
}

fn hex_id() -> String {
    let bytes: [u8; 12] = rand::rng().random();
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}
