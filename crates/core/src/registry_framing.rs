//! Confluent Schema Registry framing (the "wire format" of Confluent's serializers): a `0x00` magic byte, the
//! schema id as 4 bytes big-endian, then the payload. Protobuf payloads start with the message indexes (the path of
//! the message type in the schema's file): a zig-zag varint count, then each index as a zig-zag varint; the single
//! byte `0` stands for `[0]`, the first message.
//!
//! Detection is unambiguous: no JSON text starts with byte 0 (nor with whitespace then 0), and no protobuf message
//! does (its first byte is a field key, and field number 0 is invalid).

use crate::vocabulary::DeadLetterReason;

/// The first byte of a framed value.
pub const MAGIC: u8 = 0;
/// Magic byte and schema id.
pub const HEADER_LEN: usize = 5;
/// Deepest nesting of message indexes accepted: real schemas nest a few levels; the bound keeps a hostile count
/// from allocating.
pub const MAX_MESSAGE_INDEXES: usize = 32;

/// What a registry-backed decoder made of a framed payload that is not JSON (Avro, Protobuf).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Resolved {
    /// The payload as JSON text.
    Json(Vec<u8>),
    /// The schema is not known yet: it is being fetched.
    Pending,
    /// Decoding is settled as impossible (no registry, an unknown id, a payload its schema does not read): a dead
    /// letter with this reason and detail (which the caller prefixes with the schema id).
    Rejected(DeadLetterReason, String),
}

/// Turns framed payloads into JSON through their schemas (the `hookline-schema-registry` crate); core does no I/O.
pub trait PayloadDecoder {
    fn to_json(&self, framed: Framed<'_>) -> Resolved;
}

/// No registry configured: Avro and Protobuf payloads cannot be read.
pub struct NoRegistry;

impl PayloadDecoder for NoRegistry {
    fn to_json(&self, _: Framed<'_>) -> Resolved {
        Resolved::Rejected(DeadLetterReason::EventSchemaRegistryRequired, NO_REGISTRY.into())
    }
}

/// The detail of [`DeadLetterReason::EventSchemaRegistryRequired`].
pub const NO_REGISTRY: &str = "the value is framed for a Schema Registry and its payload is not JSON (Avro or Protobuf): \
     set ingest.schema_registry.url so hookline can fetch the schema and decode it";

/// A framed value: its schema id and the bytes after the header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Framed<'a> {
    pub schema_id: u32,
    pub payload: &'a [u8],
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FramingError {
    #[error("a Schema Registry framed value needs 5 header bytes (magic byte 0 and a 4-byte schema id), it has {0}")]
    Truncated(usize),
    #[error("schema id 0 is not a Schema Registry id")]
    ZeroId,
    #[error("schema id {0}: the Protobuf message indexes are truncated or not varints")]
    BadIndexes(u32),
    #[error("schema id {0}: {1} Protobuf message indexes is more than {MAX_MESSAGE_INDEXES}")]
    TooManyIndexes(u32, u64),
    #[error("schema id {0}: a negative Protobuf message index")]
    NegativeIndex(u32),
}

/// Whether `value` is framed (its first byte is the magic byte).
pub fn is_framed(value: &[u8]) -> bool {
    value.first() == Some(&MAGIC)
}

/// Splits a framed value; `None` when it is not framed.
pub fn split(value: &[u8]) -> Option<Result<Framed<'_>, FramingError>> {
    if !is_framed(value) {
        return None;
    }
    let Some((id, payload)) = value.get(1..HEADER_LEN).zip(value.get(HEADER_LEN..)) else {
        return Some(Err(FramingError::Truncated(value.len())));
    };
    let schema_id = u32::from_be_bytes([id[0], id[1], id[2], id[3]]);
    if schema_id == 0 {
        return Some(Err(FramingError::ZeroId));
    }
    Some(Ok(Framed { schema_id, payload }))
}

/// A Protobuf payload's message indexes and the message bytes after them.
pub fn message_indexes(schema_id: u32, payload: &[u8]) -> Result<(Vec<u32>, &[u8]), FramingError> {
    let (count, mut rest) = zigzag(payload).ok_or(FramingError::BadIndexes(schema_id))?;
    if count == 0 {
        return Ok((vec![0], rest));
    }
    let count = u64::try_from(count).map_err(|_| FramingError::BadIndexes(schema_id))?;
    if count > MAX_MESSAGE_INDEXES as u64 {
        return Err(FramingError::TooManyIndexes(schema_id, count));
    }
    let mut indexes = Vec::with_capacity(count as usize);
    for _ in 0..count {
        let (i, r) = zigzag(rest).ok_or(FramingError::BadIndexes(schema_id))?;
        indexes.push(u32::try_from(i).map_err(|_| FramingError::NegativeIndex(schema_id))?);
        rest = r;
    }
    Ok((indexes, rest))
}

/// A zig-zag varint (at most 10 bytes, as protobuf's and Avro's `long`) and the bytes after it.
pub fn zigzag(bytes: &[u8]) -> Option<(i64, &[u8])> {
    let (v, rest) = varint(bytes)?;
    Some((((v >> 1) as i64) ^ -((v & 1) as i64), rest))
}

/// An unsigned LEB128 varint of at most 10 bytes and the bytes after it.
pub fn varint(bytes: &[u8]) -> Option<(u64, &[u8])> {
    let mut v = 0u64;
    for (i, &b) in bytes.iter().enumerate().take(10) {
        v |= u64::from(b & 0x7f).checked_shl(7 * i as u32)?;
        if b & 0x80 == 0 {
            return Some((v, &bytes[i + 1..]));
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn zz(v: i64) -> Vec<u8> {
        let mut u = ((v << 1) ^ (v >> 63)) as u64;
        let mut out = Vec::new();
        loop {
            let b = (u & 0x7f) as u8;
            u >>= 7;
            if u == 0 {
                out.push(b);
                return out;
            }
            out.push(b | 0x80);
        }
    }

    #[test]
    fn splits_the_header_and_reads_the_id_big_endian() {
        assert_eq!(split(b"{\"id\":1}"), None, "JSON is not framed");
        assert_eq!(split(b"\x0a\x01x"), None, "protobuf is not framed");
        assert_eq!(split(b""), None);
        let v = b"\x00\x00\x01\x00\x07{}";
        assert_eq!(split(v), Some(Ok(Framed { schema_id: 65_543, payload: b"{}" })));
        assert_eq!(split(b"\x00\xff\xff\xff\xff"), Some(Ok(Framed { schema_id: u32::MAX, payload: b"" })));
        for short in [&b"\x00"[..], b"\x00\x00", b"\x00\x00\x00\x01"] {
            assert_eq!(split(short), Some(Err(FramingError::Truncated(short.len()))));
        }
        assert_eq!(split(b"\x00\x00\x00\x00\x00{}"), Some(Err(FramingError::ZeroId)));
    }

    #[test]
    fn message_indexes_as_confluent_writes_them() {
        // The single 0 byte: the first message of the file.
        assert_eq!(message_indexes(1, b"\x00\x08\x01"), Ok((vec![0], &b"\x08\x01"[..])));
        // [1]: count 1, index 1.
        let mut v = zz(1);
        v.extend(zz(1));
        v.extend(b"\x08\x01");
        assert_eq!(message_indexes(1, &v), Ok((vec![1], &b"\x08\x01"[..])));
        // [2, 0, 130]: a nested message, an index past one varint byte.
        let mut v = zz(3);
        for i in [2, 0, 130] {
            v.extend(zz(i));
        }
        assert_eq!(message_indexes(1, &v), Ok((vec![2, 0, 130], &b""[..])));
    }

    #[test]
    fn bad_message_indexes_are_errors_naming_the_schema() {
        assert_eq!(message_indexes(7, b""), Err(FramingError::BadIndexes(7)));
        assert_eq!(message_indexes(7, b"\x80"), Err(FramingError::BadIndexes(7)), "unterminated varint");
        assert_eq!(message_indexes(7, &zz(2)), Err(FramingError::BadIndexes(7)), "count 2, no index");
        assert_eq!(message_indexes(7, &zz(1_000_000)), Err(FramingError::TooManyIndexes(7, 1_000_000)));
        assert_eq!(message_indexes(7, &zz(-3)), Err(FramingError::BadIndexes(7)), "a negative count");
        let mut v = zz(1);
        v.extend(zz(-1));
        assert_eq!(message_indexes(7, &v), Err(FramingError::NegativeIndex(7)));
        assert_eq!(message_indexes(7, &[0xff; 11]), Err(FramingError::BadIndexes(7)), "a varint longer than 10 bytes");
        assert!(FramingError::BadIndexes(7).to_string().contains("schema id 7"));
    }

    #[test]
    fn zigzag_round_trips_extremes() {
        for v in [0, -1, 1, 63, -64, 64, i64::MAX, i64::MIN] {
            assert_eq!(zigzag(&zz(v)), Some((v, &b""[..])), "{v}");
        }
    }

    proptest::proptest! {
        #[test]
        fn no_input_panics(bytes in proptest::collection::vec(proptest::num::u8::ANY, 0..64), id in 1u32..) {
            let _ = split(&bytes);
            let _ = message_indexes(id, &bytes);
            let _ = zigzag(&bytes);
        }
    }
}
