//! `GET /portal` and `GET /portal/{file}`: the portal, a web page where app owners see their subscriptions'
//! delivery log, resume them and replay. Plain HTML, CSS and JavaScript modules from `crates/api/portal/`,
//! embedded in the binary (nothing is fetched from elsewhere). The page is public; every data call it makes carries
//! the bearer token its user typed, or the portal link's token it was opened with (`#token=hlp_…`).

use std::sync::Arc;

use axum::extract::{Path, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};

use super::{ApiError, ApiState};

/// (file name, content type, bytes).
const ASSETS: &[(&str, &str, &[u8])] = &[
    ("index.html", "text/html; charset=utf-8", include_bytes!("../portal/index.html")),
    ("app.js", "text/javascript; charset=utf-8", include_bytes!("../portal/app.js")),
    ("chart.js", "text/javascript; charset=utf-8", include_bytes!("../portal/chart.js")),
    ("style.css", "text/css; charset=utf-8", include_bytes!("../portal/style.css")),
    ("favicon.svg", "image/svg+xml", include_bytes!("../portal/favicon.svg")),
];

/// Scripts, styles, images and API calls from this origin only; no inline scripts or styles, and no form ever
/// submitted by the browser itself (the token must never end up in a URL). Framing only by the origins of
/// `ingest.portal.frame_ancestors` (an app embedding the portal for its customers), by none when it is empty.
fn csp(frame_ancestors: &[String]) -> String {
    let ancestors = if frame_ancestors.is_empty() { "'none'".to_owned() } else { frame_ancestors.join(" ") };
    format!(
        "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; \
         object-src 'none'; base-uri 'none'; form-action 'none'; frame-ancestors {ancestors}"
    )
}

pub async fn index(State(s): State<Arc<ApiState>>, headers: HeaderMap) -> Response {
    serve("index.html", &headers, &s.portal.frame_ancestors)
}

pub async fn file(State(s): State<Arc<ApiState>>, Path(file): Path<String>, headers: HeaderMap) -> Response {
    serve(&file, &headers, &s.portal.frame_ancestors)
}

fn serve(name: &str, headers: &HeaderMap, frame_ancestors: &[String]) -> Response {
    let Some((_, content_type, body)) = ASSETS.iter().find(|(n, _, _)| *n == name) else {
        return ApiError::new(StatusCode::NOT_FOUND, "not_found", format!("no portal file {name}")).with_field("file").into_response();
    };
    // The files change with the binary, not with their names: revalidate every time, with an ETag of the content.
    let etag = format!("\"{:016x}\"", fnv1a(body));
    let fresh = headers.get(header::IF_NONE_MATCH).and_then(|v| v.to_str().ok()).is_some_and(|v| v.split(',').any(|t| t.trim() == etag));
    let mut resp = if fresh { StatusCode::NOT_MODIFIED.into_response() } else { (StatusCode::OK, *body).into_response() };
    let h = resp.headers_mut();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    h.insert(header::ETAG, HeaderValue::from_str(&etag).expect("hex etag"));
    // The sources were checked at config load (visible ASCII, no `;` or `,`), so the header value is valid.
    if let Ok(v) = HeaderValue::from_str(&csp(frame_ancestors)) {
        h.insert(header::CONTENT_SECURITY_POLICY, v);
    }
    h.insert(header::X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
    h.insert(header::REFERRER_POLICY, HeaderValue::from_static("no-referrer"));
    // For browsers without CSP level 2; it cannot name origins, so it is left out when some may frame the portal.
    if frame_ancestors.is_empty() {
        h.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    }
    resp
}

fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, b| (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn serves_the_embedded_files_with_their_type_and_a_strict_policy() {
        let r = serve("index.html", &HeaderMap::new(), &[]);
        assert_eq!(r.status(), StatusCode::OK);
        assert_eq!(r.headers()[header::CONTENT_TYPE], "text/html; charset=utf-8");
        let policy = r.headers()[header::CONTENT_SECURITY_POLICY].to_str().unwrap().to_owned();
        assert!(policy.starts_with("default-src 'self'") && policy.ends_with("frame-ancestors 'none'"), "{policy}");
        assert_eq!(r.headers()[header::X_FRAME_OPTIONS], "DENY");
        let r = serve("app.js", &HeaderMap::new(), &[]);
        assert_eq!(r.headers()[header::CONTENT_TYPE], "text/javascript; charset=utf-8");
        let etag = r.headers()[header::ETAG].clone();
        let mut h = HeaderMap::new();
        h.insert(header::IF_NONE_MATCH, etag);
        assert_eq!(serve("app.js", &h, &[]).status(), StatusCode::NOT_MODIFIED);
        assert_eq!(serve("../Cargo.toml", &HeaderMap::new(), &[]).status(), StatusCode::NOT_FOUND);
    }

    #[test]
    fn configured_origins_may_frame_the_portal() {
        let origins = ["https://app.example.com".to_owned(), "'self'".to_owned()];
        let r = serve("index.html", &HeaderMap::new(), &origins);
        let policy = r.headers()[header::CONTENT_SECURITY_POLICY].to_str().unwrap().to_owned();
        assert!(policy.ends_with("frame-ancestors https://app.example.com 'self'"), "{policy}");
        assert!(r.headers().get(header::X_FRAME_OPTIONS).is_none());
    }

    #[test]
    fn no_inline_script_or_style_in_the_page() {
        let html = std::str::from_utf8(ASSETS[0].2).unwrap();
        assert!(!html.contains("<script>") && !html.contains("style=") && !html.contains("<style"));
        let handler = html.split(" on").skip(1).any(|rest| {
            let name: String = rest.chars().take_while(char::is_ascii_alphabetic).collect();
            !name.is_empty() && rest[name.len()..].starts_with('=')
        });
        assert!(!handler, "no inline event handler attributes");
    }
}
