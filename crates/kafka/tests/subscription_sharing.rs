//! Subscriptions that have equal policies hold one parsed copy of it (and of its egress key) between them, however
//! many there are: what keeps a large table small (docs/benchmarks.md, "Subscriptions held").

use std::sync::Arc;

use hookline_core::model::Subscription;
use hookline_kafka::state::SubscriptionTable;
use prost::Message;

fn put(table: &SubscriptionTable, id: &str, policy: &str, policy_toml: &str) -> Arc<hookline_kafka::state::SubscriptionEntry> {
    let sub = Subscription {
        id: id.into(),
        url: "http://127.0.0.1:1/".into(),
        event_types: vec!["a.b".into()],
        policy: policy.into(),
        policy_toml: policy_toml.into(),
        ..Default::default()
    };
    table.apply(id.as_bytes(), Some(&sub.encode_to_vec()));
    table.get(id).expect("applied")
}

fn inline(name: &str, timeout_ms: u64) -> String {
    let mut p = hookline_core::policy::builtin("standard").expect("built-in profile");
    p.name = name.into();
    p.attempt.timeout_ms = timeout_ms;
    toml::to_string(&p).expect("a policy serialises")
}

#[test]
fn subscriptions_on_one_built_in_profile_share_its_parsed_policy_and_egress_key() {
    let t = SubscriptionTable::default();
    let a = put(&t, "a", "standard", "");
    let b = put(&t, "b", "", "");
    let other = SubscriptionTable::default();
    let c = put(&other, "c", "standard", "");
    let (pa, pb, pc) = (a.policy.as_ref().unwrap(), b.policy.as_ref().unwrap(), c.policy.as_ref().unwrap());
    assert!(Arc::ptr_eq(pa, pb), "the default profile is `standard`, and both hold the one copy");
    assert!(Arc::ptr_eq(pa, pc), "one copy per process, whatever the table");
    assert!(Arc::ptr_eq(&a.egress_key, &b.egress_key));
    assert_eq!(**pa, hookline_core::policy::builtin("standard").unwrap(), "the shared copy is the profile");
    assert_eq!(*a.egress_key, format!("{:?}", pa.egress));
    let relay = put(&t, "s", "relay", "");
    let relay_policy = relay.policy.as_ref().expect("`relay` is a built-in profile");
    assert!(!Arc::ptr_eq(pa, relay_policy));
    assert_eq!(relay_policy.name, "relay");
}

#[test]
fn equal_inline_policies_are_parsed_once_and_different_ones_apart() {
    let t = SubscriptionTable::default();
    let doc = inline("shared-inline", 7_000);
    let a = put(&t, "a", "", &doc);
    let b = put(&t, "b", "", &doc);
    let c = put(&t, "c", "", &inline("shared-inline", 9_000));
    let (pa, pb, pc) = (a.policy.as_ref().unwrap(), b.policy.as_ref().unwrap(), c.policy.as_ref().unwrap());
    assert!(Arc::ptr_eq(pa, pb));
    assert_eq!(pa.attempt.timeout_ms, 7_000);
    assert!(!Arc::ptr_eq(pa, pc));
    assert_eq!(pc.attempt.timeout_ms, 9_000, "each subscription gets the policy its own document says");
    // A rewrite to another document moves that subscription only.
    let b = put(&t, "b", "", &inline("shared-inline", 9_000));
    assert!(Arc::ptr_eq(b.policy.as_ref().unwrap(), pc));
    assert_eq!(t.get("a").unwrap().policy.as_ref().unwrap().attempt.timeout_ms, 7_000);
}

#[test]
fn a_policy_that_does_not_resolve_is_still_the_entrys_error() {
    let t = SubscriptionTable::default();
    let unknown = put(&t, "u", "no-such-profile", "");
    let err = unknown.policy.as_ref().expect_err("an unknown profile does not resolve");
    assert!(err.contains("no-such-profile"), "{err}");
    assert_eq!(&*unknown.egress_key, "");
    let broken = put(&t, "b", "", "this is = = not toml");
    assert!(broken.policy.is_err());
    let again = put(&t, "b2", "", "this is = = not toml");
    assert_eq!(broken.policy.as_ref().unwrap_err(), again.policy.as_ref().unwrap_err());
}

/// What a table holds per subscription is the compact form, and what subscriptions share is one allocation per
/// process: a tenant's name, a policy's name. A record with more than the held fields keeps the rest, and the
/// API's read of the record (`to_subscription`) is the record that was written, after a change as before it.
#[test]
fn a_table_holds_the_compact_form_with_tenant_and_policy_names_shared_and_gives_back_the_record() {
    let t = SubscriptionTable::default();
    let record = |id: &str, description: &str| Subscription {
        id: id.into(),
        url: "http://127.0.0.1:1/".into(),
        tenant: "acme".into(),
        event_types: vec!["a.b".into(), "c.*".into()],
        policy: "standard".into(),
        description: description.into(),
        enabled: true,
        ..Default::default()
    };
    for (id, d) in [("a", ""), ("b", "")] {
        t.apply(id.as_bytes(), Some(&record(id, d).encode_to_vec()));
    }
    let (a, b) = (t.get("a").unwrap(), t.get("b").unwrap());
    assert!(Arc::ptr_eq(&a.sub.tenant, &b.sub.tenant), "one copy of the tenant's name");
    assert!(Arc::ptr_eq(&a.sub.policy, &b.sub.policy), "one copy of the policy's name");
    assert!(!a.sub.keeps_rest(), "nothing beyond the held fields is set, so nothing else is kept");
    assert_eq!(a.sub.to_subscription(), record("a", ""));
    // A change that sets a field outside the held ones: kept, and given back.
    t.apply(b"a", Some(&record("a", "billing hook").encode_to_vec()));
    let a = t.get("a").unwrap();
    assert!(a.sub.keeps_rest());
    assert_eq!(a.sub.description(), "billing hook");
    assert_eq!(a.sub.to_subscription(), record("a", "billing hook"));
    // The index found it before and finds it after, by exact type and by prefix.
    assert_eq!(t.matching("acme", "a.b").len(), 2);
    assert_eq!(t.matching("acme", "c.d").iter().map(|e| e.sub.id.to_string()).collect::<Vec<_>>(), ["a", "b"]);
    t.apply(b"b", None);
    assert_eq!(t.matching("acme", "c.d").iter().map(|e| e.sub.id.to_string()).collect::<Vec<_>>(), ["a"]);
}
