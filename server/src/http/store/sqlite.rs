//! The embedded plan store: one SQLite file (WAL) holding every plan and sweep job, its options, its
//! status and its result.
//!
//! Writes go through one connection; reads use a small pool of connections so that many
//! readers do not wait on each other (WAL lets them read while a job writes).
//!
//! One process owns a store file: opening marks the jobs a previous run left in flight as
//! failed, which is right only when no other process runs them. An exclusive lock on a file
//! beside its real path (`<file>.lock`, through symbolic links), taken before anything is read
//! or written and held while the store is open, refuses a second `remat serve` on the same file (a double start, an
//! overlapping restart, a blue/green rollout on a shared volume) instead of letting it fail
//! the first one's running jobs. Replicas share PostgreSQL instead.

use super::types::{
    interrupted_error, now, Claim, JobStatus, Kind, NewJob, Record, Reuse, Row, StoreError,
};
use crate::http::error::ErrorObject;
use rusqlite::{params, Connection, OpenFlags, OptionalExtension};
use std::fs::{File, TryLockError};
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard};

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS jobs (
    seq          INTEGER PRIMARY KEY AUTOINCREMENT,
    id           TEXT NOT NULL UNIQUE,
    kind         TEXT NOT NULL,
    model_hash   TEXT NOT NULL,
    model_name   TEXT,
    model_format TEXT NOT NULL,
    options      TEXT NOT NULL,
    cache_key    TEXT NOT NULL,
    status       TEXT NOT NULL,
    created_at   TEXT NOT NULL,
    updated_at   TEXT NOT NULL,
    summary      TEXT,
    result       TEXT,
    error        TEXT,
    error_status INTEGER
);
CREATE INDEX IF NOT EXISTS jobs_model ON jobs(model_hash, kind, seq);
CREATE INDEX IF NOT EXISTS jobs_cache ON jobs(cache_key, seq);
";

const ROW_COLUMNS: &str = "id, status, model_hash, model_name, model_format, options, created_at, \
                           updated_at, summary, error, error_status";

/// The SQLite plan store.
pub struct SqliteStore {
    writer: Mutex<Connection>,
    readers: Vec<Mutex<Connection>>,
    next_reader: AtomicUsize,
    closed: AtomicBool,
    interrupted: usize,
    /// The lock that makes this process the file's one owner, held until the store is closed
    /// (`None` in memory, and once closed).
    owner: Mutex<Option<File>>,
}

fn lock(conn: &Mutex<Connection>) -> MutexGuard<'_, Connection> {
    // A panic while holding the lock cannot leave SQLite inconsistent (statements are atomic).
    conn.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl SqliteStore {
    /// Opens (creating if needed) the store at `path`, in WAL mode, and marks the jobs a
    /// previous run left in flight as failed ("interrupted by a restart"). A store another
    /// process has open is [`StoreError::InUse`], before anything is read or written.
    pub fn open(path: &Path) -> Result<SqliteStore, StoreError> {
        let owner = Self::own(path)?;
        let writer = Connection::open(path)?;
        writer.pragma_update(None, "journal_mode", "WAL")?;
        Self::configure(&writer)?;
        writer.execute_batch(SCHEMA)?;
        let mut readers = Vec::new();
        for _ in 0..4 {
            let reader = Connection::open_with_flags(
                path,
                OpenFlags::SQLITE_OPEN_READ_ONLY
                    | OpenFlags::SQLITE_OPEN_NO_MUTEX
                    | OpenFlags::SQLITE_OPEN_URI,
            )?;
            Self::configure(&reader)?;
            readers.push(Mutex::new(reader));
        }
        Ok(Self::finish_open(writer, readers, Some(owner))?)
    }

    /// Takes the exclusive lock of the store at `path` (on `<real path>.lock`, created if
    /// missing; released when the file is closed, by the process's end too, a kill included).
    fn own(path: &Path) -> Result<File, StoreError> {
        // Beside the file itself, through any symbolic link to it: two paths to one store take
        // one lock (a hard link is another name for the file, which this cannot see).
        let real = std::fs::canonicalize(path)
            .or_else(|_| {
                // Not made yet: its folder's real path, and its name.
                let parent = path.parent().filter(|p| !p.as_os_str().is_empty());
                let folder = std::fs::canonicalize(parent.unwrap_or(Path::new(".")))?;
                Ok::<_, std::io::Error>(folder.join(path.file_name().unwrap_or_default()))
            })
            .unwrap_or_else(|_| path.to_path_buf());
        let mut name = real.as_os_str().to_owned();
        name.push(".lock");
        let lock_path = std::path::PathBuf::from(name);
        let file = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&lock_path)
            .map_err(|e| {
                StoreError::InUse(format!("cannot open its lock {}: {e}", lock_path.display()))
            })?;
        match file.try_lock() {
            Ok(()) => Ok(file),
            Err(TryLockError::WouldBlock) => Err(StoreError::InUse(format!(
                "another process has it open (its lock {} is held): one remat serve owns a SQLite \
                 store; stop the other one first, give this one another --db, or share a \
                 PostgreSQL database between replicas",
                lock_path.display()
            ))),
            Err(TryLockError::Error(e)) => Err(StoreError::InUse(format!(
                "cannot lock {}: {e}",
                lock_path.display()
            ))),
        }
    }

    /// A store in memory (for tests): one connection for reads and writes.
    pub fn open_in_memory() -> Result<SqliteStore, rusqlite::Error> {
        let writer = Connection::open_in_memory()?;
        Self::configure(&writer)?;
        writer.execute_batch(SCHEMA)?;
        Self::finish_open(writer, Vec::new(), None)
    }

    fn configure(conn: &Connection) -> Result<(), rusqlite::Error> {
        conn.busy_timeout(std::time::Duration::from_secs(10))?;
        conn.pragma_update(None, "synchronous", "NORMAL")?;
        Ok(())
    }

    fn finish_open(
        writer: Connection,
        readers: Vec<Mutex<Connection>>,
        owner: Option<File>,
    ) -> Result<SqliteStore, rusqlite::Error> {
        let error = serde_json::to_string(&interrupted_error()).unwrap_or_default();
        let interrupted = writer.execute(
            "UPDATE jobs SET status = 'failed', error = ?1, error_status = 500, updated_at = ?2
             WHERE status IN ('queued', 'solving', 'validating')",
            params![error, now()],
        )?;
        if interrupted > 0 {
            tracing::warn!(
                jobs = interrupted,
                "marked jobs left in flight by the last run as failed"
            );
        }
        Ok(SqliteStore {
            writer: Mutex::new(writer),
            readers,
            next_reader: AtomicUsize::new(0),
            closed: AtomicBool::new(false),
            interrupted,
            owner: Mutex::new(owner),
        })
    }

    /// How many in-flight jobs opening this store marked as interrupted.
    pub fn interrupted_on_open(&self) -> usize {
        self.interrupted
    }

    /// Refuses every later write (jobs still running after a shutdown must not write: the next
    /// run owns the file and has marked them interrupted), and gives up the file's lock: the
    /// next run may open it now.
    pub fn close(&self) {
        let _guard = lock(&self.writer);
        self.closed.store(true, Ordering::SeqCst);
        drop(self.owner.lock().unwrap_or_else(|p| p.into_inner()).take());
    }

    pub fn is_closed(&self) -> bool {
        self.closed.load(Ordering::SeqCst)
    }

    fn reader(&self) -> MutexGuard<'_, Connection> {
        if self.readers.is_empty() {
            return lock(&self.writer);
        }
        let start = self.next_reader.fetch_add(1, Ordering::Relaxed);
        for i in 0..self.readers.len() {
            let conn = &self.readers[(start + i) % self.readers.len()];
            if let Ok(guard) = conn.try_lock() {
                return guard;
            }
        }
        lock(&self.readers[start % self.readers.len()])
    }

    /// Runs a write unless the store is closed; `Ok(None)` when it is.
    fn write<T>(
        &self,
        f: impl FnOnce(&Connection) -> Result<T, rusqlite::Error>,
    ) -> Result<Option<T>, rusqlite::Error> {
        let conn = lock(&self.writer);
        if self.closed.load(Ordering::SeqCst) {
            return Ok(None);
        }
        f(&conn).map(Some)
    }

    /// Creates the job, unless a job of the same kind and cache key that `reuse` takes exists
    /// (done or in flight, or in flight only): then that job's id. One step under the write
    /// lock, so identical posts arriving together make one job. `None` when the store is closed.
    pub fn claim(&self, job: &NewJob<'_>, reuse: Reuse) -> Result<Option<Claim>, rusqlite::Error> {
        self.write(|c| {
            let taken = match reuse {
                Reuse::Any => Some("status != 'failed'"),
                Reuse::InFlight => Some("status NOT IN ('done', 'failed')"),
                Reuse::Never => None,
            };
            if let Some(taken) = taken {
                let existing: Option<String> = c
                    .prepare_cached(&format!(
                        "SELECT id FROM jobs WHERE cache_key = ?1 AND kind = ?2 AND {taken}
                         ORDER BY seq DESC LIMIT 1"
                    ))?
                    .query_row(params![job.cache_key, job.kind.as_str()], |r| r.get(0))
                    .optional()?;
                if let Some(id) = existing {
                    return Ok(Claim::Existing(id));
                }
            }
            c.execute(
                "INSERT INTO jobs (id, kind, model_hash, model_name, model_format, options, cache_key,
                                   status, created_at, updated_at)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, 'queued', ?8, ?8)",
                params![
                    job.id,
                    job.kind.as_str(),
                    job.model_hash,
                    job.model_name,
                    job.model_format,
                    job.options,
                    job.cache_key,
                    job.created_at
                ],
            )?;
            Ok(Claim::Created)
        })
    }

    pub fn set_status(&self, id: &str, status: JobStatus) -> Result<(), rusqlite::Error> {
        self.write(|c| {
            c.execute(
                "UPDATE jobs SET status = ?2, updated_at = ?3 WHERE id = ?1 AND status NOT IN ('done', 'failed')",
                params![id, status.as_str(), now()],
            )
        })?;
        Ok(())
    }

    pub fn finish(
        &self,
        id: &str,
        result: &str,
        summary: Option<&str>,
    ) -> Result<(), rusqlite::Error> {
        self.write(|c| {
            c.execute(
                "UPDATE jobs SET status = 'done', result = ?2, summary = ?3, updated_at = ?4 WHERE id = ?1",
                params![id, result, summary, now()],
            )
        })?;
        Ok(())
    }

    pub fn fail(&self, id: &str, status: u16, error: &ErrorObject) -> Result<(), rusqlite::Error> {
        let text = serde_json::to_string(error)
            .map_err(|e| rusqlite::Error::ToSqlConversionFailure(Box::new(e)))?;
        self.write(|c| {
            c.execute(
                "UPDATE jobs SET status = 'failed', error = ?2, error_status = ?3, updated_at = ?4 WHERE id = ?1",
                params![id, text, status, now()],
            )
        })?;
        Ok(())
    }

    /// Replaces the document of a finished job of `kind` (a validation attached to it); false
    /// when there is no such job done.
    pub fn replace_result(
        &self,
        kind: Kind,
        id: &str,
        result: &str,
    ) -> Result<bool, rusqlite::Error> {
        let n = self.write(|c| {
            c.execute(
                "UPDATE jobs SET result = ?3, updated_at = ?4 WHERE id = ?1 AND kind = ?2 AND status = 'done'",
                params![id, kind.as_str(), result, now()],
            )
        })?;
        Ok(n.unwrap_or(0) > 0)
    }

    /// Deletes a job of `kind`; false when there is none.
    pub fn delete(&self, kind: Kind, id: &str) -> Result<bool, rusqlite::Error> {
        let n = self.write(|c| {
            c.execute(
                "DELETE FROM jobs WHERE id = ?1 AND kind = ?2",
                params![id, kind.as_str()],
            )
        })?;
        Ok(n.unwrap_or(0) > 0)
    }

    fn row(r: &rusqlite::Row<'_>) -> Result<Row, rusqlite::Error> {
        let status: String = r.get(1)?;
        Ok(Row {
            id: r.get(0)?,
            status: JobStatus::parse(&status).ok_or_else(|| {
                rusqlite::Error::FromSqlConversionFailure(
                    1,
                    rusqlite::types::Type::Text,
                    format!("unknown status {status:?}").into(),
                )
            })?,
            model_hash: r.get(2)?,
            model_name: r.get(3)?,
            model_format: r.get(4)?,
            options: r.get(5)?,
            created_at: r.get(6)?,
            updated_at: r.get(7)?,
            summary: r.get(8)?,
            error: r.get(9)?,
            error_status: r.get(10)?,
        })
    }

    /// One job of `kind`, with its engine document.
    pub fn get(&self, kind: Kind, id: &str) -> Result<Option<Record>, rusqlite::Error> {
        let sql = format!("SELECT {ROW_COLUMNS}, result FROM jobs WHERE id = ?1 AND kind = ?2");
        self.reader()
            .prepare_cached(&sql)?
            .query_row(params![id, kind.as_str()], |r| {
                Ok(Record {
                    row: Self::row(r)?,
                    result: r.get(11)?,
                })
            })
            .optional()
    }

    /// Jobs of `kind`, newest first, optionally of one model.
    pub fn list(
        &self,
        kind: Kind,
        model: Option<&str>,
        limit: usize,
    ) -> Result<Vec<Row>, rusqlite::Error> {
        let conn = self.reader();
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let rows = match model {
            Some(hash) => {
                let sql = format!(
                    "SELECT {ROW_COLUMNS} FROM jobs WHERE kind = ?1 AND model_hash = ?2 ORDER BY seq DESC LIMIT ?3"
                );
                let mut stmt = conn.prepare_cached(&sql)?;
                let rows = stmt.query_map(params![kind.as_str(), hash, limit], Self::row)?;
                rows.collect::<Result<Vec<_>, _>>()?
            }
            None => {
                let sql = format!(
                    "SELECT {ROW_COLUMNS} FROM jobs WHERE kind = ?1 ORDER BY seq DESC LIMIT ?2"
                );
                let mut stmt = conn.prepare_cached(&sql)?;
                let rows = stmt.query_map(params![kind.as_str(), limit], Self::row)?;
                rows.collect::<Result<Vec<_>, _>>()?
            }
        };
        Ok(rows)
    }

    /// Every plan of one model, oldest first.
    pub fn history(&self, model_hash: &str) -> Result<Vec<Row>, rusqlite::Error> {
        let conn = self.reader();
        let sql = format!("SELECT {ROW_COLUMNS} FROM jobs WHERE kind = 'plan' AND model_hash = ?1 ORDER BY seq ASC");
        let mut stmt = conn.prepare_cached(&sql)?;
        let rows = stmt.query_map(params![model_hash], Self::row)?;
        rows.collect()
    }

    /// A cheap liveness query.
    pub fn ping(&self) -> Result<(), rusqlite::Error> {
        self.reader().query_row("SELECT 1", [], |_| Ok(()))
    }
}
