//! What the sender's tests share: a loopback-allowed sender, and reading one request off a raw server's socket.

use std::sync::Arc;

use tokio::io::AsyncReadExt;
use tokio::net::TcpStream;

use super::{EgressSettings, Sender};

/// A sender whose egress rules allow plain HTTP to 127.0.0.1 (the tests' receivers).
pub fn loopback_sender() -> Sender {
    let settings = EgressSettings { allow_ranges: vec!["127.0.0.1/32".into()], allow_http: true, ..Default::default() };
    Sender::new(settings, Arc::new(crate::connector::SystemResolver))
}

/// Reads one request (its head, then `content-length` bytes of body) into `buf`, removes it from there and
/// returns its head as received; `None` once the connection ends or fails first. Bytes after the request stay in
/// `buf` for the next call.
pub async fn read_request(sock: &mut TcpStream, buf: &mut Vec<u8>) -> Option<String> {
    let mut chunk = [0u8; 4096];
    let head_end = loop {
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break i + 4;
        }
        match sock.read(&mut chunk).await {
            Ok(0) | Err(_) => return None,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    };
    let head = String::from_utf8_lossy(&buf[..head_end]).into_owned();
    let len: usize = head
        .to_ascii_lowercase()
        .lines()
        .find_map(|l| l.strip_prefix("content-length:").map(|v| v.trim().parse().unwrap_or(0)))
        .unwrap_or(0);
    while buf.len() < head_end.saturating_add(len) {
        match sock.read(&mut chunk).await {
            Ok(0) | Err(_) => return None,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    }
    buf.drain(..head_end.saturating_add(len));
    Some(head)
}
