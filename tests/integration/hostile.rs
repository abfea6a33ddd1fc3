//! Hostile input, through the real pipeline.
//!
//! Receivers that misbehave (written on a raw `TcpListener`, where axum cannot misbehave enough): each one must end
//! as one attempt outcome within the policy's deadline and caps, read back from the `attempts` topic. Events that
//! are malformed in every way a producer can manage, written straight to the events topic: each one is
//! dead-lettered with its reason and raw bytes, and a valid event after them is still delivered. And the HTTP API's
//! answers to bad bodies and bad credentials not already covered by `api.rs`.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use hookline_core::model::{AttemptRecord, Event};
use hookline_core::policy::{self, Policy};
use http_body_util::{BodyExt, Full};
use prost::Message as _;
use rdkafka::producer::{FutureProducer, FutureRecord};
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Notify;

use crate::support::{wait_for, Pipeline, TOKEN};

const LIMIT: Duration = Duration::from_secs(60);
/// The hostile receivers' policy deadline.
const TIMEOUT_MS: u64 = 2_000;
/// Time allowed beyond the deadline for the dispatcher to notice it and record the outcome.
const SLACK_MS: i64 = 1_000;
/// The response cap of the hostile receivers' policy.
const CAP: u64 = 8 << 10;
/// `EXCERPT_BYTES` in `crates/dispatcher/src/sender.rs`: the most of a response kept in the delivery log.
const EXCERPT_BYTES: usize = 512;

/// The standard profile with a scaled-down schedule (no waits: a single attempt), the given deadline and response
/// cap.
fn policy_with(waits_s: &[f64], timeout_ms: u64, cap: u64) -> String {
    let mut p: Policy = policy::builtin("standard").unwrap();
    p.name = "test-hostile".into();
    // A policy lists at least one wait; a single attempt is `max_attempts = 1`.
    p.schedule.waits_s = Some(if waits_s.is_empty() { vec![1.0] } else { waits_s.to_vec() });
    p.schedule.exponential = None;
    p.schedule.max_attempts = Some(waits_s.len() as u32 + 1);
    p.schedule.jitter = None;
    p.schedule.max_window_s = None;
    p.attempt.timeout_ms = timeout_ms;
    p.attempt.response_cap_bytes = cap;
    let text = toml::to_string(&p).unwrap();
    policy::parse(&text).expect("the test policy is valid");
    text
}

// ---------------------------------------------------------------------------------------------------------
// A receiver that misbehaves at the TCP level

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Misbehave {
    /// 200, chunked, and the body never ends.
    EndlessBody,
    /// The status line, then one header byte every 100 ms, never finishing the head.
    SlowHeaders,
    /// A complete 200 head (`content-length: 100000`), then one body byte every 100 ms.
    SlowBody,
    /// The status line, then 1 MiB of header lines.
    HugeHeaders,
    /// `302 Found` to the cloud metadata address, on a keep-alive connection.
    RedirectToMetadata,
    /// Reset (SO_LINGER 0, close) right after accept, before reading anything.
    ResetOnAccept,
}

#[derive(Default)]
struct Raw {
    /// Connections accepted.
    conns: AtomicUsize,
    /// Request heads read, one per request.
    heads: Mutex<Vec<String>>,
    /// Response bytes the socket accepted (for the endless body: what the client read plus the socket buffers).
    written: AtomicU64,
    changed: Notify,
}

impl Raw {
    fn requests(&self) -> usize {
        self.heads.lock().unwrap().len()
    }
}

async fn raw_receiver(kind: Misbehave) -> (SocketAddr, Arc<Raw>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind raw receiver");
    let addr = listener.local_addr().unwrap();
    let raw = Arc::new(Raw::default());
    let r = raw.clone();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            r.conns.fetch_add(1, Ordering::SeqCst);
            r.changed.notify_waiters();
            tokio::spawn(serve(kind, stream, r.clone()));
        }
    });
    (addr, raw)
}

/// Reads one request (head and `content-length` body). `None` when the peer closed first.
async fn read_request(stream: &mut TcpStream) -> Option<String> {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 8192];
    let head_end = loop {
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break i + 4;
        }
        let n = stream.read(&mut chunk).await.ok()?;
        if n == 0 {
            return None;
        }
        buf.extend_from_slice(&chunk[..n]);
    };
    let head = String::from_utf8_lossy(&buf[..head_end]).into_owned();
    let len: usize = head
        .lines()
        .find_map(|l| l.to_ascii_lowercase().strip_prefix("content-length:").map(|v| v.trim().parse().unwrap_or(0)))
        .unwrap_or(0);
    let mut have = buf.len() - head_end;
    while have < len {
        let n = stream.read(&mut chunk).await.ok()?;
        if n == 0 {
            return None;
        }
        have += n;
    }
    Some(head)
}

/// Writes `bytes` and counts them once the socket took them all.
async fn write(stream: &mut TcpStream, r: &Raw, bytes: Vec<u8>) -> std::io::Result<()> {
    stream.write_all(&bytes).await?;
    r.written.fetch_add(bytes.len() as u64, Ordering::Relaxed);
    Ok(())
}

async fn serve(kind: Misbehave, mut stream: TcpStream, r: Arc<Raw>) {
    if kind == Misbehave::ResetOnAccept {
        // An RST instead of a FIN: the client's write or read fails with "connection reset".
        stream.set_zero_linger().expect("SO_LINGER 0");
        drop(stream);
        return;
    }
    loop {
        let Some(head) = read_request(&mut stream).await else { return };
        r.heads.lock().unwrap().push(head);
        r.changed.notify_waiters();
        // Every misbehaviour but the redirect ends when the client gives up (a write fails).
        match kind {
            Misbehave::EndlessBody => {
                if write(&mut stream, &r, b"HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\ntransfer-encoding: chunked\r\n\r\n".to_vec())
                    .await
                    .is_err()
                {
                    return;
                }
                let mut chunk = b"1000\r\n".to_vec();
                chunk.extend(std::iter::repeat_n(b'A', 0x1000));
                chunk.extend_from_slice(b"\r\n");
                while write(&mut stream, &r, chunk.clone()).await.is_ok() {}
                return;
            }
            Misbehave::SlowHeaders | Misbehave::SlowBody => {
                let head: &[u8] = if kind == Misbehave::SlowHeaders {
                    b"HTTP/1.1 200 OK\r\n"
                } else {
                    b"HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\ncontent-length: 100000\r\n\r\n"
                };
                if write(&mut stream, &r, head.to_vec()).await.is_err() {
                    return;
                }
                let dribble: &[u8] = if kind == Misbehave::SlowHeaders { b"x-slow: " } else { b"B" };
                let mut i = 0usize;
                loop {
                    // The misbehaviour itself is timed: one byte per 100 ms.
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    let b = if i < dribble.len() { dribble[i] } else { dribble[dribble.len() - 1].max(b'a') };
                    i += 1;
                    if write(&mut stream, &r, vec![b]).await.is_err() || stream.flush().await.is_err() {
                        return;
                    }
                }
            }
            Misbehave::HugeHeaders => {
                let mut resp = b"HTTP/1.1 200 OK\r\n".to_vec();
                let mut n = 0;
                while resp.len() < 1 << 20 {
                    resp.extend_from_slice(format!("x-huge-{n:06}: {}\r\n", "h".repeat(1000)).as_bytes());
                    n += 1;
                }
                resp.extend_from_slice(b"content-length: 0\r\n\r\n");
                let _ = write(&mut stream, &r, resp).await;
                // Wait for the client to close (or give up).
                let mut sink = [0u8; 1024];
                while matches!(stream.read(&mut sink).await, Ok(n) if n > 0) {}
                return;
            }
            Misbehave::RedirectToMetadata => {
                let resp = b"HTTP/1.1 302 Found\r\nlocation: http://169.254.169.254/latest/meta-data/\r\ncontent-length: 0\r\n\r\n";
                if write(&mut stream, &r, resp.to_vec()).await.is_err() {
                    return;
                }
            }
            Misbehave::ResetOnAccept => unreachable!(),
        }
    }
}

/// Starts a pipeline and a misbehaving receiver, subscribes to it with `policy_toml`, publishes one event and waits
/// for its final state. Returns the subscription's attempt records.
async fn against(kind: Misbehave, policy_toml: String) -> (Pipeline, Arc<Raw>, Vec<AttemptRecord>) {
    let p = Pipeline::start(1).await;
    let (addr, raw) = raw_receiver(kind).await;
    let (sub, _) = p.subscribe(json!({"url": format!("http://{addr}/hook"), "event_types": ["*"], "policy_toml": policy_toml})).await;
    p.publish(&format!("evt_{kind:?}"), "hostile.receiver").await;
    let records = p.wait_final_of(&sub, 1, LIMIT).await;
    (p, raw, records)
}

/// Prints the records, one JSON line each (visible with `--nocapture`): the numbers for docs/reliability.md.
fn show(test: &str, records: &[AttemptRecord]) {
    for a in records {
        println!(
            "{}",
            json!({"test": test, "attempt": a.attempt, "outcome": a.outcome, "reason": a.reason, "duration_ms": a.duration_ms,
                   "excerpt_bytes": a.response_excerpt.len(), "verdict": a.verdict, "final_state": a.final_state})
        );
    }
}

fn within_deadline(a: &AttemptRecord) {
    assert!(
        a.duration_ms <= TIMEOUT_MS as i64 + SLACK_MS,
        "the attempt took {} ms, over the {TIMEOUT_MS} ms deadline (+{SLACK_MS} ms): {a:?}",
        a.duration_ms
    );
    assert!(a.response_excerpt.len() <= EXCERPT_BYTES, "excerpt over {EXCERPT_BYTES} bytes: {}", a.response_excerpt.len());
}

// ---------------------------------------------------------------------------------------------------------
// Hostile receivers

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_endless_body_is_read_up_to_the_cap_and_the_status_decides() {
    let (p, raw, records) = against(Misbehave::EndlessBody, policy_with(&[], TIMEOUT_MS, CAP)).await;
    show("endless_body", &records);
    assert_eq!(records.len(), 1, "{records:?}");
    let a = &records[0];
    within_deadline(a);
    assert_eq!((a.outcome.as_str(), a.reason.as_str(), a.final_state.as_str()), ("200", "HTTP 200", "succeeded"));
    assert_eq!(a.response_excerpt, "A".repeat(EXCERPT_BYTES), "the excerpt is the start of the body, capped");
    // The read stopped at the cap: far inside the deadline, not cut by it.
    assert!(a.duration_ms < TIMEOUT_MS as i64 / 2, "the capped read took {} ms", a.duration_ms);
    // Once the dispatcher drops the connection the receiver's writes fail; what it managed to write is bounded by
    // the socket buffers, not by the 2 s the deadline would have allowed.
    let conns = raw.conns.load(Ordering::SeqCst);
    assert_eq!((conns, raw.requests()), (1, 1));
    p.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slowloris_headers_time_out_at_the_deadline() {
    let (p, raw, records) = against(Misbehave::SlowHeaders, policy_with(&[], TIMEOUT_MS, CAP)).await;
    show("slowloris_headers", &records);
    assert_eq!(records.len(), 1, "{records:?}");
    let a = &records[0];
    within_deadline(a);
    assert_eq!((a.outcome.as_str(), a.reason.as_str(), a.final_state.as_str()), ("timeout", "Timed out after 2 s", "failed"));
    assert!(a.duration_ms >= TIMEOUT_MS as i64, "a timeout before the deadline: {} ms", a.duration_ms);
    assert_eq!(a.http_status, 0);
    assert!(a.response_excerpt.is_empty());
    assert_eq!(raw.requests(), 1);
    p.stop().await;
}

/// The status line and headers arrived (200), then the body dribbles. The deadline covers the whole exchange,
/// body included (`sender.rs`: one `tokio::time::timeout` around request + `read_capped`), so the attempt is a
/// `timeout`, not a 200: the status that arrived is discarded with the excerpt. Under the standard profile that
/// means the delivery is retried although the receiver answered 200.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slowloris_body_after_a_200_is_a_timeout() {
    let (p, raw, records) = against(Misbehave::SlowBody, policy_with(&[], TIMEOUT_MS, CAP)).await;
    show("slowloris_body", &records);
    assert_eq!(records.len(), 1, "{records:?}");
    let a = &records[0];
    within_deadline(a);
    assert_eq!((a.outcome.as_str(), a.reason.as_str(), a.final_state.as_str()), ("timeout", "Timed out after 2 s", "failed"));
    assert_eq!(a.http_status, 0, "the 200 that arrived before the deadline is not recorded");
    assert!(a.response_excerpt.is_empty(), "nor is the part of the body read: {:?}", a.response_excerpt);
    assert!(a.duration_ms >= TIMEOUT_MS as i64);
    assert_eq!(raw.requests(), 1);
    p.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_megabyte_of_response_headers_is_a_connect_error() {
    let (p, raw, records) = against(Misbehave::HugeHeaders, policy_with(&[], TIMEOUT_MS, CAP)).await;
    show("huge_headers", &records);
    assert_eq!(records.len(), 1, "{records:?}");
    let a = &records[0];
    within_deadline(a);
    assert_eq!((a.outcome.as_str(), a.final_state.as_str()), ("connect_error", "failed"), "{a:?}");
    // The sender refuses a head over its limit (64 KiB, `sender/h1` MAX_HEAD_BYTES) instead of buffering the
    // whole megabyte.
    assert!(a.reason.starts_with("connection failed: "), "{}", a.reason);
    assert!(a.reason.contains("too large"), "the reason names the oversized head: {}", a.reason);
    assert!(a.duration_ms < TIMEOUT_MS as i64, "refused before the deadline: {} ms", a.duration_ms);
    assert_eq!(raw.requests(), 1);
    p.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redirect_to_the_metadata_address_is_the_outcome_and_never_followed() {
    // Standard: a 302 falls under `any` and is retried. Three attempts, 300 ms apart.
    let (p, raw, records) = against(Misbehave::RedirectToMetadata, policy_with(&[0.3, 0.3], TIMEOUT_MS, CAP)).await;
    show("redirect_302", &records);
    assert_eq!(records.len(), 3, "{records:?}");
    for (i, a) in records.iter().enumerate() {
        within_deadline(a);
        assert_eq!((a.attempt as usize, a.outcome.as_str(), a.reason.as_str(), a.http_status), (i + 1, "302", "HTTP 302", 302));
    }
    assert_eq!(records[..2].iter().map(|a| a.verdict.as_str()).collect::<Vec<_>>(), ["retry", "retry"]);
    assert_eq!(records[2].final_state, "failed");
    // One request per attempt reached the receiver and no other: a followed redirect would have been a GET to
    // 169.254.169.254 (which the egress guard would refuse and which no request here could reach anyway).
    assert_eq!(raw.requests(), 3, "exactly one request per attempt");
    assert!(raw.heads.lock().unwrap().iter().all(|h| h.starts_with("POST /hook HTTP/1.1")));
    p.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_reset_on_accept_is_a_connect_error() {
    let (p, raw, records) = against(Misbehave::ResetOnAccept, policy_with(&[], TIMEOUT_MS, CAP)).await;
    show("reset_on_accept", &records);
    assert_eq!(records.len(), 1, "{records:?}");
    let a = &records[0];
    within_deadline(a);
    assert_eq!((a.outcome.as_str(), a.final_state.as_str()), ("connect_error", "failed"), "{a:?}");
    assert!(a.reason.starts_with("connection failed: "), "{}", a.reason);
    assert!(a.duration_ms < TIMEOUT_MS as i64);
    // hyper's client retries a request only on a reused (pooled) connection; this was a fresh one.
    assert!(raw.conns.load(Ordering::SeqCst) >= 1);
    assert_eq!(raw.requests(), 0);
    p.stop().await;
}

/// An `https://` subscription pointed at a plain-HTTP server (allowed by the dev egress allow-list): the server
/// reads the ClientHello as a malformed request and answers `HTTP/1.1 400`, which rustls reads as a corrupt TLS
/// record ("received corrupt message of type InvalidContentType").
///
/// A TLS handshake failure is the `tls_error` outcome (hyper-rustls nests the rustls error in two `io::Error`s;
/// the sender looks through them).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn https_to_a_plain_http_server_fails_the_tls_handshake() {
    let p = Pipeline::start(1).await;
    let url = format!("https://127.0.0.1:{}/tls", p.receiver.port());
    let (sub, _) = p.subscribe(json!({"url": url, "event_types": ["*"], "policy_toml": policy_with(&[], TIMEOUT_MS, CAP)})).await;
    p.publish("evt_tls", "hostile.receiver").await;
    let records = p.wait_final_of(&sub, 1, LIMIT).await;
    show("https_to_plain_http", &records);
    assert_eq!(records.len(), 1, "{records:?}");
    let a = &records[0];
    within_deadline(a);
    assert!(a.reason.contains("corrupt message of type InvalidContentType"), "a TLS failure: {}", a.reason);
    assert_eq!((a.outcome.as_str(), a.final_state.as_str()), ("tls_error", "failed"), "{a:?}");
    assert!(a.reason.starts_with("TLS error: "), "{}", a.reason);
    assert!(a.duration_ms < TIMEOUT_MS as i64);
    assert!(p.requests_to("tls").is_empty(), "no request got through");
    p.stop().await;
}

// ---------------------------------------------------------------------------------------------------------
// Hostile events, straight to the events topic

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_events_are_dead_lettered_with_their_reason_and_bytes_and_never_stall_the_partition() {
    const MAX_EVENT: usize = 48 << 10;
    let p = Pipeline::start_with(1, |c| c.ingest.max_event_bytes = MAX_EVENT).await;
    p.subscribe(json!({"url": p.url("ok"), "event_types": ["*"]})).await;
    let producer = hookline_kafka::client::producer(&p.config.kafka, "test-hostile-upstream").unwrap();
    let events = p.topics().events().to_owned();

    let deep_data = format!("{{\"id\":\"a\",\"type\":\"t\",\"data\":{}{}}}", "[".repeat(10_000), "]".repeat(10_000));
    let deep_top = format!("{}{}", "[".repeat(10_000), "]".repeat(10_000));
    let oversize = format!("{{\"id\":\"big\",\"type\":\"t\",\"data\":\"{}\"}}", "x".repeat(MAX_EVENT));
    let long_id = format!("{{\"id\":\"{}\",\"type\":\"t\"}}", "i".repeat(300));
    let pb = |ev: Event| ev.encode_to_vec();
    let cases: Vec<(&str, Vec<u8>, &str)> = vec![
        ("invalid json", b"{not json".to_vec(), "invalid_json"),
        ("truncated json", br#"{"id":"a","type":"t","data":{"#.to_vec(), "invalid_json"),
        ("duplicate keys", br#"{"id":"a","id":"b","type":"t"}"#.to_vec(), "invalid_json"),
        ("missing id", br#"{"type":"t"}"#.to_vec(), "missing_field"),
        ("empty id", br#"{"id":"","type":"t"}"#.to_vec(), "missing_field"),
        ("blank type", br#"{"id":"a","type":"   "}"#.to_vec(), "missing_field"),
        ("missing type", br#"{"id":"a"}"#.to_vec(), "missing_field"),
        ("id is a number", br#"{"id":1,"type":"t"}"#.to_vec(), "invalid_json"),
        ("type is an object", br#"{"id":"a","type":{}}"#.to_vec(), "invalid_json"),
        ("occurred_at is a bool", br#"{"id":"a","type":"t","occurred_at":true}"#.to_vec(), "invalid_field"),
        ("negative occurred_at", br#"{"id":"a","type":"t","occurred_at":-1}"#.to_vec(), "invalid_field"),
        ("control char in id", b"{\"id\":\"a\\u0007\",\"type\":\"t\"}".to_vec(), "invalid_field"),
        ("id over 256 bytes", long_id.into_bytes(), "invalid_field"),
        ("top-level array", b"[1,2,3]".to_vec(), "invalid_json"),
        ("top-level string", b"\"evt\"".to_vec(), "invalid_json"),
        ("invalid utf-8 in json", b"{\"id\":\"a\xff\xfe\",\"type\":\"t\"}".to_vec(), "invalid_utf8"),
        ("nesting 10k deep in data", deep_data.into_bytes(), "invalid_json"),
        ("nesting 10k deep at the top", deep_top.into_bytes(), "invalid_json"),
        ("over max_event_bytes", oversize.into_bytes(), "oversize"),
        ("protobuf garbage", b"\x0a\x03abc\x12".to_vec(), "invalid_protobuf"),
        ("varint overflow", b"\x08\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\x01".to_vec(), "invalid_protobuf"),
        ("random bytes", vec![0xde, 0xad, 0xbe, 0xef, 0x00, 0x13, 0x37], "invalid_protobuf"),
        // A UTF-8 byte-order mark before the JSON: not JSON's first byte, so it is read as protobuf.
        // A byte-order mark is skipped: what follows is judged as JSON.
        ("bad json after a BOM", b"\xef\xbb\xbf{\"id\":\"a\",".to_vec(), "invalid_json"),
        ("protobuf without id", pb(Event { r#type: "t".into(), ..Default::default() }), "missing_field"),
        (
            "protobuf with bad data_json",
            pb(Event { id: "a".into(), r#type: "t".into(), data_json: Bytes::from_static(b"{x"), ..Default::default() }),
            "invalid_json",
        ),
        (
            "protobuf with non-utf8 data_json",
            pb(Event { id: "a".into(), r#type: "t".into(), data_json: Bytes::from_static(b"\"\xff\""), ..Default::default() }),
            "invalid_utf8",
        ),
        ("whitespace only", b"   \n\t ".to_vec(), "invalid_protobuf"),
        ("empty value", Vec::new(), "empty"),
    ];
    for (_, bytes, _) in &cases {
        producer.send(FutureRecord::<str, [u8]>::to(&events).key("k").payload(bytes), Duration::from_secs(5)).await.unwrap();
    }
    // And a record with no value at all (a tombstone on the events topic).
    producer.send(FutureRecord::<str, [u8]>::to(&events).key("k"), Duration::from_secs(5)).await.unwrap();
    let good = br#"{"id":"evt_after_hostile","type":"x.y","data":{}}"#;
    producer.send(FutureRecord::<str, [u8]>::to(&events).key("k").payload(&good[..]), Duration::from_secs(5)).await.unwrap();

    p.wait_finals(1, LIMIT).await;
    let n = cases.len() + 1;
    let dlq = p.dlq.clone();
    wait_for(&p.dlq.changed, LIMIT, &format!("{n} dead letters"), || dlq.items.lock().unwrap().len() >= n).await;
    let letters = p.dlq.items.lock().unwrap().clone();
    assert_eq!(letters.len(), n, "one dead letter per hostile record");
    let mut wrong = Vec::new();
    for (offset, (what, bytes, reason)) in cases.iter().enumerate() {
        let Some(d) = letters.iter().find(|d| d.source_offset == offset as i64) else {
            wrong.push(format!("{what}: no dead letter at offset {offset}"));
            continue;
        };
        println!("{}", json!({"test": "hostile_event", "case": what, "reason": d.reason, "detail": d.detail, "raw_bytes": d.raw.len()}));
        if d.reason != *reason {
            wrong.push(format!("{what}: reason {:?} ({}), expected {reason:?}", d.reason, d.detail));
        }
        // Raw bytes are kept whole up to the event limit; an oversize record keeps its first `limit` bytes.
        let kept = &bytes[..bytes.len().min(p.config.ingest.max_event_bytes)];
        if d.raw[..] != *kept {
            wrong.push(format!("{what}: raw bytes not kept ({} bytes, sent {})", d.raw.len(), bytes.len()));
        }
        if d.detail.is_empty() || d.source_topic != events || !d.final_state.is_empty() || !d.subscription_id.is_empty() {
            wrong.push(format!("{what}: {d:?}"));
        }
    }
    let tombstone = letters.iter().find(|d| d.source_offset == cases.len() as i64).expect("the null value is dead-lettered");
    assert_eq!((tombstone.reason.as_str(), tombstone.raw.len()), ("empty", 0));
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));

    let ok = p.requests_to("ok");
    assert_eq!(ok.len(), 1, "the valid event after the hostile ones is delivered");
    assert_eq!(ok[0].headers["webhook-id"], "evt_after_hostile");
    p.stop().await;
}

// ---------------------------------------------------------------------------------------------------------
// The HTTP API (what api.rs's `bad_requests_get_json_errors_that_name_the_problem` does not cover)

async fn api_send(p: &Pipeline, headers: &[(&str, &str)], path: &str, body: Vec<u8>) -> (u16, Value) {
    let client = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new()).build_http();
    let mut req = http::Request::post(format!("http://{}{path}", p.api));
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let resp = client.request(req.body(Full::new(Bytes::from(body))).unwrap()).await.expect("the API answers");
    let status = resp.status().as_u16();
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    (status, serde_json::from_slice(&body).unwrap_or_default())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_events_api_refuses_hostile_bodies_with_the_decoder_reasons() {
    const MAX_EVENT: usize = 4 << 10;
    let p = Pipeline::start_with(1, |c| c.ingest.max_event_bytes = MAX_EVENT).await;
    let bearer = format!("Bearer {TOKEN}");
    let bearer = bearer.as_str();
    let json_ct = [("authorization", bearer), ("content-type", "application/json")];
    let ev = |id: &str| format!(r#"{{"id":"{id}","type":"t","data":{{}}}}"#).into_bytes();
    let deep = format!("{{\"id\":\"a\",\"type\":\"t\",\"data\":{}{}}}", "[".repeat(1000), "]".repeat(1000));
    let between = format!("{{\"id\":\"big\",\"type\":\"t\",\"data\":\"{}\"}}", "x".repeat(MAX_EVENT)); // over max_event, under max_request
    let proto = Event { id: "a".into(), r#type: "t".into(), ..Default::default() }.encode_to_vec();
    let cases: Vec<(&str, Vec<(&str, &str)>, Vec<u8>, u16, &str)> = vec![
        ("text/plain", vec![("authorization", bearer), ("content-type", "text/plain")], ev("e1"), 415, "unsupported_media_type"),
        ("no content type", vec![("authorization", bearer)], ev("e2"), 415, "unsupported_media_type"),
        (
            "json with a suffix type",
            vec![("authorization", bearer), ("content-type", "application/jsonx")],
            ev("e3"),
            415,
            "unsupported_media_type",
        ),
        ("malformed json", json_ct.to_vec(), b"{\"id\":".to_vec(), 422, "invalid_json"),
        ("duplicate keys", json_ct.to_vec(), br#"{"id":"a","id":"b","type":"t"}"#.to_vec(), 422, "invalid_json"),
        ("1000 deep", json_ct.to_vec(), deep.into_bytes(), 422, "invalid_json"),
        ("empty body", json_ct.to_vec(), Vec::new(), 422, "empty"),
        ("invalid utf-8", json_ct.to_vec(), b"{\"id\":\"\xff\",\"type\":\"t\"}".to_vec(), 422, "invalid_utf8"),
        ("protobuf sent as json", json_ct.to_vec(), proto, 422, "invalid_json"),
        ("over max_event_bytes", json_ct.to_vec(), between.into_bytes(), 413, "oversize"),
        ("empty type", json_ct.to_vec(), br#"{"id":"a","type":""}"#.to_vec(), 422, "missing_field"),
    ];
    for (what, headers, body, want_status, want_code) in cases {
        let (status, v) = api_send(&p, &headers, "/v1/events", body).await;
        assert_eq!((status, v["error"]["code"].as_str().unwrap_or("")), (want_status, want_code), "{what}: {v}");
        assert!(!v["error"]["message"].as_str().unwrap_or("").is_empty(), "{what}: {v}");
    }
    // Parameters on the media type are fine.
    let (status, v) =
        api_send(&p, &[("authorization", bearer), ("content-type", "Application/JSON; charset=utf-8")], "/v1/events", ev("e_ok")).await;
    assert_eq!(status, 202, "{v}");
    p.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_api_refuses_malformed_credentials() {
    let p = Pipeline::start(1).await;
    let ev = br#"{"id":"evt_auth","type":"t"}"#.to_vec();
    let call = |auth: Vec<String>| {
        let p = &p;
        let ev = ev.clone();
        async move {
            let mut headers: Vec<(&str, &str)> = vec![("content-type", "application/json")];
            for a in &auth {
                headers.push(("authorization", a.as_str()));
            }
            api_send(p, &headers, "/v1/events", ev).await
        }
    };
    let huge = format!("Bearer {}", "t".repeat(256 << 10));
    let cases: Vec<(&str, Vec<String>, u16)> = vec![
        ("`Bearer` without a token", vec!["Bearer".into()], 401),
        ("`Bearer ` and spaces", vec!["Bearer    ".into()], 401),
        // The scheme name is case-insensitive (RFC 9110 §11.1).
        ("lower-case scheme", vec![format!("bearer {TOKEN}")], 202),
        ("Basic scheme", vec![format!("Basic {TOKEN}")], 401),
        ("token without scheme", vec![TOKEN.into()], 401),
        ("truncated token", vec![format!("Bearer {}", &TOKEN[..TOKEN.len() - 1])], 401),
        ("token plus a character", vec![format!("Bearer {TOKEN}x")], 401),
        ("token with a NUL-free tab inside", vec![format!("Bearer {}\t{}", &TOKEN[..4], &TOKEN[4..])], 401),
        // Over the API's 64 KiB of headers: refused before the credential is read, in the documented JSON shape.
        ("a 256 KiB token", vec![huge], 431),
        ("wrong token first, right one second", vec!["Bearer wrong-token-wrong-token".into(), format!("Bearer {TOKEN}")], 401),
        // Surrounding whitespace is not part of a header value (RFC 9110 §5.5); the token itself is trimmed too.
        ("token with a trailing space", vec![format!("Bearer {TOKEN} ")], 202),
        ("token after two spaces", vec![format!("Bearer  {TOKEN}")], 202),
    ];
    for (what, auth, want) in cases {
        let (status, v) = call(auth).await;
        assert_eq!(status, want, "{what}: {v}");
        if want == 401 {
            assert_eq!(v["error"]["code"], "unauthorized", "{what}: {v}");
        }
        if want == 431 {
            assert_eq!(v["error"]["code"], "headers_too_large", "{what}: {v}");
        }
    }

    // A 1 MiB Authorization header is over hyper's head limit: refused (431) or the connection closed, never
    // buffered or let through, and the API keeps answering.
    let mut s = TcpStream::connect(p.api).await.unwrap();
    let head = format!(
        "POST /v1/events HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: {}\r\nauthorization: Bearer {}\r\n\r\n",
        ev.len(),
        "t".repeat(1 << 20)
    );
    let _ = s.write_all(head.as_bytes()).await;
    let mut answer = Vec::new();
    let _ = s.read_to_end(&mut answer).await;
    let answer = String::from_utf8_lossy(&answer);
    println!("{}", json!({"test": "api_1mib_authorization", "answer": answer.lines().next().unwrap_or("")}));
    assert!(answer.is_empty() || answer.starts_with("HTTP/1.1 431"), "{answer}");
    let (status, _) = call(vec![format!("Bearer {TOKEN}")]).await;
    assert_eq!(status, 202, "the API still answers");
    p.stop().await;
}

/// A record over `ingest.max_event_bytes` is dead-lettered as `oversize` with the start of its raw bytes (the dead
/// letter must itself fit in a Kafka record), and the partition moves on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_malformed_record_near_max_event_bytes_is_dead_lettered() {
    let p = Pipeline::start(1).await;
    let limit = p.config.ingest.max_event_bytes;
    assert_eq!(limit, 960 << 10);
    p.subscribe(json!({"url": p.url("after-big"), "event_types": ["*"]})).await;
    let mut cfg = hookline_kafka::client::producer_config(&p.config.kafka, "test-big-upstream").unwrap();
    cfg.set("message.max.bytes", "4000000");
    let producer: FutureProducer = cfg.create().unwrap();
    let events = p.topics().events().to_owned();
    let big = format!("{{not json {}", "x".repeat(1_020_000));
    producer.send(FutureRecord::<str, [u8]>::to(&events).key("k").payload(big.as_bytes()), Duration::from_secs(5)).await.unwrap();
    let dlq = p.dlq.clone();
    wait_for(&p.dlq.changed, Duration::from_secs(15), "the dead letter of a 1 MB record", || !dlq.items.lock().unwrap().is_empty()).await;
    let dl = p.dlq.items.lock().unwrap()[0].clone();
    assert_eq!(dl.reason, "oversize");
    assert_eq!(dl.raw.len(), limit, "the start of the record is kept");
    assert!(dl.detail.contains("raw truncated"), "{}", dl.detail);
    producer
        .send(
            FutureRecord::<str, [u8]>::to(&events).key("k").payload(&br#"{"id":"evt_after_big","type":"x.y"}"#[..]),
            Duration::from_secs(5),
        )
        .await
        .unwrap();
    p.wait_finals(1, Duration::from_secs(30)).await;
    assert_eq!(p.requests_to("after-big").len(), 1, "the partition moved on");
    p.stop().await;
}
