//! Listing through the table's ordered index (`SubscriptionTable::page`) against sorting the whole table, through
//! random inserts, tenant moves and tombstones; and what the table does with sealed signing secrets.

use std::sync::Arc;

use hookline_core::model::{Secret, Subscription};
use hookline_core::seal::{self, Keyring};
use hookline_kafka::state::{SecretMode, SubscriptionTable};
use proptest::prelude::*;
use prost::Message;

const TENANTS: &[&str] = &["", "a", "b", "acme:eu", "b0"];

fn record(id: &str, tenant: &str) -> Vec<u8> {
    Subscription { id: id.into(), tenant: tenant.into(), event_types: vec!["*".into()], ..Default::default() }.encode_to_vec()
}

/// Every page from the start, `limit` at a time, following `next_after` as a client does.
fn walk(t: &SubscriptionTable, tenant: Option<&str>, limit: usize) -> Vec<String> {
    let mut out = Vec::new();
    let mut after: Option<String> = None;
    loop {
        let page = t.page(tenant, after.as_deref(), limit);
        assert!(page.items.len() <= limit);
        out.extend(page.items.iter().map(|e| e.sub.id.to_string()));
        if !page.more {
            return out;
        }
        assert_eq!(page.items.len(), limit, "a page that says more follow is full");
        after = out.last().cloned();
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 128, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn pages_hold_exactly_the_sorted_table(ops in prop::collection::vec((0..40usize, prop::option::of(0..TENANTS.len())), 1..120), limit in 1..7usize) {
        let t = SubscriptionTable::default();
        for (id, tenant) in ops {
            let id = format!("sub_{id:02}");
            match tenant {
                Some(i) => t.apply(id.as_bytes(), Some(&record(&id, TENANTS[i]))),
                None => t.apply(id.as_bytes(), None),
            }
        }
        let mut all: Vec<_> = t.all().iter().map(|e| (e.sub.tenant.to_string(), e.sub.id.to_string())).collect();
        all.sort_by(|a, b| a.1.cmp(&b.1));
        prop_assert_eq!(walk(&t, None, limit), all.iter().map(|(_, id)| id.clone()).collect::<Vec<_>>());
        for tenant in TENANTS.iter().chain(&["nobody"]) {
            let want: Vec<String> = all.iter().filter(|(t, _)| t == tenant).map(|(_, id)| id.clone()).collect();
            prop_assert_eq!(walk(&t, Some(tenant), limit), want, "tenant {:?}", tenant);
        }
    }
}

#[test]
fn a_page_starts_after_the_cursor_even_when_it_is_gone() {
    let t = SubscriptionTable::default();
    for id in ["s1", "s2", "s3"] {
        t.apply(id.as_bytes(), Some(&record(id, "a")));
    }
    t.apply(b"s2", None);
    let page = t.page(Some("a"), Some("s2"), 10);
    assert_eq!(page.items.iter().map(|e| &*e.sub.id).collect::<Vec<_>>(), ["s3"]);
    assert_eq!(t.ids_of_tenant("a"), ["s1", "s3"]);
    assert!(t.ids_of_tenant("b").is_empty());
}

fn sealed(id: &str, keys: &Keyring, secret: &str) -> Vec<u8> {
    let mut s = Subscription {
        id: id.into(),
        event_types: vec!["*".into()],
        secrets: vec![Secret { value: secret.into(), ..Default::default() }],
        ..Default::default()
    };
    seal::seal_secrets(&mut s, keys, &mut rand::rng());
    s.encode_to_vec()
}

#[test]
fn sealed_secrets_open_with_the_key_and_a_record_that_does_not_open_never_signs() {
    let mut rng = rand::rng();
    let right = Arc::new(Keyring::from_entries([seal::generate_entry("k1", &mut rng).as_str()], None).unwrap());
    let wrong = Arc::new(Keyring::from_entries([seal::generate_entry("k1", &mut rng).as_str()], None).unwrap());

    let t = SubscriptionTable::with_secrets(SecretMode::Open(right.clone()));
    t.apply(b"s1", Some(&sealed("s1", &right, "whsec_one")));
    assert_eq!(t.get("s1").unwrap().signing_secrets(0), ["whsec_one"]);
    assert!(t.secret_failures().is_empty());

    let t = SubscriptionTable::with_secrets(SecretMode::Open(wrong));
    t.apply(b"s1", Some(&sealed("s1", &right, "whsec_one")));
    assert!(t.get("s1").unwrap().signing_secrets(0).is_empty(), "nothing to sign with, rather than garbage");
    assert_eq!(t.secret_failures().len(), 1);
    assert!(t.secret_failures()[0].1.to_string().contains("does not open"));
    // Deleted: no longer a failure.
    t.apply(b"s1", None);
    assert!(t.secret_failures().is_empty());

    // A table that never signs keeps no secret (and needs no key).
    let t = SubscriptionTable::with_secrets(SecretMode::Drop);
    t.apply(b"s1", Some(&sealed("s1", &right, "whsec_one")));
    assert!(t.get("s1").unwrap().sub.secrets.is_empty());
    assert!(t.secret_failures().is_empty());

    // Kept as stored, a sealed secret has no value and signs nothing.
    let t = SubscriptionTable::default();
    t.apply(b"s1", Some(&sealed("s1", &right, "whsec_one")));
    assert!(t.get("s1").unwrap().signing_secrets(0).is_empty());
}
