//! Versioned schema migrations, one list per backend. A migration is applied once, in its own transaction, and
//! recorded in `schema_migrations`; a database whose recorded version is newer than this build knows is refused
//! (an older hookline must not write to a schema it does not understand). Never edit a released migration: add one.

/// `(version, name, SQL)`, in order.
pub type Migration = (u32, &'static str, &'static str);

pub const SQLITE: &[Migration] = &[
    (
        1,
        "delivery log: deliveries, attempts, events",
        r#"
CREATE TABLE deliveries (
    delivery_id TEXT PRIMARY KEY,
    subscription_id TEXT NOT NULL,
    tenant TEXT NOT NULL,
    event_id TEXT NOT NULL,
    event_type TEXT NOT NULL,
    state TEXT NOT NULL,
    status_word TEXT NOT NULL,
    first_at_ms INTEGER NOT NULL,
    last_at_ms INTEGER NOT NULL,
    attempts_made INTEGER NOT NULL,
    last_http_status INTEGER NOT NULL,
    last_outcome TEXT NOT NULL,
    run_id TEXT NOT NULL,
    dead_letter_reason TEXT NOT NULL
) WITHOUT ROWID;
CREATE INDEX deliveries_by_subscription ON deliveries (subscription_id, first_at_ms DESC, delivery_id DESC);
CREATE INDEX deliveries_by_subscription_state ON deliveries (subscription_id, state, first_at_ms DESC, delivery_id DESC);
CREATE INDEX deliveries_by_subscription_type ON deliveries (subscription_id, event_type, first_at_ms DESC, delivery_id DESC);
CREATE INDEX deliveries_by_tenant ON deliveries (tenant, first_at_ms DESC, delivery_id DESC);
CREATE INDEX deliveries_by_event ON deliveries (event_id);
CREATE INDEX deliveries_by_last_at ON deliveries (last_at_ms);

CREATE TABLE attempts (
    delivery_id TEXT NOT NULL,
    run_id TEXT NOT NULL,
    attempt INTEGER NOT NULL,
    try_no INTEGER NOT NULL,
    started_at_ms INTEGER NOT NULL,
    subscription_id TEXT NOT NULL,
    duration_ms INTEGER NOT NULL,
    outcome TEXT NOT NULL,
    http_status INTEGER NOT NULL,
    reason TEXT NOT NULL,
    request_headers TEXT NOT NULL,
    body_ref TEXT NOT NULL,
    response_headers TEXT NOT NULL,
    response_excerpt TEXT NOT NULL,
    verdict TEXT NOT NULL,
    counts_toward_disable INTEGER NOT NULL,
    next_due_at_ms INTEGER NOT NULL,
    final_state TEXT NOT NULL,
    status_word TEXT NOT NULL,
    policy TEXT NOT NULL,
    concludes_attempt INTEGER NOT NULL,
    traceparent TEXT NOT NULL,
    PRIMARY KEY (delivery_id, run_id, attempt, try_no, started_at_ms)
) WITHOUT ROWID;
CREATE INDEX attempts_by_time ON attempts (started_at_ms);

CREATE TABLE events (
    event_id TEXT NOT NULL,
    at_ms INTEGER NOT NULL,
    event_type TEXT NOT NULL,
    tenant TEXT NOT NULL,
    payload BLOB NOT NULL,
    PRIMARY KEY (event_id, at_ms)
) WITHOUT ROWID;
CREATE INDEX events_by_time ON events (at_ms);
"#,
    ),
    (2, "attempts by subscription and time (the API's per-minute stats)", ATTEMPTS_BY_SUBSCRIPTION),
    (
        3,
        "store_meta: the store's own id",
        "CREATE TABLE store_meta (key TEXT PRIMARY KEY, value TEXT NOT NULL) WITHOUT ROWID; \
     INSERT INTO store_meta (key, value) VALUES ('store_id', lower(hex(randomblob(8))));",
    ),
    (
        4,
        "attempts: the policy's reasoning (decided_by, rule, rule_when)",
        "ALTER TABLE attempts ADD COLUMN decided_by TEXT NOT NULL DEFAULT ''; \
     ALTER TABLE attempts ADD COLUMN rule INTEGER NOT NULL DEFAULT 0; \
     ALTER TABLE attempts ADD COLUMN rule_when TEXT NOT NULL DEFAULT '';",
    ),
    (5, "deliveries, attempts, events: rowid tables, keys in narrow unique indexes", SQLITE_ROWID_TABLES),
    (
        6,
        "events: keyed by (tenant, event id, time), so two tenants' events of one id are two events",
        // The old key (event_id, at_ms) is unique, so every stored row is unique under the wider one too.
        "DROP INDEX events_key; CREATE UNIQUE INDEX events_key ON events (tenant, event_id, at_ms);",
    ),
    // PostgreSQL's planner statistics; SQLite has no such thing. Recorded so both lists keep one numbering.
    (7, "nothing (PostgreSQL: statistics on how a subscription's event types and states go together)", "SELECT 1"),
];

/// Migration 5 (SQLite): the three tables become rowid tables; their keys move to unique indexes. Keyed by hashes
/// and random ids, a `WITHOUT ROWID` table puts each whole row (an attempt with its headers and excerpt: often
/// over the ~1 KB an index page keeps in place, so an overflow page as well) at a random place in the file: every
/// indexed row dirtied one or two random pages of wide rows, split them often, and made the random-access part of
/// the file too large for the writer's cache. Now rows are appended (the right-most pages, shared by a batch) and
/// only the key's narrow index entry lands at a random place. The rows are copied in their time order, so a file
/// migrated reads like one written since. Column order is unchanged (`INSERT INTO t VALUES (…)` still lines up).
const SQLITE_ROWID_TABLES: &str = r#"
CREATE TABLE deliveries_v5 (
    delivery_id TEXT NOT NULL,
    subscription_id TEXT NOT NULL,
    tenant TEXT NOT NULL,
    event_id TEXT NOT NULL,
    event_type TEXT NOT NULL,
    state TEXT NOT NULL,
    status_word TEXT NOT NULL,
    first_at_ms INTEGER NOT NULL,
    last_at_ms INTEGER NOT NULL,
    attempts_made INTEGER NOT NULL,
    last_http_status INTEGER NOT NULL,
    last_outcome TEXT NOT NULL,
    run_id TEXT NOT NULL,
    dead_letter_reason TEXT NOT NULL
);
INSERT INTO deliveries_v5 SELECT * FROM deliveries ORDER BY first_at_ms, delivery_id;
DROP TABLE deliveries;
ALTER TABLE deliveries_v5 RENAME TO deliveries;
CREATE UNIQUE INDEX deliveries_key ON deliveries (delivery_id);
CREATE INDEX deliveries_by_subscription ON deliveries (subscription_id, first_at_ms DESC, delivery_id DESC);
CREATE INDEX deliveries_by_subscription_state ON deliveries (subscription_id, state, first_at_ms DESC, delivery_id DESC);
CREATE INDEX deliveries_by_subscription_type ON deliveries (subscription_id, event_type, first_at_ms DESC, delivery_id DESC);
CREATE INDEX deliveries_by_tenant ON deliveries (tenant, first_at_ms DESC, delivery_id DESC);
CREATE INDEX deliveries_by_event ON deliveries (event_id);
CREATE INDEX deliveries_by_last_at ON deliveries (last_at_ms);

CREATE TABLE attempts_v5 (
    delivery_id TEXT NOT NULL,
    run_id TEXT NOT NULL,
    attempt INTEGER NOT NULL,
    try_no INTEGER NOT NULL,
    started_at_ms INTEGER NOT NULL,
    subscription_id TEXT NOT NULL,
    duration_ms INTEGER NOT NULL,
    outcome TEXT NOT NULL,
    http_status INTEGER NOT NULL,
    reason TEXT NOT NULL,
    request_headers TEXT NOT NULL,
    body_ref TEXT NOT NULL,
    response_headers TEXT NOT NULL,
    response_excerpt TEXT NOT NULL,
    verdict TEXT NOT NULL,
    counts_toward_disable INTEGER NOT NULL,
    next_due_at_ms INTEGER NOT NULL,
    final_state TEXT NOT NULL,
    status_word TEXT NOT NULL,
    policy TEXT NOT NULL,
    concludes_attempt INTEGER NOT NULL,
    traceparent TEXT NOT NULL,
    decided_by TEXT NOT NULL DEFAULT '',
    rule INTEGER NOT NULL DEFAULT 0,
    rule_when TEXT NOT NULL DEFAULT ''
);
INSERT INTO attempts_v5 SELECT * FROM attempts ORDER BY started_at_ms, delivery_id;
DROP TABLE attempts;
ALTER TABLE attempts_v5 RENAME TO attempts;
CREATE UNIQUE INDEX attempts_key ON attempts (delivery_id, run_id, attempt, try_no, started_at_ms);
CREATE INDEX attempts_by_time ON attempts (started_at_ms);
CREATE INDEX attempts_by_subscription ON attempts (subscription_id, started_at_ms);

CREATE TABLE events_v5 (
    event_id TEXT NOT NULL,
    at_ms INTEGER NOT NULL,
    event_type TEXT NOT NULL,
    tenant TEXT NOT NULL,
    payload BLOB NOT NULL
);
INSERT INTO events_v5 SELECT * FROM events ORDER BY at_ms, event_id;
DROP TABLE events;
ALTER TABLE events_v5 RENAME TO events;
CREATE UNIQUE INDEX events_key ON events (event_id, at_ms);
CREATE INDEX events_by_time ON events (at_ms);
"#;

/// PostgreSQL: `attempts` and `events` are range-partitioned by time (one partition per UTC day, created ahead by
/// the store), so retention drops whole partitions. `deliveries` is one table (a row is updated over its life).
pub const POSTGRES: &[Migration] = &[
    (
        1,
        "delivery log: deliveries, attempts and events partitioned by day",
        r#"
CREATE TABLE deliveries (
    delivery_id TEXT PRIMARY KEY,
    subscription_id TEXT NOT NULL,
    tenant TEXT NOT NULL,
    event_id TEXT NOT NULL,
    event_type TEXT NOT NULL,
    state TEXT NOT NULL,
    status_word TEXT NOT NULL,
    first_at_ms BIGINT NOT NULL,
    last_at_ms BIGINT NOT NULL,
    attempts_made BIGINT NOT NULL,
    last_http_status BIGINT NOT NULL,
    last_outcome TEXT NOT NULL,
    run_id TEXT NOT NULL,
    dead_letter_reason TEXT NOT NULL
);
CREATE INDEX deliveries_by_subscription ON deliveries (subscription_id, first_at_ms DESC, delivery_id DESC);
CREATE INDEX deliveries_by_subscription_state ON deliveries (subscription_id, state, first_at_ms DESC, delivery_id DESC);
CREATE INDEX deliveries_by_subscription_type ON deliveries (subscription_id, event_type, first_at_ms DESC, delivery_id DESC);
CREATE INDEX deliveries_by_tenant ON deliveries (tenant, first_at_ms DESC, delivery_id DESC);
CREATE INDEX deliveries_by_event ON deliveries (event_id);
CREATE INDEX deliveries_by_last_at ON deliveries (last_at_ms);

CREATE TABLE attempts (
    delivery_id TEXT NOT NULL,
    run_id TEXT NOT NULL,
    attempt BIGINT NOT NULL,
    try_no BIGINT NOT NULL,
    started_at_ms BIGINT NOT NULL,
    subscription_id TEXT NOT NULL,
    duration_ms BIGINT NOT NULL,
    outcome TEXT NOT NULL,
    http_status BIGINT NOT NULL,
    reason TEXT NOT NULL,
    request_headers TEXT NOT NULL,
    body_ref TEXT NOT NULL,
    response_headers TEXT NOT NULL,
    response_excerpt TEXT NOT NULL,
    verdict TEXT NOT NULL,
    counts_toward_disable BOOLEAN NOT NULL,
    next_due_at_ms BIGINT NOT NULL,
    final_state TEXT NOT NULL,
    status_word TEXT NOT NULL,
    policy TEXT NOT NULL,
    concludes_attempt BIGINT NOT NULL,
    traceparent TEXT NOT NULL,
    PRIMARY KEY (delivery_id, run_id, attempt, try_no, started_at_ms)
) PARTITION BY RANGE (started_at_ms);

CREATE TABLE events (
    event_id TEXT NOT NULL,
    at_ms BIGINT NOT NULL,
    event_type TEXT NOT NULL,
    tenant TEXT NOT NULL,
    payload BYTEA NOT NULL,
    PRIMARY KEY (event_id, at_ms)
) PARTITION BY RANGE (at_ms);
"#,
    ),
    (2, "attempts by subscription and time (the API's per-minute stats)", ATTEMPTS_BY_SUBSCRIPTION),
    (
        3,
        "store_meta: the store's own id",
        "CREATE TABLE store_meta (key TEXT PRIMARY KEY, value TEXT NOT NULL); \
     INSERT INTO store_meta (key, value) VALUES ('store_id', md5(random()::text || clock_timestamp()::text));",
    ),
    (
        4,
        "attempts: the policy's reasoning (decided_by, rule, rule_when)",
        // On the partitioned parent: every partition, present and future, gets the columns. A constant default is
        // metadata only (PostgreSQL 11+): no rewrite of the stored rows.
        "ALTER TABLE attempts ADD COLUMN decided_by TEXT NOT NULL DEFAULT '', \
     ADD COLUMN rule BIGINT NOT NULL DEFAULT 0, \
     ADD COLUMN rule_when TEXT NOT NULL DEFAULT '';",
    ),
    // PostgreSQL's tables are heaps already (rows appended, keys in their own B-trees): nothing to change. The version
    // is recorded so both lists keep one numbering.
    (5, "nothing (SQLite's tables became rowid tables)", "SELECT 1"),
    (
        6,
        "events: keyed by (tenant, event id, time), so two tenants' events of one id are two events",
        // On the partitioned parent: every partition's key is rebuilt (the partition column stays in the key).
        "ALTER TABLE events DROP CONSTRAINT events_pkey; ALTER TABLE events ADD PRIMARY KEY (tenant, event_id, at_ms);",
    ),
    (
        7,
        "deliveries: statistics on how a subscription's event types and states go together",
        // The planner takes a subscription, an event type and a state as independent, so for the filtered list it
        // expects a handful of rows where a subscription to `order.*` has thousands, and reads every one of them
        // instead of walking an index to the page's end. Functional dependencies and the most common combinations
        // correct the estimate; ANALYZE gathers them now rather than at autovacuum's next pass.
        "CREATE STATISTICS deliveries_subscription_type_state (dependencies, mcv) ON subscription_id, event_type, state \
     FROM deliveries; ANALYZE deliveries;",
    ),
];

/// The same in both dialects (PostgreSQL creates it on every partition, present and future).
const ATTEMPTS_BY_SUBSCRIPTION: &str = "CREATE INDEX attempts_by_subscription ON attempts (subscription_id, started_at_ms)";

/// The newest version this build knows (both lists move together).
pub fn latest(migrations: &[Migration]) -> u32 {
    migrations.last().map_or(0, |m| m.0)
}

#[cfg(test)]
mod tests {
    #[test]
    fn versions_count_up_from_one_in_both_lists() {
        for list in [super::SQLITE, super::POSTGRES] {
            for (i, (v, name, sql)) in list.iter().enumerate() {
                assert_eq!(*v as usize, i + 1);
                assert!(!name.is_empty() && !sql.trim().is_empty());
            }
        }
        assert_eq!(super::latest(super::SQLITE), super::latest(super::POSTGRES));
    }
}
