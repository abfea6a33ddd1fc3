//! The event-type catalogue through the real pipeline: its routes and their errors, subscriptions that must
//! choose from a non-empty catalogue, publishing checked against a type's schema (reject / warn), and a test
//! event that reaches the one subscription it was sent to.

use std::time::Duration;

use serde_json::{json, Value};

use crate::support::Pipeline;

const LIMIT: Duration = Duration::from_secs(60);

fn error_of(v: &Value) -> (&str, &str) {
    (v["error"]["code"].as_str().unwrap_or("?"), v["error"]["field"].as_str().unwrap_or("?"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn event_types_are_created_listed_read_updated_and_deleted_and_bad_requests_name_the_field() {
    // Room in a request for an example over its own limit.
    let p = Pipeline::start_with(1, |c| c.ingest.max_request_bytes = 64 << 10).await;
    let schema = json!({"type": "object", "required": ["amount"], "properties": {"amount": {"type": "integer"}}});
    let (status, v) = p
        .call(
            "POST",
            "/v1/event-types",
            Some(json!({"name": "invoice.paid", "description": "An invoice was paid", "schema": schema, "examples": [{"amount": 5}], "validation": "reject"})),
        )
        .await;
    assert_eq!(status, 201, "{v}");
    assert_eq!(
        (v["name"].as_str(), v["validation"].as_str(), v["effective_validation"].as_str()),
        (Some("invoice.paid"), Some("reject"), Some("reject"))
    );
    assert_eq!(v["examples"], json!([{"amount": 5}]));
    assert_eq!(v["schema"], schema);

    let bad = [
        (json!({"name": "invoice.paid"}), 409, "event_type_exists", "name"),
        (json!({"name": ""}), 422, "invalid_field", "name"),
        (json!({"name": "has space"}), 422, "invalid_field", "name"),
        (json!({"name": "order.*"}), 422, "invalid_field", "name"),
        (json!({"name": "x".repeat(256)}), 422, "invalid_field", "name"),
        (json!({"name": "a.b", "schema": {"type": "no-such-type"}}), 422, "invalid_field", "schema"),
        (json!({"name": "a.b", "schema": {"$ref": "file:///etc/hostname"}}), 422, "invalid_field", "schema"),
        (json!({"name": "a.b", "schema": "object"}), 422, "invalid_field", "schema"),
        (json!({"name": "a.b", "schema": schema, "examples": [{"amount": 1}, {"amount": "one"}]}), 422, "invalid_field", "examples[1]"),
        (json!({"name": "a.b", "examples": vec![json!({}); 11]}), 422, "invalid_field", "examples"),
        (json!({"name": "a.b", "examples": [{"big": "x".repeat(17 << 10)}]}), 422, "invalid_field", "examples[0]"),
        (json!({"name": "a.b", "validation": "strict"}), 422, "invalid_body", "validation"),
        (json!({"name": "a.b", "descripton": "typo"}), 422, "invalid_body", "descripton"),
        (json!({"description": "no name"}), 422, "invalid_body", "name"),
    ];
    for (body, want_status, want_code, want_field) in bad {
        let (status, v) = p.call("POST", "/v1/event-types", Some(body.clone())).await;
        assert_eq!((status, error_of(&v)), (want_status, (want_code, want_field)), "{body}: {v}");
    }
    // The refused schema says why.
    let (_, v) = p.call("POST", "/v1/event-types", Some(json!({"name": "a.b", "schema": {"$ref": "file:///etc/hostname"}}))).await;
    assert!(v["error"]["message"].as_str().unwrap().contains("not loaded"), "{v}");

    for name in ["a.one", "a.two"] {
        let (status, v) = p.call("POST", "/v1/event-types", Some(json!({"name": name}))).await;
        assert_eq!(status, 201, "{v}");
        assert_eq!(
            (v["validation"].clone(), v["effective_validation"].as_str()),
            (Value::Null, Some("warn")),
            "the server default applies: {v}"
        );
    }
    let (status, page) = p.call("GET", "/v1/event-types?limit=2", None).await;
    assert_eq!(status, 200);
    let names = |v: &Value| v["items"].as_array().unwrap().iter().map(|t| t["name"].as_str().unwrap().to_owned()).collect::<Vec<_>>();
    assert_eq!(names(&page), ["a.one", "a.two"]);
    assert_eq!(page["next_after"], "a.two");
    let (_, page) = p.call("GET", "/v1/event-types?limit=2&after=a.two", None).await;
    assert_eq!((names(&page), page["next_after"].clone()), (vec!["invoice.paid".to_owned()], Value::Null));
    let (status, v) = p.call("GET", "/v1/event-types?limit=0", None).await;
    assert_eq!((status, error_of(&v).1), (422, "limit"), "{v}");

    let (status, v) = p.call("GET", "/v1/event-types/invoice.paid", None).await;
    assert_eq!((status, v["description"].as_str()), (200, Some("An invoice was paid")), "{v}");
    let (status, v) = p.call("GET", "/v1/event-types/nope", None).await;
    assert_eq!((status, error_of(&v)), (404, ("not_found", "name")), "{v}");

    // A schema that the kept example breaks is refused; with a new example it is taken.
    let strict = json!({"type": "object", "properties": {"amount": {"type": "integer", "minimum": 10}}});
    let (status, v) = p.call("PATCH", "/v1/event-types/invoice.paid", Some(json!({"schema": strict}))).await;
    assert_eq!((status, error_of(&v)), (422, ("invalid_field", "examples[0]")), "{v}");
    let (status, v) = p
        .call("PATCH", "/v1/event-types/invoice.paid", Some(json!({"schema": strict, "examples": [{"amount": 10}], "validation": null})))
        .await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(
        (v["validation"].clone(), v["effective_validation"].as_str(), v["examples"].clone()),
        (Value::Null, Some("warn"), json!([{"amount": 10}]))
    );
    let (status, v) = p.call("PATCH", "/v1/event-types/invoice.paid", Some(json!({"validation": "loud"}))).await;
    assert_eq!((status, error_of(&v).1), (422, "validation"), "{v}");
    let (status, v) = p.call("PATCH", "/v1/event-types/invoice.paid", Some(json!({"schema": null, "description": "paid"}))).await;
    assert_eq!((status, v["schema"].clone(), v["description"].as_str()), (200, Value::Null, Some("paid")), "{v}");
    let (status, v) = p.call("PATCH", "/v1/event-types/nope", Some(json!({"description": "x"}))).await;
    assert_eq!((status, error_of(&v).1), (404, "name"), "{v}");

    let (status, _) = p.call("DELETE", "/v1/event-types/a.one", None).await;
    assert_eq!(status, 204);
    assert_eq!(p.call("GET", "/v1/event-types/a.one", None).await.0, 404);
    assert_eq!(p.call("DELETE", "/v1/event-types/a.one", None).await.0, 404);
    // Deleted, the name may be catalogued again.
    assert_eq!(p.call("POST", "/v1/event-types", Some(json!({"name": "a.one"}))).await.0, 201);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn subscriptions_choose_from_a_non_empty_catalogue_and_patterns_stay_allowed() {
    let p = Pipeline::start(1).await;
    // An empty catalogue constrains nothing (existing users).
    let (old, _) = p.subscribe(json!({"url": p.url("a"), "event_types": ["legacy.thing"]})).await;

    assert_eq!(p.call("POST", "/v1/event-types", Some(json!({"name": "invoice.paid"}))).await.0, 201);
    let (status, v) = p
        .call("POST", "/v1/subscriptions", Some(json!({"url": p.url("a"), "event_types": ["invoice.paid", "invoice.*", "invoce.paid"]})))
        .await;
    assert_eq!((status, error_of(&v)), (422, ("invalid_field", "event_types[2]")), "{v}");
    assert!(v["error"]["message"].as_str().unwrap().contains("catalogue"), "{v}");
    p.subscribe(json!({"url": p.url("a"), "event_types": ["invoice.paid", "invoice.*", "*"]})).await;

    // A subscription keeps the types it had (a type deleted later does not make it unsavable); new ones are checked.
    let (status, v) = p.call("PATCH", &format!("/v1/subscriptions/{old}"), Some(json!({"description": "still fine"}))).await;
    assert_eq!(status, 200, "{v}");
    let (status, v) = p
        .call("PATCH", &format!("/v1/subscriptions/{old}"), Some(json!({"event_types": ["legacy.thing", "invoice.paid", "made.up"]})))
        .await;
    assert_eq!((status, error_of(&v).1), (422, "event_types[2]"), "{v}");

    // Emptied again, the catalogue constrains nothing.
    assert_eq!(p.call("DELETE", "/v1/event-types/invoice.paid", None).await.0, 204);
    p.subscribe(json!({"url": p.url("a"), "event_types": ["made.up"]})).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reject_mode_refuses_naming_the_path_and_publishes_nothing_while_warn_mode_delivers_and_counts() {
    let p = Pipeline::start(1).await;
    let schema = json!({"type": "object", "required": ["amount"], "properties": {"amount": {"type": "integer"}}});
    for (name, mode) in [("pay.strict", "reject"), ("pay.lenient", "warn"), ("pay.unchecked", "off")] {
        let (status, v) = p.call("POST", "/v1/event-types", Some(json!({"name": name, "schema": schema, "validation": mode}))).await;
        assert_eq!(status, 201, "{v}");
    }
    let (sub, _) = p.subscribe(json!({"url": p.url("pay"), "event_types": ["pay.*"]})).await;
    let warned_before = p.counter("hookline_schema_violations_total{mode=\"warn\"}").await;
    let rejected_before = p.counter("hookline_schema_violations_total{mode=\"reject\"}").await;

    let (status, v) = p.call("POST", "/v1/events", Some(json!({"id": "evt_bad", "type": "pay.strict", "data": {"amount": "12.50"}}))).await;
    assert_eq!((status, error_of(&v)), (422, ("schema_violation", "data.amount")), "{v}");
    let message = v["error"]["message"].as_str().unwrap();
    assert!(message.starts_with("data.amount:") && message.contains("`type`"), "the path and the rule: {v}");
    let (status, v) = p.call("POST", "/v1/events", Some(json!({"id": "evt_missing", "type": "pay.strict", "data": {}}))).await;
    assert_eq!((status, error_of(&v).1), (422, "data.amount"), "{v}");

    for (id, ty, data) in [
        ("evt_ok", "pay.strict", json!({"amount": 1250})),
        ("evt_warn", "pay.lenient", json!({"amount": "12.50"})),
        ("evt_warn2", "pay.lenient", json!({"amount": "13"})),
        ("evt_off", "pay.unchecked", json!({"amount": "12.50"})),
    ] {
        let (status, v) = p.call("POST", "/v1/events", Some(json!({"id": id, "type": ty, "data": data}))).await;
        assert_eq!(status, 202, "{id}: {v}");
    }
    p.wait_final_of(&sub, 4, LIMIT).await;
    let mut got: Vec<String> =
        p.requests_to("pay").iter().map(|r| serde_json::from_slice::<Value>(&r.body).unwrap()["id"].as_str().unwrap().to_owned()).collect();
    got.sort();
    assert_eq!(got, ["evt_off", "evt_ok", "evt_warn", "evt_warn2"], "refused events were never published");
    let (_, found) = p.call("GET", "/v1/deliveries?event_id=evt_bad", None).await;
    assert_eq!(found["items"], json!([]), "{found}");
    // Counted per event, whatever is logged (the counter is process-wide: other tests only add to it).
    assert!(p.counter("hookline_schema_violations_total{mode=\"warn\"}").await >= warned_before + 2.0);
    assert!(p.counter("hookline_schema_violations_total{mode=\"reject\"}").await >= rejected_before + 2.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_test_event_delivers_the_example_to_the_chosen_subscription_only() {
    let p = Pipeline::start(1).await;
    let (status, v) = p
        .call("POST", "/v1/event-types", Some(json!({"name": "order.created", "examples": [{"order": 1}, {"order": 2, "total": 9}]})))
        .await;
    assert_eq!(status, 201, "{v}");
    assert_eq!(p.call("POST", "/v1/event-types", Some(json!({"name": "order.bare"}))).await.0, 201);
    let (a, _) = p.subscribe(json!({"url": p.url("a"), "event_types": ["order.created", "order.bare"]})).await;
    let (b, _) = p.subscribe(json!({"url": p.url("b"), "event_types": ["order.*"]})).await;

    let (status, v) =
        p.call("POST", &format!("/v1/subscriptions/{a}/test-event"), Some(json!({"event_type": "order.created", "example": 1}))).await;
    assert_eq!(status, 202, "{v}");
    let event_id = v["event_id"].as_str().unwrap().to_owned();
    let delivery_id = v["delivery_id"].as_str().unwrap().to_owned();
    assert!(event_id.starts_with("evt_test_"), "{v}");
    p.wait_final_of(&a, 1, LIMIT).await;
    let body: Value = serde_json::from_slice(&p.requests_to("a")[0].body).unwrap();
    assert_eq!(
        (body["id"].as_str(), body["type"].as_str(), body["data"].clone()),
        (Some(event_id.as_str()), Some("order.created"), json!({"order": 2, "total": 9}))
    );
    // The attempt, as the portal shows it.
    let d = p.get_when(&format!("/v1/deliveries/{delivery_id}"), |v| v["state"] == "succeeded").await;
    assert_eq!((d["subscription_id"].as_str(), d["attempts"][0]["http_status"].as_u64()), (Some(a.as_str()), Some(204)), "{d}");
    assert!(d["attempts"][0]["duration_ms"].is_number(), "{d}");
    // Its event went through the events topic, so the delivery log keeps it and it can be resent (once indexed).
    let deadline = tokio::time::Instant::now() + LIMIT;
    loop {
        let (status, v) = p.call("POST", &format!("/v1/deliveries/{delivery_id}/replay"), None).await;
        if status == 202 {
            break;
        }
        assert_eq!(status, 409, "only 'not indexed yet' may come first: {v}");
        assert!(tokio::time::Instant::now() < deadline, "the test event's delivery was never resendable: {v}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    p.wait_final_of(&a, 2, LIMIT).await;
    let again: Value = serde_json::from_slice(&p.requests_to("a")[1].body).unwrap();
    assert_eq!(again["id"].as_str(), Some(event_id.as_str()), "resent with the same event id");

    // B, subscribed to the same type, got nothing: a test event of its own (the default example) is its first.
    let (status, v) = p.call("POST", &format!("/v1/subscriptions/{b}/test-event"), Some(json!({"event_type": "order.created"}))).await;
    assert_eq!(status, 202, "{v}");
    let own = v["event_id"].as_str().unwrap().to_owned();
    p.wait_final_of(&b, 1, LIMIT).await;
    let to_b: Vec<Value> = p.requests_to("b").iter().map(|r| serde_json::from_slice(&r.body).unwrap()).collect();
    assert_eq!(to_b.len(), 1, "{to_b:?}");
    assert_eq!((to_b[0]["id"].as_str(), to_b[0]["data"].clone()), (Some(own.as_str()), json!({"order": 1})));
    assert_eq!(p.requests_to("a").len(), 2, "and A did not get B's");

    // A payload of the caller's instead of an example.
    let (status, v) =
        p.call("POST", &format!("/v1/subscriptions/{a}/test-event"), Some(json!({"event_type": "order.bare", "data": {"x": true}}))).await;
    assert_eq!(status, 202, "{v}");
    p.wait_final_of(&a, 3, LIMIT).await;

    let bad = [
        (a.as_str(), json!({"event_type": "order.created", "example": 2}), 422, "example"),
        (a.as_str(), json!({"event_type": "order.bare"}), 422, "example"),
        (a.as_str(), json!({"event_type": "order.created", "example": 0, "data": {}}), 422, "data"),
        (a.as_str(), json!({"event_type": "order.unknown"}), 422, "event_type"),
        (a.as_str(), json!({"example": 0}), 422, "event_type"),
        ("sub_nope", json!({"event_type": "order.created"}), 404, "id"),
    ];
    for (sub, body, want_status, want_field) in bad {
        let (status, v) = p.call("POST", &format!("/v1/subscriptions/{sub}/test-event"), Some(body.clone())).await;
        assert_eq!((status, error_of(&v).1), (want_status, want_field), "{body}: {v}");
    }
    // A subscription that does not receive the type cannot be sent it.
    assert_eq!(p.call("POST", "/v1/event-types", Some(json!({"name": "user.created", "examples": [{}]}))).await.0, 201);
    let (status, v) = p.call("POST", &format!("/v1/subscriptions/{a}/test-event"), Some(json!({"event_type": "user.created"}))).await;
    assert_eq!((status, error_of(&v).1), (422, "event_type"), "{v}");
    assert_eq!(p.requests_to("a").len(), 3);
    assert_eq!(p.requests_to("b").len(), 1);
}
