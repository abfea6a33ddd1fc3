//! Keeps `src/openapi.json` true: its paths and methods are exactly the router's (read from the source), its
//! public routes are exactly those outside the bearer-token layer, its error codes are exactly the ones the
//! handlers return, and the document is well-formed (3.0.x, every `$ref` resolves, every operation has responses
//! and a unique `operationId`, path parameters match the templates).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use serde_json::Value;

const METHODS: [&str; 8] = ["get", "put", "post", "delete", "options", "head", "patch", "trace"];

fn crate_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()))
}

fn document() -> Value {
    let path = crate_dir().join("src/openapi.json");
    serde_json::from_str(&read(&path)).unwrap_or_else(|e| panic!("{} is not JSON: {e}", path.display()))
}

/// The source without whole-line `//` comments (doc comments may mention routes).
fn code_of(src: &str) -> String {
    src.lines().filter(|l| !l.trim_start().starts_with("//")).collect::<Vec<_>>().join("\n")
}

/// A tiny Rust-token scanner: yields (index, char, paren depth) for every char outside string and char literals.
fn scan_code(chars: &[char], start: usize, mut visit: impl FnMut(usize, char, i32) -> bool) {
    let (mut i, mut depth) = (start, 0i32);
    while i < chars.len() {
        let c = chars[i];
        match c {
            '"' => {
                i += 1;
                while i < chars.len() && chars[i] != '"' {
                    if chars[i] == '\\' {
                        i += 1;
                    }
                    i += 1;
                }
                i += 1;
                continue;
            }
            '\'' => {
                if chars.get(i + 2) == Some(&'\'') {
                    i += 3;
                    continue;
                }
                if chars.get(i + 1) == Some(&'\\') {
                    i += 2;
                    while i < chars.len() && chars[i] != '\'' {
                        i += 1;
                    }
                    i += 1;
                    continue;
                }
                // A lifetime.
            }
            '(' => depth += 1,
            ')' => depth -= 1,
            _ => {}
        }
        if !visit(i, c, depth) {
            return;
        }
        i += 1;
    }
}

fn string_literal_at(chars: &[char], mut i: usize) -> Option<(String, usize)> {
    while chars.get(i).is_some_and(|c| c.is_whitespace()) {
        i += 1;
    }
    if chars.get(i) != Some(&'"') {
        return None;
    }
    let start = i + 1;
    let end = (start..chars.len()).find(|&j| chars[j] == '"' && chars[j - 1] != '\\')?;
    Some((chars[start..end].iter().collect(), end + 1))
}

/// One `.route("PATH", ...)` call: its path, its methods, and where it starts in the source.
#[derive(Debug)]
struct Route {
    path: String,
    methods: BTreeSet<String>,
    at: usize,
}

/// Every `.route("PATH", <method router>)` in `src`, with the methods named by `get(`, `post(`, `.patch(`, ...
fn routes_in(src: &str, file: &str) -> Vec<Route> {
    let chars: Vec<char> = src.chars().collect();
    let snippet = |chars: &[char], at: usize| chars[at..(at + 60).min(chars.len())].iter().collect::<String>();
    let needle: Vec<char> = ".route(".chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i + needle.len() <= chars.len() {
        if chars[i..i + needle.len()] != needle[..] {
            i += 1;
            continue;
        }
        let open = i + needle.len() - 1;
        let (path, after_path) = string_literal_at(&chars, open + 1)
            .unwrap_or_else(|| panic!("{file}: a `.route(` whose path is not a string literal: {}", snippet(&chars, i)));
        let mut methods = BTreeSet::new();
        let mut end = chars.len();
        // Depth counts from the route's own parenthesis: the method router sits at depth 1.
        scan_code(&chars, open, |j, c, depth| {
            if depth == 0 && c == ')' {
                end = j;
                return false;
            }
            if c == '(' && depth == 2 && j > after_path {
                // The identifier just before this parenthesis, at the method router's level.
                let mut k = j;
                while k > 0 && (chars[k - 1].is_alphanumeric() || chars[k - 1] == '_') {
                    k -= 1;
                }
                let ident: String = chars[k..j].iter().collect();
                let name = ident.strip_suffix("_service").unwrap_or(&ident).to_owned();
                if METHODS.contains(&name.as_str()) {
                    methods.insert(name);
                } else if !matches!(name.as_str(), "layer" | "route_layer" | "with_state") {
                    panic!("{file}: route {path}: unrecognised `{ident}(` in the method router; teach this test about it");
                }
            }
            true
        });
        assert!(!methods.is_empty(), "{file}: route {path}: no method found");
        out.push(Route { path, methods, at: i });
        i = end;
    }
    out
}

/// path -> methods of the document, and whether each operation is public (an empty `security`).
fn documented(doc: &Value) -> BTreeMap<(String, String), bool> {
    let global_public = doc["security"].as_array().is_none_or(|a| a.is_empty());
    let mut out = BTreeMap::new();
    for (path, item) in doc["paths"].as_object().expect("`paths` is an object") {
        for (key, op) in item.as_object().expect("a path item is an object") {
            if !METHODS.contains(&key.as_str()) {
                continue;
            }
            let public = match op.get("security") {
                Some(s) => s.as_array().expect("`security` is an array").is_empty(),
                None => global_public,
            };
            out.insert((path.clone(), key.clone()), public);
        }
    }
    out
}

#[test]
fn the_document_lists_exactly_the_routes_of_the_router_and_their_auth() {
    let dir = crate_dir();
    let api_src = code_of(&read(&dir.join("src/lib.rs")));
    assert!(!api_src.contains(".nest(") && !api_src.contains(".merge("), "lib.rs nests or merges routers: teach this test");
    let layer_at = api_src.find(".route_layer(").expect("lib.rs applies the auth layer with `.route_layer(`");
    assert!(api_src[layer_at..].starts_with(".route_layer(middleware::from_fn_with_state(state.clone(), auth::middleware))"));

    // (path, method) -> public, from the source.
    let mut source: BTreeMap<(String, String), bool> = BTreeMap::new();
    let mut add = |routes: Vec<Route>, public_if: &dyn Fn(&Route) -> bool| {
        for r in routes {
            let public = public_if(&r);
            for m in &r.methods {
                assert!(source.insert((r.path.clone(), m.clone()), public).is_none(), "{} {} routed twice", m, r.path);
            }
        }
    };
    let api_routes = routes_in(&api_src, "lib.rs");
    assert!(api_routes.len() >= 10, "suspiciously few routes parsed: {api_routes:?}");
    // `route_layer` covers the routes added before it: those need the token, the ones after are public.
    add(api_routes, &|r: &Route| r.at > layer_at);

    // The health routes are merged into the same listener by `lib.rs`, without the auth layer.
    let lib_src = code_of(&read(&dir.join("../ingest/src/lib.rs")));
    assert!(lib_src.contains(".merge(health::routes("), "ingest no longer merges the health routes into the API router");
    let health_src = code_of(&read(&dir.join("../service/src/health.rs")));
    let health_routes = routes_in(&health_src, "service/src/health.rs");
    assert_eq!(health_routes.iter().map(|r| r.path.as_str()).collect::<BTreeSet<_>>(), BTreeSet::from(["/metrics", "/healthz", "/readyz"]),);
    add(health_routes, &|_| true);

    let doc = documented(&document());
    let missing: Vec<_> = source.keys().filter(|k| !doc.contains_key(*k)).collect();
    let extra: Vec<_> = doc.keys().filter(|k| !source.contains_key(*k)).collect();
    assert!(missing.is_empty(), "routed but not in openapi.json: {missing:?}");
    assert!(extra.is_empty(), "in openapi.json but not routed: {extra:?}");
    for (key, public) in &source {
        assert_eq!(doc[key], *public, "{key:?}: the router says public = {public}, the document disagrees (`security`)");
    }
}

fn check_refs(doc: &Value, v: &Value, at: &str, count: &mut usize) {
    match v {
        Value::Object(map) => {
            for (k, child) in map {
                if k == "$ref" {
                    let r = child.as_str().unwrap_or_else(|| panic!("{at}: `$ref` is not a string"));
                    let pointer = r.strip_prefix('#').unwrap_or_else(|| panic!("{at}: `$ref` {r} points outside the document"));
                    assert!(doc.pointer(pointer).is_some(), "{at}: `$ref` {r} does not resolve");
                    *count += 1;
                } else {
                    check_refs(doc, child, &format!("{at}/{k}"), count);
                }
            }
        }
        Value::Array(items) => {
            for (i, child) in items.iter().enumerate() {
                check_refs(doc, child, &format!("{at}/{i}"), count);
            }
        }
        _ => {}
    }
}

fn resolve<'a>(doc: &'a Value, v: &'a Value) -> &'a Value {
    match v.get("$ref").and_then(Value::as_str) {
        Some(r) => doc.pointer(&r[1..]).expect("checked above"),
        None => v,
    }
}

#[test]
fn the_document_is_well_formed() {
    let doc = document();
    let version = doc["openapi"].as_str().expect("`openapi` is a string");
    assert!(version.starts_with("3.0."), "openapi {version}");
    assert!(doc["info"]["title"].is_string() && doc["info"]["version"].is_string());

    let mut refs = 0;
    check_refs(&doc, &doc, "#", &mut refs);
    assert!(refs > 0);

    let schemes = doc["components"]["securitySchemes"].as_object().expect("security schemes");
    let check_security = |s: &Value, at: &str| {
        for req in s.as_array().unwrap_or_else(|| panic!("{at}: `security` is an array")) {
            for name in req.as_object().expect("a security requirement is an object").keys() {
                assert!(schemes.contains_key(name), "{at}: unknown security scheme {name}");
            }
        }
    };
    check_security(&doc["security"], "#/security");

    let mut ids = BTreeSet::new();
    let paths = doc["paths"].as_object().expect("`paths` is an object");
    assert!(!paths.is_empty());
    for (path, item) in paths {
        assert!(path.starts_with('/'), "{path}");
        let template: BTreeSet<String> =
            path.split('/').filter_map(|seg| seg.strip_prefix('{').and_then(|s| s.strip_suffix('}'))).map(str::to_owned).collect();
        let params_of = |v: Option<&Value>| -> Vec<Value> {
            v.map(|p| p.as_array().expect("`parameters` is an array").iter().map(|p| resolve(&doc, p).clone()).collect())
                .unwrap_or_default()
        };
        let path_level = params_of(item.get("parameters"));
        let mut operations = 0;
        for (method, op) in item.as_object().expect("a path item is an object") {
            if method == "parameters" {
                continue;
            }
            assert!(METHODS.contains(&method.as_str()), "{path}: unexpected key {method}");
            operations += 1;
            let at = format!("{} {path}", method.to_uppercase());
            let id = op["operationId"].as_str().filter(|s| !s.is_empty()).unwrap_or_else(|| panic!("{at}: no operationId"));
            assert!(ids.insert(id.to_owned()), "{at}: operationId {id} is not unique");
            let responses = op["responses"].as_object().unwrap_or_else(|| panic!("{at}: no responses"));
            assert!(!responses.is_empty(), "{at}: no responses");
            for (code, r) in responses {
                let ok = code == "default" || (code.len() == 3 && code.parse::<u16>().is_ok_and(|c| (100..600).contains(&c)));
                assert!(ok, "{at}: response key {code}");
                assert!(resolve(&doc, r)["description"].is_string(), "{at} {code}: a response needs a description");
            }
            if let Some(s) = op.get("security") {
                check_security(s, &at);
            }
            let mut params = path_level.clone();
            params.extend(params_of(op.get("parameters")));
            let mut declared = BTreeSet::new();
            for p in &params {
                let name = p["name"].as_str().unwrap_or_else(|| panic!("{at}: a parameter without a name"));
                let place = p["in"].as_str().unwrap_or_else(|| panic!("{at}: parameter {name} without `in`"));
                assert!(["path", "query", "header", "cookie"].contains(&place), "{at}: parameter {name} in {place}");
                assert!(p.get("schema").is_some() || p.get("content").is_some(), "{at}: parameter {name} has no schema");
                if place == "path" {
                    assert_eq!(p["required"], true, "{at}: path parameter {name} must be required");
                    declared.insert(name.to_owned());
                }
            }
            assert_eq!(declared, template, "{at}: path parameters do not match the template");
            if let Some(body) = op.get("requestBody") {
                let body = resolve(&doc, body);
                assert!(body["content"].as_object().is_some_and(|c| !c.is_empty()), "{at}: request body without content");
            }
        }
        assert!(operations > 0, "{path}: no operations");
    }
}

/// The second argument of every `ApiError::new(` / `Self::new(` call when it is a string literal.
fn literal_codes(src: &str, into: &mut BTreeSet<String>) {
    let chars: Vec<char> = src.chars().collect();
    for needle in ["ApiError::new(", "Self::new("] {
        let needle: Vec<char> = needle.chars().collect();
        for i in 0..(chars.len() + 1).saturating_sub(needle.len()) {
            if chars[i..i + needle.len()] != needle[..] {
                continue;
            }
            let open = i + needle.len() - 1;
            let mut commas = Vec::new();
            scan_code(&chars, open, |j, c, depth| {
                if depth == 1 && c == ',' {
                    commas.push(j);
                }
                !(depth == 0 && c == ')')
            });
            if let Some(&first) = commas.first() {
                if let Some((code, _)) = string_literal_at(&chars, first + 1) {
                    into.insert(code);
                }
            }
        }
    }
    let mut rest = src;
    while let Some(at) = rest.find("code: \"") {
        let tail = &rest[at + 7..];
        let end = tail.find('"').expect("closing quote");
        into.insert(tail[..end].to_owned());
        rest = &tail[end..];
    }
}

#[test]
fn the_documented_error_codes_are_the_ones_the_handlers_return() {
    let dir = crate_dir();
    let mut source = BTreeSet::new();
    let mut files: Vec<_> = std::fs::read_dir(dir.join("src")).expect("src").map(|e| e.unwrap().path()).collect();
    files.sort();
    for f in files.iter().filter(|f| f.extension().is_some_and(|e| e == "rs")) {
        literal_codes(&code_of(&read(f)), &mut source);
    }
    // `POST /v1/events` answers with the decoder's reasons (the event reasons of the dead-letter vocabulary, which
    // crates/core/src/event_decode.rs uses); the API decodes JSON only, so never `invalid_protobuf` nor a Schema
    // Registry reason.
    use hookline_core::vocabulary::DeadLetterReason as R;
    let decode = code_of(&read(&dir.join("../core/src/event_decode.rs")));
    for r in R::ALL.into_iter().filter(|r| !r.is_delivery() && *r != R::InvalidTask && !r.is_schema_registry()) {
        let variant = format!("{r:?}");
        assert!(decode.contains(&format!("Reason::{variant}")) || r == R::EventOversize, "event_decode.rs never uses {variant}");
        if r != R::EventInvalidProtobuf {
            source.insert(r.as_str().to_owned());
        }
    }
    assert!(source.len() >= 10, "suspiciously few codes parsed: {source:?}");

    let doc = document();
    let documented: BTreeSet<String> = doc["components"]["schemas"]["ErrorCode"]["enum"]
        .as_array()
        .expect("components.schemas.ErrorCode.enum")
        .iter()
        .map(|v| v.as_str().expect("codes are strings").to_owned())
        .collect();
    let missing: Vec<_> = source.difference(&documented).collect();
    let extra: Vec<_> = documented.difference(&source).collect();
    assert!(missing.is_empty(), "returned by the API but not in ErrorCode: {missing:?}");
    assert!(extra.is_empty(), "in ErrorCode but never returned: {extra:?}");
}
