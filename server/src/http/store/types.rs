//! What both stores hold and answer: a job's status and kind, the job as it is created, a
//! claim's outcome, the rows and records read back, and the store's error.

use crate::http::error::ErrorObject;
use serde::{Deserialize, Serialize};

/// Where a job is (the `status` of a plan or sweep record).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum JobStatus {
    Queued,
    Solving,
    Validating,
    Done,
    Failed,
}

impl JobStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            JobStatus::Queued => "queued",
            JobStatus::Solving => "solving",
            JobStatus::Validating => "validating",
            JobStatus::Done => "done",
            JobStatus::Failed => "failed",
        }
    }

    pub fn parse(text: &str) -> Option<JobStatus> {
        Some(match text {
            "queued" => JobStatus::Queued,
            "solving" => JobStatus::Solving,
            "validating" => JobStatus::Validating,
            "done" => JobStatus::Done,
            "failed" => JobStatus::Failed,
            _ => return None,
        })
    }

    pub fn is_terminal(self) -> bool {
        matches!(self, JobStatus::Done | JobStatus::Failed)
    }
}

/// What a job computes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Kind {
    Plan,
    Sweep,
}

impl Kind {
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Plan => "plan",
            Kind::Sweep => "sweep",
        }
    }

    /// The kind of a stored name ([`Kind::as_str`]).
    pub fn parse(text: &str) -> Option<Kind> {
        [Kind::Plan, Kind::Sweep]
            .into_iter()
            .find(|k| k.as_str() == text)
    }
}

/// A timestamp as both stores keep them (RFC 3339, milliseconds, UTC).
pub fn now() -> String {
    humantime::format_rfc3339_millis(std::time::SystemTime::now()).to_string()
}

/// A job as it is created.
#[derive(Debug, Clone)]
pub struct NewJob<'a> {
    pub id: &'a str,
    pub kind: Kind,
    pub model_hash: &'a str,
    pub model_name: Option<&'a str>,
    pub model_format: &'a str,
    /// The options as applied, a JSON object.
    pub options: &'a str,
    pub cache_key: &'a str,
    pub created_at: &'a str,
}

/// Which earlier job of the same kind and cache key a submission takes as its answer instead
/// of making one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reuse {
    /// One done or in flight: an identical request.
    Any,
    /// One in flight only: a request planned again because its stored plan was superseded,
    /// which an identical request arriving with it (also finding the stored plan superseded)
    /// follows rather than making a second job of the same problem.
    InFlight,
    /// None: asked to plan again (`refresh`).
    Never,
}

/// What [`Store::claim`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Claim {
    /// The job was created.
    Created,
    /// A job with the same model and options exists (done or in flight): its id.
    Existing(String),
    /// The shared queue holds as many waiting jobs as it may (PostgreSQL; the embedded queue
    /// says so when the job is queued).
    QueueFull,
}

/// A summary row: everything but the engine's full document.
#[derive(Debug, Clone)]
pub struct Row {
    pub id: String,
    pub status: JobStatus,
    pub model_hash: String,
    pub model_name: Option<String>,
    pub model_format: String,
    pub options: String,
    pub created_at: String,
    pub updated_at: String,
    pub summary: Option<String>,
    pub error: Option<String>,
    pub error_status: Option<u16>,
}

/// A full record: the row and the engine's document, as JSON text.
#[derive(Debug, Clone)]
pub struct Record {
    pub row: Row,
    pub result: Option<String>,
}

/// The error a job in flight gets when the server restarts under it.
pub fn interrupted_error() -> ErrorObject {
    ErrorObject {
        code: "interrupted".to_string(),
        message: "interrupted by a restart: the server stopped while this job was in flight; \
                  post the model again"
            .to_string(),
        details: serde_json::Value::Null,
    }
}

/// A store failure. [`StoreError::is_unavailable`] tells a database that cannot be reached or
/// cannot serve now (PostgreSQL down or restarting, no answer within `REMAT_DB_TIMEOUT`, no
/// connection within the pool's timeout, too many connections, a password refused: the service
/// answers 503 with `Retry-After`) from a query that failed (500).
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("sqlite: {0}")]
    Sqlite(#[from] rusqlite::Error),
    /// A query or connection that failed: the message is the database's own (severity,
    /// SQLSTATE, message, detail, hint), which tokio-postgres's "db error" leaves to its source;
    /// not a `source` itself, so that an error chain says it once.
    #[error("postgres: {}", postgres_message(.0))]
    Postgres(tokio_postgres::Error),
    /// No connection to the database.
    #[error("the database is unreachable: {0}")]
    Unavailable(String),
    /// The database holds what this version cannot read.
    #[error("{0}")]
    Corrupt(String),
    /// A SQLite store that another process has open (or whose lock cannot be taken).
    #[error("{0}")]
    InUse(String),
    /// A store's settings that cannot work (a PostgreSQL URL's TLS parameters): the message
    /// names the setting.
    #[error("{0}")]
    Config(String),
}

impl From<tokio_postgres::Error> for StoreError {
    fn from(e: tokio_postgres::Error) -> Self {
        StoreError::Postgres(e)
    }
}

/// What a PostgreSQL error says: the server's report where there is one (`ERROR 42703:
/// column "attempts" does not exist`, with its detail and hint), otherwise the client's error
/// and its causes.
pub fn postgres_message(e: &tokio_postgres::Error) -> String {
    if let Some(db) = e.as_db_error() {
        let mut m = format!("{} {}: {}", db.severity(), db.code().code(), db.message());
        if let Some(d) = db.detail() {
            m.push_str(&format!(" (detail: {d})"));
        }
        if let Some(h) = db.hint() {
            m.push_str(&format!(" (hint: {h})"));
        }
        return m;
    }
    let mut m = e.to_string();
    let mut source: Option<&(dyn std::error::Error + 'static)> = std::error::Error::source(e);
    while let Some(s) = source {
        let text = s.to_string();
        if !m.ends_with(&text) {
            m.push_str(": ");
            m.push_str(&text);
        }
        source = s.source();
    }
    m
}

impl StoreError {
    /// Whether the database could not be reached (as opposed to a query that failed).
    pub fn is_unavailable(&self) -> bool {
        match self {
            StoreError::Unavailable(_) => true,
            StoreError::Postgres(e) => postgres_unreachable(e),
            _ => self.is_busy(),
        }
    }

    /// Whether the SQLite file stayed locked by another connection past the busy timeout (a
    /// backup, an `sqlite3` shell holding a transaction): it passes with time, as an
    /// unreachable database does.
    pub fn is_busy(&self) -> bool {
        matches!(
            self,
            StoreError::Sqlite(rusqlite::Error::SqliteFailure(
                rusqlite::ffi::Error {
                    code: rusqlite::ErrorCode::DatabaseBusy | rusqlite::ErrorCode::DatabaseLocked,
                    ..
                },
                _,
            ))
        )
    }
}

/// Whether a SQLSTATE is the database's state, not the query's, and passes with time (the
/// service answers 503 `database_unavailable` with `Retry-After`, a worker retries its write):
/// class 08 (connection exception), 57 (operator intervention: the server shutting down or
/// restarting), 53 (insufficient resources: too many connections, out of memory, disk full),
/// 28 (invalid authorization, which only a connection's start raises: a password rotated
/// before the replica's URL), and 40001 / 40P01 (a serialization failure or a deadlock, which
/// the same request retried passes).
pub fn transient_sqlstate(code: &str) -> bool {
    ["08", "57", "53", "28"].iter().any(|c| code.starts_with(c))
        || code == "40001"
        || code == "40P01"
}

/// Whether a PostgreSQL error says the database cannot serve now rather than that a query
/// failed: a closed connection, an I/O error, or a SQLSTATE that passes with time:
/// [`transient_sqlstate`].
pub fn postgres_unreachable(e: &tokio_postgres::Error) -> bool {
    if e.is_closed() {
        return true;
    }
    if let Some(db) = e.as_db_error() {
        return transient_sqlstate(db.code().code());
    }
    let mut source: Option<&(dyn std::error::Error + 'static)> = std::error::Error::source(e);
    while let Some(s) = source {
        if s.is::<std::io::Error>() {
            return true;
        }
        source = s.source();
    }
    false
}

#[cfg(test)]
mod tests {
    use super::transient_sqlstate;

    #[test]
    fn resource_and_authorization_errors_are_transient_a_failed_query_is_not() {
        for code in [
            "08006", "57P01", "57P03", "53300", "53100", "28P01", "28000", "40001", "40P01",
        ] {
            assert!(transient_sqlstate(code), "{code}");
        }
        for code in ["22021", "42703", "23505", "42P01", "XX000"] {
            assert!(!transient_sqlstate(code), "{code}");
        }
    }
}
