//! Protobuf encoding of borrowed values, byte for byte as prost encodes the generated message with the same field
//! values (proto3: a zero or empty scalar is left out, fields in declaration order, every element of a repeated
//! message written). Lets a record be encoded from the values it is made of, without first copying each of them
//! into an owned `String` of the generated struct and freeing them all after.

use hookline_core::model::Header;
use prost::encoding::{encode_key, encode_varint, encoded_len_varint, key_len, WireType};

pub struct Writer(pub Vec<u8>);

impl Writer {
    pub fn with_capacity(n: usize) -> Self {
        Self(Vec::with_capacity(n))
    }

    fn len_delimited(&mut self, tag: u32, len: usize) {
        encode_key(tag, WireType::LengthDelimited, &mut self.0);
        encode_varint(len as u64, &mut self.0);
    }

    /// A `string` or `bytes` field.
    pub fn bytes(&mut self, tag: u32, v: &[u8]) {
        if !v.is_empty() {
            self.len_delimited(tag, v.len());
            self.0.extend_from_slice(v);
        }
    }

    pub fn str(&mut self, tag: u32, v: &str) {
        self.bytes(tag, v.as_bytes());
    }

    /// A `string` field made of `parts` joined by one space (as `parts.join(" ")` would be).
    pub fn joined(&mut self, tag: u32, parts: &[String]) {
        let len = parts.iter().map(String::len).sum::<usize>() + parts.len().saturating_sub(1);
        if len == 0 {
            return;
        }
        self.len_delimited(tag, len);
        for (i, p) in parts.iter().enumerate() {
            if i > 0 {
                self.0.push(b' ');
            }
            self.0.extend_from_slice(p.as_bytes());
        }
    }

    /// `uint32`, `uint64`, `bool` (as 0/1) fields.
    pub fn uint(&mut self, tag: u32, v: u64) {
        if v != 0 {
            encode_key(tag, WireType::Varint, &mut self.0);
            encode_varint(v, &mut self.0);
        }
    }

    /// `int64`, `int32` and enum fields (a negative value is its 64-bit two's complement, 10 bytes).
    pub fn int(&mut self, tag: u32, v: i64) {
        self.uint(tag, v as u64);
    }

    /// A `repeated Header` field.
    pub fn headers(&mut self, tag: u32, headers: &[Header]) {
        for h in headers {
            let len = str_len(1, h.name.len()) + str_len(2, h.value.len());
            self.len_delimited(tag, len);
            self.str(1, &h.name);
            self.bytes(2, &h.value);
        }
    }
}

/// The encoded size of a length-delimited field of `len` bytes (0 when empty: left out).
fn str_len(tag: u32, len: usize) -> usize {
    if len == 0 {
        0
    } else {
        key_len(tag) + encoded_len_varint(len as u64) + len
    }
}
