//! The sender's HTTP/1.1 exchange against a raw loopback server sending crafted responses: framing, interim
//! responses, connection reuse and its limits, malformed heads and bodies.

use std::sync::atomic::{AtomicUsize, Ordering};

use tokio::io::AsyncWriteExt;

use super::test_server::{loopback_sender, read_request};
use super::*;

/// What the server does after writing a reply.
#[derive(Clone, Copy, PartialEq, Debug)]
enum After {
    /// Waits for the next request on the connection.
    Keep,
    /// Closes the connection.
    Close,
}

#[derive(Clone)]
enum Reply {
    /// Writes the bytes in pieces of `step` bytes (each its own write and segment), then does `After`.
    Send { bytes: Vec<u8>, step: usize, after: After },
    /// Reads the request and closes the connection without a word (a receiver's idle timeout racing the request).
    Drop,
}

fn reply(bytes: impl AsRef<[u8]>, after: After) -> Reply {
    Reply::Send { bytes: bytes.as_ref().to_vec(), step: usize::MAX, after }
}

struct Server {
    url: String,
    conns: Arc<AtomicUsize>,
    requests: Arc<AtomicUsize>,
}

/// A loopback server answering the n-th request it reads (over all connections) with `replies[n]` (the last one
/// once they run out).
async fn server(replies: Vec<Reply>) -> Server {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/hook", listener.local_addr().unwrap());
    let (conns, requests) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let (c, r) = (conns.clone(), requests.clone());
    let replies = Arc::new(replies);
    tokio::spawn(async move {
        while let Ok((mut sock, _)) = listener.accept().await {
            sock.set_nodelay(true).unwrap();
            c.fetch_add(1, Ordering::SeqCst);
            let (r, replies) = (r.clone(), replies.clone());
            tokio::spawn(async move {
                let mut buf = Vec::new();
                while read_request(&mut sock, &mut buf).await.is_some() {
                    let n = r.fetch_add(1, Ordering::SeqCst);
                    match replies[n.min(replies.len() - 1)].clone() {
                        Reply::Drop => return,
                        Reply::Send { bytes, step, after } => {
                            for piece in bytes.chunks(step.max(1)) {
                                if sock.write_all(piece).await.is_err() {
                                    return;
                                }
                                if step != usize::MAX {
                                    tokio::time::sleep(Duration::from_millis(1)).await;
                                }
                            }
                            if after == After::Close {
                                let _ = sock.shutdown().await;
                                return;
                            }
                        }
                    }
                }
            });
        }
    });
    Server { url, conns, requests }
}

async fn post(sender: &Sender, url: &str) -> TryResult {
    let policy = hookline_core::policy::builtin("standard").unwrap();
    sender.send("k", &policy, url, &Default::default(), Bytes::from_static(b"{\"a\":1}")).await
}

fn conns(s: &Server) -> usize {
    s.conns.load(Ordering::SeqCst)
}

const OK: &str = "HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok";

#[tokio::test]
async fn a_chunked_body_with_extensions_and_trailers_is_read_and_its_connection_reused() {
    let chunked = "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n4;name=\"v\"\r\nWiki\r\n5 ; x\r\npedia\r\n0;end\r\nX-Checksum: 1\r\nX-More: 2\r\n\r\n";
    let s = server(vec![reply(chunked, After::Keep)]).await;
    let sender = loopback_sender();
    for _ in 0..2 {
        let r = post(&sender, &s.url).await;
        assert_eq!((&r.outcome, r.response_excerpt.as_str()), (&Outcome::http(200), "Wikipedia"), "{}", r.reason);
    }
    assert_eq!(conns(&s), 1, "the body was read to its end: the connection took the second request");
}

#[tokio::test]
async fn a_response_in_many_tiny_writes_is_read_whole() {
    let body = "x".repeat(300);
    let raw = format!("HTTP/1.1 202 Accepted\r\nX-One: 1\r\nTransfer-Encoding: chunked\r\n\r\n12c\r\n{body}\r\n0\r\n\r\n");
    let s = server(vec![Reply::Send { bytes: raw.into_bytes(), step: 1, after: After::Keep }, reply(OK, After::Keep)]).await;
    let sender = loopback_sender();
    let r = post(&sender, &s.url).await;
    assert_eq!(r.outcome, Outcome::http(202), "{}", r.reason);
    assert_eq!(r.response_excerpt, body);
    assert_eq!(post(&sender, &s.url).await.outcome, Outcome::http(200));
    assert_eq!(conns(&s), 1);
}

#[tokio::test]
async fn a_close_delimited_body_is_read_to_the_close_and_the_connection_not_reused() {
    let s = server(vec![reply("HTTP/1.1 200 OK\r\n\r\nuntil the end", After::Close)]).await;
    let sender = loopback_sender();
    for _ in 0..2 {
        let r = post(&sender, &s.url).await;
        assert_eq!((&r.outcome, r.response_excerpt.as_str()), (&Outcome::http(200), "until the end"), "{}", r.reason);
    }
    assert_eq!(conns(&s), 2);
    assert_eq!(s.requests.load(Ordering::SeqCst), 2, "no request sent twice");
}

#[tokio::test]
async fn interim_responses_are_skipped() {
    let raw = "HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\nLink: </style.css>; rel=preload\r\n\r\nHTTP/1.1 201 Created\r\nContent-Length: 4\r\nRetry-After: 7\r\n\r\ndone";
    let s = server(vec![reply(raw, After::Keep)]).await;
    let r = post(&loopback_sender(), &s.url).await;
    assert_eq!(r.outcome, Outcome::Http { status: 201, retry_after: Some("7".into()) }, "{}", r.reason);
    assert_eq!(r.response_excerpt, "done");
}

#[tokio::test]
async fn a_204_has_no_body_and_keeps_the_connection() {
    // A content-length on a 204 does not make it carry a body: the next bytes are the next response.
    let s = server(vec![reply("HTTP/1.1 204 No Content\r\ncontent-length: 5\r\n\r\n", After::Keep), reply(OK, After::Keep)]).await;
    let sender = loopback_sender();
    let r = post(&sender, &s.url).await;
    assert_eq!((&r.outcome, r.response_excerpt.as_str()), (&Outcome::http(204), ""), "{}", r.reason);
    let r = post(&sender, &s.url).await;
    assert_eq!((&r.outcome, r.response_excerpt.as_str()), (&Outcome::http(200), "ok"), "{}", r.reason);
    assert_eq!(conns(&s), 1);
}

#[tokio::test]
async fn a_connection_the_receiver_asked_to_close_is_not_reused() {
    // The server keeps the socket open after each answer: only the headers say not to reuse it.
    let s = server(vec![
        reply("HTTP/1.1 200 OK\r\nConnection: close\r\ncontent-length: 2\r\n\r\nok", After::Keep),
        reply("HTTP/1.0 200 OK\r\ncontent-length: 2\r\n\r\nok", After::Keep),
        reply("HTTP/1.0 200 OK\r\nConnection: keep-alive\r\ncontent-length: 2\r\n\r\nok", After::Keep),
    ])
    .await;
    let sender = loopback_sender();
    for n in 1..=4 {
        let r = post(&sender, &s.url).await;
        assert_eq!(r.outcome, Outcome::http(200), "try {n}: {}", r.reason);
    }
    assert_eq!(conns(&s), 3, "close, then HTTP/1.0 without keep-alive: new connections; HTTP/1.0 keep-alive: reused");
}

#[tokio::test]
async fn a_reused_connection_closed_before_answering_sends_the_request_once_more_on_a_new_one() {
    // The kept connection looks open when taken, and the receiver closes it on reading the request.
    let s = server(vec![reply(OK, After::Keep), Reply::Drop, reply(OK, After::Keep)]).await;
    let sender = loopback_sender();
    assert_eq!(post(&sender, &s.url).await.outcome, Outcome::http(200));
    let r = post(&sender, &s.url).await;
    assert_eq!((&r.outcome, r.response_excerpt.as_str()), (&Outcome::http(200), "ok"), "{}", r.reason);
    assert_eq!((conns(&s), s.requests.load(Ordering::SeqCst)), (2, 3));
}

#[tokio::test]
async fn a_new_connection_closed_before_answering_is_a_connect_error_sent_once() {
    let s = server(vec![Reply::Drop]).await;
    let r = post(&loopback_sender(), &s.url).await;
    assert_eq!(r.outcome, Outcome::ConnectError);
    assert_eq!(r.reason, "connection failed: request failed: connection closed before a response");
    assert_eq!((conns(&s), s.requests.load(Ordering::SeqCst)), (1, 1));
}

#[tokio::test]
async fn a_head_over_64_kib_fails_the_try() {
    let raw = format!("HTTP/1.1 200 OK\r\nx-big: {}\r\ncontent-length: 2\r\n\r\nok", "a".repeat(70_000));
    let s = server(vec![reply(raw, After::Keep)]).await;
    let r = post(&loopback_sender(), &s.url).await;
    assert_eq!(r.outcome, Outcome::ConnectError);
    assert_eq!(r.reason, "connection failed: request failed: message head is too large (over 65536 bytes)");
    // Just under the cap is fine.
    let raw = format!("HTTP/1.1 200 OK\r\nx-big: {}\r\ncontent-length: 2\r\n\r\nok", "a".repeat(60_000));
    let s = server(vec![reply(raw, After::Keep)]).await;
    assert_eq!(post(&loopback_sender(), &s.url).await.outcome, Outcome::http(200));
}

#[tokio::test]
async fn conflicting_framing_fails_the_try_with_its_reason() {
    for (raw, why) in [
        (
            "HTTP/1.1 200 OK\r\ncontent-length: 2\r\ntransfer-encoding: chunked\r\n\r\n2\r\nok\r\n0\r\n\r\n",
            "both content-length and transfer-encoding",
        ),
        ("HTTP/1.1 200 OK\r\ncontent-length: 2\r\ncontent-length: 3\r\n\r\nok", "differing content-length values"),
        ("HTTP/1.1 200 OK\r\ncontent-length: 1e3\r\n\r\nok", "invalid content-length \"1e3\""),
        ("HTTP/1.1 101 Switching Protocols\r\nupgrade: websocket\r\n\r\n", "unexpected 101 Switching Protocols"),
        ("HTTP/1.1 OK\r\n\r\n", "invalid response head: invalid response status"),
    ] {
        let s = server(vec![reply(raw, After::Keep)]).await;
        let r = post(&loopback_sender(), &s.url).await;
        assert_eq!(
            (&r.outcome, r.reason.as_str()),
            (&Outcome::ConnectError, format!("connection failed: request failed: {why}").as_str()),
            "{raw:?}"
        );
    }
}

#[tokio::test]
async fn a_broken_chunked_body_keeps_the_status_but_not_the_connection() {
    let s = server(vec![
        reply("HTTP/1.1 500 Oops\r\ntransfer-encoding: chunked\r\n\r\n2\r\nokXX0\r\n\r\n", After::Keep),
        reply(OK, After::Keep),
    ])
    .await;
    let sender = loopback_sender();
    let r = post(&sender, &s.url).await;
    assert_eq!((&r.outcome, r.response_excerpt.as_str()), (&Outcome::http(500), "ok"), "the status decides: {}", r.reason);
    assert_eq!(post(&sender, &s.url).await.outcome, Outcome::http(200));
    assert_eq!(conns(&s), 2, "the broken connection was not reused");
}

#[tokio::test]
async fn a_body_over_the_cap_is_cut_and_its_connection_not_reused() {
    let policy = hookline_core::policy::builtin("standard").unwrap();
    let cap = policy.attempt.response_cap_bytes as usize;
    let big = "y".repeat(cap + 10_000);
    let s =
        server(vec![reply(format!("HTTP/1.1 200 OK\r\ncontent-length: {}\r\n\r\n{big}", big.len()), After::Keep), reply(OK, After::Keep)])
            .await;
    let sender = loopback_sender();
    let r = post(&sender, &s.url).await;
    assert_eq!(r.outcome, Outcome::http(200));
    assert_eq!(r.response_excerpt.len(), EXCERPT_BYTES);
    assert_eq!(post(&sender, &s.url).await.outcome, Outcome::http(200));
    assert_eq!(conns(&s), 2);
}

/// A body shorter than its `Content-Length` (the connection closed early): the status still decides, the attempt's
/// reason says the body was cut short, and the connection is not reused. A body read whole, or up to the response
/// cap, says nothing of the kind.
#[tokio::test]
async fn a_body_cut_short_keeps_the_status_and_says_so() {
    let s = server(vec![reply("HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\nabc", After::Close), reply(OK, After::Keep)]).await;
    let sender = loopback_sender();
    let r = post(&sender, &s.url).await;
    assert_eq!((&r.outcome, r.response_excerpt.as_str()), (&Outcome::http(200), "abc"));
    assert!(r.reason.starts_with("HTTP 200; the response body was cut short"), "{}", r.reason);
    let whole = post(&sender, &s.url).await;
    assert_eq!((&whole.outcome, whole.reason.as_str()), (&Outcome::http(200), "HTTP 200"));
}
