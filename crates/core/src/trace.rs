//! W3C trace context (`traceparent`), parsed strictly: what arrives from outside is either a well-formed version-00
//! header or ignored, and what hookline sends on is always formatted from the parsed value, never copied raw.

use std::fmt;

/// A parsed `traceparent`: `00-<32 hex trace id>-<16 hex parent id>-<2 hex flags>`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TraceParent {
    pub trace_id: [u8; 16],
    pub span_id: [u8; 8],
    pub flags: u8,
}

/// Longest `tracestate` carried on (the W3C limit a vendor must propagate).
pub const MAX_TRACESTATE_LEN: usize = 512;

impl TraceParent {
    /// The header value, or `None` unless it is exactly a version-00 `traceparent` in lowercase hex with a non-zero
    /// trace id and parent id. Only version 00 is accepted: it is the only one whose shape is defined.
    pub fn parse(value: &str) -> Option<TraceParent> {
        let b = value.as_bytes();
        if b.len() != 55 || b[2] != b'-' || b[35] != b'-' || b[52] != b'-' || &b[..2] != b"00" {
            return None;
        }
        let mut trace_id = [0u8; 16];
        let mut span_id = [0u8; 8];
        let mut flags = [0u8; 1];
        hex_into(&b[3..35], &mut trace_id)?;
        hex_into(&b[36..52], &mut span_id)?;
        hex_into(&b[53..55], &mut flags)?;
        if trace_id == [0; 16] || span_id == [0; 8] {
            return None;
        }
        Some(TraceParent { trace_id, span_id, flags: flags[0] })
    }

    pub fn sampled(&self) -> bool {
        self.flags & 1 == 1
    }
}

impl fmt::Display for TraceParent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("00-")?;
        for b in self.trace_id {
            write!(f, "{b:02x}")?;
        }
        f.write_str("-")?;
        for b in self.span_id {
            write!(f, "{b:02x}")?;
        }
        write!(f, "-{:02x}", self.flags)
    }
}

/// Lowercase hex only: the W3C grammar has no uppercase digits.
fn hex_into(src: &[u8], dst: &mut [u8]) -> Option<()> {
    fn nibble(c: u8) -> Option<u8> {
        match c {
            b'0'..=b'9' => Some(c - b'0'),
            b'a'..=b'f' => Some(c - b'a' + 10),
            _ => None,
        }
    }
    for (i, out) in dst.iter_mut().enumerate() {
        *out = (nibble(src[2 * i])? << 4) | nibble(src[2 * i + 1])?;
    }
    Some(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const VALID: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    #[test]
    fn a_valid_traceparent_parses_and_formats_back_identically() {
        let tp = TraceParent::parse(VALID).expect("valid");
        assert_eq!(tp.trace_id[0], 0x4b);
        assert_eq!(tp.span_id[7], 0xb7);
        assert!(tp.sampled());
        assert_eq!(tp.to_string(), VALID);
        let unsampled = TraceParent::parse("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00").unwrap();
        assert!(!unsampled.sampled());
    }

    #[test]
    fn other_versions_are_ignored() {
        for v in ["01", "ff", "0a", "fe"] {
            let s = format!("{v}{}", &VALID[2..]);
            assert_eq!(TraceParent::parse(&s), None, "{s}");
        }
        // A future version may append fields; version 00 must not.
        assert_eq!(TraceParent::parse(&format!("{VALID}-00")), None);
    }

    #[test]
    fn all_zero_ids_are_invalid() {
        assert_eq!(TraceParent::parse("00-00000000000000000000000000000000-00f067aa0ba902b7-01"), None);
        assert_eq!(TraceParent::parse("00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01"), None);
    }

    #[test]
    fn wrong_lengths_and_separators_are_invalid() {
        for s in [
            "",
            "00",
            "00-4bf92f3577b34da6a3ce929d0e0e473-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e47366-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-1",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-011",
            "00_4bf92f3577b34da6a3ce929d0e0e4736_00f067aa0ba902b7_01",
            " 00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-0",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01 ",
        ] {
            assert_eq!(TraceParent::parse(s), None, "{s:?}");
        }
    }

    #[test]
    fn uppercase_and_non_hex_digits_are_invalid() {
        assert_eq!(TraceParent::parse("00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01"), None);
        assert_eq!(TraceParent::parse("00-4bf92f3577b34da6a3ce929d0e0e4736-00F067AA0BA902B7-01"), None);
        assert_eq!(TraceParent::parse("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-0A"), None);
        assert_eq!(TraceParent::parse("00-4bf92f3577b34da6a3ce929d0e0e473g-00f067aa0ba902b7-01"), None);
        // Multi-byte UTF-8 of the right byte length does not slip through.
        assert_eq!(TraceParent::parse("00-4bf92f3577b34da6a3ce929d0e0e47é-00f067aa0ba902b7-01"), None);
    }
}
