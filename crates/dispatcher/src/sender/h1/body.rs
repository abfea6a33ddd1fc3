//! The response body's decoder: content-length, chunked (extensions and trailers skipped) or to the end of the
//! connection. Fed whatever bytes have arrived; hands the body's bytes to a sink and says how many it consumed.

use super::response::Framing;
use super::Error;

/// The longest chunk-size line (size and extensions) accepted.
pub const MAX_CHUNK_LINE: usize = 4096;
/// The most bytes of trailer fields accepted after the last chunk.
pub const MAX_TRAILER_BYTES: usize = 64 * 1024;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decoder {
    Length(u64),
    /// Expecting a chunk-size line.
    ChunkSize,
    /// In a chunk's data, this much of it left.
    ChunkData(u64),
    /// The CRLF after a chunk's data.
    ChunkEnd,
    /// Trailer fields after the last chunk, this many bytes of them so far.
    Trailers(usize),
    /// To the end of the connection.
    Close,
    Done,
}

impl Decoder {
    pub fn new(framing: Framing) -> Self {
        match framing {
            Framing::Empty | Framing::Length(0) => Decoder::Done,
            Framing::Length(n) => Decoder::Length(n),
            Framing::Chunked => Decoder::ChunkSize,
            Framing::Close => Decoder::Close,
        }
    }

    pub fn is_done(&self) -> bool {
        *self == Decoder::Done
    }

    /// Decodes what it can of `input`, handing body bytes to `sink`; returns how many bytes of `input` it used.
    /// Using fewer than all while not done means it needs more input to go on.
    pub fn decode(&mut self, input: &[u8], sink: &mut impl FnMut(&[u8])) -> Result<usize, Error> {
        let mut used = 0usize;
        loop {
            let rest = &input[used..];
            match *self {
                Decoder::Done => return Ok(used),
                _ if rest.is_empty() => return Ok(used),
                Decoder::Length(left) | Decoder::ChunkData(left) => {
                    let take = usize::try_from(left).unwrap_or(usize::MAX).min(rest.len());
                    sink(&rest[..take]);
                    used += take;
                    let left = left - take as u64;
                    *self = match (*self, left) {
                        (Decoder::Length(_), 0) => Decoder::Done,
                        (Decoder::Length(_), n) => Decoder::Length(n),
                        (_, 0) => Decoder::ChunkEnd,
                        (_, n) => Decoder::ChunkData(n),
                    };
                }
                Decoder::Close => {
                    sink(rest);
                    return Ok(input.len());
                }
                Decoder::ChunkSize => {
                    let Some(end) = line_end(rest) else {
                        // The longest line's CR may have come without its LF: that much is still a line.
                        if rest.len() > MAX_CHUNK_LINE.saturating_add(1) {
                            return Err(Error::Malformed("chunk size line too long".into()));
                        }
                        return Ok(used);
                    };
                    if end > MAX_CHUNK_LINE || !rest[0].is_ascii_hexdigit() {
                        return Err(bad_chunk_size(&rest[..end]));
                    }
                    let size = match httparse::parse_chunk_size(&rest[..end + 2]) {
                        Ok(httparse::Status::Complete((_, size))) => size,
                        _ => return Err(bad_chunk_size(&rest[..end])),
                    };
                    used += end + 2;
                    *self = if size == 0 { Decoder::Trailers(0) } else { Decoder::ChunkData(size) };
                }
                Decoder::ChunkEnd => {
                    if rest.len() < 2 {
                        if rest[0] != b'\r' {
                            return Err(Error::Malformed("chunk data not followed by CRLF".into()));
                        }
                        return Ok(used);
                    }
                    if &rest[..2] != b"\r\n" {
                        return Err(Error::Malformed("chunk data not followed by CRLF".into()));
                    }
                    used += 2;
                    *self = Decoder::ChunkSize;
                }
                Decoder::Trailers(seen) => {
                    let Some(end) = line_end(rest) else {
                        if seen.saturating_add(rest.len()) > MAX_TRAILER_BYTES {
                            return Err(Error::Malformed("trailers too large".into()));
                        }
                        return Ok(used);
                    };
                    used += end + 2;
                    let seen = seen.saturating_add(end + 2);
                    *self = if end == 0 {
                        Decoder::Done
                    } else if seen > MAX_TRAILER_BYTES {
                        return Err(Error::Malformed("trailers too large".into()));
                    } else {
                        Decoder::Trailers(seen)
                    };
                }
            }
        }
    }
}

/// Where the first CRLF starts.
fn line_end(b: &[u8]) -> Option<usize> {
    b.windows(2).position(|w| w == b"\r\n")
}

fn bad_chunk_size(line: &[u8]) -> Error {
    let shown = &line[..line.len().min(64)];
    Error::Malformed(format!("invalid chunk size line {:?}", String::from_utf8_lossy(shown)))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Feeds `input` in pieces of `step` bytes (keeping what the decoder did not use, as the reader does); the
    /// body, and whether the decoder finished with nothing left over.
    fn decode_in_steps(framing: Framing, input: &[u8], step: usize) -> Result<(Vec<u8>, bool), Error> {
        let mut d = Decoder::new(framing);
        let mut body = Vec::new();
        let mut pending: Vec<u8> = Vec::new();
        for piece in input.chunks(step) {
            pending.extend_from_slice(piece);
            let used = d.decode(&pending, &mut |b| body.extend_from_slice(b))?;
            pending.drain(..used);
        }
        Ok((body, d.is_done() && pending.is_empty()))
    }

    #[test]
    fn chunked_with_extensions_and_trailers_in_any_split() {
        let raw = b"4;name=value\r\nWiki\r\n5 ; x\r\npedia\r\nE\r\n in\r\n\r\nchunks.\r\n0;last\r\nExpires: never\r\nX-Trailer: 1\r\n\r\n";
        for step in [1, 2, 3, 7, raw.len()] {
            let (body, done) = decode_in_steps(Framing::Chunked, raw, step).unwrap();
            assert_eq!(body, b"Wikipedia in\r\n\r\nchunks.", "step {step}");
            assert!(done, "step {step}");
        }
    }

    #[test]
    fn a_length_body_ends_at_its_length() {
        let mut d = Decoder::new(Framing::Length(5));
        let mut body = Vec::new();
        assert_eq!(d.decode(b"hello, extra", &mut |b| body.extend_from_slice(b)).unwrap(), 5);
        assert!(d.is_done());
        assert_eq!(body, b"hello");
        assert!(Decoder::new(Framing::Empty).is_done());
        let mut d = Decoder::new(Framing::Close);
        assert_eq!(d.decode(b"anything", &mut |_| {}).unwrap(), 8);
        assert!(!d.is_done(), "a close-delimited body ends with the connection");
    }

    #[test]
    fn bad_chunks_are_refused() {
        for (raw, why) in [
            (&b"zz\r\n"[..], "invalid chunk size line \"zz\""),
            (b"\r\n", "invalid chunk size line \"\""),
            (b"-1\r\n", "invalid chunk size line \"-1\""),
            (b"fffffffffffffffff\r\n", "invalid chunk size line \"fffffffffffffffff\""),
            (b"3\r\nabcX\r\n", "chunk data not followed by CRLF"),
        ] {
            match decode_in_steps(Framing::Chunked, raw, 1) {
                Err(Error::Malformed(m)) => assert_eq!(m, why, "{raw:?}"),
                other => panic!("{raw:?}: {other:?}"),
            }
        }
        let long = vec![b'1'; MAX_CHUNK_LINE + 10];
        assert!(matches!(decode_in_steps(Framing::Chunked, &long, 100), Err(Error::Malformed(_))));
        // The longest line is accepted however it is split, even with its CR and LF in different reads.
        let mut longest = format!("1;{}\r\nx\r\n0\r\n\r\n", "e".repeat(MAX_CHUNK_LINE - 2)).into_bytes();
        for step in [MAX_CHUNK_LINE + 1, MAX_CHUNK_LINE, 1000, longest.len()] {
            assert_eq!(decode_in_steps(Framing::Chunked, &longest, step).unwrap(), (b"x".to_vec(), true), "step {step}");
        }
        longest.insert(0, b'0');
        assert!(matches!(decode_in_steps(Framing::Chunked, &longest, MAX_CHUNK_LINE + 2), Err(Error::Malformed(_))));
        let mut trailers = b"0\r\n".to_vec();
        while trailers.len() < MAX_TRAILER_BYTES + 100 {
            trailers.extend_from_slice(b"x-t: 0123456789\r\n");
        }
        assert!(matches!(decode_in_steps(Framing::Chunked, &trailers, 1000), Err(Error::Malformed(m)) if m == "trailers too large"));
    }

    mod properties {
        use super::*;
        use proptest::prelude::*;

        /// A chunked encoding of `chunks` (sizes in hex, sometimes with an extension), then `trailers`.
        fn chunked(chunks: &[Vec<u8>], ext: bool, trailers: &[String]) -> Vec<u8> {
            let mut raw = Vec::new();
            for c in chunks.iter().filter(|c| !c.is_empty()) {
                raw.extend_from_slice(format!("{:X}", c.len()).as_bytes());
                if ext {
                    raw.extend_from_slice(b";e=1");
                }
                raw.extend_from_slice(b"\r\n");
                raw.extend_from_slice(c);
                raw.extend_from_slice(b"\r\n");
            }
            raw.extend_from_slice(b"0\r\n");
            for t in trailers {
                raw.extend_from_slice(format!("x-{t}: v\r\n").as_bytes());
            }
            raw.extend_from_slice(b"\r\n");
            raw
        }

        fn framing() -> impl Strategy<Value = Framing> {
            prop_oneof![Just(Framing::Chunked), (0u64..64).prop_map(Framing::Length), Just(Framing::Close), Just(Framing::Empty)]
        }

        proptest! {
            /// Whatever a receiver sends and however the kernel splits it, the decoder neither panics nor reads
            /// a different body: the outcome for any split is the outcome for the whole input at once.
            #[test]
            fn any_bytes_in_any_split_decode_as_they_do_whole(
                framing in framing(),
                raw in proptest::collection::vec(
                    prop_oneof![Just(b'\r'), Just(b'\n'), Just(b'0'), Just(b'a'), Just(b';'), Just(b'F'), any::<u8>()],
                    0..300,
                ),
                step in 1usize..40,
            ) {
                let whole = decode_in_steps(framing, &raw, raw.len().max(1));
                let split = decode_in_steps(framing, &raw, step);
                match (whole, split) {
                    (Ok(w), Ok(s)) => prop_assert_eq!(w, s),
                    (Err(_), Err(_)) => {}
                    (w, s) => prop_assert!(false, "whole {:?} but split {:?}", w, s),
                }
            }

            /// A well-formed chunked body, with or without extensions and trailers, is exactly its chunks'
            /// bytes in any split, and the decoder ends where the message ends.
            #[test]
            fn a_chunked_body_is_its_chunks_in_any_split(
                chunks in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..40), 0..6),
                ext in any::<bool>(),
                trailers in proptest::collection::vec("[a-z]{1,8}", 0..3),
                step in 1usize..50,
            ) {
                let mut raw = chunked(&chunks, ext, &trailers);
                let expected: Vec<u8> = chunks.concat();
                let (body, done) = decode_in_steps(Framing::Chunked, &raw, step).unwrap();
                prop_assert_eq!(&body, &expected);
                prop_assert!(done);
                // Bytes after the message (a pipelined response) are left for the next head.
                raw.extend_from_slice(b"HTTP/1.1 200 OK\r\n");
                let mut d = Decoder::new(Framing::Chunked);
                let used = d.decode(&raw, &mut |_| {}).unwrap();
                prop_assert!(d.is_done());
                prop_assert_eq!(&raw[used..], b"HTTP/1.1 200 OK\r\n");
            }
        }
    }
}
