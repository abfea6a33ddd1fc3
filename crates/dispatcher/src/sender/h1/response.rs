//! The response head: parsed with `httparse`, then how its body is framed and whether the connection may be
//! used again (RFC 9112 §6.3, §9.3).

use http::header::{CONNECTION, CONTENT_LENGTH, TRANSFER_ENCODING};
use http::{HeaderMap, HeaderName, HeaderValue, StatusCode};

use super::Error;

/// Most header fields in a response head (hyper's default too).
pub const MAX_HEADERS: usize = 100;

/// How the body after a head ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Framing {
    /// No body: 204, 304 (1xx are skipped before this).
    Empty,
    Length(u64),
    Chunked,
    /// Read to the end of the connection (which then cannot be reused).
    Close,
}

#[derive(Debug)]
pub struct Head {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub framing: Framing,
    /// Neither the response's `Connection` nor its version rules out another request on the connection.
    pub keep_alive: bool,
}

/// Parses a complete head at the start of `buf`: `Ok(None)` while it is incomplete, else its length and the head.
pub fn parse(buf: &[u8]) -> Result<Option<(usize, Head)>, Error> {
    let mut fields = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut resp = httparse::Response::new(&mut fields);
    let len = match resp.parse(buf) {
        Ok(httparse::Status::Complete(n)) => n,
        Ok(httparse::Status::Partial) => return Ok(None),
        Err(httparse::Error::TooManyHeaders) => return Err(Error::Malformed(format!("more than {MAX_HEADERS} header fields"))),
        Err(e) => return Err(Error::Malformed(format!("invalid response head: {e}"))),
    };
    let code = resp.code.unwrap_or(0);
    let status = StatusCode::from_u16(code).map_err(|_| Error::Malformed(format!("invalid status code {code}")))?;
    let mut headers = HeaderMap::with_capacity(resp.headers.len());
    for h in resp.headers.iter() {
        let name = HeaderName::from_bytes(h.name.as_bytes()).map_err(|_| Error::Malformed(format!("invalid header name {:?}", h.name)))?;
        let value = HeaderValue::from_bytes(h.value).map_err(|_| Error::Malformed(format!("invalid value of header {:?}", h.name)))?;
        headers.append(name, value);
    }
    let framing = framing(status, &headers)?;
    let keep_alive = match resp.version {
        Some(1) => !has_token(&headers, CONNECTION, "close"),
        // HTTP/1.0: only when the receiver offers it.
        _ => has_token(&headers, CONNECTION, "keep-alive") && !has_token(&headers, CONNECTION, "close"),
    };
    Ok(Some((len, Head { status, headers, framing, keep_alive })))
}

/// The body's framing by RFC 9112 §6.3 for a response to a POST; conflicting or invalid framing is an error (the
/// message boundary cannot be trusted).
fn framing(status: StatusCode, headers: &HeaderMap) -> Result<Framing, Error> {
    if status == StatusCode::NO_CONTENT || status == StatusCode::NOT_MODIFIED || status.is_informational() {
        return Ok(Framing::Empty);
    }
    let chunked_last = {
        let mut codings = tokens(headers, TRANSFER_ENCODING).peekable();
        if codings.peek().is_none() {
            None
        } else {
            let mut last = None;
            let mut chunked_before = false;
            for c in codings {
                if last.is_some_and(|l: &str| l.eq_ignore_ascii_case("chunked")) {
                    chunked_before = true;
                }
                last = Some(c);
            }
            if chunked_before {
                return Err(Error::Malformed("transfer-encoding: chunked is not the final coding".into()));
            }
            Some(last.is_some_and(|l| l.eq_ignore_ascii_case("chunked")))
        }
    };
    let length = content_length(headers)?;
    match (chunked_last, length) {
        (Some(_), Some(_)) => Err(Error::Malformed("both content-length and transfer-encoding".into())),
        (Some(true), None) => Ok(Framing::Chunked),
        // Another final coding: the body runs to the end of the connection.
        (Some(false), None) => Ok(Framing::Close),
        (None, Some(0)) => Ok(Framing::Empty),
        (None, Some(n)) => Ok(Framing::Length(n)),
        (None, None) => Ok(Framing::Close),
    }
}

/// The `content-length`, which every field and list element must agree on.
fn content_length(headers: &HeaderMap) -> Result<Option<u64>, Error> {
    let mut found: Option<u64> = None;
    for value in headers.get_all(CONTENT_LENGTH) {
        for part in value.as_bytes().split(|b| *b == b',') {
            let part = part.trim_ascii();
            // Digits only: `u64::from_str` would take a leading `+`.
            let n = if !part.is_empty() && part.len() <= 19 && part.iter().all(u8::is_ascii_digit) {
                std::str::from_utf8(part).ok().and_then(|s| s.parse::<u64>().ok())
            } else {
                None
            };
            let n = n.ok_or_else(|| Error::Malformed(format!("invalid content-length {:?}", String::from_utf8_lossy(value.as_bytes()))))?;
            match found {
                Some(prev) if prev != n => return Err(Error::Malformed("differing content-length values".into())),
                _ => found = Some(n),
            }
        }
    }
    Ok(found)
}

/// The comma-separated tokens of every `name` field, trimmed, empty ones left out.
fn tokens(headers: &HeaderMap, name: HeaderName) -> impl Iterator<Item = &str> {
    headers.get_all(name).into_iter().filter_map(|v| v.to_str().ok()).flat_map(|v| v.split(',')).map(str::trim).filter(|t| !t.is_empty())
}

/// Whether a `name` field lists `token` (case-insensitive).
pub fn has_token(headers: &HeaderMap, name: HeaderName, token: &str) -> bool {
    tokens(headers, name).any(|t| t.eq_ignore_ascii_case(token))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn head(raw: &str) -> Result<Head, Error> {
        match parse(raw.as_bytes()) {
            Ok(Some((n, h))) => {
                assert_eq!(n, raw.len());
                Ok(h)
            }
            Ok(None) => panic!("incomplete: {raw:?}"),
            Err(e) => Err(e),
        }
    }

    #[test]
    fn framing_follows_the_headers() {
        let h = head("HTTP/1.1 200 OK\r\nContent-Length: 12\r\nX-A: b\r\n\r\n").unwrap();
        assert_eq!((h.status.as_u16(), h.framing, h.keep_alive), (200, Framing::Length(12), true));
        assert_eq!(h.headers["x-a"], "b");
        assert_eq!(head("HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, Chunked\r\n\r\n").unwrap().framing, Framing::Chunked);
        assert_eq!(head("HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\n\r\n").unwrap().framing, Framing::Close);
        assert_eq!(head("HTTP/1.1 200 OK\r\n\r\n").unwrap().framing, Framing::Close);
        assert_eq!(head("HTTP/1.1 204 No Content\r\nContent-Length: 5\r\n\r\n").unwrap().framing, Framing::Empty);
        assert_eq!(head("HTTP/1.1 304 Not Modified\r\n\r\n").unwrap().framing, Framing::Empty);
        assert_eq!(head("HTTP/1.1 200 OK\r\nContent-Length: 3\r\ncontent-length: 3, 3\r\n\r\n").unwrap().framing, Framing::Length(3));
        assert_eq!(head("HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n").unwrap().framing, Framing::Empty);
    }

    #[test]
    fn keep_alive_by_version_and_connection() {
        assert!(!head("HTTP/1.1 200 OK\r\nConnection: keep-alive, Close\r\nContent-Length: 0\r\n\r\n").unwrap().keep_alive);
        assert!(!head("HTTP/1.0 200 OK\r\nContent-Length: 0\r\n\r\n").unwrap().keep_alive);
        assert!(head("HTTP/1.0 200 OK\r\nConnection: Keep-Alive\r\nContent-Length: 0\r\n\r\n").unwrap().keep_alive);
    }

    #[test]
    fn conflicting_or_invalid_framing_is_refused() {
        for (raw, why) in [
            ("HTTP/1.1 200 OK\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n", "both content-length and transfer-encoding"),
            ("HTTP/1.1 200 OK\r\nContent-Length: 3\r\nContent-Length: 4\r\n\r\n", "differing content-length values"),
            ("HTTP/1.1 200 OK\r\nContent-Length: 3, 4\r\n\r\n", "differing content-length values"),
            ("HTTP/1.1 200 OK\r\nContent-Length: +3\r\n\r\n", "invalid content-length \"+3\""),
            ("HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\n", "invalid content-length \"-1\""),
            ("HTTP/1.1 200 OK\r\nContent-Length: 99999999999999999999\r\n\r\n", "invalid content-length \"99999999999999999999\""),
            ("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked, gzip\r\n\r\n", "transfer-encoding: chunked is not the final coding"),
        ] {
            match head(raw) {
                Err(Error::Malformed(m)) => assert_eq!(m, why, "{raw:?}"),
                other => panic!("{raw:?}: {other:?}"),
            }
        }
        assert!(matches!(parse(b"HTTP/1.1 2000 OK\r\n\r\n"), Err(Error::Malformed(_))));
        assert!(matches!(parse(b"SMTP ready\r\n\r\n"), Err(Error::Malformed(_))));
        let many: String = (0..=MAX_HEADERS).map(|i| format!("x-{i}: v\r\n")).collect();
        assert!(matches!(parse(format!("HTTP/1.1 200 OK\r\n{many}\r\n").as_bytes()), Err(Error::Malformed(_))));
        assert!(matches!(parse(b"HTTP/1.1 200 OK\r\nContent-Le"), Ok(None)));
    }
}
