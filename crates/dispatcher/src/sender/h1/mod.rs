//! The dispatcher's HTTP/1.1 client framing, on `httparse`: one request, its response head, its body, on a
//! connection the delivery's own future drives (no connection task, no request channel).
//!
//! Why not hyper's `client::conn::http1`: each of its connections keeps a request channel (~8.9 KB), an 8 KiB write
//! buffer and an 8 KiB read buffer while the request waits for its answer, and with 10,000 deliveries in flight
//! there are 10,000 of them. Here a waiting request holds its socket and nothing else: the head is written from a
//! buffer of its own size (it and the body freed once sent on a new connection), and the read buffer is taken only
//! when the socket is readable, starting at [`INITIAL_READ_BYTES`] and growing up to [`MAX_HEAD_BYTES`] for the head.

mod body;
mod request;
mod response;

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use futures::FutureExt;
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::TcpStream;

pub use request::{asks_close, encode_method_head, Method};
pub use response::Framing;

/// The read buffer's first size, taken when the response starts to arrive.
pub const INITIAL_READ_BYTES: usize = 1024;
/// The largest response head (interim 1xx heads included) before the try fails as "message head is too large".
/// The attempt record keeps 4 KiB of response headers at most.
pub const MAX_HEAD_BYTES: usize = 64 * 1024;
/// The read buffer's largest size while reading a body (bytes are handed on as they arrive; this bounds a read).
const BODY_READ_BYTES: usize = 8 * 1024;

/// What went wrong in an exchange. The sender records it as `connect_error` with this as the reason (a TLS
/// error inside an `io::Error` as `tls_error`).
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("writing the request failed")]
    Write(#[source] io::Error),
    /// The connection ended (or was reset) before any byte of a response: on a reused connection, the receiver
    /// closed it while it was idle, and the request may go again on a new one.
    #[error("connection closed before a response")]
    Unanswered(#[source] Option<io::Error>),
    #[error("reading the response failed")]
    Read(#[source] io::Error),
    #[error("connection closed before message completed")]
    Incomplete,
    #[error("message head is too large (over {MAX_HEAD_BYTES} bytes)")]
    HeadTooLarge,
    #[error("unexpected 101 Switching Protocols")]
    Upgrade,
    #[error("{0}")]
    Malformed(String),
}

type TlsStream = tokio_rustls::client::TlsStream<TokioIo<TokioIo<TcpStream>>>;

/// A connection's transport: plain TCP inline, TLS boxed (rustls' state is much larger than a socket, and every
/// waiting delivery holds its stream).
pub enum Stream {
    Plain(TcpStream),
    Tls(Box<TlsStream>),
}

impl Stream {
    /// The stream a connector made (`hyper_rustls` wraps both kinds in hyper's I/O adapters), as tokio I/O.
    pub fn from_connector(s: hyper_rustls::MaybeHttpsStream<TokioIo<TcpStream>>) -> Self {
        match s {
            hyper_rustls::MaybeHttpsStream::Http(tcp) => Stream::Plain(tcp.into_inner()),
            hyper_rustls::MaybeHttpsStream::Https(tls) => Stream::Tls(Box::new(tls.into_inner())),
        }
    }

    /// Whether the peer closed an idle connection (or sent something unasked, which makes it unusable too),
    /// judged without waiting.
    pub fn closed_while_idle(&mut self) -> bool {
        let mut probe = [0u8; 1];
        self.read(&mut probe).now_or_never().is_some()
    }

    /// Waits until a plain socket has bytes (or an error) to read, so that no buffer is held before then; a TLS
    /// stream may have bytes decrypted already, so it is read at once.
    async fn readable(&self) -> io::Result<()> {
        match self {
            Stream::Plain(tcp) => tcp.readable().await,
            Stream::Tls(_) => Ok(()),
        }
    }

    /// Writes the head and the body (vectored where the transport can) and flushes.
    async fn write_request(&mut self, head: &[u8], body: &[u8]) -> io::Result<()> {
        let (mut head, mut body) = (head, body);
        while !head.is_empty() || !body.is_empty() {
            let n = if head.is_empty() {
                self.write(body).await?
            } else {
                self.write_vectored(&[io::IoSlice::new(head), io::IoSlice::new(body)]).await?
            };
            if n == 0 {
                return Err(io::ErrorKind::WriteZero.into());
            }
            let from_head = n.min(head.len());
            head = &head[from_head..];
            body = &body[(n - from_head).min(body.len())..];
        }
        self.flush().await
    }
}

impl AsyncRead for Stream {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_read(cx, buf),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Stream {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_write(cx, buf),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_flush(cx),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_shutdown(cx),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
        }
    }

    fn is_write_vectored(&self) -> bool {
        match self {
            Stream::Plain(s) => s.is_write_vectored(),
            Stream::Tls(s) => s.is_write_vectored(),
        }
    }

    fn poll_write_vectored(self: Pin<&mut Self>, cx: &mut Context<'_>, bufs: &[io::IoSlice<'_>]) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_write_vectored(cx, bufs),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_write_vectored(cx, bufs),
        }
    }
}

/// A response whose head was read; its body is read with [`Response::read_body`].
pub struct Response {
    pub status: http::StatusCode,
    pub headers: http::HeaderMap,
    body: Body,
}

struct Body {
    conn: Conn,
    decoder: body::Decoder,
    /// Neither side asked to close, and the body is not delimited by the close.
    keep_alive: bool,
}

/// A stream and the bytes read from it but not yet used.
struct Conn {
    io: Stream,
    buf: Vec<u8>,
    /// Where the unused bytes in `buf` start.
    pos: usize,
}

impl Conn {
    fn unused(&self) -> &[u8] {
        &self.buf[self.pos..]
    }

    fn consume(&mut self, n: usize) {
        self.pos = self.pos.saturating_add(n).min(self.buf.len());
        if self.pos == self.buf.len() {
            self.buf.clear();
            self.pos = 0;
        }
    }

    /// Reads more bytes after the unused ones, keeping at most `limit` unused bytes (`Ok(None)`: that many are
    /// held already). `Ok(Some(0))`: the end of the stream.
    async fn fill(&mut self, limit: usize) -> io::Result<Option<usize>> {
        if self.pos > 0 {
            self.buf.drain(..self.pos);
            self.pos = 0;
        }
        if self.buf.len() >= limit {
            return Ok(None);
        }
        if self.buf.capacity() == 0 {
            self.io.readable().await?;
        }
        if self.buf.len() == self.buf.capacity() {
            let want = self.buf.capacity().saturating_mul(2).clamp(INITIAL_READ_BYTES, limit.max(INITIAL_READ_BYTES));
            self.buf.reserve_exact(want.saturating_sub(self.buf.len()));
        }
        self.io.read_buf(&mut self.buf).await.map(Some)
    }
}

/// Writes one request: `head` from [`encode_method_head`], then `body`.
pub async fn write_request(io: &mut Stream, head: &[u8], body: &[u8]) -> Result<(), Error> {
    io.write_request(head, body).await.map_err(Error::Write)
}

/// Reads the response head after a request was written, skipping interim (1xx) responses. `close`: the request
/// asked to close the connection.
pub fn read_response(io: Stream, close: bool) -> impl std::future::Future<Output = Result<Response, Error>> {
    // Not an `async fn`: the stream is moved into `conn` before the future is made, so it is held once.
    let mut conn = Conn { io, buf: Vec::new(), pos: 0 };
    async move {
        let h = read_head(&mut conn).await?;
        let decoder = body::Decoder::new(h.framing);
        let keep_alive = h.keep_alive && !close && h.framing != Framing::Close;
        Ok(Response { status: h.status, headers: h.headers, body: Body { conn, decoder, keep_alive } })
    }
}

async fn read_head(conn: &mut Conn) -> Result<response::Head, Error> {
    // Whether any byte of a response arrived: before it, a closed or reset connection is `Unanswered`.
    let mut answered = false;
    loop {
        if !conn.unused().is_empty() {
            answered = true;
            match response::parse(conn.unused())? {
                Some((len, head)) if head.status.is_informational() => {
                    if head.status == http::StatusCode::SWITCHING_PROTOCOLS {
                        return Err(Error::Upgrade);
                    }
                    conn.consume(len);
                    continue;
                }
                Some((len, head)) => {
                    conn.consume(len);
                    return Ok(head);
                }
                None => {}
            }
        }
        match conn.fill(MAX_HEAD_BYTES).await {
            Ok(Some(0)) if !answered => return Err(Error::Unanswered(None)),
            Ok(Some(0)) => return Err(Error::Incomplete),
            Ok(Some(_)) => {}
            Ok(None) => return Err(Error::HeadTooLarge),
            Err(e) if !answered && is_reset(&e) => return Err(Error::Unanswered(Some(e))),
            Err(e) => return Err(Error::Read(e)),
        }
    }
}

fn is_reset(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::ConnectionReset | io::ErrorKind::ConnectionAborted | io::ErrorKind::BrokenPipe | io::ErrorKind::UnexpectedEof
    )
}

impl Error {
    /// Whether the request may go again on another connection: a reused connection took it or not, but gave no
    /// answer (the receiver closed it while it was idle).
    pub fn unanswered(&self) -> bool {
        matches!(self, Error::Write(_) | Error::Unanswered(_))
    }
}

/// How reading a body stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BodyEnd {
    /// Read to its end (the rest of the connection is not needed for it).
    Complete,
    /// Reading stopped at the response cap: the rest was not wanted.
    Capped,
    /// The body broke off before its end: the connection closed or failed before `Content-Length` bytes or the
    /// last chunk, or its chunked framing was malformed. The status still decides; the attempt says so.
    CutShort,
}

/// What reading a body gave: its first bytes, how it stopped, and the connection when it can take another request.
pub struct Read {
    pub excerpt: Vec<u8>,
    pub end: BodyEnd,
    pub reusable: Option<Stream>,
}

impl Response {
    /// Reads the body until its end or until `cap` bytes of it were read, keeping the first `keep` bytes. The
    /// connection is handed back only when the body ended, nothing follows it, and neither side asked to close.
    pub async fn read_body(self, cap: u64, keep: usize) -> Read {
        let Body { mut conn, mut decoder, keep_alive } = self.body;
        let mut excerpt = Vec::new();
        let mut read: u64 = 0;
        let end = loop {
            let mut sink = |data: &[u8]| {
                read = read.saturating_add(data.len() as u64);
                if excerpt.len() < keep {
                    let take = (keep - excerpt.len()).min(data.len());
                    excerpt.extend_from_slice(&data[..take]);
                }
            };
            match decoder.decode(conn.unused(), &mut sink) {
                Ok(used) => conn.consume(used),
                // A broken body after the status arrived does not change the outcome: the status decides.
                Err(_) => break BodyEnd::CutShort,
            }
            if decoder.is_done() {
                break BodyEnd::Complete;
            }
            if read >= cap {
                break BodyEnd::Capped;
            }
            let limit = match decoder {
                // A line (chunk size, trailer) must fit; data is handed on as it comes.
                body::Decoder::ChunkSize => body::MAX_CHUNK_LINE + 2,
                body::Decoder::Trailers(_) => body::MAX_TRAILER_BYTES,
                _ => BODY_READ_BYTES,
            };
            match conn.fill(limit).await {
                Ok(Some(0)) if decoder == body::Decoder::Close => break BodyEnd::Complete,
                Ok(Some(0)) | Err(_) => break BodyEnd::CutShort,
                // The read buffer is full without a complete line: framing no receiver should send.
                Ok(None) => break BodyEnd::CutShort,
                Ok(Some(_)) => {}
            }
        };
        let reusable = (end == BodyEnd::Complete && keep_alive && conn.unused().is_empty()).then_some(conn.io);
        Read { excerpt, end, reusable }
    }
}
