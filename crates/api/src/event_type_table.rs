//! The event-type catalogue, read from the compacted `event-types` topic into memory (ingest is its only writer
//! and reader). Each type's JSON Schema is compiled once, when its record is applied, so publishing only runs the
//! compiled validator. Schemas are checked with `boon` with every external reference refused: a `$ref` to another
//! document (`file://`, `https://`) would make the server read files or the network on a caller's behalf.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, RwLock};

use hookline_core::model::{EventType, SchemaValidation as StoredMode};
use hookline_service::config::SchemaValidation;
use prost::Message as _;
use serde_json::Value;

/// How often one type's schema violations are logged in `warn` mode (each one is counted).
pub const WARN_LOG_INTERVAL_MS: i64 = 60_000;
/// Where a schema is compiled from: a name of ours, so a schema's relative `$ref`s stay inside it.
const SCHEMA_URL: &str = "urn:hookline:event-type-schema";

/// A compiled JSON Schema.
pub struct Compiled {
    schemas: boon::Schemas,
    index: boon::SchemaIndex,
}

/// Where `data` breaks its schema: `path` inside the event (`data.amount`, `data.items[2]`), the schema keyword
/// (`type`, `required`, ...) and boon's words for it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Violation {
    pub path: String,
    pub rule: String,
    pub message: String,
}

struct RefuseLoads;

impl boon::UrlLoader for RefuseLoads {
    fn load(&self, url: &str) -> Result<Value, Box<dyn std::error::Error>> {
        Err(format!("{url} is not loaded: a schema may refer only to itself (#/$defs/...)").into())
    }
}

impl Compiled {
    /// Compiles `schema` (any draft boon knows; 2020-12 unless `$schema` says otherwise).
    pub fn new(schema: &Value) -> Result<Self, String> {
        let mut compiler = boon::Compiler::new();
        compiler.use_loader(Box::new(RefuseLoads));
        compiler.add_resource(SCHEMA_URL, schema.clone()).map_err(|e| e.to_string())?;
        let mut schemas = boon::Schemas::new();
        let index = compiler.compile(SCHEMA_URL, &mut schemas).map_err(|e| format!("{e:#}"))?;
        Ok(Self { schemas, index })
    }

    /// Checks the event's `data` (`null` when it has none).
    pub fn check(&self, data: &Value) -> Result<(), Violation> {
        let Err(e) = self.schemas.validate(data, self.index) else { return Ok(()) };
        // The innermost cause names the value and keyword at fault (the outer ones are "not valid against ...").
        let mut leaf = &e;
        while let Some(first) = leaf.causes.first() {
            leaf = first;
        }
        let mut path = String::from("data");
        for t in &leaf.instance_location.tokens {
            match t {
                boon::InstanceToken::Prop(p) => {
                    path.push('.');
                    path.push_str(p);
                }
                boon::InstanceToken::Item(i) => path.push_str(&format!("[{i}]")),
            }
        }
        // A missing property is named itself, not the object that lacks it.
        if let boon::ErrorKind::Required { want } = &leaf.kind {
            if let Some(first) = want.first() {
                path.push('.');
                path.push_str(first);
            }
        }
        let rule = leaf.kind.keyword_path().map_or("schema", |k| k.keyword).to_owned();
        Err(Violation { path, rule, message: leaf.kind.to_string() })
    }
}

/// One catalogued type, with what is derived from its record once.
pub struct Entry {
    pub ty: EventType,
    /// None: no schema (or a stored one that no longer compiles, which is logged and then not checked).
    pub schema: Option<Compiled>,
}

impl Entry {
    pub fn new(ty: EventType) -> Self {
        let schema = if ty.schema_json.is_empty() {
            None
        } else {
            match serde_json::from_str::<Value>(&ty.schema_json).map_err(|e| e.to_string()).and_then(|v| Compiled::new(&v)) {
                Ok(c) => Some(c),
                Err(e) => {
                    tracing::warn!(event_type = %ty.name, error = %e, "a stored event-type schema does not compile; events of the type are not checked");
                    None
                }
            }
        };
        Self { ty, schema }
    }

    /// The type's own mode, or `default` when it names none.
    pub fn mode(&self, default: SchemaValidation) -> SchemaValidation {
        match StoredMode::try_from(self.ty.validation).unwrap_or(StoredMode::Unspecified) {
            StoredMode::Unspecified => default,
            StoredMode::Off => SchemaValidation::Off,
            StoredMode::Warn => SchemaValidation::Warn,
            StoredMode::Reject => SchemaValidation::Reject,
        }
    }
}

/// Event types by name, in name order (the listing walks a range). Cloning shares it.
#[derive(Clone, Default)]
pub struct EventTypeTable {
    inner: Arc<RwLock<BTreeMap<String, Arc<Entry>>>>,
    /// When each type's violations were last logged (warn mode).
    warned: Arc<Mutex<HashMap<String, i64>>>,
}

impl EventTypeTable {
    pub fn apply(&self, key: &[u8], value: Option<&[u8]>) {
        let name = String::from_utf8_lossy(key).into_owned();
        // Compiled outside the lock: readers are never held up by a schema's compilation.
        let entry = match value.filter(|v| !v.is_empty()).map(EventType::decode) {
            None => None,
            Some(Ok(mut t)) => {
                t.name.clone_from(&name);
                Some(Arc::new(Entry::new(t)))
            }
            Some(Err(e)) => {
                tracing::warn!(event_type = %name, error = %e, "undecodable event-type record ignored");
                return;
            }
        };
        let mut map = self.inner.write().expect("event-type table lock");
        match entry {
            Some(e) => {
                map.insert(name, e);
            }
            None => {
                map.remove(&name);
                self.warned.lock().expect("warned lock").remove(&name);
            }
        }
    }

    pub fn get(&self, name: &str) -> Option<Arc<Entry>> {
        self.inner.read().expect("event-type table lock").get(name).cloned()
    }

    pub fn contains(&self, name: &str) -> bool {
        self.inner.read().expect("event-type table lock").contains_key(name)
    }

    pub fn len(&self) -> usize {
        self.inner.read().expect("event-type table lock").len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Up to `limit` types after the name `after`, and whether more follow.
    pub fn page(&self, after: Option<&str>, limit: usize) -> (Vec<Arc<Entry>>, bool) {
        use std::ops::Bound::{Excluded, Unbounded};
        let map = self.inner.read().expect("event-type table lock");
        let start = after.map_or(Unbounded, |a| Excluded(a.to_owned()));
        let mut it = map.range::<String, _>((start, Unbounded)).map(|(_, t)| t.clone());
        let items: Vec<_> = it.by_ref().take(limit).collect();
        let more = it.next().is_some();
        (items, more)
    }

    /// True when a violation of `name` seen at `now_ms` should be logged (the last was logged at least
    /// [`WARN_LOG_INTERVAL_MS`] before).
    pub fn should_log(&self, name: &str, now_ms: i64) -> bool {
        let mut w = self.warned.lock().expect("warned lock");
        let last = w.entry(name.to_owned()).or_insert(i64::MIN);
        if now_ms.saturating_sub(*last) < WARN_LOG_INTERVAL_MS {
            return false;
        }
        *last = now_ms;
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn record(schema: &Value, mode: StoredMode) -> Vec<u8> {
        EventType { name: "x".into(), schema_json: schema.to_string(), validation: mode as i32, ..Default::default() }.encode_to_vec()
    }

    #[test]
    fn violations_name_the_path_inside_the_event_and_the_keyword() {
        let schema = json!({
            "type": "object",
            "required": ["amount", "currency"],
            "properties": {
                "amount": {"type": "integer", "minimum": 0},
                "items": {"type": "array", "items": {"$ref": "#/$defs/item"}}
            },
            "$defs": {"item": {"type": "object", "properties": {"sku": {"type": "string"}}}}
        });
        let c = Compiled::new(&schema).unwrap();
        assert_eq!(c.check(&json!({"amount": 3, "currency": "EUR"})), Ok(()));
        let v = c.check(&json!({"amount": "3", "currency": "EUR"})).unwrap_err();
        assert_eq!((v.path.as_str(), v.rule.as_str()), ("data.amount", "type"), "{v:?}");
        let v = c.check(&json!({"amount": -1, "currency": "EUR"})).unwrap_err();
        assert_eq!((v.path.as_str(), v.rule.as_str()), ("data.amount", "minimum"), "{v:?}");
        let v = c.check(&json!({"amount": 1})).unwrap_err();
        assert_eq!((v.path.as_str(), v.rule.as_str()), ("data.currency", "required"), "{v:?}");
        let v = c.check(&json!({"amount": 1, "currency": "EUR", "items": [{"sku": "a"}, {"sku": 7}]})).unwrap_err();
        assert_eq!((v.path.as_str(), v.rule.as_str()), ("data.items[1].sku", "type"), "{v:?}");
        let v = c.check(&Value::Null).unwrap_err();
        assert_eq!((v.path.as_str(), v.rule.as_str()), ("data", "type"), "{v:?}");
    }

    #[test]
    fn schemas_that_do_not_compile_or_reach_outside_are_refused() {
        assert!(Compiled::new(&json!({"type": "no-such-type"})).is_err());
        assert!(Compiled::new(&json!({"minimum": "zero"})).is_err());
        let e = Compiled::new(&json!({"$ref": "file:///etc/hostname"})).err().expect("a file reference is refused");
        assert!(e.contains("not loaded"), "{e}");
        assert!(Compiled::new(&json!({"$ref": "https://example.com/s.json"})).is_err());
        // The drafts' meta-schemas are built in, not fetched.
        assert!(Compiled::new(&json!({"$schema": "http://json-schema.org/draft-07/schema#", "type": "object"})).is_ok());
    }

    #[test]
    fn the_table_compiles_on_apply_and_a_type_without_a_mode_takes_the_default() {
        let t = EventTypeTable::default();
        assert!(t.is_empty());
        t.apply(b"x", Some(&record(&json!({"type": "object"}), StoredMode::Unspecified)));
        let e = t.get("x").unwrap();
        assert!(e.schema.as_ref().unwrap().check(&json!([])).is_err());
        assert_eq!(e.mode(SchemaValidation::Reject), SchemaValidation::Reject);
        t.apply(b"x", Some(&record(&json!({"type": "object"}), StoredMode::Off)));
        assert_eq!(t.get("x").unwrap().mode(SchemaValidation::Reject), SchemaValidation::Off);
        // A stored schema that no longer compiles is not checked rather than refusing everything.
        t.apply(b"x", Some(&record(&json!({"type": 5}), StoredMode::Reject)));
        assert!(t.get("x").unwrap().schema.is_none());
        t.apply(b"x", None);
        assert!(!t.contains("x") && t.is_empty());
    }

    #[test]
    fn warnings_are_logged_once_per_type_per_interval() {
        let t = EventTypeTable::default();
        assert!(t.should_log("a", 1_000));
        assert!(!t.should_log("a", 1_000 + WARN_LOG_INTERVAL_MS - 1));
        assert!(t.should_log("b", 1_001), "each type has its own interval");
        assert!(t.should_log("a", 1_000 + WARN_LOG_INTERVAL_MS));
    }

    #[test]
    fn pages_in_name_order() {
        let t = EventTypeTable::default();
        for n in ["c", "a", "b"] {
            t.apply(n.as_bytes(), Some(&EventType { description: n.into(), ..Default::default() }.encode_to_vec()));
        }
        let (page, more) = t.page(None, 2);
        assert_eq!(page.iter().map(|e| e.ty.name.as_str()).collect::<Vec<_>>(), ["a", "b"]);
        assert!(more);
        let (page, more) = t.page(Some("b"), 2);
        assert_eq!(page.iter().map(|e| e.ty.name.as_str()).collect::<Vec<_>>(), ["c"]);
        assert!(!more);
    }
}
