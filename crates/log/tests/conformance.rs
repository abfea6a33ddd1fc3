//! The same suite against both backends: SQLite in a temporary file and a real PostgreSQL server
//! (scripts/with-postgres). Each case gets a new, empty store.

mod support;

use hookline_core::model::{AttemptRecord, DeadLetter, Event};
use hookline_log::model::MAX_PAGE;
use hookline_log::{Batch, Cursor, DeliveryState, ListQuery, LogStore, Progress, Scope, StoreError, Target};

const DAY: i64 = 86_400_000;
/// 2026-01-01T00:00:00Z.
const T0: i64 = 1_767_225_600_000;
const NOW: i64 = T0 + DAY;
const KEEP_DAYS: u32 = 30;

fn event(id: &str, tenant: &str, ty: &str) -> Event {
    Event {
        id: id.into(),
        r#type: ty.into(),
        tenant: tenant.into(),
        occurred_at_ms: T0,
        data_json: format!("{{\"id\":\"{id}\"}}").into_bytes().into(),
        accepted_at_ms: T0,
        ..Default::default()
    }
}

/// An attempt of tenant `acme`'s event (set `tenant` for another).
fn attempt(delivery: &str, sub: &str, event_id: &str, n: u32, at: i64, status: u32, final_state: &str) -> AttemptRecord {
    AttemptRecord {
        delivery_id: delivery.into(),
        subscription_id: sub.into(),
        event_id: event_id.into(),
        tenant: "acme".into(),
        event_type: "order.created".into(),
        attempt: n,
        r#try: 1,
        started_at_ms: at,
        duration_ms: 12,
        outcome: status.to_string(),
        http_status: status,
        reason: format!("HTTP {status}"),
        response_excerpt: "busy".into(),
        verdict: if final_state == "succeeded" { "success" } else { "retry" }.into(),
        counts_toward_disable: status >= 500,
        next_due_at_ms: if final_state.is_empty() { at + 60_000 } else { 0 },
        final_state: final_state.into(),
        status_word: final_state.to_uppercase(),
        phase: 1,
        policy: "standard".into(),
        ..Default::default()
    }
}

async fn open(target: &Target) -> LogStore {
    LogStore::open(target).await.expect("store opens")
}

async fn index(store: &LogStore, batch: Batch) -> hookline_log::IndexSummary {
    store.index(batch, KEEP_DAYS, NOW).await.expect("batch indexed")
}

macro_rules! conformance {
    ($($case:ident),* $(,)?) => {$(
        mod $case {
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn sqlite() {
                let dir = crate::support::TempDir::new(stringify!($case));
                super::$case(crate::support::sqlite(&dir)).await;
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn postgres() {
                let Some(target) = crate::support::postgres().await else { return };
                super::$case(target).await;
            }
        }
    )*};
}

conformance!(
    migrations_apply_once_and_a_newer_schema_is_refused,
    a_delivery_comes_back_with_its_attempts_and_its_event,
    indexing_the_same_records_again_changes_nothing,
    records_read_out_of_order_make_the_same_delivery,
    the_same_event_id_from_two_tenants_is_two_events,
    a_delivery_keeps_its_own_tenant_whatever_shares_its_event_id,
    lists_page_newest_first_without_gaps_or_repeats,
    filters_combine_and_scope_by_tenant,
    search_by_event_id_finds_every_subscription,
    stats_count_by_state_in_a_window,
    stats_of_a_page_of_subscriptions_in_one_query,
    the_latest_success_of_a_page_of_subscriptions,
    attempt_points_are_one_subscriptions_tries_in_a_window,
    a_page_gets_the_latest_try_of_each_delivery,
    retention_skips_and_removes_old_history,
    headers_and_the_policys_reasoning_come_back_redacted,
    rows_of_a_version_3_store_read_after_migration_4,
    a_version_4_store_keeps_its_rows_through_migration_5,
    a_large_batch_stores_every_row_once,
    only_the_sqlite_writer_thread_yields_the_cores,
    how_far_behind_the_indexer_was_is_stored_with_its_batch,
    batches_written_side_by_side_over_the_same_deliveries_both_land,
);

async fn migrations_apply_once_and_a_newer_schema_is_refused(target: Target) {
    let first = open(&target).await;
    assert_eq!(first.migrations_applied(), [1, 2, 3, 4, 5, 6, 7]);
    assert_eq!(first.schema_version().await.unwrap(), 7);
    drop(first);
    let (applied, version) = hookline_log::migrate(&target).await.unwrap();
    assert!(applied.is_empty(), "nothing left to apply: {applied:?}");
    assert_eq!(version, 7);
    // The store's id stays with it; the SQLite indexer's group is the file's own.
    let again = open(&target).await;
    let id = again.store_id().await.unwrap();
    assert!(id.len() >= 16, "{id}");
    assert_eq!(open(&target).await.store_id().await.unwrap(), id, "stable across opens");
    let group = again.indexer_group("hookline-log-indexer").await.unwrap();
    match &target {
        Target::Sqlite(_) => assert_eq!(group, format!("hookline-log-indexer-{id}")),
        Target::Postgres(_) => assert_eq!(group, "hookline-log-indexer", "one group for the one database"),
    }
    drop(again);
    // A newer hookline migrated this database: this one must not write to it.
    match &target {
        Target::Sqlite(path) => {
            let c = rusqlite::Connection::open(path).unwrap();
            c.execute("INSERT INTO schema_migrations VALUES (99, 'future', 0)", []).unwrap();
        }
        Target::Postgres(url) => {
            let (c, conn) = tokio_postgres::connect(url, tokio_postgres::NoTls).await.unwrap();
            tokio::spawn(conn);
            c.batch_execute("INSERT INTO schema_migrations VALUES (99, 'future', 0)").await.unwrap();
        }
    }
    match LogStore::open(&target).await {
        Err(e @ StoreError::SchemaTooNew { found: 99, known: 7 }) => assert!(e.to_string().contains("upgrade hookline"), "{e}"),
        Err(e) => panic!("expected SchemaTooNew, got {e}"),
        Ok(_) => panic!("a newer schema was accepted"),
    }
}

async fn a_delivery_comes_back_with_its_attempts_and_its_event(target: Target) {
    let store = open(&target).await;
    let ev = event("evt_1", "acme", "order.created");
    let s = index(
        &store,
        Batch {
            events: vec![(ev.clone(), T0)],
            attempts: vec![
                attempt("dlv_1", "sub_a", "evt_1", 1, T0 + 10, 503, ""),
                attempt("dlv_1", "sub_a", "evt_1", 2, T0 + 60_010, 200, "succeeded"),
            ],
            dead_letters: vec![],
        },
    )
    .await;
    assert_eq!((s.attempts, s.deliveries, s.events, s.skipped), (2, 1, 1, 0));
    let d = store.delivery("dlv_1").await.unwrap().expect("stored");
    assert_eq!(d.delivery.state, DeliveryState::Succeeded);
    assert_eq!(d.delivery.status_word, "SUCCEEDED");
    assert_eq!((d.delivery.first_at_ms, d.delivery.last_at_ms, d.delivery.attempts_made), (T0 + 10, T0 + 60_010, 2));
    assert_eq!((d.delivery.tenant.as_str(), d.delivery.event_type.as_str(), d.delivery.last_http_status), ("acme", "order.created", 200));
    assert_eq!(d.attempts.len(), 2);
    let first = &d.attempts[0];
    assert_eq!((first.attempt, first.http_status, first.next_due_at_ms), (1, 503, T0 + 60_010));
    assert_eq!((first.verdict.as_str(), first.policy.as_str(), first.reason.as_str()), ("retry", "standard", "HTTP 503"));
    assert_eq!((first.response_excerpt.as_str(), first.duration_ms, first.counts_toward_disable), ("busy", 12, true));
    assert_eq!(first.body_ref, "event:evt_1");
    // The event is kept whole: a resend sends exactly this.
    assert_eq!(d.event.as_ref(), Some(&ev));
    assert_eq!(store.event("acme", "evt_1").await.unwrap(), Some(ev));
    assert_eq!(store.event("globex", "evt_1").await.unwrap(), None, "an event is its tenant's");
    assert!(store.delivery("dlv_missing").await.unwrap().is_none());
}

async fn indexing_the_same_records_again_changes_nothing(target: Target) {
    let store = open(&target).await;
    let mut concluding = attempt("dlv_1", "sub_a", "evt_1", 2, T0 + 50, 500, "dead");
    let batch = Batch {
        events: vec![(event("evt_1", "acme", "order.created"), T0)],
        attempts: vec![attempt("dlv_1", "sub_a", "evt_1", 1, T0 + 10, 500, ""), concluding.clone()],
        dead_letters: vec![DeadLetter {
            reason: "retries_exhausted".into(),
            final_state: "dead".into(),
            status_word: "DEAD".into(),
            subscription_id: "sub_a".into(),
            delivery_id: "dlv_1".into(),
            event: Some(event("evt_1", "acme", "order.created")),
            attempts: 2,
            last_outcome: "500".into(),
            at_ms: T0 + 60,
            first_attempt_at_ms: T0 + 10,
            ..Default::default()
        }],
    };
    index(&store, batch.clone()).await;
    let before = store.delivery("dlv_1").await.unwrap().unwrap();
    index(&store, batch.clone()).await;
    // The record that concludes an attempt repeats its try: same row, conclusion kept.
    concluding.concludes_attempt = 2;
    index(&store, Batch { attempts: vec![concluding], ..Default::default() }).await;
    let after = store.delivery("dlv_1").await.unwrap().unwrap();
    assert_eq!(after.attempts.len(), 2, "no duplicate attempts");
    assert_eq!(after.attempts[1].concludes_attempt, 2);
    assert_eq!(after.delivery, before.delivery);
    assert_eq!(after.delivery.dead_letter_reason, "retries_exhausted");
    assert_eq!(after.delivery.state, DeliveryState::Dead);
    assert_eq!(store.by_event_id("evt_1", None, 10).await.unwrap().len(), 1);
}

async fn records_read_out_of_order_make_the_same_delivery(target: Target) {
    let store = open(&target).await;
    // The three topics are read independently: the dead letter, then the last attempt, then the first, then the
    // event. The tenant comes with the attempts (each record names its event's tenant).
    let dl = DeadLetter {
        reason: "retries_exhausted".into(),
        final_state: "failed".into(),
        status_word: "FAILED".into(),
        subscription_id: "sub_a".into(),
        delivery_id: "dlv_9".into(),
        event: None,
        attempts: 3,
        last_outcome: "503".into(),
        at_ms: T0 + 300,
        first_attempt_at_ms: T0 + 100,
        ..Default::default()
    };
    index(&store, Batch { dead_letters: vec![dl], ..Default::default() }).await;
    let globex = |n, at, status, fin| AttemptRecord { tenant: "globex".into(), ..attempt("dlv_9", "sub_a", "evt_9", n, at, status, fin) };
    index(&store, Batch { attempts: vec![globex(3, T0 + 250, 503, "failed")], ..Default::default() }).await;
    index(&store, Batch { attempts: vec![globex(1, T0 + 100, 503, "")], ..Default::default() }).await;
    let d = store.delivery("dlv_9").await.unwrap().unwrap();
    assert_eq!(
        (d.delivery.state, d.delivery.attempts_made, d.delivery.first_at_ms, d.delivery.last_at_ms),
        (DeliveryState::Failed, 3, T0 + 100, T0 + 300)
    );
    assert_eq!((d.delivery.event_id.as_str(), d.delivery.tenant.as_str()), ("evt_9", "globex"));
    assert!(d.event.is_none(), "not indexed yet");
    index(&store, Batch { events: vec![(event("evt_9", "globex", "order.created"), T0 + 50)], ..Default::default() }).await;
    let d = store.delivery("dlv_9").await.unwrap().unwrap();
    assert_eq!(d.delivery.tenant, "globex");
    assert_eq!(d.event.unwrap().tenant, "globex");
    let page = store.list(&ListQuery::new(Scope::Tenant("globex".into()))).await.unwrap();
    assert_eq!(page.items.len(), 1);
}

/// Two tenants publish `order-2000` (their own order numbers), in either order: each delivery shows and resends
/// its own tenant's event, and a search within one tenant finds only that tenant's deliveries.
async fn the_same_event_id_from_two_tenants_is_two_events(target: Target) {
    let store = open(&target).await;
    let ev = |tenant: &str, card: &str| Event {
        data_json: format!("{{\"card_last4\":\"{card}\",\"tenant\":\"{tenant}\"}}").into_bytes().into(),
        ..event("order-2000", tenant, "order.paid")
    };
    let of = |tenant: &str, d: &str, sub: &str, at: i64| AttemptRecord {
        tenant: tenant.into(),
        ..attempt(d, sub, "order-2000", 1, at, 200, "succeeded")
    };
    // A first, then B a moment later; then, for another pair, B first and A after (and in one batch: the same ms).
    index(&store, Batch { events: vec![(ev("A", "1111"), T0)], attempts: vec![of("A", "dlv_a1", "sub_a", T0 + 5)], ..Default::default() })
        .await;
    index(
        &store,
        Batch { events: vec![(ev("B", "4242"), T0 + 1)], attempts: vec![of("B", "dlv_b1", "sub_b", T0 + 6)], ..Default::default() },
    )
    .await;
    index(&store, Batch { events: vec![(ev("B", "4242"), T0 + 100), (ev("A", "1111"), T0 + 100)], ..Default::default() }).await;
    index(
        &store,
        Batch { attempts: vec![of("B", "dlv_b2", "sub_b", T0 + 105), of("A", "dlv_a2", "sub_a", T0 + 106)], ..Default::default() },
    )
    .await;
    for (d, tenant, card) in [("dlv_a1", "A", "1111"), ("dlv_b1", "B", "4242"), ("dlv_a2", "A", "1111"), ("dlv_b2", "B", "4242")] {
        let got = store.delivery(d).await.unwrap().unwrap();
        assert_eq!(got.delivery.tenant, tenant, "{d}");
        let e = got.event.unwrap_or_else(|| panic!("{d}: its event is stored"));
        assert_eq!(e.tenant, tenant, "{d} shows its own tenant's event");
        assert!(String::from_utf8_lossy(&e.data_json).contains(card), "{d}: {:?}", String::from_utf8_lossy(&e.data_json));
    }
    assert_eq!(store.event("A", "order-2000").await.unwrap().unwrap().tenant, "A");
    assert_eq!(store.event("B", "order-2000").await.unwrap().unwrap().tenant, "B");
    let ids = |rows: Vec<hookline_log::DeliveryRow>| {
        let mut v: Vec<String> = rows.into_iter().map(|d| d.delivery_id).collect();
        v.sort();
        v
    };
    assert_eq!(ids(store.by_event_id("order-2000", Some("A"), 10).await.unwrap()), ["dlv_a1", "dlv_a2"]);
    assert_eq!(ids(store.by_event_id("order-2000", Some("B"), 10).await.unwrap()), ["dlv_b1", "dlv_b2"]);
    let tenant_a = store.list(&ListQuery::new(Scope::Tenant("A".into()))).await.unwrap();
    assert_eq!(tenant_a.items.len(), 2, "{:?}", tenant_a.items);
}

/// A delivery's tenant is its own records', never taken from another tenant's event of the same id (nor is a
/// record of no tenant given one that way).
async fn a_delivery_keeps_its_own_tenant_whatever_shares_its_event_id(target: Target) {
    let store = open(&target).await;
    index(&store, Batch { events: vec![(event("evt_5", "initech", "order.created"), T0 + 10)], ..Default::default() }).await;
    let no_tenant = AttemptRecord { tenant: String::new(), ..attempt("dlv_5", "sub_a", "evt_5", 1, T0 + 100, 503, "") };
    index(&store, Batch { attempts: vec![no_tenant], ..Default::default() }).await;
    let d = store.delivery("dlv_5").await.unwrap().unwrap();
    assert_eq!(d.delivery.tenant, "", "not initech's, whose event shares the id");
    assert!(d.event.is_none(), "nor is initech's event shown for it");
    // Its own records name the tenant from then on; the other tenant's event stays the other's.
    let named = AttemptRecord { tenant: "hooli".into(), ..attempt("dlv_5", "sub_a", "evt_5", 2, T0 + 200, 200, "succeeded") };
    index(&store, Batch { attempts: vec![named], ..Default::default() }).await;
    let d = store.delivery("dlv_5").await.unwrap().unwrap();
    assert_eq!((d.delivery.tenant.as_str(), d.delivery.state, d.delivery.attempts_made), ("hooli", DeliveryState::Succeeded, 2));
    assert!(d.event.is_none());
    let page = store.list(&ListQuery::new(Scope::Tenant("initech".into()))).await.unwrap();
    assert!(page.items.is_empty(), "{:?}", page.items);
}

/// 25 deliveries of sub_a, some sharing a millisecond, plus other subscriptions' noise.
async fn seed_many(store: &LogStore) {
    let mut attempts = Vec::new();
    for i in 0..25i64 {
        let at = T0 + (i / 3) * 1_000; // three per millisecond group: the cursor must break ties
        let (status, fin) = match i % 3 {
            0 => (200, "succeeded"),
            1 => (503, "dead"),
            _ => (404, "failed"),
        };
        let ty = if i % 2 == 0 { "order.created" } else { "order.paid" };
        let mut a = attempt(&format!("dlv_a{i:02}"), "sub_a", &format!("evt_{i}"), 1, at, status, fin);
        let mut b = attempt(&format!("dlv_b{i:02}"), "sub_b", &format!("evt_{i}"), 1, at, 200, "succeeded");
        a.event_type = ty.into();
        b.event_type = ty.into();
        let tenant = if i < 10 { "acme" } else { "globex" };
        a.tenant = tenant.into();
        b.tenant = tenant.into();
        attempts.extend([a, b]);
    }
    let events = (0..25)
        .map(|i| {
            (
                event(&format!("evt_{i}"), if i < 10 { "acme" } else { "globex" }, if i % 2 == 0 { "order.created" } else { "order.paid" }),
                T0,
            )
        })
        .collect();
    index(store, Batch { attempts, events, dead_letters: vec![] }).await;
}

async fn lists_page_newest_first_without_gaps_or_repeats(target: Target) {
    let store = open(&target).await;
    seed_many(&store).await;
    let mut q = ListQuery::new(Scope::Subscription("sub_a".into()));
    q.limit = 10;
    let mut seen = Vec::new();
    let mut pages = 0;
    loop {
        let page = store.list(&q).await.unwrap();
        pages += 1;
        seen.extend(page.items.iter().map(|d| (d.first_at_ms, d.delivery_id.clone())));
        match page.next {
            Some(c) => q.after = Some(Cursor::decode(&c.encode()).unwrap()),
            None => break,
        }
    }
    assert_eq!(pages, 3);
    assert_eq!(seen.len(), 25);
    let mut sorted = seen.clone();
    sorted.sort_by(|a, b| b.cmp(a));
    sorted.dedup();
    assert_eq!(seen, sorted, "newest first, each once");
    assert!(seen.iter().all(|(_, id)| id.starts_with("dlv_a")));
    // An exact page: no phantom next page.
    let mut q = ListQuery::new(Scope::Subscription("sub_a".into()));
    q.limit = 25;
    assert!(store.list(&q).await.unwrap().next.is_none());
    q.limit = 100_000;
    assert_eq!(q.page_size(), MAX_PAGE);
    let nobody = store.list(&ListQuery::new(Scope::Subscription("sub_none".into()))).await.unwrap();
    assert!(nobody.items.is_empty() && nobody.next.is_none());
}

async fn filters_combine_and_scope_by_tenant(target: Target) {
    let store = open(&target).await;
    seed_many(&store).await;
    let ids = |p: hookline_log::Page| p.items.into_iter().map(|d| d.delivery_id).collect::<Vec<_>>();
    let mut q = ListQuery::new(Scope::Subscription("sub_a".into()));
    q.limit = 100;
    q.state = Some("dead".parse().unwrap());
    let dead = ids(store.list(&q).await.unwrap());
    assert_eq!(dead.len(), 8);
    assert!(dead.iter().all(|id| id[5..].parse::<u32>().unwrap() % 3 == 1));
    q.state = None;
    q.http_status = Some(404);
    assert_eq!(store.list(&q).await.unwrap().items.len(), 8);
    q.http_status = None;
    q.event_type = Some("order.paid".into());
    assert_eq!(store.list(&q).await.unwrap().items.len(), 12);
    q.event_type = None;
    q.since_ms = Some(T0 + 2_000);
    q.until_ms = Some(T0 + 4_000);
    assert_eq!(ids(store.list(&q).await.unwrap()), ["dlv_a11", "dlv_a10", "dlv_a09", "dlv_a08", "dlv_a07", "dlv_a06"]);
    q.state = Some(DeliveryState::Succeeded);
    assert_eq!(ids(store.list(&q).await.unwrap()), ["dlv_a09", "dlv_a06"]);
    let mut t = ListQuery::new(Scope::Tenant("acme".into()));
    t.limit = 100;
    assert_eq!(store.list(&t).await.unwrap().items.len(), 20, "10 events of acme, two subscriptions each");
    t.state = Some(DeliveryState::Dead);
    assert_eq!(store.list(&t).await.unwrap().items.len(), 3);
}

async fn search_by_event_id_finds_every_subscription(target: Target) {
    let store = open(&target).await;
    seed_many(&store).await;
    let mut found: Vec<String> = store.by_event_id("evt_3", None, 10).await.unwrap().into_iter().map(|d| d.delivery_id).collect();
    found.sort();
    assert_eq!(found, ["dlv_a03", "dlv_b03"]);
    assert_eq!(store.by_event_id("evt_3", Some("acme"), 10).await.unwrap().len(), 2);
    assert!(store.by_event_id("evt_3", Some("globex"), 10).await.unwrap().is_empty(), "another tenant's event is not found");
    assert!(store.by_event_id("evt_none", None, 10).await.unwrap().is_empty());
}

async fn stats_count_by_state_in_a_window(target: Target) {
    let store = open(&target).await;
    seed_many(&store).await;
    let s = store.stats(&Scope::Subscription("sub_a".into()), T0, T0 + DAY).await.unwrap();
    assert_eq!(s.total, 25);
    assert_eq!(s.by_state, [(DeliveryState::Succeeded, 9), (DeliveryState::Failed, 8), (DeliveryState::Dead, 8)]);
    let s = store.stats(&Scope::Subscription("sub_a".into()), T0 + 3_000, T0 + 4_000).await.unwrap();
    assert_eq!(s.total, 3);
    let s = store.stats(&Scope::Tenant("globex".into()), T0, T0 + DAY).await.unwrap();
    assert_eq!(s.total, 30);
}

async fn stats_of_a_page_of_subscriptions_in_one_query(target: Target) {
    let store = open(&target).await;
    seed_many(&store).await;
    let ids = ["sub_a".to_owned(), "sub_b".to_owned(), "sub_none".to_owned()];
    let all = store.stats_of_subscriptions(&ids, T0, T0 + DAY).await.unwrap();
    // The same numbers as one query per subscription.
    for id in ["sub_a", "sub_b"] {
        assert_eq!(all[id], store.stats(&Scope::Subscription(id.into()), T0, T0 + DAY).await.unwrap(), "{id}");
    }
    assert!(!all.contains_key("sub_none"), "no deliveries, no entry");
    let some = store.stats_of_subscriptions(&ids[..1], T0 + 3_000, T0 + 4_000).await.unwrap();
    assert_eq!((some.len(), some["sub_a"].total), (1, 3));
    assert!(store.stats_of_subscriptions(&[], T0, T0 + DAY).await.unwrap().is_empty());
}

async fn the_latest_success_of_a_page_of_subscriptions(target: Target) {
    let store = open(&target).await;
    seed_many(&store).await;
    // sub_a: every third delivery succeeded, the last of them dlv_a24; sub_b: all of them.
    let late = attempt("dlv_c01", "sub_c", "evt_1", 1, T0 + 5_000, 503, "failed");
    index(&store, Batch { attempts: vec![late], events: vec![], dead_letters: vec![] }).await;
    let mut ids: Vec<String> = ["sub_a", "sub_b", "sub_c", "sub_none"].map(String::from).to_vec();
    // More than one statement's worth: the page is split.
    ids.extend((0..600).map(|i| format!("sub_pad_{i}")));
    let last = store.last_successes(&ids).await.unwrap();
    assert_eq!(last.get("sub_a").copied(), Some(store_last_at(&store, "dlv_a24").await));
    assert_eq!(last.get("sub_b").copied(), Some(store_last_at(&store, "dlv_b24").await));
    assert_eq!(last.len(), 2, "no success (sub_c), no deliveries (sub_none): absent; {last:?}");
    assert!(store.last_successes(&[]).await.unwrap().is_empty());
}

async fn store_last_at(store: &LogStore, delivery: &str) -> i64 {
    store.delivery(delivery).await.unwrap().expect("indexed").delivery.last_at_ms
}

async fn attempt_points_are_one_subscriptions_tries_in_a_window(target: Target) {
    let store = open(&target).await;
    seed_many(&store).await;
    let all = store.attempt_points("sub_a", T0, T0 + DAY).await.unwrap();
    assert_eq!(all.len(), 25, "sub_b's tries are not counted");
    assert!(all.windows(2).all(|w| w[0].started_at_ms >= w[1].started_at_ms), "newest first");
    let some = store.attempt_points("sub_a", T0 + 3_000, T0 + 4_000).await.unwrap();
    assert_eq!(some.len(), 3);
    assert_eq!(some.iter().filter(|p| p.final_state == "succeeded").count(), 1);
    assert!(store.attempt_points("sub_none", T0, T0 + DAY).await.unwrap().is_empty());
}

async fn a_page_gets_the_latest_try_of_each_delivery(target: Target) {
    let store = open(&target).await;
    index(
        &store,
        Batch {
            attempts: vec![
                attempt("dlv_x", "sub_a", "evt_x", 1, T0, 503, ""),
                attempt("dlv_x", "sub_a", "evt_x", 2, T0 + 500, 200, "succeeded"),
                attempt("dlv_y", "sub_a", "evt_y", 1, T0 + 100, 404, "failed"),
            ],
            ..Default::default()
        },
    )
    .await;
    let page = store.list(&ListQuery::new(Scope::Subscription("sub_a".into()))).await.unwrap();
    let last = store.last_attempts(&page.items).await.unwrap();
    assert_eq!(last.len(), 2);
    assert_eq!((last["dlv_x"].attempt, last["dlv_x"].http_status), (2, 200));
    assert_eq!((last["dlv_y"].attempt, last["dlv_y"].http_status), (1, 404));
    assert!(store.last_attempts(&[]).await.unwrap().is_empty());
}

async fn retention_skips_and_removes_old_history(target: Target) {
    let store = open(&target).await;
    let long_ago = NOW - 40 * DAY;
    let s = index(
        &store,
        Batch { attempts: vec![attempt("dlv_old", "sub_a", "evt_old", 1, long_ago, 200, "succeeded")], ..Default::default() },
    )
    .await;
    assert_eq!(s.skipped, 1, "older than the retention when read: not stored");
    assert!(store.delivery("dlv_old").await.unwrap().is_none());
    // Stored while young (a 60-day retention then), expired under a 30-day one now.
    store
        .index(
            Batch {
                attempts: vec![attempt("dlv_aged", "sub_a", "evt_aged", 1, long_ago, 200, "succeeded")],
                events: vec![(event("evt_aged", "acme", "order.created"), long_ago)],
                ..Default::default()
            },
            60,
            NOW,
        )
        .await
        .unwrap();
    index(&store, Batch { attempts: vec![attempt("dlv_new", "sub_a", "evt_new", 1, NOW - 1_000, 200, "succeeded")], ..Default::default() })
        .await;
    assert!(store.delivery("dlv_aged").await.unwrap().is_some());
    let r = store.apply_retention(KEEP_DAYS, NOW).await.unwrap();
    assert_eq!(r.deliveries, 1);
    assert!(store.delivery("dlv_aged").await.unwrap().is_none());
    assert!(store.event("acme", "evt_aged").await.unwrap().is_none(), "the event went with it");
    let young = store.delivery("dlv_new").await.unwrap().expect("kept");
    assert_eq!(young.attempts.len(), 1);
    if let LogStore::Postgres(pg) = &store {
        assert!(r.partitions_dropped >= 2, "the old day's attempts and events partitions: {r:?}");
        let days = pg.partition_days().await.unwrap();
        let cutoff_day = (NOW - i64::from(KEEP_DAYS) * DAY).div_euclid(DAY);
        assert!(days.iter().all(|d| *d >= cutoff_day), "{days:?}");
        let today = hookline_service::now_ms().div_euclid(DAY);
        assert!(days.contains(&(today + 2)), "partitions are created ahead: {days:?}");
    } else {
        assert_eq!((r.attempts, r.events), (1, 1));
    }
}

fn header(name: &str, value: &str) -> hookline_core::model::Header {
    hookline_core::model::Header { name: name.into(), value: value.as_bytes().to_vec().into() }
}

async fn headers_and_the_policys_reasoning_come_back_redacted(target: Target) {
    let store = open(&target).await;
    let mut retried = attempt("dlv_h", "sub_a", "evt_h", 1, T0 + 10, 503, "");
    retried.request_headers = vec![
        header("content-type", "application/json"),
        header("webhook-id", "evt_h"),
        header("webhook-timestamp", "1767225600"),
        // A record written by other means than the dispatcher: the store redacts again.
        header("webhook-signature", "v1,c2VjcmV0"),
    ];
    retried.response_headers = vec![header("retry-after", "60"), header("set-cookie", "session=abc")];
    retried.decided_by = hookline_core::DecidedBy::RetryAfter.to_wire();
    retried.rule = 3;
    retried.rule_when = "429 503".into();
    let mut done = attempt("dlv_h", "sub_a", "evt_h", 2, T0 + 60_010, 200, "succeeded");
    done.decided_by = hookline_core::DecidedBy::SuccessRule.to_wire();
    done.rule = 1;
    index(&store, Batch { attempts: vec![retried, done], ..Default::default() }).await;
    let d = store.delivery("dlv_h").await.unwrap().expect("stored");
    let [first, second] = &d.attempts[..] else { panic!("{:?}", d.attempts) };
    let pairs = |v: &[(&str, &str)]| v.iter().map(|(a, b)| (a.to_string(), b.to_string())).collect::<Vec<_>>();
    assert_eq!(
        first.request_headers,
        pairs(&[
            ("content-type", "application/json"),
            ("webhook-id", "evt_h"),
            ("webhook-timestamp", "1767225600"),
            ("webhook-signature", "<redacted>")
        ])
    );
    assert_eq!(first.response_headers, pairs(&[("retry-after", "60"), ("set-cookie", "<redacted>")]));
    assert_eq!(
        (first.decided_by, first.rule, first.rule_when.as_str(), first.next_due_at_ms),
        (Some(hookline_core::DecidedBy::RetryAfter), 3, "429 503", T0 + 60_010)
    );
    assert_eq!((second.decided_by, second.rule, second.next_due_at_ms), (Some(hookline_core::DecidedBy::SuccessRule), 1, 0));
    // The list's latest try carries them too.
    let last = store.last_attempts(std::slice::from_ref(&d.delivery)).await.unwrap();
    assert_eq!(last["dlv_h"].decided_by, Some(hookline_core::DecidedBy::SuccessRule));
}

/// A store made by a hookline of schema version 3 (before the reasoning columns) with a row in it: opening it
/// applies migration 4 and the old row reads, with no reasoning.
async fn rows_of_a_version_3_store_read_after_migration_4(target: Target) {
    let old_row = "INSERT INTO attempts (delivery_id, run_id, attempt, try_no, started_at_ms, subscription_id, duration_ms, \
        outcome, http_status, reason, request_headers, body_ref, response_headers, response_excerpt, verdict, \
        counts_toward_disable, next_due_at_ms, final_state, status_word, policy, concludes_attempt, traceparent) VALUES \
        ('dlv_old', '', 1, 1, START, 'sub_a', 5, '200', 200, 'HTTP 200', '[]', 'event:evt_old', '[]', '', 'success', \
        FALSE, 0, 'succeeded', 'succeeded', 'standard', 1, ''); \
        INSERT INTO deliveries VALUES ('dlv_old', 'sub_a', '', 'evt_old', 'order.created', 'succeeded', 'succeeded', \
        START, START, 1, 200, '200', '', '');";
    let start = T0 + 10;
    let old_row = old_row.replace("START", &start.to_string());
    let record = |v: u32| format!("INSERT INTO schema_migrations (version, name, applied_at_ms) VALUES ({v}, 'v{v}', 0);");
    match &target {
        Target::Sqlite(path) => {
            let c = rusqlite::Connection::open(path).unwrap();
            c.execute_batch(
                "CREATE TABLE schema_migrations (version INTEGER PRIMARY KEY, name TEXT NOT NULL, applied_at_ms INTEGER NOT NULL)",
            )
            .unwrap();
            for (v, _, sql) in &hookline_log::schema::SQLITE[..3] {
                c.execute_batch(sql).unwrap();
                c.execute_batch(&record(*v)).unwrap();
            }
            c.execute_batch(&old_row.replace("FALSE", "0")).unwrap();
        }
        Target::Postgres(url) => {
            let (c, conn) = tokio_postgres::connect(url, tokio_postgres::NoTls).await.unwrap();
            tokio::spawn(conn);
            c.batch_execute(
                "CREATE TABLE schema_migrations (version BIGINT PRIMARY KEY, name TEXT NOT NULL, applied_at_ms BIGINT NOT NULL)",
            )
            .await
            .unwrap();
            for (v, _, sql) in &hookline_log::schema::POSTGRES[..3] {
                c.batch_execute(sql).await.unwrap();
                c.batch_execute(&record(*v)).await.unwrap();
            }
            let day = start.div_euclid(DAY);
            c.batch_execute(&format!(
                "CREATE TABLE {} PARTITION OF attempts FOR VALUES FROM ({}) TO ({})",
                hookline_log::postgres::partition_name("attempts", day),
                day * DAY,
                (day + 1) * DAY
            ))
            .await
            .unwrap();
            c.batch_execute(&old_row).await.unwrap();
        }
    }
    let store = open(&target).await;
    assert_eq!(store.migrations_applied(), [4, 5, 6, 7]);
    let d = store.delivery("dlv_old").await.unwrap().expect("the old row reads");
    assert_eq!(d.delivery.state, DeliveryState::Succeeded);
    let a = &d.attempts[0];
    assert_eq!((a.http_status, a.decided_by, a.rule, a.rule_when.as_str()), (200, None, 0, ""));
    assert!(a.request_headers.is_empty());
    // New rows beside it carry the reasoning.
    let mut new = attempt("dlv_old", "sub_a", "evt_old", 2, start + 1_000, 200, "succeeded");
    new.decided_by = hookline_core::DecidedBy::SuccessRule.to_wire();
    index(&store, Batch { attempts: vec![new], ..Default::default() }).await;
    let d = store.delivery("dlv_old").await.unwrap().unwrap();
    assert_eq!(d.attempts.iter().map(|a| a.decided_by).collect::<Vec<_>>(), [None, Some(hookline_core::DecidedBy::SuccessRule)]);
}

/// A store of schema version 4 with a delivery, its two tries and its event in it (SQLite: `WITHOUT ROWID` tables
/// keyed by those ids): opening it applies migration 5 (SQLite: rowid tables, the keys in unique indexes; PostgreSQL:
/// nothing) and everything reads as before; the keys still deduplicate re-indexed records, and new rows join.
async fn a_version_4_store_keeps_its_rows_through_migration_5(target: Target) {
    use prost::Message as _;
    let start = T0 + 10;
    let payload: String = event("evt_m", "acme", "order.created").encode_to_vec().iter().map(|b| format!("{b:02x}")).collect();
    let row = |n: u32, at: i64, status: u32, fin: &str| {
        format!(
            "INSERT INTO attempts VALUES ('dlv_m', '', {n}, 1, {at}, 'sub_m', 12, '{status}', {status}, 'HTTP {status}', \
             '[[\"content-type\",\"application/json\"]]', 'event:evt_m', '[]', 'busy', 'retry', FALSE, 0, '{fin}', '{fin}', \
             'standard', {n}, '', 'schedule', 1, '503');"
        )
    };
    let rows = format!(
        "{}{}INSERT INTO deliveries VALUES ('dlv_m', 'sub_m', 'acme', 'evt_m', 'order.created', 'succeeded', 'SUCCEEDED', \
         {start}, {}, 2, 200, '200', '', ''); INSERT INTO events VALUES ('evt_m', {T0}, 'order.created', 'acme', PAYLOAD);",
        row(1, start, 503, ""),
        row(2, start + 1_000, 200, "succeeded"),
        start + 1_000,
    );
    let record = |v: u32| format!("INSERT INTO schema_migrations (version, name, applied_at_ms) VALUES ({v}, 'v{v}', 0);");
    match &target {
        Target::Sqlite(path) => {
            let c = rusqlite::Connection::open(path).unwrap();
            c.execute_batch(
                "CREATE TABLE schema_migrations (version INTEGER PRIMARY KEY, name TEXT NOT NULL, applied_at_ms INTEGER NOT NULL)",
            )
            .unwrap();
            for (v, _, sql) in &hookline_log::schema::SQLITE[..4] {
                c.execute_batch(sql).unwrap();
                c.execute_batch(&record(*v)).unwrap();
            }
            c.execute_batch(&rows.replace("FALSE", "0").replace("PAYLOAD", &format!("X'{payload}'"))).unwrap();
        }
        Target::Postgres(url) => {
            let (c, conn) = tokio_postgres::connect(url, tokio_postgres::NoTls).await.unwrap();
            tokio::spawn(conn);
            c.batch_execute(
                "CREATE TABLE schema_migrations (version BIGINT PRIMARY KEY, name TEXT NOT NULL, applied_at_ms BIGINT NOT NULL)",
            )
            .await
            .unwrap();
            for (v, _, sql) in &hookline_log::schema::POSTGRES[..4] {
                c.batch_execute(sql).await.unwrap();
                c.batch_execute(&record(*v)).await.unwrap();
            }
            let day = T0.div_euclid(DAY);
            for table in ["attempts", "events"] {
                c.batch_execute(&format!(
                    "CREATE TABLE {} PARTITION OF {table} FOR VALUES FROM ({}) TO ({})",
                    hookline_log::postgres::partition_name(table, day),
                    day * DAY,
                    (day + 1) * DAY
                ))
                .await
                .unwrap();
            }
            c.batch_execute(&rows.replace("PAYLOAD", &format!("decode('{payload}', 'hex')"))).await.unwrap();
        }
    }
    let store = open(&target).await;
    assert_eq!(store.migrations_applied(), [5, 6, 7]);
    assert_eq!(store.schema_version().await.unwrap(), 7);
    let before = store.delivery("dlv_m").await.unwrap().expect("the migrated delivery reads");
    assert_eq!(
        (before.delivery.state, before.delivery.tenant.as_str(), before.delivery.attempts_made),
        (DeliveryState::Succeeded, "acme", 2)
    );
    assert_eq!(before.attempts.iter().map(|a| a.http_status).collect::<Vec<_>>(), [503, 200], "oldest first");
    assert_eq!(before.attempts[0].request_headers, [("content-type".to_owned(), "application/json".to_owned())]);
    assert_eq!(before.attempts[0].decided_by, Some(hookline_core::DecidedBy::Schedule));
    assert_eq!(before.event.as_ref().map(|e| e.id.as_str()), Some("evt_m"), "the stored event, for a resend");
    let page = store.list(&ListQuery::new(Scope::Subscription("sub_m".into()))).await.unwrap();
    assert_eq!(page.items.iter().map(|d| d.delivery_id.as_str()).collect::<Vec<_>>(), ["dlv_m"]);
    assert_eq!(store.by_event_id("evt_m", Some("acme"), 10).await.unwrap().len(), 1);
    // The same records indexed again (the indexer re-reading after a crash) hit the migrated keys: no new rows.
    let mut again = attempt("dlv_m", "sub_m", "evt_m", 2, start + 1_000, 200, "succeeded");
    again.concludes_attempt = 2;
    index(&store, Batch { attempts: vec![again], events: vec![(event("evt_m", "acme", "order.created"), T0)], ..Default::default() }).await;
    let after = store.delivery("dlv_m").await.unwrap().unwrap();
    assert_eq!(after.attempts.len(), 2, "{:?}", after.attempts);
    assert_eq!(after.delivery.attempts_made, 2);
    // A new run's try joins the migrated rows.
    let mut replayed = attempt("dlv_m", "sub_m", "evt_m", 3, start + 5_000, 503, "");
    replayed.run_id = "run_2".into();
    index(&store, Batch { attempts: vec![replayed], ..Default::default() }).await;
    let last = store.delivery("dlv_m").await.unwrap().unwrap();
    assert_eq!(last.attempts.len(), 3);
    // Migration 6: another tenant's event of the same id and time is a row of its own, and each reads as its own.
    index(&store, Batch { events: vec![(event("evt_m", "globex", "order.created"), T0)], ..Default::default() }).await;
    assert_eq!(store.event("acme", "evt_m").await.unwrap().map(|e| e.tenant), Some("acme".into()));
    assert_eq!(store.event("globex", "evt_m").await.unwrap().map(|e| e.tenant), Some("globex".into()));
    assert_eq!(store.delivery("dlv_m").await.unwrap().unwrap().event.map(|e| e.tenant), Some("acme".into()));
    assert_eq!((last.delivery.state, last.delivery.run_id.as_str(), last.delivery.attempts_made), (DeliveryState::Pending, "run_2", 3));
}

/// A batch larger than one multi-row statement (SQLite writes 50 rows per statement, the rest one by one), indexed
/// twice: every row once, each with its own values and its own tenant, events arriving after their deliveries.
async fn a_large_batch_stores_every_row_once(target: Target) {
    let store = open(&target).await;
    let n = 123;
    let batch = || Batch {
        attempts: (0..n)
            .flat_map(|i| {
                let (d, e) = (format!("dlv_{i:03}"), format!("evt_{i:03}"));
                let t = format!("t{}", i % 7);
                [attempt(&d, "sub_l", &e, 1, T0 + i, 503, ""), attempt(&d, "sub_l", &e, 2, T0 + 1_000 + i, 200, "succeeded")]
                    .map(|a| AttemptRecord { tenant: t.clone(), ..a })
            })
            .collect(),
        events: (0..n).map(|i| (event(&format!("evt_{i:03}"), &format!("t{}", i % 7), "order.created"), T0)).collect(),
        dead_letters: vec![],
    };
    // The deliveries first, the events in a later batch.
    let first = Batch { events: vec![], ..batch() };
    let s = index(&store, first).await;
    assert_eq!((s.attempts, s.deliveries), (2 * n as usize, n as usize));
    index(&store, batch()).await;
    index(&store, batch()).await;
    let mut seen = 0;
    let mut q = ListQuery { limit: 50, ..ListQuery::new(Scope::Subscription("sub_l".into())) };
    loop {
        let page = store.list(&q).await.unwrap();
        for d in &page.items {
            let i: i64 = d.delivery_id[4..].parse().unwrap();
            assert_eq!((d.first_at_ms, d.last_at_ms, d.attempts_made, d.state), (T0 + i, T0 + 1_000 + i, 2, DeliveryState::Succeeded));
            assert_eq!((d.event_id.clone(), d.tenant.clone()), (format!("evt_{i:03}"), format!("t{}", i % 7)), "{d:?}");
            seen += 1;
        }
        match page.next {
            Some(c) => q.after = Some(c),
            None => break,
        }
    }
    assert_eq!(seen, n);
    let d = store.delivery("dlv_077").await.unwrap().unwrap();
    assert_eq!(d.attempts.iter().map(|a| (a.attempt, a.started_at_ms)).collect::<Vec<_>>(), [(1, T0 + 77), (2, T0 + 1_077)]);
    assert_eq!(d.event.map(|e| e.tenant), Some("t0".into()));
    assert_eq!(store.by_event_id("evt_100", Some("t2"), 10).await.unwrap().len(), 1);
}

/// A thread's nice value, field 19 of `/proc/self/task/<tid>/stat` (counted after the `(comm)` field, which may hold
/// spaces).
#[cfg(target_os = "linux")]
fn nice_of(stat_path: &str) -> i32 {
    let stat = std::fs::read_to_string(stat_path).unwrap();
    let after_comm = &stat[stat.rfind(')').unwrap() + 2..];
    // Fields from the 3rd (state) on: nice is the 19th of the line, the 17th here.
    after_comm.split(' ').nth(16).unwrap().parse().unwrap()
}

/// `log.sqlite_writer_nice`: the SQLite writer runs at the configured nice value and the rest of the process
/// (here: this test's thread, in a real install the fan-out and the API) keeps its own; writes still land.
/// PostgreSQL's rows are written by the server, so nothing changes there.
async fn only_the_sqlite_writer_thread_yields_the_cores(target: Target) {
    let store = open(&target).await;
    assert_eq!(store.lower_writer_priority(0).await.unwrap(), None, "0 leaves the writer as it is");
    #[cfg(target_os = "linux")]
    let own = nice_of("/proc/thread-self/stat");
    let lowered = store.lower_writer_priority(7).await.unwrap();
    match (&target, lowered) {
        (Target::Postgres(_), p) => assert_eq!(p, None),
        #[cfg(target_os = "linux")]
        (Target::Sqlite(_), Some(p)) => {
            let expected = (own + 7).min(19);
            assert_eq!(p.nice, expected, "7 steps below where it ran (the test process's {own})");
            assert_eq!(nice_of(&format!("/proc/self/task/{}/stat", p.thread_id)), expected, "the writer thread itself");
            let comm = std::fs::read_to_string(format!("/proc/self/task/{}/comm", p.thread_id)).unwrap();
            assert_eq!(comm.trim(), hookline_log::sqlite::WRITER_THREAD);
            assert_eq!(nice_of("/proc/thread-self/stat"), own, "only the writer: the caller's thread keeps its priority");
            let again = store.lower_writer_priority(7).await.unwrap().unwrap();
            assert_eq!(again.nice, (expected + 7).min(19), "relative each time, never past 19");
        }
        (Target::Sqlite(_), p) => assert!(cfg!(not(target_os = "linux")) && p.is_none(), "{p:?}"),
    }
    let batch = Batch { attempts: vec![attempt("dlv_n", "sub_n", "evt_n", 1, T0, 200, "succeeded")], ..Default::default() };
    assert_eq!(index(&store, batch).await.attempts, 1);
    assert!(store.delivery("dlv_n").await.unwrap().is_some(), "the lowered writer still writes");
}

/// The indexer's progress goes in with its batch (the same transaction) and reads back as written; a batch without
/// progress (another writer's) leaves the last one; nothing is stored before the first.
async fn how_far_behind_the_indexer_was_is_stored_with_its_batch(target: Target) {
    let store = open(&target).await;
    assert_eq!(store.progress().await.unwrap(), None);
    let batch = || Batch { events: vec![(event("evt_p", "acme", "order.created"), T0)], ..Default::default() };
    let mut folded = hookline_log::fold(batch(), KEEP_DAYS, NOW);
    folded.progress = Some(Progress { newest_record_ms: T0, indexed_at_ms: T0 + 42_000 });
    store.index_folded(std::sync::Arc::new(folded)).await.unwrap();
    let p = store.progress().await.unwrap().expect("stored with the batch");
    assert_eq!((p.newest_record_ms, p.indexed_at_ms, p.behind_ms()), (T0, T0 + 42_000, 42_000));
    index(&store, batch()).await;
    assert_eq!(store.progress().await.unwrap(), Some(p), "a batch without progress keeps the last");
    let mut folded = hookline_log::fold(batch(), KEEP_DAYS, NOW);
    // A clock behind the record's timestamp is never "behind" by a negative amount.
    folded.progress = Some(Progress { newest_record_ms: T0 + 5, indexed_at_ms: T0 });
    store.index_folded(std::sync::Arc::new(folded)).await.unwrap();
    assert_eq!(store.progress().await.unwrap().map(|p| p.behind_ms()), Some(0));
}

/// Two batches over the same deliveries written at once (PostgreSQL: on two connections, as the indexer does),
/// round after round, each round's tries on days of their own (so each batch also creates its day's partitions while
/// the other writes): neither deadlocks nor loses the other's rows, and the merge is the same whichever lands first.
async fn batches_written_side_by_side_over_the_same_deliveries_both_land(target: Target) {
    let store = std::sync::Arc::new(open(&target).await);
    let (n, rounds): (i64, i64) = (1_000, 6);
    for round in 0..rounds {
        let base = T0 - (20 - 2 * round) * DAY;
        // Each with its events too: a batch writes events, attempts and deliveries, in that order.
        let tries = |number: u32, at: i64, status: u32, fin: &'static str| Batch {
            attempts: (0..n)
                .map(|i| attempt(&format!("dlv_r{round}_{i:03}"), "sub_side", &format!("evt_r{round}_{i:03}"), number, at + i, status, fin))
                .collect(),
            events: (0..n).map(|i| (event(&format!("evt_r{round}_{i:03}"), "acme", "order.created"), at + i)).collect(),
            ..Default::default()
        };
        let (a, b) = (store.clone(), store.clone());
        let (first, last) = (tries(1, base, 503, ""), tries(2, base + DAY, 200, "succeeded"));
        let (x, y) = tokio::join!(
            tokio::spawn(async move { a.index(first, KEEP_DAYS, NOW).await }),
            tokio::spawn(async move { b.index(last, KEEP_DAYS, NOW).await }),
        );
        x.unwrap().expect("the first tries indexed");
        y.unwrap().expect("the last tries indexed");
    }
    let mut seen = 0i64;
    let mut q = ListQuery { limit: 500, ..ListQuery::new(Scope::Subscription("sub_side".into())) };
    loop {
        let page = store.list(&q).await.unwrap();
        for d in &page.items {
            assert_eq!((d.attempts_made, d.state), (2, DeliveryState::Succeeded), "{d:?}");
            assert_eq!(d.last_at_ms - d.first_at_ms, DAY, "both tries merged: {d:?}");
            seen += 1;
        }
        match page.next {
            Some(c) => q.after = Some(c),
            None => break,
        }
    }
    assert_eq!(seen, rounds * n, "every delivery of every round");
}
