//! Topic names and the fixed ladder of retry-delay tiers.

/// One retry tier: a topic whose records are held at least `delay_ms` after they were enqueued.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Tier {
    pub name: &'static str,
    pub delay_ms: u64,
}

/// The ladder, shortest first. A retry goes to the largest tier not longer than its remaining wait, and is
/// re-routed on release while time remains, so any wait is reached with bounded lateness and no early release.
/// Ratios of ~4 keep the number of hops for a 12 h wait small (4h + 4h + 4h) while short waits stay precise.
pub const TIERS: &[Tier] = &[
    Tier { name: "1s", delay_ms: 1_000 },
    Tier { name: "4s", delay_ms: 4_000 },
    Tier { name: "15s", delay_ms: 15_000 },
    Tier { name: "1m", delay_ms: 60_000 },
    Tier { name: "4m", delay_ms: 240_000 },
    Tier { name: "15m", delay_ms: 900_000 },
    Tier { name: "1h", delay_ms: 3_600_000 },
    Tier { name: "4h", delay_ms: 14_400_000 },
];

/// The tier for a remaining wait: the largest not longer than it, or the shortest for waits under a second
/// (the scheduler holds those until their due time, not the tier's full delay).
pub fn tier_for(remaining_ms: u64) -> &'static Tier {
    TIERS.iter().rev().find(|t| t.delay_ms <= remaining_ms).unwrap_or(&TIERS[0])
}

/// Whether a topic is compacted (state, keyed by subscription id) or deleted by time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cleanup {
    Compact,
    Delete,
}

/// A topic hookline uses, with how it is created.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TopicSpec {
    pub name: String,
    pub cleanup: Cleanup,
    /// Whether it must have the co-partitioned (work) partition count.
    pub co_partitioned: bool,
    /// Retention for delete topics (ms); None = broker default.
    pub retention_ms: Option<u64>,
    /// How long a record stays out of the log cleaner's reach (compacted topics; None = broker default, 0).
    pub min_compaction_lag_ms: Option<u64>,
}

/// Topic names under a prefix (default `hookline.`), built once: they are looked up for every record produced.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Topics {
    events: String,
    deliveries: String,
    retry: Vec<String>,
    held: String,
    parked: String,
    ordered: String,
    dlq: String,
    subscriptions: String,
    endpoint_state: String,
    attempts: String,
    ops: String,
    inflight: String,
    tenants: String,
    api_keys: String,
    event_types: String,
}

impl Topics {
    pub fn new(prefix: impl Into<String>) -> Self {
        let prefix = prefix.into();
        let name = |base: &str| format!("{prefix}{base}");
        Self {
            events: name("events"),
            deliveries: name("deliveries"),
            retry: TIERS.iter().map(|t| name(&format!("retry.{}", t.name))).collect(),
            held: name("held"),
            parked: name("parked"),
            ordered: name("ordered"),
            dlq: name("dlq"),
            subscriptions: name("subscriptions"),
            endpoint_state: name("endpoint-state"),
            attempts: name("attempts"),
            ops: name("ops"),
            inflight: name("inflight"),
            tenants: name("tenants"),
            api_keys: name("api-keys"),
            event_types: name("event-types"),
        }
    }

    pub fn events(&self) -> &str {
        &self.events
    }
    pub fn deliveries(&self) -> &str {
        &self.deliveries
    }
    pub fn retry(&self, tier: &Tier) -> &str {
        let i = TIERS.iter().position(|t| t == tier).expect("tiers come from TIERS");
        &self.retry[i]
    }
    /// Deliveries waiting for their paused subscription to be resumed.
    pub fn held(&self) -> &str {
        &self.held
    }
    /// Where each subscription's parked deliveries begin on its `held` partition (compacted, key = subscription
    /// id, co-partitioned so a subscription's position lives on the partition number of its held records), written
    /// and read by the retry-scheduler that owns that partition.
    pub fn parked(&self) -> &str {
        &self.parked
    }
    /// Deliveries of an ordered subscription parked behind their key's head while it waits on the retry ladder
    /// (key = subscription id, co-partitioned with `deliveries`), written and read by the dispatcher that owns the
    /// partition; where each key's parked records begin is in its endpoint state (`ordering_heads`).
    pub fn ordered(&self) -> &str {
        &self.ordered
    }
    pub fn dlq(&self) -> &str {
        &self.dlq
    }
    pub fn subscriptions(&self) -> &str {
        &self.subscriptions
    }
    pub fn endpoint_state(&self) -> &str {
        &self.endpoint_state
    }
    pub fn attempts(&self) -> &str {
        &self.attempts
    }
    pub fn ops(&self) -> &str {
        &self.ops
    }
    /// Leases of attempts in flight (policies with `in_flight = "count"`), key = delivery id, written to the
    /// delivery's partition; removed by a tombstone once the attempt's outcome is written.
    pub fn inflight(&self) -> &str {
        &self.inflight
    }

    /// Tenants (compacted, key = tenant id), written and read by ingest's API.
    pub fn tenants(&self) -> &str {
        &self.tenants
    }
    /// Tenant API keys (compacted, key = key id, and `<key id>/used` for its last use), read by ingest's API.
    pub fn api_keys(&self) -> &str {
        &self.api_keys
    }
    /// The event-type catalogue (compacted, key = event type name), written and read by ingest's API.
    pub fn event_types(&self) -> &str {
        &self.event_types
    }

    /// Every topic, with how `hookline topics create` makes it.
    pub fn all(&self) -> Vec<TopicSpec> {
        let day = 24 * 3_600_000u64;
        let mut specs = vec![
            TopicSpec {
                name: self.events.clone(),
                cleanup: Cleanup::Delete,
                co_partitioned: false,
                retention_ms: Some(30 * day),
                min_compaction_lag_ms: None,
            },
            TopicSpec {
                name: self.deliveries.clone(),
                cleanup: Cleanup::Delete,
                co_partitioned: true,
                retention_ms: Some(7 * day),
                min_compaction_lag_ms: None,
            },
        ];
        specs.extend(TIERS.iter().map(|t| TopicSpec {
            name: self.retry(t).to_owned(),
            cleanup: Cleanup::Delete,
            co_partitioned: true,
            retention_ms: Some(7 * day),
            min_compaction_lag_ms: None,
        }));
        specs.extend([
            TopicSpec {
                name: self.held.clone(),
                cleanup: Cleanup::Delete,
                co_partitioned: true,
                retention_ms: Some(30 * day),
                min_compaction_lag_ms: None,
            },
            TopicSpec {
                name: self.parked.clone(),
                cleanup: Cleanup::Compact,
                co_partitioned: true,
                retention_ms: None,
                min_compaction_lag_ms: None,
            },
            TopicSpec {
                name: self.ordered.clone(),
                cleanup: Cleanup::Delete,
                co_partitioned: true,
                retention_ms: Some(30 * day),
                min_compaction_lag_ms: None,
            },
            TopicSpec {
                name: self.dlq.clone(),
                cleanup: Cleanup::Delete,
                co_partitioned: false,
                retention_ms: Some(30 * day),
                min_compaction_lag_ms: None,
            },
            TopicSpec {
                name: self.subscriptions.clone(),
                cleanup: Cleanup::Compact,
                co_partitioned: true,
                retention_ms: None,
                min_compaction_lag_ms: None,
            },
            // A former owner's late write is a key's last record until the owner writes the state again; a day out of the
            // cleaner's reach covers a partition with no owner to do it (`state::EndpointStates`).
            TopicSpec {
                name: self.endpoint_state.clone(),
                cleanup: Cleanup::Compact,
                co_partitioned: true,
                retention_ms: None,
                min_compaction_lag_ms: Some(day),
            },
            TopicSpec {
                name: self.inflight.clone(),
                cleanup: Cleanup::Compact,
                co_partitioned: true,
                retention_ms: None,
                min_compaction_lag_ms: None,
            },
            TopicSpec {
                name: self.attempts.clone(),
                cleanup: Cleanup::Delete,
                co_partitioned: true,
                retention_ms: Some(30 * day),
                min_compaction_lag_ms: None,
            },
            TopicSpec {
                name: self.ops.clone(),
                cleanup: Cleanup::Delete,
                co_partitioned: false,
                retention_ms: Some(30 * day),
                min_compaction_lag_ms: None,
            },
            TopicSpec {
                name: self.tenants.clone(),
                cleanup: Cleanup::Compact,
                co_partitioned: false,
                retention_ms: None,
                min_compaction_lag_ms: None,
            },
            TopicSpec {
                name: self.api_keys.clone(),
                cleanup: Cleanup::Compact,
                co_partitioned: false,
                retention_ms: None,
                min_compaction_lag_ms: None,
            },
            TopicSpec {
                name: self.event_types.clone(),
                cleanup: Cleanup::Compact,
                co_partitioned: false,
                retention_ms: None,
                min_compaction_lag_ms: None,
            },
        ]);
        specs
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tier_is_largest_not_longer_than_remaining() {
        assert_eq!(tier_for(0).name, "1s");
        assert_eq!(tier_for(999).name, "1s");
        assert_eq!(tier_for(1_000).name, "1s");
        assert_eq!(tier_for(3_999).name, "1s");
        assert_eq!(tier_for(4_000).name, "4s");
        assert_eq!(tier_for(59_999).name, "15s");
        assert_eq!(tier_for(60_000).name, "1m");
        assert_eq!(tier_for(43_200_000).name, "4h");
        for w in [0u64, 1, 500, 1_000, 5_000, 70_000, 3_600_000, 86_400_000] {
            let t = tier_for(w);
            assert!(t.delay_ms <= w.max(TIERS[0].delay_ms), "tier {} for {w}", t.name);
        }
    }

    #[test]
    fn ladder_is_strictly_increasing() {
        assert!(TIERS.windows(2).all(|w| w[0].delay_ms < w[1].delay_ms));
    }

    #[test]
    fn names_use_the_prefix_and_state_topics_are_compacted() {
        let t = Topics::new("acme.");
        assert_eq!(t.deliveries(), "acme.deliveries");
        assert_eq!(t.retry(&TIERS[3]), "acme.retry.1m");
        let all = t.all();
        assert!(all.iter().all(|s| s.name.starts_with("acme.")));
        let compacted: Vec<_> = all.iter().filter(|s| s.cleanup == Cleanup::Compact).map(|s| s.name.as_str()).collect();
        assert_eq!(
            compacted,
            [
                "acme.parked",
                "acme.subscriptions",
                "acme.endpoint-state",
                "acme.inflight",
                "acme.tenants",
                "acme.api-keys",
                "acme.event-types"
            ]
        );
    }
}
