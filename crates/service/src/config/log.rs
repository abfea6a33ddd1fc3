//! `[log]`: where the delivery log is stored and how long it is kept (the store and its indexer live in
//! `crates/log`; this is only the settings, so every binary reads the same file without linking a database).

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use super::ConfigError;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LogStoreKind {
    /// A file in-process: `hookline dev` and single-node installs.
    Sqlite,
    /// A PostgreSQL server: any number of API replicas query one database.
    Postgres,
}

#[derive(Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LogSettings {
    pub store: LogStoreKind,
    /// The SQLite database file (its directory is created when missing). A relative path is read from the working
    /// directory.
    pub sqlite_path: PathBuf,
    /// `postgres://user:password@host:port/dbname` (or libpq `key=value` form). Set it, or `postgres_url_file`,
    /// when `store = "postgres"`.
    pub postgres_url: Option<String>,
    /// A file holding the URL (a mounted Secret); read at start, surrounding whitespace ignored.
    pub postgres_url_file: Option<PathBuf>,
    /// How long deliveries, attempts and events are kept (whole days: PostgreSQL drops daily partitions).
    pub retention_days: u32,
    /// Consumer group of the indexer.
    pub group_id: String,
    /// Most records written to the store in one transaction.
    pub batch_max_records: usize,
    /// Longest a record waits for its batch to fill before the batch is written anyway.
    pub batch_max_wait_ms: u64,
    /// Whether the ingest process runs the indexer in-process (beside the API and the fan-out, never in their way).
    /// False leaves it to `hookline log index`: with SQLite a process on the same host with the same `sqlite_path`
    /// (the file takes one writer and any number of readers), so the log's CPU can be given cores or a priority of
    /// its own; with PostgreSQL, set it false on all API replicas but one (or some): the indexers share one consumer
    /// group, so any number is correct, but one or two is enough.
    pub run_indexer: bool,
    /// How many nice steps (0 to 19, as `nice -n`) the SQLite writer thread runs below the process, and it alone:
    /// when the cores are saturated the fan-out, the API and the dispatcher get them first and the log catches up
    /// after. 0 leaves it at the process's own. Nothing with PostgreSQL (its server writes).
    pub sqlite_writer_nice: u8,
}

impl Default for LogSettings {
    fn default() -> Self {
        Self {
            store: LogStoreKind::Sqlite,
            sqlite_path: PathBuf::from("data/delivery-log.sqlite3"),
            postgres_url: None,
            postgres_url_file: None,
            retention_days: 30,
            group_id: "hookline-log-indexer".into(),
            batch_max_records: 2_000,
            batch_max_wait_ms: 200,
            run_indexer: true,
            sqlite_writer_nice: 10,
        }
    }
}

impl std::fmt::Debug for LogSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LogSettings")
            .field("store", &self.store)
            .field("sqlite_path", &self.sqlite_path)
            .field("postgres_url", &self.postgres_url.as_ref().map(|_| "<redacted>"))
            .field("postgres_url_file", &self.postgres_url_file)
            .field("retention_days", &self.retention_days)
            .field("group_id", &self.group_id)
            .field("batch_max_records", &self.batch_max_records)
            .field("batch_max_wait_ms", &self.batch_max_wait_ms)
            .field("run_indexer", &self.run_indexer)
            .field("sqlite_writer_nice", &self.sqlite_writer_nice)
            .finish()
    }
}

impl LogSettings {
    pub fn validate(&self) -> Result<(), ConfigError> {
        let invalid = |m: String| Err(ConfigError::Invalid(m));
        if !(1..=3_650).contains(&self.retention_days) {
            return invalid(format!("log.retention_days: must be 1 to 3650, got {}", self.retention_days));
        }
        if !(1..=50_000).contains(&self.batch_max_records) {
            return invalid(format!("log.batch_max_records: must be 1 to 50000, got {}", self.batch_max_records));
        }
        if !(1..=60_000).contains(&self.batch_max_wait_ms) {
            return invalid(format!("log.batch_max_wait_ms: must be 1 to 60000, got {}", self.batch_max_wait_ms));
        }
        if self.sqlite_writer_nice > 19 {
            return invalid(format!("log.sqlite_writer_nice: must be 0 to 19, got {}", self.sqlite_writer_nice));
        }
        if self.group_id.trim().is_empty() {
            return invalid("log.group_id: must not be empty".into());
        }
        match self.store {
            LogStoreKind::Sqlite if self.sqlite_path.as_os_str().is_empty() => {
                invalid("log.sqlite_path: must not be empty with log.store = \"sqlite\"".into())
            }
            LogStoreKind::Postgres => match (&self.postgres_url, &self.postgres_url_file) {
                (Some(_), Some(_)) => invalid("log.postgres_url, log.postgres_url_file: set one, not both".into()),
                (None, None) => invalid("log.postgres_url: required with log.store = \"postgres\" (or set log.postgres_url_file)".into()),
                (Some(url), None) if url.trim().is_empty() => invalid("log.postgres_url: must not be empty".into()),
                _ => Ok(()),
            },
            LogStoreKind::Sqlite => Ok(()),
        }
    }

    /// The PostgreSQL URL: `postgres_url`, or the contents of `postgres_url_file` (read now, so a rotated Secret
    /// is picked up at the next start). Errors name the key.
    pub fn postgres_url(&self) -> Result<String, ConfigError> {
        if let Some(url) = &self.postgres_url {
            return Ok(url.clone());
        }
        let Some(path) = &self.postgres_url_file else {
            return Err(ConfigError::Invalid("log.postgres_url: not set (nor log.postgres_url_file)".into()));
        };
        let text = std::fs::read_to_string(path)
            .map_err(|e| ConfigError::Invalid(format!("log.postgres_url_file: reading {}: {e}", path.display())))?;
        let url = text.trim();
        if url.is_empty() {
            return Err(ConfigError::Invalid(format!("log.postgres_url_file: {} is empty", path.display())));
        }
        Ok(url.to_owned())
    }
}

#[cfg(test)]
mod tests {
    use super::super::Config;
    use super::*;

    fn load(text: &str, env: &[(&str, &str)]) -> Result<Config, ConfigError> {
        Config::from_toml_with_env(text, "f.toml", env.iter().map(|(k, v)| (k.to_string(), v.to_string())))
    }

    #[test]
    fn defaults_to_an_embedded_sqlite_file_kept_thirty_days() {
        let c = load("", &[]).unwrap();
        assert_eq!(c.log.store, LogStoreKind::Sqlite);
        assert_eq!(c.log.retention_days, 30);
        assert!(c.log.sqlite_path.ends_with("delivery-log.sqlite3"));
        assert!(c.log.run_indexer);
        assert_eq!(c.log.sqlite_writer_nice, 10, "the log's writer yields the cores to deliveries");
        let c = load("[log]\nstore = \"postgres\"\npostgres_url = \"postgres://a@h/db\"\nrun_indexer = false\n", &[]).unwrap();
        assert!(!c.log.run_indexer, "an API replica that leaves indexing to another");
        let c = load("[log]\nrun_indexer = false\n", &[]).unwrap();
        assert!(!c.log.run_indexer, "a SQLite file indexed by `hookline log index` beside ingest");
    }

    #[test]
    fn postgres_takes_its_url_from_the_file_the_environment_or_a_secret_file() {
        let c = load("[log]\nstore = \"postgres\"\npostgres_url = \"postgres://a@h/db\"\n", &[]).unwrap();
        assert_eq!(c.log.postgres_url().unwrap(), "postgres://a@h/db");
        let c = load("[log]\nstore = \"postgres\"\n", &[("HOOKLINE_LOG__POSTGRES_URL", "postgres://b@h/db")]).unwrap();
        assert_eq!(c.log.postgres_url().unwrap(), "postgres://b@h/db");
        assert!(!format!("{:?}", c.log).contains("b@h"), "the URL (and its password) stays out of debug output");
        let dir = std::env::temp_dir().join(format!("hookline-log-settings-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("url");
        std::fs::write(&file, "postgres://c@h/db\n").unwrap();
        let c = load(&format!("[log]\nstore = \"postgres\"\npostgres_url_file = {:?}\n", file), &[]).unwrap();
        assert_eq!(c.log.postgres_url().unwrap(), "postgres://c@h/db");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn bad_values_name_the_key() {
        for (text, key) in [
            ("[log]\nstore = \"postgres\"\n", "log.postgres_url"),
            ("[log]\nstore = \"mysql\"\n", "store"),
            ("[log]\nretention_days = 0\n", "log.retention_days"),
            ("[log]\nbatch_max_records = 0\n", "log.batch_max_records"),
            ("[log]\nbatch_max_wait_ms = 0\n", "log.batch_max_wait_ms"),
            ("[log]\nsqlite_path = \"\"\n", "log.sqlite_path"),
            ("[log]\nrun_indexer = 0\n", "run_indexer"),
            ("[log]\nretention = 3\n", "retention"),
            ("[log]\nsqlite_writer_nice = 20\n", "log.sqlite_writer_nice"),
            ("[log]\nsqlite_writer_nice = -1\n", "sqlite_writer_nice"),
            ("[log]\nstore = \"postgres\"\npostgres_url = \"x\"\npostgres_url_file = \"/y\"\n", "log.postgres_url_file"),
        ] {
            let e = load(text, &[]).unwrap_err();
            assert!(e.to_string().contains(key), "{text}: {e}");
        }
        let c = load("", &[("HOOKLINE_LOG__SQLITE_WRITER_NICE", "0")]).unwrap();
        assert_eq!(c.log.sqlite_writer_nice, 0, "the environment can turn it off");
        let e = load("", &[("HOOKLINE_LOG__SQLITE_WRITER_NICE", "20")]).unwrap_err();
        assert!(e.to_string().contains("log.sqlite_writer_nice"), "{e}");
        let e =
            load("[log]\nstore = \"postgres\"\npostgres_url_file = \"/nonexistent/url\"\n", &[]).unwrap().log.postgres_url().unwrap_err();
        assert!(e.to_string().contains("log.postgres_url_file"), "{e}");
    }
}
