//! What the subscription table keeps per subscription, counted by a global allocator: each process holds one such
//! table (ingest, dispatcher, retry-scheduler), so this is most of a process's memory per subscription held.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicIsize, Ordering};

use hookline_core::model::{Secret, Subscription};
use hookline_kafka::state::{SecretMode, SubscriptionTable};
use prost::Message;

struct Counting;

static LIVE: AtomicIsize = AtomicIsize::new(0);

// SAFETY: forwards to the system allocator; only counts.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        LIVE.fetch_add(l.size() as isize, Ordering::Relaxed);
        unsafe { System.alloc(l) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        LIVE.fetch_sub(l.size() as isize, Ordering::Relaxed);
        unsafe { System.dealloc(p, l) }
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, new: usize) -> *mut u8 {
        LIVE.fetch_add(new as isize - l.size() as isize, Ordering::Relaxed);
        unsafe { System.realloc(p, l, new) }
    }
}

#[global_allocator]
static A: Counting = Counting;

/// A subscription as `hookline bench subscriptions` writes them (and as the API would): a URL, a tenant, two
/// exact types and a prefix, the `standard` profile, one signing secret.
fn record(i: usize) -> (String, Vec<u8>) {
    let sub = Subscription {
        id: format!("sub_{i:07}"),
        url: format!("http://127.0.0.1:40000/ok/{i}"),
        tenant: format!("t{}", i % 1000),
        event_types: vec![format!("e{i}.created"), format!("e{i}.updated"), format!("p{i}.*")],
        policy: "standard".into(),
        secrets: vec![Secret { value: "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw".into(), ..Default::default() }],
        enabled: true,
        created_at_ms: 1_764_000_000_000,
        updated_at_ms: 1_764_000_000_000,
        ..Default::default()
    };
    (sub.id.clone(), sub.encode_to_vec())
}

fn bytes_per_subscription(mode: SecretMode) -> f64 {
    const N: usize = 20_000;
    let records: Vec<_> = (0..N).map(record).collect();
    let table = SubscriptionTable::with_secrets(mode);
    // Warm the lazily parsed built-in profiles so they are not counted.
    let (id, v) = record(N);
    table.apply(id.as_bytes(), Some(&v));
    let before = LIVE.load(Ordering::Relaxed);
    for (id, v) in &records {
        table.apply(id.as_bytes(), Some(v));
    }
    let after = LIVE.load(Ordering::Relaxed);
    assert_eq!(table.len(), N + 1);
    (after - before) as f64 / N as f64
}

/// The only test in this file: the allocator count is process-wide, so nothing may allocate beside it.
#[test]
fn a_subscription_held_costs_well_under_a_kibibyte_of_heap() {
    let held = bytes_per_subscription(SecretMode::AsStored);
    eprintln!("heap per subscription: {held:.0} bytes");
    // ~720 bytes (docs/benchmarks.md, "Subscriptions held"): the held form (`held::HeldSubscription` in its
    // entry, ~280 bytes, and its strings: id, URL, three patterns, one secret), the fan-out index's buckets and the
    // listing's three orders (pointers to the entry). The decoded record held again would add ~430 bytes, a policy
    // copied per subscription ~2,700, index or listing keys copying the names ~200.
    assert!(held <= 850.0, "the table keeps {held:.0} bytes of heap per subscription");
}
