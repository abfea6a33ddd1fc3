//! Dead-letter records on the wire: the value in the configured format (`hookline_core::dead_letter`) with the
//! `hookline-*` headers, and reading either format back from a consumed record.

use hookline_core::dead_letter::{self, DecodeError, DlqFormat};
use hookline_core::model::DeadLetter;
use rdkafka::message::{Header, Headers, OwnedHeaders};
use rdkafka::Message;

/// The value and headers of `dl`'s record.
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
