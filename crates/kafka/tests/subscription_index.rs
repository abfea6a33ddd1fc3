//! The fan-out index (`SubscriptionTable::matching`) against the linear filter it replaces
//! (`matching_linear`: `hookline_core::filter::delivers` over every subscription), through the table's own
//! `apply` of subscription records: random inserts, updates (tenant and types), tombstones and undecodable
//! records, every (tenant, event type) pair compared after every step.

use hookline_core::model::Subscription;
use hookline_kafka::state::SubscriptionTable;
use proptest::prelude::*;
use prost::Message;

const TENANTS: &[&str] = &["", "a", "b", "acme:eu"];
/// Every pattern shape, including ones the API refuses but a stored record may hold.
const PATTERNS: &[&str] =
    &["*", "a", "a.b", "a.b.c", "a.*", "a.b.*", "b.*", ".*", "a*", "a.**", "*.b", "a.*.c", "**", "", "a.", "x", "a..*"];
const EVENT_TYPES: &[&str] = &["a", "a.b", "a.b.c", "a.bc", "a.", ".", "..", "a..b", "b", "b.x", "x", "a.*.c", "*.b", "*", "", "a.b.c.d"];

fn ids(v: &[std::sync::Arc<hookline_kafka::state::SubscriptionEntry>]) -> Vec<String> {
    v.iter().map(|e| e.sub.id.to_string()).collect()
}

fn record(id: &str, tenant: &str, types: &[&str]) -> Vec<u8> {
    Subscription {
        id: id.into(),
        url: "http://127.0.0.1:1/".into(),
        tenant: tenant.into(),
        event_types: types.iter().map(|t| (*t).to_owned()).collect(),
        ..Default::default()
    }
    .encode_to_vec()
}

fn assert_same(table: &SubscriptionTable) -> Result<(), TestCaseError> {
    for tenant in TENANTS.iter().chain(&["nobody"]) {
        for ty in EVENT_TYPES {
            let got = ids(&table.matching(tenant, ty));
            let want = ids(&table.matching_linear(tenant, ty));
            prop_assert_eq!(got, want, "tenant {:?}, type {:?}", tenant, ty);
        }
    }
    Ok(())
}

#[derive(Debug, Clone)]
enum Op {
    Upsert { id: usize, tenant: usize, patterns: Vec<usize> },
    Delete(usize),
    Garbage(usize),
}

/// Ops on `ids` subscriptions using the first `tenants` tenants and `patterns` patterns.
fn op(ids: usize, tenants: usize, patterns: usize) -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (0..ids, 0..tenants, prop::collection::vec(0..patterns, 0..4))
            .prop_map(|(id, tenant, patterns)| Op::Upsert { id, tenant, patterns }),
        3 => (0..ids).prop_map(Op::Delete),
        1 => (0..ids).prop_map(Op::Garbage),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 128, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn index_answers_exactly_what_the_linear_filter_does(ops in prop::collection::vec(op(12, TENANTS.len(), PATTERNS.len()), 1..40)) {
        check(&ops)?;
    }

    /// Few tenants and patterns, many subscriptions: buckets grow past the size where they keep a map of
    /// positions, and shrink again.
    #[test]
    fn full_buckets_stay_exact(ops in prop::collection::vec(op(80, 2, 2), 1..300)) {
        check(&ops)?;
    }
}

#[test]
fn a_bucket_past_its_position_map_size_removes_exactly() {
    let t = SubscriptionTable::default();
    let n = 100;
    for i in 0..n {
        t.apply(format!("s{i:03}").as_bytes(), Some(&record(&format!("s{i:03}"), "a", &["*", "x"])));
    }
    // Out of order, so `swap_remove` moves entries around the map of positions.
    let mut left: Vec<usize> = (0..n).collect();
    for step in 0..n {
        let i = left.remove((step * 37) % left.len());
        t.apply(format!("s{i:03}").as_bytes(), None);
        let want: Vec<String> = {
            let mut v: Vec<_> = left.iter().map(|j| format!("s{j:03}")).collect();
            v.sort();
            v
        };
        assert_eq!(ids(&t.matching("a", "x")), want);
        assert_eq!(ids(&t.matching("a", "y")), want);
    }
    assert_eq!(t.indexed_tenants(), 0);
}

fn check(ops: &[Op]) -> Result<(), TestCaseError> {
    {
        let table = SubscriptionTable::default();
        for op in ops {
            match op {
                Op::Upsert { id, tenant, patterns } => {
                    let types: Vec<&str> = patterns.iter().map(|p| PATTERNS[*p]).collect();
                    table.apply(format!("sub_{id}").as_bytes(), Some(&record(&format!("sub_{id}"), TENANTS[*tenant], &types)));
                }
                Op::Delete(id) => table.apply(format!("sub_{id}").as_bytes(), None),
                // Ignored like any undecodable record: the previous version stays, in the index too.
                Op::Garbage(id) => table.apply(format!("sub_{id}").as_bytes(), Some(b"\xff\xff\xff")),
            }
            assert_same(&table)?;
        }
        // Deleted and moved subscriptions leave nothing behind: the index holds exactly the tenants that still
        // have a subscription with a pattern that can match.
        let live: std::collections::HashSet<String> = table
            .all()
            .iter()
            .filter(|e| e.sub.event_types.iter().any(|p| hookline_core::filter::key(p) != hookline_core::filter::Key::Never))
            .map(|e| e.sub.tenant.to_string())
            .collect();
        prop_assert_eq!(table.indexed_tenants(), live.len());
    }
    Ok(())
}

#[test]
fn an_event_reaches_only_its_own_tenant() {
    let t = SubscriptionTable::default();
    t.apply(b"sub_a", Some(&record("sub_a", "a", &["invoice.paid"])));
    t.apply(b"sub_b", Some(&record("sub_b", "b", &["invoice.*"])));
    t.apply(b"sub_none", Some(&record("sub_none", "", &["*"])));
    assert_eq!(ids(&t.matching("a", "invoice.paid")), ["sub_a"]);
    assert_eq!(ids(&t.matching("b", "invoice.paid")), ["sub_b"]);
    assert_eq!(ids(&t.matching("", "invoice.paid")), ["sub_none"]);
    assert!(t.matching("c", "invoice.paid").is_empty());
}

#[test]
fn overlapping_patterns_give_a_subscription_once() {
    let t = SubscriptionTable::default();
    t.apply(b"s", Some(&record("s", "a", &["*", "x.y", "x.*", "x.y", "x.y.*"])));
    assert_eq!(ids(&t.matching("a", "x.y")), ["s"]);
    assert_eq!(ids(&t.matching("a", "x.y.z")), ["s"]);
}

#[test]
fn an_update_moves_a_subscription_and_a_delete_forgets_it() {
    let t = SubscriptionTable::default();
    t.apply(b"s", Some(&record("s", "a", &["x.*"])));
    assert_eq!(ids(&t.matching("a", "x.1")), ["s"]);
    // New tenant and new types: nothing is left under the old ones.
    t.apply(b"s", Some(&record("s", "b", &["y"])));
    assert!(t.matching("a", "x.1").is_empty());
    assert!(t.matching("b", "x.1").is_empty());
    assert_eq!(ids(&t.matching("b", "y")), ["s"]);
    assert_eq!(t.indexed_tenants(), 1);
    t.apply(b"s", None);
    assert!(t.matching("b", "y").is_empty());
    assert_eq!((t.len(), t.indexed_tenants()), (0, 0));
}

#[test]
fn the_record_key_is_the_id() {
    // A record whose body names another id is known by its key, so its tombstone removes it from the index too.
    let t = SubscriptionTable::default();
    t.apply(b"sub_key", Some(&record("sub_other", "", &["*"])));
    assert_eq!(ids(&t.matching("", "e")), ["sub_key"]);
    t.apply(b"sub_key", None);
    assert!(t.matching("", "e").is_empty());
}
