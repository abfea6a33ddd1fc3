//! The local receiver: a plain hyper HTTP/1 server on its own runtime (threads `bench-recv`, so its CPU is
//! separable), on two ports (the second one for endpoints that misbehave, so they do not share a connection
//! pool host with the healthy ones).
//!
//! Paths: `/ok/{sub}` 204 · `/fail1/{sub}` 503 on the first request of an event, 204 after ·
//! `/ra/{secs}/{sub}` 429 with `Retry-After: secs` first, 204 after · `/hang/{sub}` answers after `hang_ms`
//! (longer than the policy timeout) · `/hold/{sub}` answers once released. Events whose id starts with
//! `warm-` are answered 204 at once on every path and only mark the subscription as reached.

use std::collections::HashSet;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::sync::watch;

/// One recorded request.
#[derive(Clone, Debug)]
pub struct Arrival {
    pub id: String,
    pub sub: u32,
    /// Wall clock, µs since the epoch (compared with due times the dispatcher recorded).
    pub unix_us: i64,
    /// Monotonic µs since the receiver started (compared with the bench's publish times).
    pub mono_us: u64,
    /// The first request of this event on a fail-once path.
    pub first: bool,
}

pub struct RecvState {
    pub t0: Instant,
    /// 2xx answers to non-warm-up requests.
    pub ok: AtomicU64,
    /// 2xx answers on the first port (healthy endpoints).
    pub ok_healthy: AtomicU64,
    /// Whether `/ok` arrivals are recorded (latency) or only counted (throughput).
    pub record_ok: AtomicBool,
    pub arrivals: Mutex<Vec<Arrival>>,
    seen: Mutex<HashSet<String>>,
    warm: Mutex<HashSet<u32>>,
    pub hang_ms: AtomicU64,
    pub holding: AtomicI64,
    pub max_holding: AtomicI64,
    release_tx: watch::Sender<bool>,
    release_rx: watch::Receiver<bool>,
}

impl RecvState {
    pub fn warm_count(&self) -> usize {
        self.warm.lock().expect("warm lock").len()
    }

    pub fn release_holds(&self) {
        let _ = self.release_tx.send(true);
    }

    pub fn mono_us(&self) -> u64 {
        self.t0.elapsed().as_micros() as u64
    }

    pub fn take_arrivals(&self) -> Vec<Arrival> {
        std::mem::take(&mut *self.arrivals.lock().expect("arrivals lock"))
    }
}

pub struct Receiver {
    /// Healthy endpoints.
    pub addr: SocketAddr,
    /// Misbehaving endpoints (hang, hold).
    pub addr2: SocketAddr,
    pub state: Arc<RecvState>,
    rt: Option<tokio::runtime::Runtime>,
}

impl Receiver {
    pub fn start(t0: Instant) -> anyhow::Result<Self> {
        let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).thread_name("bench-recv").enable_all().build()?;
        let (release_tx, release_rx) = watch::channel(false);
        let state = Arc::new(RecvState {
            t0,
            ok: AtomicU64::new(0),
            ok_healthy: AtomicU64::new(0),
            record_ok: AtomicBool::new(false),
            arrivals: Mutex::new(Vec::new()),
            seen: Mutex::new(HashSet::new()),
            warm: Mutex::new(HashSet::new()),
            hang_ms: AtomicU64::new(60_000),
            holding: AtomicI64::new(0),
            max_holding: AtomicI64::new(0),
            release_tx,
            release_rx,
        });
        let mut addrs = Vec::new();
        for healthy in [true, false] {
            // Registered with the receiver's own runtime (entering it is allowed from async code; block_on is not).
            let socket = {
                let _enter = rt.enter();
                let s = tokio::net::TcpSocket::new_v4()?;
                s.set_reuseaddr(true)?;
                s.bind("127.0.0.1:0".parse().expect("literal"))?;
                s.listen(4096)?
            };
            addrs.push(socket.local_addr()?);
            let st = state.clone();
            rt.spawn(async move {
                loop {
                    let Ok((stream, _)) = socket.accept().await else {
                        tokio::time::sleep(Duration::from_millis(10)).await;
                        continue;
                    };
                    let _ = stream.set_nodelay(true);
                    let st = st.clone();
                    tokio::spawn(async move {
                        let svc = service_fn(move |req| handle(st.clone(), healthy, req));
                        let _ = hyper::server::conn::http1::Builder::new().serve_connection(TokioIo::new(stream), svc).await;
                    });
                }
            });
        }
        Ok(Self { addr: addrs[0], addr2: addrs[1], state, rt: Some(rt) })
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}/{path}", self.addr)
    }

    pub fn url2(&self, path: &str) -> String {
        format!("http://{}/{path}", self.addr2)
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        if let Some(rt) = self.rt.take() {
            rt.shutdown_background();
        }
    }
}

fn now_unix_us() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_micros() as i64)
}

fn reply(status: StatusCode) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(Bytes::new()));
    *r.status_mut() = status;
    r
}

async fn handle(st: Arc<RecvState>, healthy: bool, req: Request<Incoming>) -> Result<Response<Full<Bytes>>, Infallible> {
    let mono_us = st.mono_us();
    let unix_us = now_unix_us();
    let (parts, body) = req.into_parts();
    // Read the whole body, as a real receiver would before answering.
    let _ = body.collect().await;
    let id = parts.headers.get("webhook-id").and_then(|v| v.to_str().ok()).unwrap_or("");
    let mut seg = parts.uri.path().trim_start_matches('/').split('/');
    let kind = seg.next().unwrap_or("");
    let (ra, sub) = if kind == "ra" { (seg.next().unwrap_or("1").to_owned(), seg.next()) } else { (String::new(), seg.next()) };
    let sub: u32 = sub.and_then(|s| s.parse().ok()).unwrap_or(u32::MAX);
    if id.starts_with("warm-") {
        st.warm.lock().expect("warm lock").insert(sub);
        return Ok(reply(StatusCode::NO_CONTENT));
    }
    let ok = |st: &RecvState| {
        st.ok.fetch_add(1, Ordering::Relaxed);
        if healthy {
            st.ok_healthy.fetch_add(1, Ordering::Relaxed);
        }
    };
    let record = |first: bool| {
        st.arrivals.lock().expect("arrivals lock").push(Arrival { id: id.to_owned(), sub, unix_us, mono_us, first });
    };
    let resp = match kind {
        "ok" => {
            if st.record_ok.load(Ordering::Relaxed) {
                record(false);
            }
            ok(&st);
            reply(StatusCode::NO_CONTENT)
        }
        "fail1" | "ra" => {
            let first = st.seen.lock().expect("seen lock").insert(id.to_owned());
            record(first);
            if !first {
                ok(&st);
                reply(StatusCode::NO_CONTENT)
            } else if kind == "ra" {
                let mut r = reply(StatusCode::TOO_MANY_REQUESTS);
                r.headers_mut().insert("retry-after", ra.parse().expect("digits are a header value"));
                r
            } else {
                reply(StatusCode::SERVICE_UNAVAILABLE)
            }
        }
        "hang" => {
            tokio::time::sleep(Duration::from_millis(st.hang_ms.load(Ordering::Relaxed))).await;
            reply(StatusCode::NO_CONTENT)
        }
        "hold" => {
            let now = st.holding.fetch_add(1, Ordering::Relaxed) + 1;
            st.max_holding.fetch_max(now, Ordering::Relaxed);
            let mut rx = st.release_rx.clone();
            let _ = rx.wait_for(|r| *r).await;
            st.holding.fetch_sub(1, Ordering::Relaxed);
            ok(&st);
            reply(StatusCode::NO_CONTENT)
        }
        _ => reply(StatusCode::NOT_FOUND),
    };
    Ok(resp)
}
