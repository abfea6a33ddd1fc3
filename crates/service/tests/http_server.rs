//! The bounded HTTP server with real sockets on 127.0.0.1:0: slow-loris clients (idle sockets, headers dribbled a
//! byte at a time, on a new or a kept-alive connection, a stalled body) are closed on time, a normal request still
//! answers, a kept-alive connection idles until the idle timeout, at the cap an idle connection is shed (or, all
//! busy, a new one waits for a free slot), one client address gets only its share, a body dribbled below the
//! minimum rate is cut short, and shutdown closes idle keep-alive connections.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use axum::routing::{get, post};
use axum::Router;
use hookline_service::http_server::{self, HttpServerSettings};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_util::sync::CancellationToken;

/// Bounds only a hang; the assertions on timing are the `elapsed` checks.
const LIMIT: Duration = Duration::from_secs(10);

fn app() -> Router {
    Router::new().route("/healthz", get(|| async { "ok" })).route("/echo", post(|body: String| async move { body }))
}

async fn start(settings: HttpServerSettings) -> (SocketAddr, CancellationToken, tokio::task::JoinHandle<()>) {
    let stop = CancellationToken::new();
    let (addr, task) = http_server::spawn("127.0.0.1:0".parse().unwrap(), app(), settings, stop.clone()).await.unwrap();
    (addr, stop, task)
}

/// Stops the server and waits until it has returned (every connection closed).
async fn shut(stop: CancellationToken, task: tokio::task::JoinHandle<()>) {
    stop.cancel();
    tokio::time::timeout(LIMIT, task).await.expect("the server stops").unwrap();
}

/// Reads until the peer closes (true) or `limit` passes (false).
async fn closed_within(s: &mut (impl AsyncRead + Unpin), limit: Duration) -> bool {
    let mut buf = [0u8; 1024];
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        match tokio::time::timeout_at(deadline, s.read(&mut buf)).await {
            Err(_) => return false,
            Ok(Ok(0) | Err(_)) => return true,
            Ok(Ok(_)) => {}
        }
    }
}

/// One keep-alive `GET /healthz` on `s`: the status line of the answer, or None if none came within `limit`.
async fn get_healthz(s: &mut TcpStream, limit: Duration) -> Option<String> {
    s.write_all(b"GET /healthz HTTP/1.1\r\nHost: t\r\n\r\n").await.ok()?;
    let mut got = Vec::new();
    let mut buf = [0u8; 1024];
    let deadline = tokio::time::Instant::now() + limit;
    // The answer is small: its end is the 2-byte body after the blank line.
    while !got.windows(6).any(|w| w == b"\r\n\r\nok") {
        match tokio::time::timeout_at(deadline, s.read(&mut buf)).await {
            Ok(Ok(n)) if n > 0 => got.extend_from_slice(&buf[..n]),
            _ => return None,
        }
    }
    String::from_utf8_lossy(&got).lines().next().map(str::to_owned)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_loris_clients_are_closed_and_a_normal_request_still_answers() {
    let settings = HttpServerSettings { header_read_timeout_ms: 400, idle_timeout_ms: 30_000, max_connections: 64, ..Default::default() };
    let (addr, stop, task) = start(settings).await;
    let mut idle = Vec::new();
    for _ in 0..30 {
        idle.push(TcpStream::connect(addr).await.unwrap());
    }
    let started = Instant::now();
    let mut dribblers = Vec::new();
    for _ in 0..6 {
        let s = TcpStream::connect(addr).await.unwrap();
        dribblers.push(tokio::spawn(async move {
            let (mut rd, mut wr) = s.into_split();
            let drip = async {
                for b in b"GET /healthz HTTP/1.1\r\nHost: t\r\nX-Slow: ".iter().chain(std::iter::repeat(&b'a')) {
                    if wr.write_all(&[*b]).await.is_err() {
                        break;
                    }
                    tokio::time::sleep(Duration::from_millis(40)).await;
                }
                std::future::pending::<()>().await;
            };
            tokio::select! {
                closed = closed_within(&mut rd, LIMIT) => closed.then(|| started.elapsed()),
                _ = drip => None,
            }
        }));
    }
    // While they hold their sockets, a normal client is answered at once.
    let mut normal = TcpStream::connect(addr).await.unwrap();
    let t = Instant::now();
    assert_eq!(get_healthz(&mut normal, LIMIT).await.as_deref(), Some("HTTP/1.1 200 OK"));
    assert!(t.elapsed() < Duration::from_secs(2), "a normal request took {:?}", t.elapsed());
    for d in dribblers {
        let closed_after = d.await.unwrap().expect("a client dribbling its headers was never closed");
        // Closed by the header timeout: not before it, and not much after.
        assert!(closed_after >= Duration::from_millis(350), "closed after only {closed_after:?}");
        assert!(closed_after < Duration::from_secs(4), "closed only after {closed_after:?}");
    }
    for s in &mut idle {
        assert!(closed_within(s, LIMIT).await, "an idle socket that sent nothing was never closed");
    }
    // The normal client's keep-alive connection stays open past the header timeout (it idles up to the idle
    // timeout), and a second request dribbled on it is closed on the header timeout from its first byte.
    let (mut rd, mut wr) = normal.into_split();
    assert!(!closed_within(&mut rd, Duration::from_millis(800)).await, "a kept-alive connection was closed on the header timeout");
    let t = Instant::now();
    let drip = async {
        for b in b"GET /healthz HTTP/1.1\r\nHost: t\r\nX-Slow: ".iter().chain(std::iter::repeat(&b'a')) {
            if wr.write_all(&[*b]).await.is_err() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(40)).await;
        }
        std::future::pending::<()>().await;
    };
    tokio::select! {
        closed = closed_within(&mut rd, LIMIT) => assert!(closed, "a request dribbled on a kept-alive connection was never closed"),
        _ = drip => unreachable!(),
    }
    assert!(t.elapsed() >= Duration::from_millis(350) && t.elapsed() < Duration::from_secs(4), "closed after {:?}", t.elapsed());
    shut(stop, task).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kept_alive_connection_idles_until_the_idle_timeout() {
    let settings = HttpServerSettings { header_read_timeout_ms: 200, idle_timeout_ms: 1_200, max_connections: 8, ..Default::default() };
    let (addr, stop, task) = start(settings).await;
    let mut s = TcpStream::connect(addr).await.unwrap();
    assert_eq!(get_healthz(&mut s, LIMIT).await.as_deref(), Some("HTTP/1.1 200 OK"));
    let t = Instant::now();
    // Still usable well past the header timeout...
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(get_healthz(&mut s, LIMIT).await.as_deref(), Some("HTTP/1.1 200 OK"));
    // ...and closed once idle for the idle timeout.
    let t2 = Instant::now();
    assert!(closed_within(&mut s, LIMIT).await, "an idle keep-alive connection was never closed");
    assert!(
        t2.elapsed() >= Duration::from_millis(1_100) && t2.elapsed() < Duration::from_secs(5),
        "closed after {:?} (since start {:?})",
        t2.elapsed(),
        t.elapsed()
    );
    shut(stop, task).await;
}

/// A connection from `ip` (any address of 127.0.0.0/8 reaches a listener on 127.0.0.1).
async fn connect_from(ip: [u8; 4], addr: SocketAddr) -> TcpStream {
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.bind(SocketAddr::from((ip, 0))).unwrap();
    socket.connect(addr).await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_the_cap_an_idle_connection_is_shed_for_a_new_one() {
    let settings = HttpServerSettings { header_read_timeout_ms: 30_000, idle_timeout_ms: 30_000, max_connections: 3, ..Default::default() };
    let (addr, stop, task) = start(settings).await;
    // One keep-alive connection answered once, then two that never send a request: the cap is reached.
    let mut served = TcpStream::connect(addr).await.unwrap();
    assert_eq!(get_healthz(&mut served, LIMIT).await.as_deref(), Some("HTTP/1.1 200 OK"));
    let mut silent = [TcpStream::connect(addr).await.unwrap(), TcpStream::connect(addr).await.unwrap()];
    // A fourth is served at once: the silent connection opened first makes room.
    let mut fourth = TcpStream::connect(addr).await.unwrap();
    let t = Instant::now();
    assert_eq!(get_healthz(&mut fourth, LIMIT).await.as_deref(), Some("HTTP/1.1 200 OK"));
    assert!(t.elapsed() < Duration::from_secs(2), "served after {:?}", t.elapsed());
    assert!(closed_within(&mut silent[0], LIMIT).await, "the oldest connection that never made a request was shed");
    assert!(!closed_within(&mut silent[1], Duration::from_millis(200)).await, "only one was shed");
    // The connection that made a request goes last: a fifth sheds the other silent one, not it.
    let mut fifth = TcpStream::connect(addr).await.unwrap();
    assert_eq!(get_healthz(&mut fifth, LIMIT).await.as_deref(), Some("HTTP/1.1 200 OK"));
    assert!(closed_within(&mut silent[1], LIMIT).await);
    assert_eq!(get_healthz(&mut served, LIMIT).await.as_deref(), Some("HTTP/1.1 200 OK"), "still open");
    shut(stop, task).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_the_cap_with_every_connection_busy_a_new_one_waits_for_a_free_slot() {
    let settings = HttpServerSettings { header_read_timeout_ms: 30_000, idle_timeout_ms: 30_000, max_connections: 2, ..Default::default() };
    let (addr, stop, task) = start(settings).await;
    // Two requests whose bodies are not finished: each connection is handling a request.
    let mut busy = Vec::new();
    for _ in 0..2 {
        let mut s = TcpStream::connect(addr).await.unwrap();
        s.write_all(b"POST /echo HTTP/1.1\r\nHost: t\r\nContent-Type: text/plain\r\nContent-Length: 4\r\n\r\nab").await.unwrap();
        busy.push(s);
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    let mut third = TcpStream::connect(addr).await.unwrap();
    let waiting = tokio::spawn(async move { (get_healthz(&mut third, LIMIT).await, Instant::now()) });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!waiting.is_finished(), "a busy connection was shed, or the cap was passed");
    // One request completes and its client goes: the third is served.
    let freed = Instant::now();
    let mut first = busy.remove(0);
    first.write_all(b"cd").await.unwrap();
    drop(first);
    let (status, answered) = waiting.await.unwrap();
    assert_eq!(status.as_deref(), Some("HTTP/1.1 200 OK"));
    assert!(answered.duration_since(freed) < Duration::from_secs(2), "served {:?} after a slot freed", answered.duration_since(freed));
    drop(busy);
    shut(stop, task).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_client_address_gets_its_share_and_others_are_served() {
    let settings = HttpServerSettings { max_connections: 16, max_connections_per_client: 4, ..Default::default() };
    let (addr, stop, task) = start(settings).await;
    let mut held = Vec::new();
    for _ in 0..4 {
        held.push(connect_from([127, 0, 0, 2], addr).await);
    }
    // The fifth from the same address is closed as it is accepted.
    let mut fifth = connect_from([127, 0, 0, 2], addr).await;
    assert!(closed_within(&mut fifth, LIMIT).await, "a connection past the client's share was kept");
    // Another address is served, at once.
    let mut other = connect_from([127, 0, 0, 3], addr).await;
    let t = Instant::now();
    assert_eq!(get_healthz(&mut other, LIMIT).await.as_deref(), Some("HTTP/1.1 200 OK"));
    assert!(t.elapsed() < Duration::from_secs(1), "{:?}", t.elapsed());
    // A share freed is a share back.
    drop(held.pop());
    tokio::time::sleep(Duration::from_millis(200)).await;
    let mut again = connect_from([127, 0, 0, 2], addr).await;
    assert_eq!(get_healthz(&mut again, LIMIT).await.as_deref(), Some("HTTP/1.1 200 OK"));
    drop(held);
    shut(stop, task).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_dribbled_below_the_minimum_rate_is_cut_short() {
    let settings = HttpServerSettings { min_body_bytes_per_s: 1_000, body_rate_grace_ms: 500, ..Default::default() };
    let (addr, stop, task) = start(settings).await;
    let s = TcpStream::connect(addr).await.unwrap();
    let (mut rd, mut wr) = s.into_split();
    wr.write_all(b"POST /echo HTTP/1.1\r\nHost: t\r\nContent-Type: text/plain\r\nContent-Length: 1000000\r\n\r\n").await.unwrap();
    let t = Instant::now();
    // A byte every 100 ms (it resets the idle timeout each time) until the server gives up on it.
    let drip = async {
        while wr.write_all(b"x").await.is_ok() {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        std::future::pending::<()>().await;
    };
    let mut answer = Vec::new();
    tokio::select! {
        r = tokio::time::timeout(LIMIT, rd.read_to_end(&mut answer)) => assert!(r.is_ok(), "never cut"),
        _ = drip => unreachable!(),
    }
    assert!(t.elapsed() >= Duration::from_millis(450) && t.elapsed() < Duration::from_secs(3), "cut after {:?}", t.elapsed());
    // The handler saw a body error (axum's String extractor answers 400) and the connection closed after it.
    let answer = String::from_utf8_lossy(&answer);
    assert!(answer.starts_with("HTTP/1.1 4"), "{answer}");
    // A body at a normal pace is read whole.
    let mut ok = TcpStream::connect(addr).await.unwrap();
    ok.write_all(b"POST /echo HTTP/1.1\r\nHost: t\r\nContent-Type: text/plain\r\nContent-Length: 2\r\nConnection: close\r\n\r\nhi")
        .await
        .unwrap();
    let mut answer = String::new();
    tokio::time::timeout(LIMIT, ok.read_to_string(&mut answer)).await.unwrap().unwrap();
    assert!(answer.starts_with("HTTP/1.1 200 OK") && answer.ends_with("hi"), "{answer}");
    shut(stop, task).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_body_is_closed_after_the_idle_timeout() {
    let settings = HttpServerSettings { header_read_timeout_ms: 30_000, idle_timeout_ms: 400, max_connections: 8, ..Default::default() };
    let (addr, stop, task) = start(settings).await;
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(b"POST /echo HTTP/1.1\r\nHost: t\r\nContent-Type: text/plain\r\nContent-Length: 100\r\n\r\nhalf").await.unwrap();
    let t = Instant::now();
    assert!(closed_within(&mut s, LIMIT).await, "a connection whose body stalled was never closed");
    assert!(t.elapsed() >= Duration::from_millis(350) && t.elapsed() < Duration::from_secs(4), "closed after {:?}", t.elapsed());
    // A complete body within the timeout is answered.
    let mut ok = TcpStream::connect(addr).await.unwrap();
    ok.write_all(b"POST /echo HTTP/1.1\r\nHost: t\r\nContent-Type: text/plain\r\nContent-Length: 2\r\nConnection: close\r\n\r\nhi")
        .await
        .unwrap();
    let mut answer = String::new();
    tokio::time::timeout(LIMIT, ok.read_to_string(&mut answer)).await.unwrap().unwrap();
    assert!(answer.starts_with("HTTP/1.1 200 OK") && answer.ends_with("hi"), "{answer}");
    shut(stop, task).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_closes_idle_keep_alive_connections_and_returns() {
    let settings = HttpServerSettings { header_read_timeout_ms: 30_000, idle_timeout_ms: 30_000, max_connections: 8, ..Default::default() };
    let (addr, stop, task) = start(settings).await;
    let mut s = TcpStream::connect(addr).await.unwrap();
    assert_eq!(get_healthz(&mut s, LIMIT).await.as_deref(), Some("HTTP/1.1 200 OK"));
    stop.cancel();
    assert!(closed_within(&mut s, LIMIT).await, "an idle keep-alive connection outlived shutdown");
    tokio::time::timeout(LIMIT, task).await.expect("the server stops once its connections are closed").unwrap();
    assert!(TcpStream::connect(addr).await.is_err(), "the listener is closed");
}
