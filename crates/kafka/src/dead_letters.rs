//! Dead-letter records on the wire: the value in the configured format (`hookline_core::dead_letter`) with the
//! `hookline-*` headers, and reading either format back from a consumed record.

use hookline_core::dead_letter::{self, DecodeError, DlqFormat};
use hookline_core::model::DeadLetter;
use rdkafka::message::{Header, Headers, OwnedHeaders};
use rdkafka::Message;

/// How a writer writes dead letters: `dlq.format`, within the producer's record size.
#[derive(Debug, Clone, Copy)]
pub struct DeadLetterWriter {
    pub format: DlqFormat,
    /// The largest value: `kafka.message_max_bytes` less room for the key, the headers and the record's framing.
    pub max_value_bytes: usize,
}

/// Kept free in a record for the key, the `hookline-*` headers and Kafka's own framing.
const RECORD_ROOM: usize = 8 << 10;

impl DeadLetterWriter {
    pub fn new(format: DlqFormat, settings: &crate::KafkaSettings) -> Self {
        DeadLetterWriter { format, max_value_bytes: settings.message_max_bytes.saturating_sub(RECORD_ROOM) }
    }

    /// The value and headers of `dl`'s record (see `hookline_core::dead_letter::encode_within`).
    pub fn record(&self, dl: &DeadLetter) -> (Vec<u8>, OwnedHeaders) {
        let (value, format, cut) = dead_letter::encode_within(dl, self.format, self.max_value_bytes);
        if format != self.format {
            tracing::warn!(reason = %dl.reason, delivery = %dl.delivery_id, bytes = value.len(), "dead letter too large as JSON for a Kafka record: written as protobuf");
        }
        (value, headers(cut.as_ref().unwrap_or(dl), format))
    }
}

/// The value and headers of `dl`'s record in `format`, whatever its size (tests, tools).
pub fn record(dl: &DeadLetter, format: DlqFormat) -> (Vec<u8>, OwnedHeaders) {
    (dead_letter::encode(dl, format), headers(dl, format))
}

pub fn headers(dl: &DeadLetter, format: DlqFormat) -> OwnedHeaders {
    dead_letter::headers(dl, format)
        .into_iter()
        .fold(OwnedHeaders::new(), |h, (key, value)| h.insert(Header { key, value: Some(value.as_bytes()) }))
}

/// The value of the first header named `name`, if the record has one.
pub fn header<'a, M: Message>(m: &'a M, name: &str) -> Option<&'a [u8]> {
    m.headers()?.iter().find(|h| h.key == name).and_then(|h| h.value)
}

/// A consumed dead letter of either format (by its `hookline-format` header, else by its content).
pub fn decode<M: Message>(m: &M) -> Result<DeadLetter, DecodeError> {
    dead_letter::decode(m.payload().unwrap_or_default(), header(m, dead_letter::header::FORMAT))
}
