//! The embedded backend: one SQLite file in WAL mode, a writer connection and a reader connection (readers are not
//! blocked by the indexer's transactions). Writes run on a thread of their own (`log-writer`: its CPU is told apart
//! from the fan-out's in a process that runs both, and it alone can run at a lower priority), reads on tokio's
//! blocking pool.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rusqlite::types::Value;
use rusqlite::{params, Connection, OpenFlags, OptionalExtension, TransactionBehavior};

use crate::model::{
    headers_to_json, AttemptRow, DeliveryDetail, DeliveryRow, EventRow, Folded, IndexSummary, ListQuery, Page, Scope, Stats,
    MAX_ATTEMPTS_RETURNED,
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

/// The writer thread and the nice value it runs at (see [`SqliteStore::lower_writer_priority`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WriterPriority {
    /// The thread's id (`/proc/<pid>/task/<thread_id>`).
    pub thread_id: i64,
    pub nice: i32,
}

mod writer_priority {
    use super::WriterPriority;
    use crate::StoreError;

    /// Lowers the calling thread's priority by `steps` nice steps from where it is (as `nice -n` does), at most to
    /// 19: never above the process's own priority, whatever the operator started it at. On Linux
    /// `setpriority(PRIO_PROCESS, tid)` applies to that one thread.
    #[cfg(target_os = "linux")]
    pub fn lower_this_thread(steps: u8) -> Result<WriterPriority, StoreError> {
        let failed = |what: &str| StoreError::Priority(format!("{what}: {}", std::io::Error::last_os_error()));
        // SAFETY: `gettid` has no preconditions.
        let tid = unsafe { libc::gettid() };
        let id = libc::id_t::try_from(tid).map_err(|_| StoreError::Priority(format!("thread id {tid} out of range")))?;
        // -1 is a nice value as well as the error return: errno tells them apart.
        // SAFETY: errno is thread-local; `getpriority` reads this thread's own priority.
        let current = unsafe {
            *libc::__errno_location() = 0;
            libc::getpriority(libc::PRIO_PROCESS, id)
        };
        if current == -1 && std::io::Error::last_os_error().raw_os_error() != Some(0) {
            return Err(failed("getpriority"));
        }
        let nice = current.saturating_add(i32::from(steps)).min(19);
        // SAFETY: plain syscall on this thread's own id; raising one's nice value needs no privilege.
        if unsafe { libc::setpriority(libc::PRIO_PROCESS, id, nice) } != 0 {
            return Err(failed("setpriority"));
        }
        Ok(WriterPriority { thread_id: i64::from(tid), nice })
    }

    #[cfg(not(target_os = "linux"))]
    pub fn lower_this_thread(_nice: u8) -> Result<WriterPriority, StoreError> {
        Err(StoreError::Priority("only on Linux".into()))
    }
}

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

    /// Lowers the writer thread's CPU priority by `nice` steps (0 leaves it as it is; at most to 19), and only that thread's:
    /// the fan-out and the API in the same process keep theirs. The log is written behind Kafka and nothing waits
    /// for it, so when the cores are saturated deliveries should get them first; the writer falls further behind
    /// and catches up once the flood ends (`log.sqlite_writer_nice`). Linux only
    /// (`None` elsewhere, and for 0).
    pub async fn lower_writer_priority(&self, nice: u8) -> Result<Option<WriterPriority>, StoreError> {
        if nice == 0 || !cfg!(target_os = "linux") {
            return Ok(None);
        }
        self.write(move |_| writer_priority::lower_this_thread(nice).map(Some)).await
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

    pub async fn progress(&self) -> Result<Option<crate::model::Progress>, StoreError> {
        self.read(|c| {
            let value: Option<String> =
                c.query_row("SELECT value FROM store_meta WHERE key = ?1", [crate::model::PROGRESS_KEY], |r| r.get(0)).optional()?;
            Ok(value.and_then(|v| crate::model::Progress::decode(&v)))
        })
        .await
    }

    pub async fn index(&self, folded: Arc<Folded>) -> Result<IndexSummary, StoreError> {
        self.write(move |c| index(c, &folded)).await
    }

    pub async fn delivery(&self, id: String) -> Result<Option<DeliveryDetail>, StoreError> {
        self.read(move |c| {
            // One read transaction, so the summary and its attempts are one snapshot: in WAL mode each statement
            // outside one sees the indexer's latest commit, which can land between the two reads.
            let c = c.unchecked_transaction()?;
            let Some(delivery) = c.query_row(&q::delivery(), [&id], |r| Ok(sql::delivery(r))).optional()?.transpose()? else {
                return Ok(None);
            };
            let mut stmt = c.prepare_cached(&q::attempts_of_delivery())?;
            let attempts = stmt
                .query_map(params![id, delivery.first_at_ms, MAX_ATTEMPTS_RETURNED as i64], |r| Ok(sql::attempt(r)))?
                .map(|r| r.map_err(StoreError::from).and_then(|x| x))
                .collect::<Result<Vec<_>, _>>()?;
            let event = event(&c, &delivery.tenant, &delivery.event_id)?;
            drop(stmt);
            c.commit()?;
            Ok(Some(DeliveryDetail { delivery, attempts, event }))
        })
        .await
    }

    pub async fn event(&self, tenant: String, event_id: String) -> Result<Option<hookline_core::model::Event>, StoreError> {
        self.read(move |c| event(c, &tenant, &event_id)).await
    }

    pub async fn by_event_id(&self, event_id: String, tenant: Option<String>, limit: usize) -> Result<Vec<DeliveryRow>, StoreError> {
        self.read(move |c| {
            let (text, p) = match tenant {
                Some(t) => (q::by_event_in_tenant(), vec![Value::Text(event_id), Value::Text(t), Value::Integer(limit as i64)]),
                None => (q::by_event(), vec![Value::Text(event_id), Value::Integer(limit as i64)]),
            };
            rows(c, &text, p)
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

fn event(c: &Connection, tenant: &str, event_id: &str) -> Result<Option<hookline_core::model::Event>, StoreError> {
    if event_id.is_empty() {
        return Ok(None);
    }
    let payload: Option<Vec<u8>> = c.prepare_cached(q::EVENT)?.query_row([tenant, event_id], |r| r.get(0)).optional()?;
    payload.map(|p| crate::decode_event(&p)).transpose()
}

fn current_version(c: &Connection) -> Result<u32, StoreError> {
    let exists: bool =
        c.query_row("SELECT count(*) > 0 FROM sqlite_master WHERE type = 'table' AND name = 'schema_migrations'", [], |r| r.get(0))?;
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

/// `{verb} {head} VALUES (…), (…) {tail}` for `rows` rows of `per_row` placeholders; `row(base)` writes one row's
/// tuple from placeholder `base + 1` (so a tuple may hold more than bare placeholders).
fn multi_row(verb: &str, head: &str, tail: &str, rows: usize, row: impl Fn(usize) -> String, per_row: usize) -> String {
    let tuples = (0..rows).map(|r| row(r * per_row)).collect::<Vec<_>>().join(", ");
    format!("{verb} {head} VALUES {tuples} {tail}")
}

/// A tuple of `n` placeholders from `base + 1`.
fn tuple(base: usize, n: usize) -> String {
    format!("({})", (base + 1..=base + n).map(|i| format!("?{i}")).collect::<Vec<_>>().join(", "))
}

/// Writes `items` with the `rows_per_statement`-row statement, then the rest with the one-row statement. `bind`
/// binds one item's values from placeholder `base + 1`.
fn insert_all<T>(
    tx: &rusqlite::Transaction<'_>,
    sql: impl Fn(usize) -> String,
    per_row: usize,
    rows_per_statement: usize,
    items: &[&T],
    bind: impl Fn(&mut rusqlite::CachedStatement<'_>, usize, &T) -> rusqlite::Result<()>,
) -> Result<(), StoreError> {
    let n = rows_per_statement.max(1);
    // Whole statements of `n` rows first (none when `n` is 1), then the rest one row each.
    let (full, rest) = items.split_at(if n > 1 { items.len() - items.len() % n } else { 0 });
    if !full.is_empty() {
        let mut many = tx.prepare_cached(&sql(n))?;
        for chunk in full.chunks_exact(n) {
            for (i, item) in chunk.iter().enumerate() {
                bind(&mut many, i * per_row, *item)?;
            }
            many.raw_execute()?;
        }
    }
    if !rest.is_empty() {
        let mut one = tx.prepare_cached(&sql(1))?;
        for item in rest {
            bind(&mut one, 0, *item)?;
            one.raw_execute()?;
        }
    }
    Ok(())
}

const EVENT_COLS: &str = "event_id, at_ms, event_type, tenant, payload";
const EVENT_WIDTH: usize = 5;
const ATTEMPT_WIDTH: usize = 25;
const DELIVERY_WIDTH: usize = 14;

fn index(c: &mut Connection, f: &Folded) -> Result<IndexSummary, StoreError> {
    let tx = c.transaction_with_behavior(TransactionBehavior::Immediate)?;
    let events: Vec<&EventRow> = f.events.iter().collect();
    insert_all(&tx, q::insert_events, EVENT_WIDTH, q::EVENT_ROWS, &events, |s, b, e| {
        s.raw_bind_parameter(b + 1, &e.event_id)?;
        s.raw_bind_parameter(b + 2, e.at_ms)?;
        s.raw_bind_parameter(b + 3, &e.event_type)?;
        s.raw_bind_parameter(b + 4, &e.tenant)?;
        s.raw_bind_parameter(b + 5, &e.payload)
    })?;
    let attempts: Vec<&AttemptRow> = f.attempts.iter().collect();
    insert_all(&tx, q::upsert_attempts, ATTEMPT_WIDTH, q::ATTEMPT_ROWS, &attempts, |s, b, a| {
        s.raw_bind_parameter(b + 1, &a.delivery_id)?;
        s.raw_bind_parameter(b + 2, &a.run_id)?;
        s.raw_bind_parameter(b + 3, a.attempt)?;
        s.raw_bind_parameter(b + 4, a.try_no)?;
        s.raw_bind_parameter(b + 5, a.started_at_ms)?;
        s.raw_bind_parameter(b + 6, &a.subscription_id)?;
        s.raw_bind_parameter(b + 7, a.duration_ms)?;
        s.raw_bind_parameter(b + 8, &a.outcome)?;
        s.raw_bind_parameter(b + 9, a.http_status)?;
        s.raw_bind_parameter(b + 10, &a.reason)?;
        s.raw_bind_parameter(b + 11, headers_to_json(&a.request_headers))?;
        s.raw_bind_parameter(b + 12, &a.body_ref)?;
        s.raw_bind_parameter(b + 13, headers_to_json(&a.response_headers))?;
        s.raw_bind_parameter(b + 14, &a.response_excerpt)?;
        s.raw_bind_parameter(b + 15, &a.verdict)?;
        s.raw_bind_parameter(b + 16, a.counts_toward_disable)?;
        s.raw_bind_parameter(b + 17, a.next_due_at_ms)?;
        s.raw_bind_parameter(b + 18, &a.final_state)?;
        s.raw_bind_parameter(b + 19, &a.status_word)?;
        s.raw_bind_parameter(b + 20, &a.policy)?;
        s.raw_bind_parameter(b + 21, a.concludes_attempt)?;
        s.raw_bind_parameter(b + 22, &a.traceparent)?;
        s.raw_bind_parameter(b + 23, a.decided_by.map_or("", |d| d.as_str()))?;
        s.raw_bind_parameter(b + 24, a.rule)?;
        s.raw_bind_parameter(b + 25, &a.rule_when)
    })?;
    let deliveries: Vec<&DeliveryRow> = f.deliveries.iter().collect();
    let bind = |s: &mut rusqlite::CachedStatement<'_>, b: usize, d: &DeliveryRow| {
        s.raw_bind_parameter(b + 1, &d.delivery_id)?;
        s.raw_bind_parameter(b + 2, &d.subscription_id)?;
        s.raw_bind_parameter(b + 3, &d.tenant)?;
        s.raw_bind_parameter(b + 4, &d.event_id)?;
        s.raw_bind_parameter(b + 5, &d.event_type)?;
        s.raw_bind_parameter(b + 6, d.state.as_str())?;
        s.raw_bind_parameter(b + 7, &d.status_word)?;
        s.raw_bind_parameter(b + 8, d.first_at_ms)?;
        s.raw_bind_parameter(b + 9, d.last_at_ms)?;
        s.raw_bind_parameter(b + 10, d.attempts_made)?;
        s.raw_bind_parameter(b + 11, d.last_http_status)?;
        s.raw_bind_parameter(b + 12, &d.last_outcome)?;
        s.raw_bind_parameter(b + 13, &d.run_id)?;
        s.raw_bind_parameter(b + 14, &d.dead_letter_reason)
    };
    insert_all(&tx, q::upsert_deliveries, DELIVERY_WIDTH, q::DELIVERY_ROWS, &deliveries, bind)?;
    if let Some(p) = f.progress {
        tx.prepare_cached("INSERT OR REPLACE INTO store_meta (key, value) VALUES (?1, ?2)")?
            .execute(rusqlite::params![crate::model::PROGRESS_KEY, p.encode()])?;
    }
    tx.commit()?;
    Ok(IndexSummary { attempts: f.attempts.len(), deliveries: f.deliveries.len(), events: f.events.len(), skipped: f.skipped })
}

/// The statements written out here (the list and stats queries are `sql`'s), named so the plan test reads the
/// same text the store runs.
mod q {
    use super::{multi_row, tuple, ATTEMPT_WIDTH, DELIVERY_WIDTH, EVENT_COLS, EVENT_WIDTH};
    use crate::sql;

    /// Rows per multi-row `INSERT` of events: one statement writes this many rows (its table and index cursors opened
    /// once, one step), far under SQLite's 32,766 parameters. A batch's last rows go one statement each.
    ///
    /// Only statements that cannot abort halfway are multi-row. Inside a transaction, SQLite gives a statement that may
    /// write several rows and then abort on a constraint a *statement journal*: a copy of every page it is about to
    /// change, written to a temporary file (past 64 KiB), so that it can undo only itself. The indexer's transaction
    /// is all or nothing anyway (any error rolls the whole batch back), so that copy buys nothing: in a profile of
    /// ingest it was an eighth of the log writer's CPU. The events' insert cannot abort: its conflict is `DO NOTHING`
    /// and `OR FAIL` stops at a violated `NOT NULL` without undoing (the batch's rollback does). An upsert's `DO UPDATE`
    /// always checks with `ABORT` (SQLite's rule), so attempts and deliveries are written one row per statement, which
    /// never needs the journal.
    pub const EVENT_ROWS: usize = 50;
    /// See [`EVENT_ROWS`]: an upsert's `DO UPDATE` may abort, so one row per statement.
    pub const ATTEMPT_ROWS: usize = 1;
    pub const DELIVERY_ROWS: usize = 1;

    /// `OR FAIL`: see [`EVENT_ROWS`].
    pub const EVENT_CONFLICT: &str = "ON CONFLICT (tenant, event_id, at_ms) DO NOTHING";

    pub fn insert_events(rows: usize) -> String {
        multi_row("INSERT OR FAIL INTO", &format!("events ({EVENT_COLS})"), EVENT_CONFLICT, rows, |b| tuple(b, EVENT_WIDTH), EVENT_WIDTH)
    }

    pub fn upsert_attempts(rows: usize) -> String {
        let head = format!("attempts AS a ({})", sql::ATTEMPT_COLS);
        multi_row("INSERT INTO", &head, &sql::attempt_merge(sql::Dialect::Sqlite), rows, |b| tuple(b, ATTEMPT_WIDTH), ATTEMPT_WIDTH)
    }

    pub fn upsert_deliveries(rows: usize) -> String {
        let head = format!("deliveries AS d ({})", sql::DELIVERY_COLS);
        multi_row("INSERT INTO", &head, &sql::delivery_merge(sql::Dialect::Sqlite), rows, |b| tuple(b, DELIVERY_WIDTH), DELIVERY_WIDTH)
    }

    pub fn delivery() -> String {
        format!("SELECT {} FROM deliveries WHERE delivery_id = ?1", sql::DELIVERY_COLS)
    }

    pub fn attempts_of_delivery() -> String {
        format!(
            "SELECT {} FROM attempts WHERE delivery_id = ?1 AND started_at_ms >= ?2 ORDER BY started_at_ms, attempt, try_no LIMIT ?3",
            sql::ATTEMPT_COLS
        )
    }

    pub fn by_event() -> String {
        format!("SELECT {} FROM deliveries WHERE event_id = ?1 ORDER BY first_at_ms DESC, delivery_id DESC LIMIT ?2", sql::DELIVERY_COLS)
    }

    pub fn by_event_in_tenant() -> String {
        format!(
            // `+tenant`: not by the tenant's index (SQLite picks it to save the sort, then walks the tenant's whole
            // history for one event's rows); the event's index finds the few rows, the tenant filters them.
            "SELECT {} FROM deliveries WHERE event_id = ?1 AND +tenant = ?2 ORDER BY first_at_ms DESC, delivery_id DESC LIMIT ?3",
            sql::DELIVERY_COLS
        )
    }

    /// An event is (tenant, id): the one of the delivery's own tenant, never another tenant's of the same id.
    pub const EVENT: &str = "SELECT payload FROM events WHERE tenant = ?1 AND event_id = ?2 ORDER BY at_ms DESC LIMIT 1";
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{Cursor, ListQuery, Scope};

    /// Every statement the store runs, on a migrated file: none reads a whole table (each is answered from an index),
    /// and the lookups by key use the key's index.
    #[test]
    fn every_query_is_answered_from_an_index() {
        let dir = std::env::temp_dir().join(format!("hookline-log-plans-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let mut c = Connection::open(dir.join("log.sqlite3")).unwrap();
        migrate(&mut c).unwrap();
        let sub = || Scope::Subscription("sub".into());
        let full = ListQuery {
            state: Some(crate::DeliveryState::Failed),
            http_status: Some(503),
            event_type: Some("order.created".into()),
            since_ms: Some(1),
            until_ms: Some(2),
            after: Some(Cursor { first_at_ms: 2, delivery_id: "dlv_x".into() }),
            ..ListQuery::new(sub())
        };
        let ids = vec!["dlv_a".to_owned(), "dlv_b".to_owned()];
        let mut statements: Vec<(String, &str)> = vec![
            (q::delivery(), "deliveries_key"),
            (q::attempts_of_delivery(), "attempts_key"),
            (q::by_event(), "deliveries_by_event"),
            (q::by_event_in_tenant(), "deliveries_by_event"),
            (q::EVENT.into(), "events_key"),
            (sql::list(Dialect::Sqlite, &ListQuery::new(sub())).text, "deliveries_by_subscription"),
            (
                sql::list(Dialect::Sqlite, &ListQuery { state: Some(crate::DeliveryState::Dead), ..ListQuery::new(sub()) }).text,
                "deliveries_by_subscription_state",
            ),
            (
                sql::list(Dialect::Sqlite, &ListQuery { event_type: Some("t".into()), ..ListQuery::new(sub()) }).text,
                "deliveries_by_subscription_type",
            ),
            (sql::list(Dialect::Sqlite, &ListQuery::new(Scope::Tenant("acme".into()))).text, "deliveries_by_tenant"),
            (sql::list(Dialect::Sqlite, &full).text, "deliveries_by_subscription"),
            (sql::stats(Dialect::Sqlite, &sub(), 1, 2).text, "deliveries_by_subscription"),
            (sql::stats_of_subscriptions(Dialect::Sqlite, &ids, 1, 2).text, "deliveries_by_subscription"),
            (sql::attempt_points(Dialect::Sqlite, "sub", 1, 2).text, "attempts_by_subscription"),
            (sql::last_attempts(Dialect::Sqlite, &ids, 1).text, "attempts_key"),
            ("DELETE FROM attempts WHERE started_at_ms < ?1".into(), "attempts_by_time"),
            ("DELETE FROM events WHERE at_ms < ?1".into(), "events_by_time"),
            ("DELETE FROM deliveries WHERE last_at_ms < ?1".into(), "deliveries_by_last_at"),
        ];
        // The writes, one row's form (their conflict check uses the key's unique index, which the plan does not show;
        // a multi-row form adds only the scan of its VALUES rows).
        for text in [q::insert_events(1), q::upsert_attempts(1), q::upsert_deliveries(1)] {
            statements.push((text, ""));
        }
        for (text, index) in &statements {
            let mut stmt = c.prepare(&format!("EXPLAIN QUERY PLAN {text}")).unwrap();
            // Parameters left unbound (NULL): the plan does not depend on their values.
            let mut rows = stmt.raw_query();
            let mut plan = Vec::new();
            while let Some(r) = rows.next().unwrap() {
                plan.push(r.get::<_, String>(3).unwrap());
            }
            let plan = plan.join(" | ");
            let full_scan = plan.split(" | ").any(|step| step.starts_with("SCAN ") && !step.contains("USING"));
            assert!(!full_scan, "a whole table read by {text}: {plan}");
            if !index.is_empty() {
                assert!(plan.contains(index), "{text} should use {index}: {plan}");
            }
        }
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// Whether `text` compiles to a constraint check that stops with `ABORT` (`OP_HaltIfNull` / `OP_Halt` with P2 =
    /// `OE_Abort`, 2): such a statement, if it may write several rows inside a transaction, gets a statement
    /// journal (see `q::EVENT_ROWS`).
    fn may_abort(c: &Connection, text: &str) -> bool {
        let mut stmt = c.prepare(&format!("EXPLAIN {text}")).unwrap();
        let mut rows = stmt.raw_query();
        let mut found = false;
        while let Some(r) = rows.next().unwrap() {
            let (op, p2) = (r.get::<_, String>(1).unwrap(), r.get::<_, i64>(3).unwrap());
            found |= (op == "HaltIfNull" || op == "Halt") && p2 == 2;
        }
        found
    }

    /// The indexer's batch writes keep no statement journal (an eighth of the log writer's CPU when they did): a
    /// statement that writes several rows at once cannot abort halfway, and one that can writes a single row.
    #[test]
    fn no_write_of_a_batch_keeps_a_statement_journal() {
        let mut c = Connection::open_in_memory().unwrap();
        migrate(&mut c).unwrap();
        // The check itself tells the two apart: a multi-row upsert and a plain multi-row insert may abort.
        assert!(may_abort(&c, &q::upsert_attempts(2)));
        assert!(may_abort(&c, &q::insert_events(2).replace("INSERT OR FAIL INTO", "INSERT INTO")));
        let several: [(&str, String, usize); 3] = [
            ("events", q::insert_events(q::EVENT_ROWS), q::EVENT_ROWS),
            ("attempts", q::upsert_attempts(q::ATTEMPT_ROWS), q::ATTEMPT_ROWS),
            ("deliveries", q::upsert_deliveries(q::DELIVERY_ROWS), q::DELIVERY_ROWS),
        ];
        for (name, text, rows) in several {
            assert!(rows == 1 || !may_abort(&c, &text), "{name}: writes {rows} rows per statement and may abort: {text}");
        }
    }
}
