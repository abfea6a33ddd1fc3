//! The embedded backend: one SQLite file in WAL mode, a writer connection and a reader connection (readers are not
//! blocked by the indexer's transactions). Writes run on a thread of their own (`log-writer`: its CPU is told apart
//! from the fan-out's in a process that runs both), reads on tokio's blocking pool.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rusqlite::types::Value;
use rusqlite::{params, Connection, OpenFlags, OptionalExtension, TransactionBehavior};

use crate::model::{
    headers_to_json, DeliveryDetail, DeliveryRow, Folded, IndexSummary, ListQuery, Page, Scope, Stats, MAX_ATTEMPTS_RETURNED,
};
use crate::schema;
use crate::sql::{self, Dialect, Param, RowGet};
use crate::{Retention, StoreError};

/// A write, run on the writer thread with its connection.
type Job = Box<dyn FnOnce(&mut Connection) + Send>;

/// The thread's name (at most 15 bytes: Linux truncates longer ones), as `/proc/<pid>/task/*/comm` shows it.
pub const WRITER_THREAD: &str = "log-writer";

/// The writer connection's page cache (`PRAGMA cache_size`, KiB).
pub const WRITER_CACHE_KIB: i64 = 16 * 1024;
/// WAL pages between automatic checkpoints (`PRAGMA wal_autocheckpoint`; SQLite's default is 1,000).
const WAL_CHECKPOINT_PAGES: i64 = 8_000;

pub struct SqliteStore {
    /// To the writer thread, which owns the writer connection; it ends when the store is dropped.
    writer: Mutex<std::sync::mpsc::Sender<Job>>,
    reader: Arc<Mutex<Connection>>,
    path: PathBuf,
    pub(crate) applied: Vec<u32>,
}

impl RowGet for rusqlite::Row<'_> {
    fn text(&self, i: usize) -> Result<String, StoreError> {
        Ok(self.get(i)?)
    }
    fn int(&self, i: usize) -> Result<i64, StoreError> {
        Ok(self.get(i)?)
    }
    fn flag(&self, i: usize) -> Result<bool, StoreError> {
        Ok(self.get::<_, i64>(i)? != 0)
    }
}

fn lock(c: &Mutex<Connection>) -> std::sync::MutexGuard<'_, Connection> {
    // A panic while holding the lock leaves no half-applied transaction (it rolls back on drop).
    c.lock().unwrap_or_else(|e| e.into_inner())
}

fn values(params: Vec<Param>) -> Vec<Value> {
    params
        .into_iter()
        .map(|p| match p {
            Param::Text(s) => Value::Text(s),
            Param::Int(i) => Value::Integer(i),
        })
        .collect()
}

impl SqliteStore {
    pub async fn open(path: &Path) -> Result<Self, StoreError> {
        let path = path.to_owned();
        tokio::task::spawn_blocking(move || Self::open_blocking(path)).await?
    }

    fn open_blocking(path: PathBuf) -> Result<Self, StoreError> {
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).map_err(|e| StoreError::Open(format!("creating {}: {e}", dir.display())))?;
        }
        let mut writer = Connection::open(&path)?;
        writer.busy_timeout(Duration::from_secs(10))?;
        writer.pragma_update(None, "journal_mode", "WAL")?;
        // WAL + NORMAL: a commit survives a process crash; a power cut may lose the last transactions, which the
        // indexer re-reads from Kafka (offsets are committed after the store commit).
        writer.pragma_update(None, "synchronous", "NORMAL")?;
        // The indexer's batches insert into B-trees keyed by hashes (delivery ids, event ids), so a batch dirties
        // pages all over the file: with SQLite's default 2 MiB cache it spills them to the WAL mid-transaction and
        // reads them back with a syscall each. A larger cache (allocated as used, at most this; the reader keeps the
        // default) takes most of those syscalls away; 16 MiB cost no more CPU than 64 in `bench log`, for less memory.
        writer.pragma_update(None, "cache_size", -WRITER_CACHE_KIB)?;
        // Checkpoints copy each page the WAL holds into the file once, however often it changed since the last one,
        // and fsync: fewer, larger ones copy the hot pages (index ends, interior pages) fewer times. The WAL is
        // truncated back to the limit after each.
        writer.pragma_update(None, "wal_autocheckpoint", WAL_CHECKPOINT_PAGES)?;
        writer.pragma_update(None, "journal_size_limit", WAL_CHECKPOINT_PAGES * 4096)?;
        let applied = migrate(&mut writer)?;
        let reader = Connection::open_with_flags(&path, OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX)?;
        reader.busy_timeout(Duration::from_secs(10))?;
        let (jobs, queue) = std::sync::mpsc::channel::<Job>();
        std::thread::Builder::new()
            .name(WRITER_THREAD.into())
            .spawn(move || {
                let mut c = writer;
                for job in queue {
                    // A panicking write drops its reply (the caller gets an error); the thread goes on.
                    let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| job(&mut c)));
                }
            })
            .map_err(|e| StoreError::Open(format!("starting the writer thread: {e}")))?;
        Ok(Self { writer: Mutex::new(jobs), reader: Arc::new(Mutex::new(reader)), path, applied })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    async fn read<T: Send + 'static>(
        &self,
        f: impl FnOnce(&Connection) -> Result<T, StoreError> + Send + 'static,
    ) -> Result<T, StoreError> {
        let c = self.reader.clone();
        tokio::task::spawn_blocking(move || f(&lock(&c))).await?
    }

    async fn write<T: Send + 'static>(
        &self,
        f: impl FnOnce(&mut Connection) -> Result<T, StoreError> + Send + 'static,
    ) -> Result<T, StoreError> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        let job: Job = Box::new(move |c| {
            let _ = tx.send(f(c));
        });
        self.writer.lock().unwrap_or_else(|e| e.into_inner()).send(job).map_err(|_| StoreError::Writer("it has stopped"))?;
        rx.await.map_err(|_| StoreError::Writer("a write panicked"))?
    }

    pub async fn schema_version(&self) -> Result<u32, StoreError> {
        self.read(current_version).await
    }

    pub async fn store_id(&self) -> Result<String, StoreError> {
        self.read(|c| Ok(c.query_row("SELECT value FROM store_meta WHERE key = 'store_id'", [], |r| r.get::<_, String>(0))?)).await
    }

    pub async fn index(&self, folded: Arc<Folded>) -> Result<IndexSummary, StoreError> {
        self.write(move |c| index(c, &folded)).await
    }

    pub async fn delivery(&self, id: String) -> Result<Option<DeliveryDetail>, StoreError> {
        self.read(move |c| {
            let q = format!("SELECT {} FROM deliveries WHERE delivery_id = ?1", sql::DELIVERY_COLS);
            let Some(delivery) = c.query_row(&q, [&id], |r| Ok(sql::delivery(r))).optional()?.transpose()? else {
                return Ok(None);
            };
            let q = format!(
                "SELECT {} FROM attempts WHERE delivery_id = ?1 AND started_at_ms >= ?2 \
                 ORDER BY started_at_ms, attempt, try_no LIMIT ?3",
                sql::ATTEMPT_COLS
            );
            let mut stmt = c.prepare_cached(&q)?;
            let attempts = stmt
                .query_map(params![id, delivery.first_at_ms, MAX_ATTEMPTS_RETURNED as i64], |r| Ok(sql::attempt(r)))?
                .map(|r| r.map_err(StoreError::from).and_then(|x| x))
                .collect::<Result<Vec<_>, _>>()?;
            let event = event(c, &delivery.event_id)?;
            Ok(Some(DeliveryDetail { delivery, attempts, event }))
        })
        .await
    }

    pub async fn event(&self, event_id: String) -> Result<Option<hookline_core::model::Event>, StoreError> {
        self.read(move |c| event(c, &event_id)).await
    }

    pub async fn by_event_id(&self, event_id: String, tenant: Option<String>, limit: usize) -> Result<Vec<DeliveryRow>, StoreError> {
        self.read(move |c| {
            let (q, p) = match tenant {
                Some(t) => (
                    format!("SELECT {} FROM deliveries WHERE event_id = ?1 AND tenant = ?2 ORDER BY first_at_ms DESC, delivery_id DESC LIMIT ?3", sql::DELIVERY_COLS),
                    vec![Value::Text(event_id), Value::Text(t), Value::Integer(limit as i64)],
                ),
                None => (
                    format!("SELECT {} FROM deliveries WHERE event_id = ?1 ORDER BY first_at_ms DESC, delivery_id DESC LIMIT ?2", sql::DELIVERY_COLS),
                    vec![Value::Text(event_id), Value::Integer(limit as i64)],
                ),
            };
            rows(c, &q, p)
        })
        .await
    }

    pub async fn list(&self, query: ListQuery) -> Result<Page, StoreError> {
        self.read(move |c| {
            let q = sql::list(Dialect::Sqlite, &query);
            let items = rows(c, &q.text, values(q.params))?;
            Ok(crate::page(items, query.page_size()))
        })
        .await
    }

    pub async fn attempt_rows(&self, q: sql::Query) -> Result<Vec<crate::AttemptRow>, StoreError> {
        self.read(move |c| {
            let mut stmt = c.prepare(&q.text)?;
            let out = stmt
                .query_map(rusqlite::params_from_iter(values(q.params)), |r| Ok(sql::attempt(r)))?
                .map(|r| r.map_err(StoreError::from).and_then(|x| x))
                .collect();
            out
        })
        .await
    }

    pub async fn attempt_points(&self, q: sql::Query) -> Result<Vec<crate::AttemptPoint>, StoreError> {
        self.read(move |c| {
            let mut stmt = c.prepare_cached(&q.text)?;
            let out = stmt
                .query_map(rusqlite::params_from_iter(values(q.params)), |r| Ok(sql::attempt_point(r)))?
                .map(|r| r.map_err(StoreError::from).and_then(|x| x))
                .collect();
            out
        })
        .await
    }

    /// Rows of `(text, text, count)`.
    pub async fn keyed_counts(&self, q: sql::Query) -> Result<Vec<(String, String, i64)>, StoreError> {
        self.read(move |c| {
            let mut stmt = c.prepare(&q.text)?;
            let out = stmt
                .query_map(rusqlite::params_from_iter(values(q.params)), |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))?
                .collect::<Result<Vec<_>, _>>()?;
            Ok(out)
        })
        .await
    }

    pub async fn stats(&self, scope: Scope, since_ms: i64, until_ms: i64) -> Result<Stats, StoreError> {
        self.read(move |c| {
            let q = sql::stats(Dialect::Sqlite, &scope, since_ms, until_ms);
            let mut stmt = c.prepare_cached(&q.text)?;
            let counts = stmt
                .query_map(rusqlite::params_from_iter(values(q.params)), |r| Ok((r.get::<_, String>(0)?, r.get::<_, i64>(1)?)))?
                .collect::<Result<Vec<_>, _>>()?;
            crate::stats(since_ms, until_ms, counts)
        })
        .await
    }

    pub async fn apply_retention(&self, cutoff_ms: i64) -> Result<Retention, StoreError> {
        self.write(move |c| {
            let tx = c.transaction_with_behavior(TransactionBehavior::Immediate)?;
            let attempts = tx.execute("DELETE FROM attempts WHERE started_at_ms < ?1", [cutoff_ms])?;
            let events = tx.execute("DELETE FROM events WHERE at_ms < ?1", [cutoff_ms])?;
            let deliveries = tx.execute("DELETE FROM deliveries WHERE last_at_ms < ?1", [cutoff_ms])?;
            tx.commit()?;
            Ok(Retention { attempts: attempts as u64, events: events as u64, deliveries: deliveries as u64, partitions_dropped: 0 })
        })
        .await
    }
}

fn rows(c: &Connection, q: &str, p: Vec<Value>) -> Result<Vec<DeliveryRow>, StoreError> {
    let mut stmt = c.prepare_cached(q)?;
    let out = stmt
        .query_map(rusqlite::params_from_iter(p), |r| Ok(sql::delivery(r)))?
        .map(|r| r.map_err(StoreError::from).and_then(|x| x))
        .collect();
    out
}

fn event(c: &Connection, event_id: &str) -> Result<Option<hookline_core::model::Event>, StoreError> {
    if event_id.is_empty() {
        return Ok(None);
    }
    let payload: Option<Vec<u8>> = c
        .prepare_cached("SELECT payload FROM events WHERE event_id = ?1 ORDER BY at_ms DESC LIMIT 1")?
        .query_row([event_id], |r| r.get(0))
        .optional()?;
    payload.map(|p| crate::decode_event(&p)).transpose()
}

fn current_version(c: &Connection) -> Result<u32, StoreError> {
    let exists: bool = c.query_row(
        "SELECT count(*) > 0 FROM sqlite_master WHERE type = 'table' AND name = 'schema_migrations'",
        [],
        |r| r.get(0),
    )?;
    if !exists {
        return Ok(0);
    }
    let v: i64 = c.query_row("SELECT COALESCE(MAX(version), 0) FROM schema_migrations", [], |r| r.get(0))?;
    Ok(u32::try_from(v).unwrap_or(u32::MAX))
}

/// Applies what is missing, each migration in its own immediate (write-locked) transaction, re-reading the
/// version inside it so two processes opening the same file apply each migration once.
fn migrate(c: &mut Connection) -> Result<Vec<u32>, StoreError> {
    c.execute_batch(
        "CREATE TABLE IF NOT EXISTS schema_migrations (version INTEGER PRIMARY KEY, name TEXT NOT NULL, applied_at_ms INTEGER NOT NULL)",
    )?;
    let known = schema::latest(schema::SQLITE);
    let mut applied = Vec::new();
    for (version, name, text) in schema::SQLITE {
        let tx = c.transaction_with_behavior(TransactionBehavior::Immediate)?;
        let current = current_version(&tx)?;
        if current > known {
            return Err(StoreError::SchemaTooNew { found: current, known });
        }
        if *version <= current {
            continue;
        }
        tx.execute_batch(text)?;
        tx.execute(
            "INSERT INTO schema_migrations (version, name, applied_at_ms) VALUES (?1, ?2, ?3)",
            params![version, name, hookline_service::now_ms()],
        )?;
        tx.commit()?;
        applied.push(*version);
    }
    let current = current_version(c)?;
    if current > known {
        return Err(StoreError::SchemaTooNew { found: current, known });
    }
    Ok(applied)
}

fn index(c: &mut Connection, f: &Folded) -> Result<IndexSummary, StoreError> {
    let tx = c.transaction_with_behavior(TransactionBehavior::Immediate)?;
    {
        let mut insert = tx.prepare_cached(
            "INSERT INTO events (event_id, at_ms, event_type, tenant, payload) VALUES (?1, ?2, ?3, ?4, ?5) \
             ON CONFLICT (event_id, at_ms) DO NOTHING",
        )?;
        // Deliveries indexed before their event learn its tenant now.
        let mut tenant = tx.prepare_cached("UPDATE deliveries SET tenant = ?2 WHERE event_id = ?1 AND tenant = ''")?;
        for e in &f.events {
            insert.execute(params![e.event_id, e.at_ms, e.event_type, e.tenant, e.payload])?;
            if !e.tenant.is_empty() {
                tenant.execute(params![e.event_id, e.tenant])?;
            }
        }
    }
    {
        let q = format!(
            "INSERT INTO attempts AS a ({}) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, \
             ?17, ?18, ?19, ?20, ?21, ?22, ?23, ?24, ?25) {}",
            sql::ATTEMPT_COLS,
            sql::attempt_merge(Dialect::Sqlite)
        );
        let mut insert = tx.prepare_cached(&q)?;
        for a in &f.attempts {
            insert.execute(params![
                a.delivery_id,
                a.run_id,
                a.attempt,
                a.try_no,
                a.started_at_ms,
                a.subscription_id,
                a.duration_ms,
                a.outcome,
                a.http_status,
                a.reason,
                headers_to_json(&a.request_headers),
                a.body_ref,
                headers_to_json(&a.response_headers),
                a.response_excerpt,
                a.verdict,
                a.counts_toward_disable,
                a.next_due_at_ms,
                a.final_state,
                a.status_word,
                a.policy,
                a.concludes_attempt,
                a.traceparent,
                a.decided_by.map_or("", |d| d.as_str()),
                a.rule,
                a.rule_when,
            ])?;
        }
    }
    {
        let q = format!(
            "INSERT INTO deliveries AS d ({}) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14) {}",
            sql::DELIVERY_COLS,
            sql::delivery_merge(Dialect::Sqlite)
        );
        let mut upsert = tx.prepare_cached(&q)?;
        // A delivery whose event is not in this batch learns its tenant from the stored event in the same statement
        // (not by an UPDATE after it, which wrote the row and its tenant index a second time).
        let q = format!(
            "INSERT INTO deliveries AS d ({}) VALUES (?1, ?2, COALESCE((SELECT e.tenant FROM events e WHERE e.event_id = ?4 \
             AND e.tenant <> '' ORDER BY e.at_ms DESC LIMIT 1), ''), ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14) {}",
            sql::DELIVERY_COLS,
            sql::delivery_merge(Dialect::Sqlite)
        );
        let mut upsert_looked_up = tx.prepare_cached(&q)?;
        for d in &f.deliveries {
            let stmt = if d.tenant.is_empty() && !d.event_id.is_empty() { &mut upsert_looked_up } else { &mut upsert };
            stmt.execute(params![
                d.delivery_id,
                d.subscription_id,
                d.tenant,
                d.event_id,
                d.event_type,
                d.state.as_str(),
                d.status_word,
                d.first_at_ms,
                d.last_at_ms,
                d.attempts_made,
                d.last_http_status,
                d.last_outcome,
                d.run_id,
                d.dead_letter_reason,
            ])?;
        }
    }
    tx.commit()?;
    Ok(IndexSummary { attempts: f.attempts.len(), deliveries: f.deliveries.len(), events: f.events.len(), skipped: f.skipped })
}
