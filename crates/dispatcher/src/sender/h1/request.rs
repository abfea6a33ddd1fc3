//! The request head, encoded into one buffer of exactly its size.

use http::header::{CONTENT_LENGTH, HOST, TRANSFER_ENCODING};
use http::HeaderMap;

/// The methods hookline sends: deliveries and challenges are POSTs; the CloudEvents validation handshake is an
/// OPTIONS.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Method {
    Post,
    Options,
}

impl Method {
    fn token(self) -> &'static [u8] {
        match self {
            Method::Post => b"POST",
            Method::Options => b"OPTIONS",
        }
    }
}

/// `<METHOD> <target> HTTP/1.1`, `host`, the headers in their order, `content-length`, the blank line. `host` is
/// the map's own when it has one; a `content-length` or `transfer-encoding` in the map is left out (the body's
/// length is the one sent). Names are lowercase (`HeaderName` is); values were validated by `HeaderValue` (no CR,
/// LF). An OPTIONS without a body has no `content-length` (RFC 9110 §8.6: none is sent for a request without
/// content whose method does not anticipate any).
pub fn encode_method_head(method: Method, target: &str, authority: &str, headers: &HeaderMap, body_len: usize) -> Vec<u8> {
    let mut len_digits = itoa_buf();
    let len = fmt_usize(body_len, &mut len_digits);
    let with_length = method == Method::Post || body_len > 0;
    let skipped = |n: &http::HeaderName| *n == CONTENT_LENGTH || *n == TRANSFER_ENCODING;
    let own_host = headers.contains_key(HOST);
    let mut size = method.token().len() + 1 + target.len() + " HTTP/1.1\r\n".len();
    if !own_host {
        size += "host: ".len() + authority.len() + 2;
    }
    for (name, value) in headers {
        if !skipped(name) {
            size += name.as_str().len() + 2 + value.len() + 2;
        }
    }
    if with_length {
        size += "content-length: ".len() + len.len() + 2;
    }
    size += 2;

    let mut head = Vec::with_capacity(size);
    head.extend_from_slice(method.token());
    head.push(b' ');
    head.extend_from_slice(target.as_bytes());
    head.extend_from_slice(b" HTTP/1.1\r\n");
    if !own_host {
        head.extend_from_slice(b"host: ");
        head.extend_from_slice(authority.as_bytes());
        head.extend_from_slice(b"\r\n");
    }
    for (name, value) in headers {
        if !skipped(name) {
            head.extend_from_slice(name.as_str().as_bytes());
            head.extend_from_slice(b": ");
            head.extend_from_slice(value.as_bytes());
            head.extend_from_slice(b"\r\n");
        }
    }
    if with_length {
        head.extend_from_slice(b"content-length: ");
        head.extend_from_slice(len);
        head.extend_from_slice(b"\r\n");
    }
    head.extend_from_slice(b"\r\n");
    debug_assert_eq!(head.len(), size);
    head
}

fn itoa_buf() -> [u8; 20] {
    [0; 20]
}

/// `n` in decimal, in the tail of `buf` (20 digits hold any u64).
fn fmt_usize(mut n: usize, buf: &mut [u8; 20]) -> &[u8] {
    let mut i = buf.len();
    loop {
        i -= 1;
        buf[i] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 || i == 0 {
            break;
        }
    }
    &buf[i..]
}

/// Whether the request's own headers ask to close the connection after this exchange.
pub fn asks_close(headers: &HeaderMap) -> bool {
    super::response::has_token(headers, http::header::CONNECTION, "close")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_head_is_origin_form_with_host_and_length_and_sized_exactly() {
        let mut h = HeaderMap::new();
        h.append("content-type", "application/json".parse().unwrap());
        h.append("webhook-id", "evt_1".parse().unwrap());
        h.append("content-length", "999".parse().unwrap());
        let head = encode_method_head(Method::Post, "/a/b?x=1", "hooks.example.com:8443", &h, 7);
        assert_eq!(head.len(), head.capacity());
        assert_eq!(
            String::from_utf8(head).unwrap(),
            "POST /a/b?x=1 HTTP/1.1\r\nhost: hooks.example.com:8443\r\ncontent-type: application/json\r\nwebhook-id: evt_1\r\ncontent-length: 7\r\n\r\n"
        );
        let mut h = HeaderMap::new();
        h.insert(HOST, "other.example".parse().unwrap());
        let head = encode_method_head(Method::Post, "/", "ignored", &h, 0);
        assert_eq!(String::from_utf8(head).unwrap(), "POST / HTTP/1.1\r\nhost: other.example\r\ncontent-length: 0\r\n\r\n");
    }

    #[test]
    fn an_options_request_without_a_body_has_no_length() {
        let mut h = HeaderMap::new();
        h.append("webhook-request-origin", "hooks.example.com".parse().unwrap());
        let head = encode_method_head(Method::Options, "/hook", "receiver.example", &h, 0);
        assert_eq!(head.len(), head.capacity());
        assert_eq!(
            String::from_utf8(head).unwrap(),
            "OPTIONS /hook HTTP/1.1\r\nhost: receiver.example\r\nwebhook-request-origin: hooks.example.com\r\n\r\n"
        );
    }

    #[test]
    fn lengths_are_decimal() {
        let mut b = itoa_buf();
        assert_eq!(fmt_usize(0, &mut b), b"0");
        let mut b = itoa_buf();
        assert_eq!(fmt_usize(1_048_576, &mut b), b"1048576");
        let mut b = itoa_buf();
        assert_eq!(fmt_usize(usize::MAX, &mut b), usize::MAX.to_string().as_bytes());
    }
}
