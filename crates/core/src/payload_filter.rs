//! Payload filters of subscriptions: conditions on an event's fields, evaluated in the fan-out after the event
//! type matched. A filter is JSON, parsed once (on save, and when a subscription is loaded) into a small typed tree:
//!
//! ```json
//! {"all": [{"path": "data.amount", "gte": 100},
//!          {"any": [{"path": "data.currency", "eq": "EUR"}, {"path": "data.country", "prefix": "DE"}]},
//!          {"path": "data.customer.vip", "exists": true}]}
//! ```
//!
//! A path is dot-separated and starts at the event envelope: `id`, `type`, `tenant`, `entity_id`, the CloudEvents
//! attributes `source`, `subject` and `extensions.<name>`, or `data.…` into the event's JSON data (a segment of digits also indexes an array). An event whose data is not a JSON document
//! matches no filter at all, whatever the conditions (documented in docs/filters.md).

use std::cmp::Ordering;

use serde_json::{Map, Number, Value};

pub const MAX_FILTER_BYTES: usize = 16 << 10;
/// Conditions and combinators together.
pub const MAX_NODES: usize = 64;
pub const MAX_DEPTH: usize = 8;
pub const MAX_PATH_BYTES: usize = 256;
pub const MAX_PATH_SEGMENTS: usize = 16;
pub const MAX_STRING_BYTES: usize = 1024;

/// The envelope fields a path may start with.
pub const ROOTS: [&str; 8] = ["id", "type", "tenant", "entity_id", "source", "subject", "extensions", "data"];

#[derive(Debug, Clone, PartialEq)]
pub enum Filter {
    /// Every child matches (and at least one is given).
    All(Vec<Filter>),
    /// At least one child matches.
    Any(Vec<Filter>),
    Cond(Condition),
}

#[derive(Debug, Clone, PartialEq)]
pub struct Condition {
    /// As written, for explanations.
    pub path: String,
    segments: Vec<String>,
    pub op: Op,
}

#[derive(Debug, Clone, PartialEq)]
pub enum Op {
    /// Equal to a scalar; numbers compare by value (`1` equals `1.0`).
    Eq(Value),
    /// The field is present (`true`) or absent (`false`). A JSON `null` is present.
    Exists(bool),
    /// A string field starting with this.
    Prefix(String),
    /// Numeric comparisons: the field must be a number.
    Gt(Number),
    Gte(Number),
    Lt(Number),
    Lte(Number),
}

impl Op {
    fn word(&self) -> &'static str {
        match self {
            Op::Eq(_) => "eq",
            Op::Exists(_) => "exists",
            Op::Prefix(_) => "prefix",
            Op::Gt(_) => "gt",
            Op::Gte(_) => "gte",
            Op::Lt(_) => "lt",
            Op::Lte(_) => "lte",
        }
    }

    fn operand(&self) -> Value {
        match self {
            Op::Eq(v) => v.clone(),
            Op::Exists(b) => Value::Bool(*b),
            Op::Prefix(s) => Value::String(s.clone()),
            Op::Gt(n) | Op::Gte(n) | Op::Lt(n) | Op::Lte(n) => Value::Number(n.clone()),
        }
    }
}

/// Where in the filter document a problem is (`filter.all[1].path`), and what it is.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{location}: {message}")]
pub struct FilterError {
    pub location: String,
    pub message: String,
}

const OPS: [&str; 7] = ["eq", "exists", "prefix", "gt", "gte", "lt", "lte"];

struct Parser {
    nodes: usize,
}

impl Filter {
    /// Parses filter JSON text (at most [`MAX_FILTER_BYTES`]). Locations in errors start with `filter`.
    pub fn parse_str(text: &str) -> Result<Filter, FilterError> {
        if text.len() > MAX_FILTER_BYTES {
            return Err(err("filter", format!("at most {MAX_FILTER_BYTES} bytes, got {}", text.len())));
        }
        let v: Value = serde_json::from_str(text).map_err(|e| err("filter", format!("not JSON: {e}")))?;
        Self::parse(&v)
    }

    /// Parses a filter from JSON.
    pub fn parse(v: &Value) -> Result<Filter, FilterError> {
        Parser { nodes: 0 }.node(v, "filter", 1)
    }

    /// Whether the event matches. Never panics; bounded by the filter's size (paths are short, nodes capped).
    pub fn matches(&self, ev: &EventFields<'_>) -> bool {
        if let Data::NotJson = ev.data {
            return false;
        }
        self.eval(ev, "filter", None)
    }

    /// Evaluates every condition (no short-cut) and says for each whether it held and what the event had.
    pub fn explain(&self, ev: &EventFields<'_>) -> Explanation {
        if let Data::NotJson = ev.data {
            return Explanation { matched: false, not_json: true, steps: Vec::new() };
        }
        let mut steps = Vec::new();
        let matched = self.eval(ev, "filter", Some(&mut steps));
        Explanation { matched, not_json: false, steps }
    }

    fn eval(&self, ev: &EventFields<'_>, location: &str, mut trace: Option<&mut Vec<Step>>) -> bool {
        match self {
            Filter::All(children) | Filter::Any(children) => {
                let all = matches!(self, Filter::All(_));
                let word = if all { "all" } else { "any" };
                let at = trace.as_ref().map(|t| t.len());
                let mut result = all;
                for (i, child) in children.iter().enumerate() {
                    let m = match trace.as_deref_mut() {
                        Some(t) => child.eval(ev, &format!("{location}.{word}[{i}]"), Some(t)),
                        None => child.eval(ev, location, None),
                    };
                    if m != all {
                        result = m;
                        if trace.is_none() {
                            break;
                        }
                    }
                }
                if let (Some(t), Some(at)) = (trace, at) {
                    let held = children.len();
                    t.insert(at, Step { location: location.to_owned(), test: format!("{word} of {held}"), actual: None, matched: result });
                }
                result
            }
            Filter::Cond(c) => {
                let found = resolve(ev, &c.segments);
                let m = test(&c.op, found.as_ref());
                if let Some(t) = trace {
                    t.push(Step {
                        location: location.to_owned(),
                        test: format!("{} {} {}", c.path, c.op.word(), c.op.operand()),
                        actual: found.map(|f| f.to_value()),
                        matched: m,
                    });
                }
                m
            }
        }
    }

    /// The filter as JSON, in the form it was parsed from (stored canonically).
    pub fn to_json(&self) -> Value {
        match self {
            Filter::All(c) => serde_json::json!({"all": c.iter().map(Filter::to_json).collect::<Vec<_>>()}),
            Filter::Any(c) => serde_json::json!({"any": c.iter().map(Filter::to_json).collect::<Vec<_>>()}),
            Filter::Cond(c) => {
                let mut m = Map::new();
                m.insert("path".into(), Value::String(c.path.clone()));
                m.insert(c.op.word().into(), c.op.operand());
                Value::Object(m)
            }
        }
    }
}

fn err(location: &str, message: impl Into<String>) -> FilterError {
    FilterError { location: location.to_owned(), message: message.into() }
}

impl Parser {
    fn node(&mut self, v: &Value, at: &str, depth: usize) -> Result<Filter, FilterError> {
        self.nodes = self.nodes.saturating_add(1);
        if self.nodes > MAX_NODES {
            return Err(err(at, format!("a filter has at most {MAX_NODES} conditions and combinators")));
        }
        if depth > MAX_DEPTH {
            return Err(err(at, format!("a filter nests at most {MAX_DEPTH} levels")));
        }
        let Value::Object(obj) = v else {
            return Err(err(at, "expected an object: {\"all\": [..]}, {\"any\": [..]} or {\"path\": .., \"<op>\": ..}"));
        };
        for combinator in ["all", "any"] {
            if let Some(children) = obj.get(combinator) {
                if obj.len() != 1 {
                    let extra = obj.keys().find(|k| k.as_str() != combinator).map(String::as_str).unwrap_or("");
                    return Err(err(at, format!("`{combinator}` stands alone; unexpected key `{extra}`")));
                }
                let here = format!("{at}.{combinator}");
                let Value::Array(items) = children else { return Err(err(&here, "expected an array of filters")) };
                if items.is_empty() {
                    return Err(err(&here, "must not be empty"));
                }
                let mut out = Vec::with_capacity(items.len().min(MAX_NODES));
                for (i, item) in items.iter().enumerate() {
                    out.push(self.node(item, &format!("{here}[{i}]"), depth + 1)?);
                }
                return Ok(if combinator == "all" { Filter::All(out) } else { Filter::Any(out) });
            }
        }
        let path_at = format!("{at}.path");
        let Some(path) = obj.get("path") else {
            return Err(err(at, "expected `all`, `any` or `path`"));
        };
        let Value::String(path) = path else { return Err(err(&path_at, "expected a string such as \"data.amount\"")) };
        let segments = parse_path(path).map_err(|m| err(&path_at, m))?;
        // Sorted so the same document always names the same key.
        let mut keys: Vec<&String> = obj.keys().filter(|k| k.as_str() != "path").collect();
        keys.sort();
        let op_key = match keys.as_slice() {
            [one] => *one,
            [] => return Err(err(at, format!("a condition needs one operator: {}", OPS.join(", ")))),
            [a, b, ..] => return Err(err(at, format!("a condition has one operator; got `{a}` and `{b}`"))),
        };
        let op_at = format!("{at}.{op_key}");
        let operand = &obj[op_key];
        let number = |v: &Value| match v {
            Value::Number(n) => Ok(n.clone()),
            _ => Err(err(&op_at, "expected a number")),
        };
        let op = match op_key.as_str() {
            "eq" => match operand {
                Value::String(s) if s.len() > MAX_STRING_BYTES => {
                    return Err(err(&op_at, format!("at most {MAX_STRING_BYTES} bytes")));
                }
                Value::Null | Value::Bool(_) | Value::Number(_) | Value::String(_) => Op::Eq(operand.clone()),
                _ => return Err(err(&op_at, "expected a string, number, boolean or null")),
            },
            "exists" => match operand {
                Value::Bool(b) => Op::Exists(*b),
                _ => return Err(err(&op_at, "expected true or false")),
            },
            "prefix" => match operand {
                Value::String(s) if s.len() > MAX_STRING_BYTES => {
                    return Err(err(&op_at, format!("at most {MAX_STRING_BYTES} bytes")));
                }
                Value::String(s) => Op::Prefix(s.clone()),
                _ => return Err(err(&op_at, "expected a string")),
            },
            "gt" => Op::Gt(number(operand)?),
            "gte" => Op::Gte(number(operand)?),
            "lt" => Op::Lt(number(operand)?),
            "lte" => Op::Lte(number(operand)?),
            other => return Err(err(&op_at, format!("unknown operator `{other}`; use one of {}", OPS.join(", ")))),
        };
        Ok(Filter::Cond(Condition { path: path.clone(), segments, op }))
    }
}

pub(crate) fn parse_path(path: &str) -> Result<Vec<String>, String> {
    if path.len() > MAX_PATH_BYTES {
        return Err(format!("at most {MAX_PATH_BYTES} bytes, got {}", path.len()));
    }
    let segments: Vec<String> = path.split('.').map(str::to_owned).collect();
    if segments.len() > MAX_PATH_SEGMENTS {
        return Err(format!("at most {MAX_PATH_SEGMENTS} segments, got {}", segments.len()));
    }
    if segments.iter().any(String::is_empty) {
        return Err(format!("{path:?} has an empty segment"));
    }
    let root = segments[0].as_str();
    if !ROOTS.contains(&root) {
        return Err(format!("{path:?} must start with one of {} (the event's data is under `data.`)", ROOTS.join(", ")));
    }
    if root == "extensions" && segments.len() != 2 {
        return Err(format!("{path:?}: name one CloudEvents extension attribute, as in `extensions.region`"));
    }
    if root != "data" && root != "extensions" && segments.len() > 1 {
        return Err(format!("`{root}` is a string; only `data` and `extensions` have fields"));
    }
    Ok(segments)
}

/// What an event offers a filter: its envelope's strings (empty = absent) and its data.
#[derive(Debug, Clone, Copy)]
pub struct EventFields<'a> {
    pub id: &'a str,
    pub event_type: &'a str,
    pub tenant: &'a str,
    pub entity_id: &'a str,
    /// CloudEvents `source` and `subject` (empty when the event was not a CloudEvent).
    pub source: &'a str,
    pub subject: &'a str,
    pub extensions: Option<&'a std::collections::HashMap<String, String>>,
    pub data: &'a Data,
}

/// An event's `data`, parsed once per event (not per subscription).
#[derive(Debug, Clone, PartialEq)]
pub enum Data {
    Absent,
    Json(Value),
    /// Not a JSON document: no filter matches.
    NotJson,
}

impl Data {
    /// Parses an event's `data_json` bytes.
    pub fn parse(bytes: &[u8]) -> Data {
        if bytes.is_empty() {
            return Data::Absent;
        }
        serde_json::from_slice(bytes).map(Data::Json).unwrap_or(Data::NotJson)
    }
}

impl<'a> EventFields<'a> {
    pub fn of(ev: &'a crate::model::Event, data: &'a Data) -> Self {
        Self {
            id: &ev.id,
            event_type: &ev.r#type,
            tenant: &ev.tenant,
            entity_id: &ev.entity_id,
            source: &ev.source,
            subject: &ev.subject,
            extensions: Some(&ev.extensions),
            data,
        }
    }
}

pub(crate) enum Found<'a> {
    Str(&'a str),
    Json(&'a Value),
}

impl Found<'_> {
    fn to_value(&self) -> Value {
        match self {
            Found::Str(s) => Value::String((*s).to_owned()),
            Found::Json(v) => (*v).clone(),
        }
    }
}

pub(crate) fn resolve<'a>(ev: &EventFields<'a>, segments: &[String]) -> Option<Found<'a>> {
    let (root, rest) = segments.split_first()?;
    let text = |s: &'a str| (!s.is_empty()).then_some(Found::Str(s));
    match root.as_str() {
        "id" => text(ev.id),
        "type" => text(ev.event_type),
        "tenant" => text(ev.tenant),
        "entity_id" => text(ev.entity_id),
        "source" => text(ev.source),
        "subject" => text(ev.subject),
        "extensions" => text(ev.extensions?.get(rest.first()?)?),
        "data" => {
            let Data::Json(root) = ev.data else { return None };
            let mut v: &'a Value = root;
            for seg in rest {
                v = match v {
                    Value::Object(m) => m.get(seg)?,
                    Value::Array(a) => a.get(seg.parse::<usize>().ok()?)?,
                    _ => return None,
                };
            }
            Some(Found::Json(v))
        }
        _ => None,
    }
}

fn test(op: &Op, found: Option<&Found<'_>>) -> bool {
    match op {
        Op::Exists(want) => found.is_some() == *want,
        Op::Eq(want) => match (found, want) {
            (Some(Found::Str(s)), Value::String(w)) => s == w,
            (Some(Found::Json(Value::Number(a))), Value::Number(b)) => cmp_numbers(a, b) == Some(Ordering::Equal),
            (Some(Found::Json(v)), w) => *v == w,
            _ => false,
        },
        Op::Prefix(p) => match found {
            Some(Found::Str(s)) => s.starts_with(p.as_str()),
            Some(Found::Json(Value::String(s))) => s.starts_with(p.as_str()),
            _ => false,
        },
        Op::Gt(n) | Op::Gte(n) | Op::Lt(n) | Op::Lte(n) => {
            let Some(Found::Json(Value::Number(have))) = found else { return false };
            let Some(ord) = cmp_numbers(have, n) else { return false };
            match op {
                Op::Gt(_) => ord == Ordering::Greater,
                Op::Gte(_) => ord != Ordering::Less,
                Op::Lt(_) => ord == Ordering::Less,
                _ => ord != Ordering::Greater,
            }
        }
    }
}

/// Integers compare exactly (also beyond 2^53); anything with a fraction compares as f64.
fn cmp_numbers(a: &Number, b: &Number) -> Option<Ordering> {
    if let (Some(x), Some(y)) = (a.as_i64(), b.as_i64()) {
        return Some(x.cmp(&y));
    }
    if let (Some(x), Some(y)) = (a.as_u64(), b.as_u64()) {
        return Some(x.cmp(&y));
    }
    // One is a u64 above i64::MAX and the other a negative i64.
    if a.as_u64().is_some() && b.as_i64().is_some() {
        return Some(Ordering::Greater);
    }
    if a.as_i64().is_some() && b.as_u64().is_some() {
        return Some(Ordering::Less);
    }
    a.as_f64()?.partial_cmp(&b.as_f64()?)
}

/// Why a filter matched or not: one step per combinator and condition, in document order.
#[derive(Debug, Clone, PartialEq)]
pub struct Explanation {
    pub matched: bool,
    /// The event's data was not JSON, so nothing was evaluated.
    pub not_json: bool,
    pub steps: Vec<Step>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Step {
    /// Where in the filter (`filter.all[0]`).
    pub location: String,
    /// `data.amount gte 100`, or `all of 3`.
    pub test: String,
    /// The event's value at the path; `None` when absent (or for a combinator).
    pub actual: Option<Value>,
    pub matched: bool,
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn fields<'a>(data: &'a Data) -> EventFields<'a> {
        EventFields {
            id: "evt_1",
            event_type: "order.created",
            tenant: "",
            entity_id: "ent_9",
            source: "",
            subject: "",
            extensions: None,
            data,
        }
    }

    fn f(v: Value) -> Filter {
        Filter::parse(&v).unwrap_or_else(|e| panic!("{v}: {e}"))
    }

    #[test]
    fn cloudevents_attributes_are_paths() {
        let data = Data::Json(json!({}));
        let ext: std::collections::HashMap<String, String> = [("region".to_owned(), "eu".to_owned())].into();
        let ev = EventFields { source: "/shop/orders", subject: "order/1", extensions: Some(&ext), ..fields(&data) };
        for yes in [
            json!({"path": "source", "prefix": "/shop/"}),
            json!({"path": "subject", "eq": "order/1"}),
            json!({"path": "extensions.region", "eq": "eu"}),
            json!({"path": "extensions.zone", "exists": false}),
        ] {
            assert!(f(yes.clone()).matches(&ev), "{yes}");
        }
        // An event that was not a CloudEvent has none of them.
        let plain = fields(&data);
        for no in [json!({"path": "source", "exists": true}), json!({"path": "extensions.region", "eq": "eu"})] {
            assert!(!f(no.clone()).matches(&plain), "{no}");
        }
    }

    #[test]
    fn conditions() {
        let data = Data::Json(json!({"amount": 150, "price": 9.5, "currency": "EUR", "country": "DE-BY",
            "vip": null, "items": [{"sku": "a"}], "big": 18446744073709551615u64, "neg": -3}));
        let ev = fields(&data);
        let yes = [
            json!({"path": "data.amount", "gte": 100}),
            json!({"path": "data.amount", "eq": 150.0}),
            json!({"path": "data.price", "lt": 10}),
            json!({"path": "data.price", "gt": 9}),
            json!({"path": "data.currency", "eq": "EUR"}),
            json!({"path": "data.country", "prefix": "DE"}),
            json!({"path": "data.vip", "exists": true}),
            json!({"path": "data.vip", "eq": null}),
            json!({"path": "data.missing", "exists": false}),
            json!({"path": "data.items.0.sku", "eq": "a"}),
            json!({"path": "data.big", "gt": 9223372036854775807i64}),
            json!({"path": "data.neg", "lt": 18446744073709551615u64}),
            json!({"path": "type", "prefix": "order."}),
            json!({"path": "entity_id", "eq": "ent_9"}),
            json!({"path": "tenant", "exists": false}),
            json!({"path": "data", "exists": true}),
        ];
        for c in yes {
            assert!(f(c.clone()).matches(&ev), "{c}");
        }
        let no = [
            json!({"path": "data.amount", "lt": 100}),
            json!({"path": "data.currency", "gt": 1}),
            json!({"path": "data.amount", "prefix": "1"}),
            json!({"path": "data.amount", "eq": "150"}),
            json!({"path": "data.items.1.sku", "exists": true}),
            json!({"path": "data.currency.x", "exists": true}),
            json!({"path": "type", "eq": "order"}),
        ];
        for c in no {
            assert!(!f(c.clone()).matches(&ev), "{c}");
        }
    }

    #[test]
    fn combinators_and_explanations() {
        let data = Data::Json(json!({"amount": 50, "currency": "USD"}));
        let filter = f(json!({"all": [{"path": "data.amount", "gte": 10},
            {"any": [{"path": "data.currency", "eq": "EUR"}, {"path": "data.currency", "eq": "GBP"}]}]}));
        assert!(!filter.matches(&fields(&data)));
        let why = filter.explain(&fields(&data));
        assert!(!why.matched);
        let failing: Vec<&str> = why.steps.iter().filter(|s| !s.matched).map(|s| s.location.as_str()).collect();
        assert_eq!(failing, ["filter", "filter.all[1]", "filter.all[1].any[0]", "filter.all[1].any[1]"]);
        assert_eq!(why.steps[1].test, "data.amount gte 10");
        assert_eq!(why.steps[1].actual, Some(json!(50)));
        let eur = Data::Json(json!({"amount": 50, "currency": "GBP"}));
        assert!(filter.matches(&fields(&eur)));
        assert!(filter.explain(&fields(&eur)).matched);
    }

    #[test]
    fn data_that_is_not_json_matches_nothing_and_absent_data_is_absent() {
        let not_json = Data::parse(b"<xml/>");
        assert_eq!(not_json, Data::NotJson);
        let absent_filter = f(json!({"path": "data.x", "exists": false}));
        assert!(!absent_filter.matches(&fields(&not_json)), "not even a test for absence");
        assert!(absent_filter.explain(&fields(&not_json)).not_json);
        assert!(absent_filter.matches(&fields(&Data::parse(b""))));
        assert!(f(json!({"path": "type", "exists": true})).matches(&fields(&Data::Absent)));
    }

    #[test]
    fn parse_errors_name_the_location() {
        let cases = [
            (json!([]), "filter", "expected an object"),
            (json!({"all": []}), "filter.all", "must not be empty"),
            (json!({"all": [{"path": "data.a", "eq": 1}, {"path": "amount", "eq": 1}]}), "filter.all[1].path", "must start with"),
            (json!({"any": [{"path": "data..a", "eq": 1}]}), "filter.any[0].path", "empty segment"),
            (json!({"path": "data.a"}), "filter", "one operator"),
            (json!({"path": "data.a", "eq": 1, "gt": 2}), "filter", "one operator"),
            (json!({"path": "data.a", "like": "x"}), "filter.like", "unknown operator"),
            (json!({"path": "data.a", "gt": "1"}), "filter.gt", "expected a number"),
            (json!({"path": "data.a", "eq": [1]}), "filter.eq", "expected a string"),
            (json!({"path": "data.a", "exists": 1}), "filter.exists", "true or false"),
            (json!({"path": "type.x", "eq": 1}), "filter.path", "only `data` and `extensions` have fields"),
            (json!({"path": "extensions", "eq": 1}), "filter.path", "name one CloudEvents extension"),
            (json!({"path": "extensions.a.b", "eq": 1}), "filter.path", "name one CloudEvents extension"),
            (json!({"all": [{"path": "data.a", "eq": 1}], "any": []}), "filter", "stands alone"),
            (json!({"path": 1, "eq": 1}), "filter.path", "expected a string"),
        ];
        for (doc, location, msg) in cases {
            let e = Filter::parse(&doc).unwrap_err();
            assert_eq!(e.location, location, "{doc}: {e}");
            assert!(e.message.contains(msg), "{doc}: {e}");
        }
        let mut deep = json!({"path": "data.a", "eq": 1});
        for _ in 0..MAX_DEPTH {
            deep = json!({"all": [deep]});
        }
        assert!(Filter::parse(&deep).unwrap_err().message.contains("nests"));
        let wide = json!({"any": (0..MAX_NODES).map(|_| json!({"path": "data.a", "eq": 1})).collect::<Vec<_>>()});
        assert!(Filter::parse(&wide).unwrap_err().message.contains("at most"));
        assert!(Filter::parse_str(&" ".repeat(MAX_FILTER_BYTES + 1)).is_err());
        assert!(Filter::parse_str("{").unwrap_err().message.contains("not JSON"));
    }

    #[test]
    fn to_json_round_trips() {
        let doc = json!({"all": [{"path": "data.a", "gte": 1.5}, {"any": [{"path": "id", "prefix": "evt_"}, {"path": "data.b", "exists": false}]}]});
        let parsed = f(doc.clone());
        assert_eq!(parsed.to_json(), doc);
        assert_eq!(f(parsed.to_json()), parsed);
    }
}
