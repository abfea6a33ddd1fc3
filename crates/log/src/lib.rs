//! The delivery log as a store, off the delivery path: every attempt, delivery and event, indexed from Kafka
//! (`attempts`, `dlq`, `events`) by [`indexer::run`] and queried by the API. Two backends behind one interface,
//! [`LogStore`]: SQLite (embedded, a file; the default) and PostgreSQL (production; time-partitioned).
//! Opening a store applies the schema migrations it lacks ([`migrate`] does only that, for `hookline log
//! migrate`). See docs/delivery-log.md.

pub mod gaps;
pub mod indexer;
pub mod model;
pub mod postgres;
pub mod schema;
pub mod sql;
pub mod sqlite;

use std::path::PathBuf;
use std::sync::Arc;

use hookline_core::model::Event;
use hookline_service::config::{LogSettings, LogStoreKind};
use prost::Message as _;

pub use model::{
    AttemptPoint, AttemptRow, Batch, Cursor, DeliveryDetail, DeliveryRow, DeliveryState, IndexSummary, InvalidCursor, ListQuery, Page,
    Progress, Scope, Stats, UnknownState, MAX_ATTEMPT_POINTS,
};

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("opening the delivery log store: {0}")]
    Open(String),
    #[error("delivery log schema version {found} is newer than this hookline knows ({known}): upgrade hookline")]
    SchemaTooNew { found: u32, known: u32 },
    #[error("sqlite: {0}")]
    Sqlite(#[from] rusqlite::Error),
    #[error("postgres: {}", pg_message(.0))]
    Postgres(#[from] tokio_postgres::Error),
    #[error("a stored value is unreadable: {0}")]
    Corrupt(String),
    #[error("the store's worker thread failed: {0}")]
    Join(#[from] tokio::task::JoinError),
    #[error("the store's writer thread failed: {0}")]
    Writer(&'static str),
    #[error("{0}")]
    Target(String),
    #[error("lowering the log writer's CPU priority (log.sqlite_writer_nice): {0}")]
    Priority(String),
}

/// The server's own message (tokio-postgres' `Display` says only "db error").
pub fn pg_message(e: &tokio_postgres::Error) -> String {
    match e.as_db_error() {
        Some(db) => format!("{} ({})", db.message(), db.code().code()),
        None => {
            let mut s = e.to_string();
            let mut source = std::error::Error::source(e);
            while let Some(inner) = source {
                s.push_str(&format!(": {inner}"));
                source = inner.source();
            }
            s
        }
    }
}

/// Where a store lives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    Sqlite(PathBuf),
    Postgres(String),
}

impl Target {
    /// `postgres://…` / `postgresql://…`, or `sqlite:PATH` / `sqlite://PATH`, or a plain file path.
    pub fn parse(url: &str) -> Result<Self, StoreError> {
        let url = url.trim();
        if url.is_empty() {
            return Err(StoreError::Target("the store URL is empty".into()));
        }
        if url.starts_with("postgres://") || url.starts_with("postgresql://") {
            return Ok(Self::Postgres(url.to_owned()));
        }
        if let Some(path) = url.strip_prefix("sqlite://").or_else(|| url.strip_prefix("sqlite:")) {
            if path.is_empty() {
                return Err(StoreError::Target("sqlite: needs a file path, e.g. sqlite:data/delivery-log.sqlite3".into()));
            }
            return Ok(Self::Sqlite(PathBuf::from(path)));
        }
        if url.contains("://") {
            return Err(StoreError::Target(format!("{url:?}: not a store URL (postgres://…, postgresql://…, sqlite:PATH or a file path)")));
        }
        Ok(Self::Sqlite(PathBuf::from(url)))
    }

    pub fn from_settings(s: &LogSettings) -> Result<Self, StoreError> {
        match s.store {
            LogStoreKind::Sqlite => Ok(Self::Sqlite(s.sqlite_path.clone())),
            LogStoreKind::Postgres => Ok(Self::Postgres(s.postgres_url().map_err(|e| StoreError::Target(e.to_string()))?)),
        }
    }
}

/// What a retention pass removed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Retention {
    pub attempts: u64,
    pub events: u64,
    pub deliveries: u64,
    /// PostgreSQL: day partitions dropped (their rows are not counted one by one).
    pub partitions_dropped: u64,
}

/// The delivery log store. Cheap to share behind an `Arc`; every method may be called concurrently.
// One per process, behind an `Arc`: the size of the variants does not matter.
#[allow(clippy::large_enum_variant)]
pub enum LogStore {
    Sqlite(sqlite::SqliteStore),
    Postgres(postgres::PgStore),
}

const DAY_MS: i64 = postgres::DAY_MS;

/// Subscriptions per query of [`LogStore::last_successes`].
const LAST_SUCCESS_CHUNK: usize = 250;

impl LogStore {
    /// Opens (creating a SQLite file and its directory when missing) and applies missing migrations.
    pub async fn open(target: &Target) -> Result<Self, StoreError> {
        Ok(match target {
            Target::Sqlite(path) => Self::Sqlite(sqlite::SqliteStore::open(path).await?),
            Target::Postgres(url) => Self::Postgres(postgres::PgStore::open(url, hookline_service::now_ms()).await?),
        })
    }

    /// SQLite: lowers the writer thread's CPU priority (see [`sqlite::SqliteStore::lower_writer_priority`]).
    /// PostgreSQL: nothing (`None`): the server writes, in its own processes.
    pub async fn lower_writer_priority(&self, nice: u8) -> Result<Option<sqlite::WriterPriority>, StoreError> {
        match self {
            Self::Sqlite(s) => s.lower_writer_priority(nice).await,
            Self::Postgres(_) => Ok(None),
        }
    }

    pub fn backend(&self) -> &'static str {
        match self {
            Self::Sqlite(_) => "sqlite",
            Self::Postgres(_) => "postgres",
        }
    }

    /// The migrations this open applied (empty when the schema was current).
    pub fn migrations_applied(&self) -> &[u32] {
        match self {
            Self::Sqlite(s) => &s.applied,
            Self::Postgres(s) => &s.applied,
        }
    }

    /// An id made when the store was created (migration 3): a new file, or a new database, gets a new one.
    pub async fn store_id(&self) -> Result<String, StoreError> {
        match self {
            Self::Sqlite(s) => s.store_id().await,
            Self::Postgres(s) => s.store_id().await,
        }
    }

    /// How many batches the store writes side by side: one for SQLite (one writer), one per writing connection for
    /// PostgreSQL ([`postgres::WRITERS`]).
    pub fn write_concurrency(&self) -> usize {
        match self {
            Self::Sqlite(_) => 1,
            Self::Postgres(_) => postgres::WRITERS,
        }
    }

    /// How far behind the topics the indexer was when it wrote its latest batch (`None` before its first).
    pub async fn progress(&self) -> Result<Option<model::Progress>, StoreError> {
        match self {
            Self::Sqlite(s) => s.progress().await,
            Self::Postgres(s) => s.progress().await,
        }
    }

    /// The indexer's consumer group. PostgreSQL: `log.group_id`, shared by every indexer of the one database.
    /// SQLite: `log.group_id` + the file's [`store_id`](Self::store_id), because the group's committed offsets
    /// must describe this file: each process with a file of its own (several API replicas, a pod whose
    /// `emptyDir` was renewed) indexes every partition from where its file is, or from the start for a new file.
    pub async fn indexer_group(&self, group_id: &str) -> Result<String, StoreError> {
        Ok(match self {
            Self::Sqlite(_) => format!("{group_id}-{}", self.store_id().await?),
            Self::Postgres(_) => group_id.to_owned(),
        })
    }

    pub async fn schema_version(&self) -> Result<u32, StoreError> {
        match self {
            Self::Sqlite(s) => s.schema_version().await,
            Self::Postgres(s) => s.schema_version().await,
        }
    }

    /// Writes a batch in one transaction: idempotent (a record indexed twice changes nothing), so the indexer may
    /// re-read anything it had not committed offsets for. Records older than `retention_days` before `now_ms`
    /// are skipped.
    pub async fn index(&self, batch: Batch, retention_days: u32, now_ms: i64) -> Result<IndexSummary, StoreError> {
        self.index_folded(Arc::new(fold(batch, retention_days, now_ms))).await
    }

    /// Writes rows [`fold`] made (the indexer folds a batch once and retries a refused write with the same rows).
    /// A write that stored rows wakes whoever waits on [`written`] in this process.
    pub async fn index_folded(&self, folded: Arc<model::Folded>) -> Result<IndexSummary, StoreError> {
        let summary = match self {
            Self::Sqlite(s) => s.index(folded).await,
            Self::Postgres(s) => s.index(&folded).await,
        }?;
        WRITTEN.send_modify(|n| *n = n.wrapping_add(1));
        Ok(summary)
    }

    /// A delivery with its attempts (oldest first) and its event (what a resend sends again).
    pub async fn delivery(&self, delivery_id: &str) -> Result<Option<DeliveryDetail>, StoreError> {
        match self {
            Self::Sqlite(s) => s.delivery(delivery_id.to_owned()).await,
            Self::Postgres(s) => s.delivery(delivery_id.to_owned()).await,
        }
    }

    /// A tenant's stored event (an event is identified by its tenant and id: two tenants may share an id).
    pub async fn event(&self, tenant: &str, event_id: &str) -> Result<Option<Event>, StoreError> {
        match self {
            Self::Sqlite(s) => s.event(tenant.to_owned(), event_id.to_owned()).await,
            Self::Postgres(s) => s.event(tenant.to_owned(), event_id.to_owned()).await,
        }
    }

    /// Every delivery of an event (one per subscription it matched), newest first; within a tenant when given.
    pub async fn by_event_id(&self, event_id: &str, tenant: Option<&str>, limit: usize) -> Result<Vec<DeliveryRow>, StoreError> {
        let limit = limit.clamp(1, model::MAX_PAGE);
        match self {
            Self::Sqlite(s) => s.by_event_id(event_id.to_owned(), tenant.map(str::to_owned), limit).await,
            Self::Postgres(s) => s.by_event_id(event_id.to_owned(), tenant.map(str::to_owned), limit).await,
        }
    }

    /// A page of a subscription's or tenant's deliveries, newest first.
    pub async fn list(&self, query: &ListQuery) -> Result<Page, StoreError> {
        match self {
            Self::Sqlite(s) => s.list(query.clone()).await,
            Self::Postgres(s) => s.list(query.clone()).await,
        }
    }

    /// Deliveries by state among those first attempted in `[since_ms, until_ms)`.
    pub async fn stats(&self, scope: &Scope, since_ms: i64, until_ms: i64) -> Result<Stats, StoreError> {
        match self {
            Self::Sqlite(s) => s.stats(scope.clone(), since_ms, until_ms).await,
            Self::Postgres(s) => s.stats(scope.clone(), since_ms, until_ms).await,
        }
    }

    /// [`Self::stats`] of each of `ids` (a page of subscriptions) in one query; a subscription without deliveries
    /// in the window is absent.
    pub async fn stats_of_subscriptions(
        &self,
        ids: &[String],
        since_ms: i64,
        until_ms: i64,
    ) -> Result<std::collections::HashMap<String, Stats>, StoreError> {
        if ids.is_empty() {
            return Ok(std::collections::HashMap::new());
        }
        let q = sql::stats_of_subscriptions(self.dialect(), ids, since_ms, until_ms);
        let rows = match self {
            Self::Sqlite(s) => s.keyed_counts(q).await?,
            Self::Postgres(s) => s.keyed_counts(q).await?,
        };
        let mut grouped: std::collections::HashMap<String, Vec<(String, i64)>> = std::collections::HashMap::new();
        for (id, state, n) in rows {
            grouped.entry(id).or_default().push((state, n));
        }
        grouped.into_iter().map(|(id, counts)| Ok((id, stats(since_ms, until_ms, counts)?))).collect()
    }

    /// The `last_at_ms` of each of `ids`' latest succeeded delivery (the one first attempted last); a subscription
    /// with none (or none left after retention) is absent. For the API's `last_success_at_ms` of an endpoint whose
    /// state the dispatcher never wrote (it had no failure).
    pub async fn last_successes(&self, ids: &[String]) -> Result<std::collections::HashMap<String, i64>, StoreError> {
        let mut out = std::collections::HashMap::new();
        // Under SQLite's limit of 500 terms in a compound SELECT.
        for chunk in ids.chunks(LAST_SUCCESS_CHUNK) {
            let q = sql::last_successes(self.dialect(), chunk);
            let rows = match self {
                Self::Sqlite(s) => s.keyed_counts(q).await?,
                Self::Postgres(s) => s.keyed_counts(q).await?,
            };
            out.extend(rows.into_iter().map(|(id, _, at)| (id, at)));
        }
        Ok(out)
    }

    /// The latest try of each delivery of a page (keyed by delivery id), for the list's `last_attempt`.
    pub async fn last_attempts(&self, page: &[DeliveryRow]) -> Result<std::collections::HashMap<String, model::AttemptRow>, StoreError> {
        let mut out = std::collections::HashMap::new();
        if page.is_empty() {
            return Ok(out);
        }
        let ids: Vec<String> = page.iter().map(|d| d.delivery_id.clone()).collect();
        let since = page.iter().map(|d| d.first_at_ms).min().unwrap_or(0);
        let q = sql::last_attempts(self.dialect(), &ids, since);
        let rows = match self {
            Self::Sqlite(s) => s.attempt_rows(q).await?,
            Self::Postgres(s) => s.attempt_rows(q).await?,
        };
        for row in rows {
            let newer = out.get(&row.delivery_id).is_none_or(|o: &model::AttemptRow| {
                (row.attempt, row.try_no, row.concludes_attempt) >= (o.attempt, o.try_no, o.concludes_attempt)
            });
            if newer {
                out.insert(row.delivery_id.clone(), row);
            }
        }
        Ok(out)
    }

    fn dialect(&self) -> sql::Dialect {
        match self {
            Self::Sqlite(_) => sql::Dialect::Sqlite,
            Self::Postgres(_) => sql::Dialect::Postgres,
        }
    }

    /// A subscription's tries that started in `[since_ms, until_ms)`, at most [`MAX_ATTEMPT_POINTS`] (the newest).
    pub async fn attempt_points(&self, subscription_id: &str, since_ms: i64, until_ms: i64) -> Result<Vec<AttemptPoint>, StoreError> {
        let q = sql::attempt_points(self.dialect(), subscription_id, since_ms, until_ms);
        match self {
            Self::Sqlite(s) => s.attempt_points(q).await,
            Self::Postgres(s) => s.attempt_points(q).await,
        }
    }

    /// Removes what is older than the retention (PostgreSQL: drops whole day partitions, and creates those ahead).
    pub async fn apply_retention(&self, retention_days: u32, now_ms: i64) -> Result<Retention, StoreError> {
        let cutoff = cutoff_ms(retention_days, now_ms);
        match self {
            Self::Sqlite(s) => s.apply_retention(cutoff).await,
            Self::Postgres(s) => s.apply_retention(cutoff, now_ms).await,
        }
    }
}

/// A batch's rows, each key once; records older than `retention_days` before `now_ms` skipped.
pub fn fold(batch: Batch, retention_days: u32, now_ms: i64) -> model::Folded {
    model::fold(batch, cutoff_ms(retention_days, now_ms))
}

/// Everything before this is outside the retention. PostgreSQL drops whole days, so it keeps up to a day more.
pub fn cutoff_ms(retention_days: u32, now_ms: i64) -> i64 {
    now_ms.saturating_sub(i64::from(retention_days).saturating_mul(DAY_MS))
}

/// Counts the batches this process's indexers stored, so a reader can wait for what was just published
/// (the API's `wait_ms`) without polling the store in a tight loop.
static WRITTEN: std::sync::LazyLock<tokio::sync::watch::Sender<u64>> = std::sync::LazyLock::new(|| tokio::sync::watch::Sender::new(0));

/// Changes each time an indexer of this process stored a batch (in any store: a waiter queries again, whichever it
/// reads). An indexer in another process wakes nobody here: waiters also look again on their own clock.
pub fn written() -> tokio::sync::watch::Receiver<u64> {
    WRITTEN.subscribe()
}

/// Applies the migrations a store lacks and returns (versions applied now, schema version after).
pub async fn migrate(target: &Target) -> Result<(Vec<u32>, u32), StoreError> {
    let store = LogStore::open(target).await?;
    let version = store.schema_version().await?;
    Ok((store.migrations_applied().to_vec(), version))
}

pub(crate) fn decode_event(payload: &[u8]) -> Result<Event, StoreError> {
    Event::decode(payload).map_err(|e| StoreError::Corrupt(format!("stored event: {e}")))
}

pub(crate) fn page(mut items: Vec<DeliveryRow>, size: usize) -> Page {
    let next = if items.len() > size {
        items.truncate(size);
        items.last().map(|l| Cursor { first_at_ms: l.first_at_ms, delivery_id: l.delivery_id.clone() })
    } else {
        None
    };
    Page { items, next }
}

pub(crate) fn stats(since_ms: i64, until_ms: i64, counts: Vec<(String, i64)>) -> Result<Stats, StoreError> {
    let mut by_state = Vec::new();
    let mut total = 0u64;
    for (state, n) in counts {
        let state: DeliveryState = state.parse().map_err(|e: UnknownState| StoreError::Corrupt(e.to_string()))?;
        let n = u64::try_from(n).unwrap_or(0);
        total = total.saturating_add(n);
        by_state.push((state, n));
    }
    by_state.sort();
    Ok(Stats { since_ms, until_ms, total, by_state })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn targets_parse_and_bad_ones_say_why() {
        assert_eq!(Target::parse("postgres://u@h/db").unwrap(), Target::Postgres("postgres://u@h/db".into()));
        assert_eq!(Target::parse("postgresql://u@h/db").unwrap(), Target::Postgres("postgresql://u@h/db".into()));
        assert_eq!(Target::parse("sqlite:a/b.db").unwrap(), Target::Sqlite("a/b.db".into()));
        assert_eq!(Target::parse("sqlite:///tmp/x.db").unwrap(), Target::Sqlite("/tmp/x.db".into()));
        assert_eq!(Target::parse("/var/lib/log.db").unwrap(), Target::Sqlite("/var/lib/log.db".into()));
        assert!(Target::parse("mysql://h/db").unwrap_err().to_string().contains("not a store URL"));
        assert!(Target::parse("").is_err());
        assert!(Target::parse("sqlite:").is_err());
    }
}
