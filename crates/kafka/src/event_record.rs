//! Reading a record of the `events` topic: its value with what its headers and key say (CloudEvents binary and
//! structured mode, the content type), through the one decoder every reader of the topic shares.

use hookline_core::cloudevents::{Binding, Context};
use hookline_core::event_decode::{decode_record, decode_record_with, DecodeError, Decoded, Invalid};
use hookline_core::registry_framing::PayloadDecoder;
use rdkafka::message::{Headers, Message};

/// The CloudEvents attributes, content type and key of a record. Records without headers cost nothing here.
pub fn context<M: Message>(m: &M) -> Context<'_> {
    let Some(headers) = m.headers() else { return Context { key: m.key(), ..Default::default() } };
    // A header without a value carries nothing to read.
    Context::from_headers(Binding::Kafka, headers.iter().filter_map(|h| Some((h.key, h.value?))), m.key())
}

/// Decodes one `events` record (`max_bytes`: the event size limit).
pub fn decode<M: Message>(m: &M, max_bytes: usize) -> Result<Decoded, Invalid> {
    decode_record(m.payload(), &context(m), max_bytes, false)
}

/// [`decode`], with Schema Registry framed Avro and Protobuf values made JSON through `registry`.
pub fn decode_with<M: Message>(m: &M, max_bytes: usize, registry: &dyn PayloadDecoder) -> Result<Decoded, DecodeError> {
    decode_record_with(m.payload(), &context(m), max_bytes, false, registry)
}
