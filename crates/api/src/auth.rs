//! Who is calling. Three kinds of bearer credential: an admin token (`ingest.api_tokens`, sees everything), a
//! tenant API key (`hlk_…`, sees and changes only its tenant), and a portal link's token (`hlp_…`, signed, short
//! lived, its tenant only, optionally read-only). The middleware turns the `Authorization` header into a
//! [`Principal`] that every handler consults; what another tenant owns answers 404, as if it did not exist.

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{header, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use hookline_core::credential::{self, API_KEY_PREFIX, PORTAL_TOKEN_PREFIX};
use hookline_core::model::ApiKeyUsage;
use prost::Message as _;
use subtle::ConstantTimeEq;

use super::{ApiError, ApiState};

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Principal {
    Admin,
    TenantKey { tenant: String, key_id: String },
    PortalLink { tenant: String, read_only: bool, expires_at_ms: i64 },
}

/// The words of `GET /v1/whoami`'s `kind`, in [`Principal::kind`]'s order.
pub const CREDENTIAL_KINDS: [&str; 3] = ["admin", "tenant_key", "portal_link"];

impl Principal {
    pub fn kind(&self) -> &'static str {
        match self {
            Principal::Admin => CREDENTIAL_KINDS[0],
            Principal::TenantKey { .. } => CREDENTIAL_KINDS[1],
            Principal::PortalLink { .. } => CREDENTIAL_KINDS[2],
        }
    }

    /// The tenant this credential is confined to; `None` for an admin.
    pub fn tenant(&self) -> Option<&str> {
        match self {
            Principal::Admin => None,
            Principal::TenantKey { tenant, .. } | Principal::PortalLink { tenant, .. } => Some(tenant),
        }
    }

    /// Whether what belongs to `tenant` (`""`: no tenant) is visible to this credential.
    pub fn sees(&self, tenant: &str) -> bool {
        self.tenant().is_none_or(|t| t == tenant)
    }

    /// 403 unless an admin token: tenants, keys and links are managed by the app, not its customers.
    pub fn require_admin(&self) -> Result<(), ApiError> {
        match self {
            Principal::Admin => Ok(()),
            _ => Err(forbidden("this route needs an admin token; a tenant API key or portal link cannot use it")),
        }
    }

    /// 403 for a read-only portal link.
    pub fn require_write(&self) -> Result<(), ApiError> {
        match self {
            Principal::PortalLink { read_only: true, .. } => Err(forbidden("this portal link is read-only")),
            _ => Ok(()),
        }
    }

    /// The tenant a request names, checked against the credential: a tenant credential gets its own tenant when the
    /// request names none, and a 403 (naming `field`) when it names another.
    pub fn tenant_for(&self, named: Option<&str>, field: &str) -> Result<Option<String>, ApiError> {
        // An empty tenant is no tenant.
        let named = named.filter(|n| !n.is_empty());
        match (self.tenant(), named) {
            (None, named) => Ok(named.map(str::to_owned)),
            (Some(own), None) => Ok(Some(own.to_owned())),
            (Some(own), Some(n)) if n == own => Ok(Some(own.to_owned())),
            (Some(own), Some(_)) => {
                Err(forbidden(&format!("this credential belongs to tenant {own:?} and cannot act for another")).with_field(field))
            }
        }
    }
}

/// A credential that may not do what it asks: `field` is `Authorization` (the credential), unless a caller names the
/// request's field it may not set.
pub fn forbidden(message: &str) -> ApiError {
    ApiError::new(StatusCode::FORBIDDEN, "forbidden", message).with_field("Authorization")
}

/// Why a credential was refused: 401 `link_expired` for a portal link that was genuine but is past its time (so
/// the portal can say "ask for a new one" rather than "not valid"), 401 `unauthorized` for everything else.
enum Refusal {
    Invalid(&'static str),
    Expired,
}

fn unauthorized(refusal: Refusal) -> Response {
    let e = match refusal {
        Refusal::Invalid(message) => ApiError::new(StatusCode::UNAUTHORIZED, "unauthorized", message),
        Refusal::Expired => ApiError::new(StatusCode::UNAUTHORIZED, "link_expired", "the portal link has expired; ask for a new one"),
    };
    e.with_field("Authorization").into_response()
}

pub async fn middleware(State(s): State<Arc<ApiState>>, mut req: Request, next: Next) -> Response {
    let presented = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        // The scheme name is case-insensitive (RFC 9110 §11.1).
        .and_then(|v| v.split_once(' ').filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer")).map(|(_, t)| t))
        .map(str::trim)
        .filter(|t| !t.is_empty());
    let Some(presented) = presented else {
        return unauthorized(Refusal::Invalid("missing `Authorization: Bearer <token>` header"));
    };
    let principal = match identify(&s, presented) {
        Ok(p) => p,
        Err(refusal) => return unauthorized(refusal),
    };
    req.extensions_mut().insert(principal);
    next.run(req).await
}

fn identify(s: &Arc<ApiState>, presented: &str) -> Result<Principal, Refusal> {
    let refuse = Refusal::Invalid;
    // Constant-time per token, and every token is compared, so timing reveals neither content nor position.
    let admin = s.tokens.iter().fold(false, |acc, t| acc | bool::from(t.as_bytes().ct_eq(presented.as_bytes())));
    if admin {
        return Ok(Principal::Admin);
    }
    if presented.starts_with(API_KEY_PREFIX) {
        // Looked up by digest: a map probe on SHA-256 output tells a timing observer nothing about the key.
        let key = s.keys.find(&credential::api_key_digest(presented)).ok_or(refuse("the API key is not valid (unknown or revoked)"))?;
        if !s.tenants.contains(&key.tenant) {
            return Err(refuse("the API key's tenant no longer exists"));
        }
        let now = crate::now_ms();
        if s.keys.touch(&key.id, now) {
            record_use(s.clone(), key.id.clone(), now);
        }
        return Ok(Principal::TenantKey { tenant: key.tenant.clone(), key_id: key.id.clone() });
    }
    if presented.starts_with(PORTAL_TOKEN_PREFIX) {
        let secret = s.portal.link_secret.as_deref().ok_or(refuse("portal links are not enabled on this server"))?;
        let grant = credential::verify_portal_token(presented, secret.as_bytes(), crate::now_ms()).map_err(|e| match e {
            credential::PortalTokenError::Expired => Refusal::Expired,
            credential::PortalTokenError::BadSignature => refuse("the portal link is not valid (its signature does not match)"),
            credential::PortalTokenError::Malformed => refuse("the portal link is malformed"),
        })?;
        if !s.tenants.contains(&grant.tenant) {
            return Err(refuse("the portal link's tenant no longer exists"));
        }
        return Ok(Principal::PortalLink { tenant: grant.tenant, read_only: grant.read_only, expires_at_ms: grant.expires_at_ms });
    }
    Err(refuse("the bearer token is not valid"))
}

/// `GET /v1/whoami`: what the credential is and may do, so a client (the portal) offers only what will not be
/// refused. Any valid credential may ask.
pub async fn whoami(State(s): State<Arc<ApiState>>, axum::Extension(who): axum::Extension<Principal>) -> axum::Json<serde_json::Value> {
    let tenant = who.tenant();
    let name = tenant.and_then(|t| s.tenants.get(t)).map(|t| t.name.clone());
    let (read_only, expires) = match &who {
        Principal::PortalLink { read_only, expires_at_ms, .. } => (*read_only, Some(*expires_at_ms)),
        _ => (false, None),
    };
    axum::Json(serde_json::json!({
        "kind": who.kind(),
        "tenant": tenant,
        "tenant_name": name,
        "read_only": read_only,
        "expires_at_ms": expires,
        "admin": who.require_admin().is_ok(),
        "can_write": who.require_write().is_ok(),
    }))
}

/// Records a key's last use on the topic, off the request's path (a lost write only makes the shown time older).
fn record_use(s: Arc<ApiState>, key_id: String, now_ms: i64) {
    tokio::spawn(async move {
        let usage = ApiKeyUsage { key_id: key_id.clone(), last_used_at_ms: now_ms }.encode_to_vec();
        let key = format!("{key_id}{}", crate::tenant_tables::USAGE_SUFFIX);
        if let Err(e) = hookline_kafka::produce::send(&s.producer, s.topics.api_keys(), &key, &usage).await {
            tracing::warn!(key_id = %key_id, error = %e, "could not record an API key's last use");
        }
    });
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_refused_credential_names_the_field_it_is_about() {
        let e = super::forbidden("this portal link is read-only");
        assert_eq!((e.status.as_u16(), e.code, e.field.as_deref()), (403, "forbidden", Some("Authorization")));
        let e = super::forbidden("another tenant").with_field("tenant");
        assert_eq!(e.field.as_deref(), Some("tenant"));
    }
}
