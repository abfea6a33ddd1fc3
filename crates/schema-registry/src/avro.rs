//! Avro binary payloads to JSON, through their writer schema. A decoder of its own (about 300 lines, no
//! dependency): `apache-avro` brings a second `syn`, `darling`, `strum` and more for what hookline needs here,
//! which is reading one datum (docs/architecture.md has the build-time figures).
//!
//! The JSON is "plain": a union's value is given as the value itself (not Avro's `{"type": value}` JSON encoding),
//! `bytes` and `fixed` as base64, an enum as its symbol, logical types as their underlying value (a `decimal` as
//! its base64 bytes, like any other bytes).

use std::collections::HashMap;

use base64::Engine as _;
use serde_json::{Map, Number, Value};

/// Deepest nesting of schema and of datum: enough for any real record, and no stack overflow on hostile input.
const MAX_DEPTH: usize = 64;
/// Most items of one array or map (items of type `null` take no bytes, so the payload's length does not bound them).
const MAX_ITEMS: u64 = 1 << 20;
/// Most nodes in one schema.
const MAX_NODES: usize = 10_000;

#[derive(Debug, Clone)]
enum Node {
    Null,
    Boolean,
    Int,
    Long,
    Float,
    Double,
    Bytes,
    String,
    Record(Vec<(String, usize)>),
    Enum(Vec<String>),
    Array(usize),
    Map(usize),
    Union(Vec<usize>),
    Fixed(usize),
    /// A named type referred to before its definition was complete (a recursive record): filled in after.
    Placeholder,
}

/// A parsed writer schema.
#[derive(Debug, Clone)]
pub struct AvroSchema {
    nodes: Vec<Node>,
    root: usize,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AvroError {
    #[error("the Avro schema is not JSON: {0}")]
    NotJson(String),
    #[error("the Avro schema is invalid: {0}")]
    Schema(String),
    #[error("the payload does not read as its Avro schema: {0}")]
    Payload(String),
}

fn schema_err(s: impl Into<String>) -> AvroError {
    AvroError::Schema(s.into())
}

fn payload_err(s: impl Into<String>) -> AvroError {
    AvroError::Payload(s.into())
}

struct Parser {
    nodes: Vec<Node>,
    names: HashMap<String, usize>,
}

impl AvroSchema {
    /// `schema` with the named types of `references` (their schema texts, referred to by full name) in scope.
    pub fn parse(schema: &str, references: &[String]) -> Result<Self, AvroError> {
        let mut p = Parser { nodes: Vec::new(), names: HashMap::new() };
        for r in references {
            let v: Value = serde_json::from_str(r).map_err(|e| AvroError::NotJson(e.to_string()))?;
            p.parse(&v, "", 0)?;
        }
        let v: Value = serde_json::from_str(schema).map_err(|e| AvroError::NotJson(e.to_string()))?;
        let root = p.parse(&v, "", 0)?;
        if let Some(i) = p.nodes.iter().position(|n| matches!(n, Node::Placeholder)) {
            return Err(schema_err(format!("node {i} is never defined")));
        }
        Ok(Self { nodes: p.nodes, root })
    }

    /// The datum in `bytes` as JSON; every byte must be read.
    pub fn to_json(&self, bytes: &[u8]) -> Result<Value, AvroError> {
        let mut r = Reader { bytes, at: 0 };
        let v = self.read(self.root, &mut r, 0)?;
        if r.at != bytes.len() {
            return Err(payload_err(format!("{} bytes left over after the datum", bytes.len().saturating_sub(r.at))));
        }
        Ok(v)
    }

    fn read(&self, node: usize, r: &mut Reader<'_>, depth: usize) -> Result<Value, AvroError> {
        if depth > MAX_DEPTH {
            return Err(payload_err(format!("nested deeper than {MAX_DEPTH} levels")));
        }
        let Some(n) = self.nodes.get(node) else { return Err(payload_err("schema node out of range")) };
        Ok(match n {
            Node::Null => Value::Null,
            Node::Boolean => match r.byte()? {
                0 => Value::Bool(false),
                1 => Value::Bool(true),
                b => return Err(payload_err(format!("boolean byte {b}"))),
            },
            Node::Int => {
                let v = r.long()?;
                i32::try_from(v).map_err(|_| payload_err(format!("int {v} out of range")))?;
                Value::from(v)
            }
            Node::Long => Value::from(r.long()?),
            Node::Float => {
                let b = r.take(4)?;
                float(f64::from(f32::from_le_bytes([b[0], b[1], b[2], b[3]])))
            }
            Node::Double => {
                let b = r.take(8)?;
                float(f64::from_le_bytes([b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]]))
            }
            Node::Bytes => {
                let len = r.len()?;
                Value::String(base64::engine::general_purpose::STANDARD.encode(r.take(len)?))
            }
            Node::String => {
                let len = r.len()?;
                let s = std::str::from_utf8(r.take(len)?).map_err(|_| payload_err("a string is not UTF-8"))?;
                Value::String(s.to_owned())
            }
            Node::Fixed(size) => Value::String(base64::engine::general_purpose::STANDARD.encode(r.take(*size)?)),
            Node::Enum(symbols) => {
                let i = r.long()?;
                let s = usize::try_from(i).ok().and_then(|i| symbols.get(i)).ok_or_else(|| payload_err(format!("enum index {i}")))?;
                Value::String(s.clone())
            }
            Node::Record(fields) => {
                let mut m = Map::new();
                for (name, t) in fields {
                    m.insert(name.clone(), self.read(*t, r, depth + 1)?);
                }
                Value::Object(m)
            }
            Node::Union(branches) => {
                let i = r.long()?;
                let t = usize::try_from(i).ok().and_then(|i| branches.get(i)).ok_or_else(|| payload_err(format!("union branch {i}")))?;
                self.read(*t, r, depth + 1)?
            }
            Node::Array(items) => {
                let mut out = Vec::new();
                r.blocks(|r| {
                    out.push(self.read(*items, r, depth + 1)?);
                    Ok(())
                })?;
                Value::Array(out)
            }
            Node::Map(values) => {
                let mut out = Map::new();
                r.blocks(|r| {
                    let len = r.len()?;
                    let k = std::str::from_utf8(r.take(len)?).map_err(|_| payload_err("a map key is not UTF-8"))?.to_owned();
                    out.insert(k, self.read(*values, r, depth + 1)?);
                    Ok(())
                })?;
                Value::Object(out)
            }
            Node::Placeholder => return Err(payload_err("undefined type")),
        })
    }
}

/// NaN and the infinities have no JSON form: `null`.
fn float(f: f64) -> Value {
    Number::from_f64(f).map_or(Value::Null, Value::Number)
}

impl Parser {
    fn push(&mut self, n: Node) -> Result<usize, AvroError> {
        if self.nodes.len() >= MAX_NODES {
            return Err(schema_err(format!("more than {MAX_NODES} types")));
        }
        self.nodes.push(n);
        Ok(self.nodes.len() - 1)
    }

    fn fullname(name: &str, namespace: &str) -> String {
        if name.contains('.') || namespace.is_empty() {
            name.to_owned()
        } else {
            format!("{namespace}.{name}")
        }
    }

    fn parse(&mut self, v: &Value, namespace: &str, depth: usize) -> Result<usize, AvroError> {
        if depth > MAX_DEPTH {
            return Err(schema_err(format!("nested deeper than {MAX_DEPTH} levels")));
        }
        match v {
            Value::String(s) => self.named_or_primitive(s, namespace),
            Value::Array(branches) => {
                let mut ts = Vec::with_capacity(branches.len().min(64));
                for b in branches {
                    ts.push(self.parse(b, namespace, depth + 1)?);
                }
                self.push(Node::Union(ts))
            }
            Value::Object(o) => {
                let t = o.get("type").ok_or_else(|| schema_err("a schema object without \"type\""))?;
                let Value::String(t) = t else {
                    // {"type": {...}} or {"type": [...]}: the inner schema (with a logical type, say).
                    return self.parse(t, namespace, depth + 1);
                };
                let name = |o: &Map<String, Value>| -> Result<(String, String), AvroError> {
                    let n = o.get("name").and_then(Value::as_str).ok_or_else(|| schema_err(format!("a {t} without a name")))?;
                    let ns = o.get("namespace").and_then(Value::as_str).unwrap_or(namespace);
                    let full = Self::fullname(n, ns);
                    let own_ns = full.rsplit_once('.').map_or(String::new(), |(ns, _)| ns.to_owned());
                    Ok((full, own_ns))
                };
                match t.as_str() {
                    "record" | "error" => {
                        let (full, own_ns) = name(o)?;
                        let slot = self.push(Node::Placeholder)?;
                        self.names.insert(full.clone(), slot);
                        let fields =
                            o.get("fields").and_then(Value::as_array).ok_or_else(|| schema_err(format!("record {full} has no fields")))?;
                        let mut out = Vec::with_capacity(fields.len().min(256));
                        for f in fields {
                            let fname = f
                                .get("name")
                                .and_then(Value::as_str)
                                .ok_or_else(|| schema_err(format!("a field of {full} without a name")))?;
                            let ft = f.get("type").ok_or_else(|| schema_err(format!("field {full}.{fname} has no type")))?;
                            out.push((fname.to_owned(), self.parse(ft, &own_ns, depth + 1)?));
                        }
                        self.nodes[slot] = Node::Record(out);
                        Ok(slot)
                    }
                    "enum" => {
                        let (full, _) = name(o)?;
                        let symbols = o
                            .get("symbols")
                            .and_then(Value::as_array)
                            .ok_or_else(|| schema_err(format!("enum {full} has no symbols")))?
                            .iter()
                            .map(|s| {
                                s.as_str().map(str::to_owned).ok_or_else(|| schema_err(format!("enum {full}: a symbol is not a string")))
                            })
                            .collect::<Result<Vec<_>, _>>()?;
                        let i = self.push(Node::Enum(symbols))?;
                        self.names.insert(full, i);
                        Ok(i)
                    }
                    "fixed" => {
                        let (full, _) = name(o)?;
                        let size = o
                            .get("size")
                            .and_then(Value::as_u64)
                            .and_then(|s| usize::try_from(s).ok())
                            .ok_or_else(|| schema_err(format!("fixed {full} has no size")))?;
                        let i = self.push(Node::Fixed(size))?;
                        self.names.insert(full, i);
                        Ok(i)
                    }
                    "array" => {
                        let items = o.get("items").ok_or_else(|| schema_err("an array without items"))?;
                        let t = self.parse(items, namespace, depth + 1)?;
                        self.push(Node::Array(t))
                    }
                    "map" => {
                        let values = o.get("values").ok_or_else(|| schema_err("a map without values"))?;
                        let t = self.parse(values, namespace, depth + 1)?;
                        self.push(Node::Map(t))
                    }
                    other => self.named_or_primitive(other, namespace),
                }
            }
            _ => Err(schema_err(format!("{v} is not a schema"))),
        }
    }

    fn named_or_primitive(&mut self, s: &str, namespace: &str) -> Result<usize, AvroError> {
        let prim = match s {
            "null" => Node::Null,
            "boolean" => Node::Boolean,
            "int" => Node::Int,
            "long" => Node::Long,
            "float" => Node::Float,
            "double" => Node::Double,
            "bytes" => Node::Bytes,
            "string" => Node::String,
            _ => {
                let found = self.names.get(&Self::fullname(s, namespace)).or_else(|| self.names.get(s));
                return found.copied().ok_or_else(|| schema_err(format!("unknown type {s:?}")));
            }
        };
        self.push(prim)
    }
}

struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], AvroError> {
        let end = self.at.checked_add(n).filter(|e| *e <= self.bytes.len()).ok_or_else(|| payload_err("truncated"))?;
        let s = &self.bytes[self.at..end];
        self.at = end;
        Ok(s)
    }

    fn byte(&mut self) -> Result<u8, AvroError> {
        Ok(self.take(1)?[0])
    }

    fn long(&mut self) -> Result<i64, AvroError> {
        let rest = self.bytes.get(self.at..).unwrap_or_default();
        let (v, after) = hookline_core::registry_framing::zigzag(rest).ok_or_else(|| payload_err("a truncated or overlong varint"))?;
        self.at = self.bytes.len() - after.len();
        Ok(v)
    }

    fn len(&mut self) -> Result<usize, AvroError> {
        let n = self.long()?;
        usize::try_from(n).map_err(|_| payload_err(format!("negative length {n}")))
    }

    /// Array and map blocks: a count, its items, until a count of 0. A negative count is followed by the block's
    /// size in bytes.
    fn blocks(&mut self, mut item: impl FnMut(&mut Self) -> Result<(), AvroError>) -> Result<(), AvroError> {
        let mut total = 0u64;
        loop {
            let count = self.long()?;
            if count == 0 {
                return Ok(());
            }
            if count < 0 {
                self.long()?;
            }
            let n = count.unsigned_abs();
            total = total.saturating_add(n);
            if total > MAX_ITEMS {
                return Err(payload_err(format!("more than {MAX_ITEMS} items")));
            }
            for _ in 0..n {
                item(self)?;
            }
        }
    }
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

    fn s(x: &str) -> Vec<u8> {
        [zz(x.len() as i64), x.as_bytes().to_vec()].concat()
    }

    const ENVELOPE: &str = r#"{"type":"record","name":"Envelope","namespace":"com.acme","fields":[
        {"name":"id","type":"string"},{"name":"type","type":"string"},
        {"name":"occurred_at","type":["null",{"type":"long","logicalType":"timestamp-millis"}],"default":null},
        {"name":"data","type":{"type":"record","name":"Data","fields":[
            {"name":"amount","type":"double"},{"name":"tags","type":{"type":"array","items":"string"}},
            {"name":"attrs","type":{"type":"map","values":"int"}},{"name":"kind","type":{"type":"enum","name":"Kind","symbols":["A","B"]}},
            {"name":"raw","type":"bytes"},{"name":"next","type":["null","Data"]}]}}]}"#;

    #[test]
    fn an_envelope_reads_as_plain_json() {
        let schema = AvroSchema::parse(ENVELOPE, &[]).unwrap();
        let data = |next: Vec<u8>| {
            [
                2.5f64.to_le_bytes().to_vec(),
                zz(2),
                s("x"),
                s("y"),
                zz(0),
                zz(-1),
                zz(3),
                s("k"),
                zz(7),
                zz(0),
                zz(1),
                zz(2),
                b"\x01\x02".to_vec(),
                next,
            ]
            .concat()
        };
        let inner = data(zz(0));
        let bytes = [s("evt_1"), s("order.paid"), zz(1), zz(1_700_000_000_000), data([zz(1), inner].concat())].concat();
        let v = schema.to_json(&bytes).unwrap();
        let d = serde_json::json!({"amount":2.5,"tags":["x","y"],"attrs":{"k":7},"kind":"B","raw":"AQI="});
        let mut outer = d.clone();
        outer["next"] = {
            let mut n = d.clone();
            n["next"] = Value::Null;
            n
        };
        assert_eq!(v, serde_json::json!({"id":"evt_1","type":"order.paid","occurred_at":1_700_000_000_000i64,"data":outer}));
    }

    #[test]
    fn bad_payloads_and_schemas_are_errors_not_panics() {
        let schema = AvroSchema::parse(ENVELOPE, &[]).unwrap();
        for bytes in [&b""[..], b"\x02", b"\x7f", &[0xff; 20], b"\x02a\x02b\x04"] {
            assert!(matches!(schema.to_json(bytes), Err(AvroError::Payload(_))), "{bytes:?}");
        }
        let long = AvroSchema::parse("\"long\"", &[]).unwrap();
        assert!(long.to_json(&[zz(1), zz(2)].concat()).is_err(), "bytes left over");
        // A billion nulls in one block take no bytes: the item bound stops them.
        let nulls = AvroSchema::parse(r#"{"type":"array","items":"null"}"#, &[]).unwrap();
        assert!(nulls.to_json(&[zz(1_000_000_000), zz(0)].concat()).is_err());
        for bad in ["{", "{\"type\":\"record\"}", "\"Nope\"", "{\"type\":\"array\"}", "7", &"[".repeat(100)] {
            assert!(AvroSchema::parse(bad, &[]).is_err(), "{bad}");
        }
    }

    #[test]
    fn named_types_of_references_are_in_scope() {
        let r = r#"{"type":"record","name":"Money","namespace":"com.acme","fields":[{"name":"cents","type":"long"}]}"#.to_owned();
        let schema = AvroSchema::parse(r#"{"type":"record","name":"E","fields":[{"name":"m","type":"com.acme.Money"}]}"#, &[r]).unwrap();
        assert_eq!(schema.to_json(&zz(-5)).unwrap(), serde_json::json!({"m":{"cents":-5}}));
    }

    proptest::proptest! {
        #[test]
        fn no_payload_panics(bytes in proptest::collection::vec(proptest::num::u8::ANY, 0..128)) {
            let schema = AvroSchema::parse(ENVELOPE, &[]).unwrap();
            let _ = schema.to_json(&bytes);
        }
    }
}
