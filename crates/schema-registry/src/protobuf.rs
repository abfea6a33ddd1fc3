//! Protobuf payloads to JSON: the schema's `.proto` text (and its references' texts, by import name) compiled
//! with `protox`, the message picked by the payload's message indexes, decoded and written as JSON by
//! `prost-reflect` with the declared field names and 64-bit integers as numbers (`occurred_at` must be one).

use std::collections::HashMap;

use prost_reflect::{DescriptorPool, DynamicMessage, MessageDescriptor, SerializeOptions};
use protox::file::{ChainFileResolver, File, FileResolver, GoogleFileResolver};

/// The name the schema's own text is compiled under (imports name the references).
const MAIN: &str = "hookline-registry-schema.proto";

#[derive(Debug, Clone)]
pub struct ProtoSchema {
    pool: DescriptorPool,
    main: String,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProtoError {
    #[error("the Protobuf schema does not compile: {0}")]
    Schema(String),
    #[error("the message indexes {0:?} name no message of the schema")]
    NoMessage(Vec<u32>),
    #[error("the payload does not read as {0}: {1}")]
    Payload(String, String),
}

/// Serves the schema's file and its references' by name, the well-known `google/protobuf/*` files after them.
struct Files(HashMap<String, File>);

impl FileResolver for Files {
    fn open_file(&self, name: &str) -> Result<File, protox::Error> {
        self.0.get(name).cloned().ok_or_else(|| protox::Error::file_not_found(name))
    }
}

/// A schema as a registry gives it: `.proto` text, or (as Confluent's Python serializer registers it, and any
/// registry serves with `format=serialized`) a base64 `FileDescriptorProto`, which names itself.
fn file(name: &str, schema: &str) -> Result<File, ProtoError> {
    use base64::Engine as _;
    let looks_base64 = !schema.is_empty() && !schema.bytes().any(|b| b.is_ascii_whitespace() || b == b';');
    if looks_base64 {
        if let Ok(bytes) = base64::engine::general_purpose::STANDARD.decode(schema) {
            if let Ok(f) = File::decode_file_descriptor_proto(bytes.as_slice()) {
                return Ok(f);
            }
        }
    }
    File::from_source(name, schema).map_err(|e| ProtoError::Schema(e.to_string()))
}

impl ProtoSchema {
    /// `references` are (import name, schema).
    pub fn compile(schema: &str, references: &[(String, String)]) -> Result<Self, ProtoError> {
        let mut files = HashMap::new();
        for (name, text) in references {
            let f = file(name, text)?;
            // A descriptor names itself; the import names the reference.
            files.insert(name.clone(), f);
        }
        let main = file(MAIN, schema)?;
        let main_name = if main.name().is_empty() { MAIN.to_owned() } else { main.name().to_owned() };
        files.insert(main_name.clone(), main);
        let mut chain = ChainFileResolver::new();
        chain.add(Files(files));
        chain.add(GoogleFileResolver::new());
        let mut compiler = protox::Compiler::with_file_resolver(chain);
        compiler.include_imports(true);
        compiler.open_file(&main_name).map_err(|e| ProtoError::Schema(e.to_string()))?;
        Ok(Self { pool: compiler.descriptor_pool(), main: main_name })
    }

    /// The message the indexes name: the first is a top-level message of the file, each next one nested in it.
    fn message(&self, indexes: &[u32]) -> Result<MessageDescriptor, ProtoError> {
        let missing = || ProtoError::NoMessage(indexes.to_vec());
        let file = self.pool.get_file_by_name(&self.main).ok_or_else(missing)?;
        let (first, rest) = indexes.split_first().ok_or_else(missing)?;
        let mut m = file.messages().nth(*first as usize).ok_or_else(missing)?;
        for i in rest {
            let child = m.child_messages().nth(*i as usize).ok_or_else(missing)?;
            m = child;
        }
        Ok(m)
    }

    pub fn to_json(&self, indexes: &[u32], message: &[u8]) -> Result<Vec<u8>, ProtoError> {
        let desc = self.message(indexes)?;
        let name = desc.full_name().to_owned();
        let msg = DynamicMessage::decode(desc, message).map_err(|e| ProtoError::Payload(name.clone(), e.to_string()))?;
        let options = SerializeOptions::new().use_proto_field_name(true).stringify_64_bit_integers(false);
        let mut out = serde_json::Serializer::new(Vec::new());
        msg.serialize_with_options(&mut out, &options).map_err(|e| ProtoError::Payload(name, e.to_string()))?;
        Ok(out.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SCHEMA: &str = r#"syntax = "proto3";
package acme.v1;
import "google/protobuf/struct.proto";
import "money.proto";
message Other { string x = 1; }
message OrderEvent {
  string id = 1;
  string type = 2;
  int64 occurred_at = 3;
  Data data = 4;
  message Data { acme.Money total = 1; repeated string tags = 2; google.protobuf.Struct extra = 3; }
}"#;

    fn money() -> (String, String) {
        ("money.proto".into(), "syntax = \"proto3\";\npackage acme;\nmessage Money { int64 cents = 1; string currency = 2; }".into())
    }

    #[test]
    fn the_message_the_indexes_name_reads_as_json_with_declared_field_names() {
        let s = ProtoSchema::compile(SCHEMA, &[money()]).unwrap();
        // OrderEvent{id:"e1", type:"t", occurred_at: 5000000000, data:{total:{cents:7}, tags:["a"]}}
        let money = [0x08u8, 7];
        let data = [&[0x0a, money.len() as u8][..], &money, &[0x12, 1, b'a']].concat();
        let msg = [&b"\x0a\x02e1\x12\x01t\x18\x80\xe4\x97\xd0\x12"[..], &[0x22, data.len() as u8], &data].concat();
        let json: serde_json::Value = serde_json::from_slice(&s.to_json(&[1], &msg).unwrap()).unwrap();
        assert_eq!(
            json,
            serde_json::json!({"id":"e1","type":"t","occurred_at":5_000_000_000i64,"data":{"total":{"cents":7},"tags":["a"]}})
        );
        // [1, 0]: OrderEvent.Data.
        let nested: serde_json::Value = serde_json::from_slice(&s.to_json(&[1, 0], &data).unwrap()).unwrap();
        assert_eq!(nested["tags"], serde_json::json!(["a"]));
        assert_eq!(s.to_json(&[0], b"\x0a\x01z").unwrap(), br#"{"x":"z"}"#);
    }

    /// What Confluent's Python ProtobufSerializer registers: the file descriptor, serialized, in base64.
    #[test]
    fn a_base64_file_descriptor_is_a_schema_too() {
        let fdp = "ChBhY21lL29yZGVyLnByb3RvEgdhY21lLnYxIiQKBU9yZGVyEg0KBXRvdGFsGAEgASgDEgwKBG5vdGUYAiABKAkiWQoKT3JkZXJFdmVudBIKCgJpZBgBIAEoCRIMCgR0eXBlGAIgASgJEhMKC29jY3VycmVkX2F0GAMgASgDEhwKBGRhdGEYBCABKAsyDi5hY21lLnYxLk9yZGVyYgZwcm90bzM=";
        let s = ProtoSchema::compile(fdp, &[]).unwrap();
        let json: serde_json::Value =
            serde_json::from_slice(&s.to_json(&[1], b"\x0a\x02e3\x12\x01t\x18\x05\x22\x02\x08\x07").unwrap()).unwrap();
        assert_eq!(json, serde_json::json!({"id":"e3","type":"t","occurred_at":5,"data":{"total":7}}));
    }

    #[test]
    fn bad_schemas_indexes_and_payloads_are_errors() {
        assert!(matches!(ProtoSchema::compile("syntax = \"proto3\"; message {", &[]), Err(ProtoError::Schema(_))));
        assert!(matches!(ProtoSchema::compile(SCHEMA, &[]), Err(ProtoError::Schema(_))), "a missing reference");
        let s = ProtoSchema::compile(SCHEMA, &[money()]).unwrap();
        assert_eq!(s.to_json(&[2], b""), Err(ProtoError::NoMessage(vec![2])));
        assert_eq!(s.to_json(&[1, 5], b""), Err(ProtoError::NoMessage(vec![1, 5])));
        assert!(matches!(s.to_json(&[1], b"\x0a\x09ab"), Err(ProtoError::Payload(..))));
    }

    proptest::proptest! {
        #[test]
        fn no_payload_panics(bytes in proptest::collection::vec(proptest::num::u8::ANY, 0..96), i in 0u32..3) {
            let s = ProtoSchema::compile(SCHEMA, &[money()]).unwrap();
            let _ = s.to_json(&[i], &bytes);
            let _ = s.to_json(&[1, i], &bytes);
        }
    }
}
