//! The service's own failures: opening the store, binding the port, bad server flags (not an
//! API response: `remat serve` reports them and exits).

/// Failures of the service itself: opening the store, binding the port, bad server flags.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    // The store's error is in the message, not a `source`: an error chain says it once.
    #[error("cannot open the plan store {path}: {error}")]
    OpenStore {
        /// The file, or the database URL with its password redacted.
        path: String,
        error: super::store::StoreError,
    },
    #[error("plan store: {0}")]
    Store(super::store::StoreError),
    /// The OS's error is in the message, not a `source`: an error chain says it once.
    #[error("cannot bind {addr}: {error}")]
    Bind { addr: String, error: std::io::Error },
    #[error("cannot start worker thread {index}: {source}")]
    Worker {
        index: usize,
        #[source]
        source: std::io::Error,
    },
    #[error("server I/O: {0}")]
    Io(#[from] std::io::Error),
    #[error("metrics registry: {0}")]
    Metrics(#[from] prometheus::Error),
    #[error("invalid --{option}: {message}")]
    Config {
        option: &'static str,
        message: String,
    },
}
