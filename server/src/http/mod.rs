//! The planning service: HTTP API v1, the job queue and its workers, the SQLite plan store,
//! metrics, the OpenAPI document and `remat serve`.
//!
//! The service talks to the planning pipeline only through [`crate::engine::Engine`].

pub mod cache;
pub mod error;
pub mod jobs;
pub mod metrics;
pub mod openapi;
pub mod options;
pub mod routes;
pub mod store;
pub mod web;

pub use error::{ApiError, ErrorBody, ErrorObject, ServerError};
pub use store::{Status, Store};

use crate::engine::Engine;
use axum::extract::{DefaultBodyLimit, MatchedPath, Request, State};
use axum::http::{header, HeaderValue, Method, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use std::future::Future;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};
use subtle::ConstantTimeEq;
use tower_http::cors::{AllowOrigin, CorsLayer};
use tower_http::timeout::TimeoutLayer;
use tower_http::trace::TraceLayer;

/// `remat serve`: the planning service.
#[derive(Debug, Clone, clap::Args)]
pub struct ServeArgs {
    /// Address to listen on (loopback by default; give a token before exposing it).
    #[arg(long, default_value = "127.0.0.1:8080")]
    pub addr: String,
    /// The plan store (SQLite file, created if missing).
    #[arg(long, default_value = "remat.db")]
    pub db: PathBuf,
    /// Worker threads that run solves (default: the number of cores).
    #[arg(long)]
    pub workers: Option<usize>,
    /// Jobs that may wait for a worker; past it a POST answers 503 with Retry-After.
    #[arg(long, default_value_t = 64)]
    pub queue: usize,
    /// Largest request body: bytes or a size such as 512MiB, 2GiB, 100MB.
    #[arg(long, default_value = "512MiB", value_parser = parse_size)]
    pub body_limit: u64,
    /// Bearer token required on writes (POST, DELETE).
    #[arg(long, env = "REMAT_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
    /// Allow cross-origin requests from this origin (repeatable); CORS is off without it.
    #[arg(long = "cors", value_name = "ORIGIN")]
    pub cors: Vec<String>,
    /// Largest solver time limit (and LP bound time) a request may ask for, in seconds each;
    /// larger ones are clamped.
    #[arg(long, default_value_t = 300.0)]
    pub max_time_limit: f64,
    /// Seconds a request may take before it is answered 408.
    #[arg(long, default_value_t = 600)]
    pub request_timeout: u64,
}

/// Parses a size: bytes ("1048576") or a number with a unit (B, KB, MB, GB, KiB, MiB, GiB).
pub fn parse_size(text: &str) -> Result<u64, String> {
    let t = text.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (number, unit) = t.split_at(split);
    let number: f64 = number
        .parse()
        .map_err(|_| format!("{text:?} is not a size (e.g. 512MiB, 2GiB, 1000000)"))?;
    let factor: f64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1.0,
        "kb" => 1e3,
        "mb" => 1e6,
        "gb" => 1e9,
        "kib" => 1024.0,
        "mib" => 1024.0 * 1024.0,
        "gib" => 1024.0 * 1024.0 * 1024.0,
        other => {
            return Err(format!(
                "{text:?}: unknown unit {other:?} (use B, KB, MB, GB, KiB, MiB, GiB)"
            ))
        }
    };
    let bytes = number * factor;
    if !bytes.is_finite() || bytes < 1.0 || bytes > u64::MAX as f64 {
        return Err(format!("{text:?} is out of range"));
    }
    Ok(bytes as u64)
}

/// Settings of the service.
#[derive(Debug, Clone)]
pub struct Config {
    pub workers: usize,
    pub queue: usize,
    pub body_limit: usize,
    pub token: Option<String>,
    pub cors: Vec<String>,
    pub request_timeout: Duration,
    pub max_time_limit: f64,
    /// How long a POST waits for its job when the request does not say.
    pub default_wait: Duration,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            workers: std::thread::available_parallelism().map_or(2, |n| n.get()),
            queue: 64,
            body_limit: 512 * 1024 * 1024,
            token: None,
            cors: Vec::new(),
            request_timeout: Duration::from_secs(600),
            max_time_limit: 300.0,
            default_wait: Duration::from_secs(30),
        }
    }
}

impl Config {
    pub fn from_args(args: &ServeArgs) -> Result<Config, ServerError> {
        let defaults = Config::default();
        if args.workers == Some(0) {
            return Err(ServerError::Config {
                option: "workers",
                message: "needs at least one worker".to_string(),
            });
        }
        if !(args.max_time_limit.is_finite() && args.max_time_limit > 0.0) {
            return Err(ServerError::Config {
                option: "max-time-limit",
                message: format!(
                    "{} is not a positive number of seconds",
                    args.max_time_limit
                ),
            });
        }
        if args.request_timeout == 0 {
            return Err(ServerError::Config {
                option: "request-timeout",
                message: "must be at least one second".to_string(),
            });
        }
        Ok(Config {
            workers: args.workers.unwrap_or(defaults.workers),
            queue: args.queue,
            body_limit: usize::try_from(args.body_limit).unwrap_or(usize::MAX),
            token: args.token.clone().filter(|t| !t.is_empty()),
            cors: args.cors.clone(),
            request_timeout: Duration::from_secs(args.request_timeout),
            max_time_limit: args.max_time_limit,
            default_wait: defaults.default_wait,
        })
    }
}

struct Inner {
    engine: Arc<dyn Engine>,
    store: Arc<Store>,
    jobs: jobs::Jobs,
    metrics: Arc<metrics::Metrics>,
    config: Config,
    caps: options::Caps,
    cors: Vec<HeaderValue>,
    openapi: String,
    rendered: cache::Rendered,
    shutting_down: tokio::sync::watch::Sender<bool>,
}

/// What every handler shares: the engine, the store, the job queue, metrics and settings.
#[derive(Clone)]
pub struct AppState {
    inner: Arc<Inner>,
}

impl AppState {
    /// Starts the worker pool and makes the state for [`app`].
    pub fn new(
        engine: Arc<dyn Engine>,
        store: Arc<Store>,
        config: Config,
    ) -> Result<AppState, ServerError> {
        let cors = config
            .cors
            .iter()
            .map(|origin| {
                HeaderValue::from_str(origin).map_err(|e| ServerError::Config {
                    option: "cors",
                    message: format!("{origin:?} is not a valid origin: {e}"),
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        let metrics = Arc::new(metrics::Metrics::new()?);
        let jobs = jobs::Jobs::start(
            Arc::clone(&engine),
            Arc::clone(&store),
            Arc::clone(&metrics),
            config.workers,
            config.queue,
        )
        .map_err(|(index, source)| ServerError::Worker { index, source })?;
        let caps = options::Caps {
            max_time_limit: config.max_time_limit,
            default_wait: config.default_wait,
            max_wait: config
                .request_timeout
                .saturating_sub(Duration::from_secs(1)),
        };
        Ok(AppState {
            inner: Arc::new(Inner {
                engine,
                store,
                jobs,
                metrics,
                config,
                caps,
                cors,
                openapi: openapi::document(),
                rendered: cache::Rendered::new(64 * 1024 * 1024),
                shutting_down: tokio::sync::watch::channel(false).0,
            }),
        })
    }

    pub fn store(&self) -> &Arc<Store> {
        &self.inner.store
    }

    /// Stops waiting requests (they answer 202) and closes the store to writes: jobs still
    /// running are left in flight in the file, and the next start marks them interrupted.
    pub fn shutdown(&self) {
        self.inner.shutting_down.send_replace(true);
        self.inner.store.close();
    }
}

/// The HTTP application (all routes and middleware) over `state`.
pub fn app(state: AppState) -> Router {
    let mut router = Router::new()
        .route("/v1/plans", post(routes::post_plan).get(routes::list_plans))
        .route(
            "/v1/plans/{id}",
            get(routes::get_plan).delete(routes::delete_plan),
        )
        .route("/v1/sweeps", post(routes::post_sweep))
        .route(
            "/v1/sweeps/{id}",
            get(routes::get_sweep).delete(routes::delete_sweep),
        )
        .route("/v1/models/{hash}/history", get(routes::history))
        .route("/v1/openapi.json", get(routes::openapi))
        .route("/healthz", get(routes::healthz))
        .route("/metrics", get(routes::metrics))
        .fallback(web::fallback)
        .layer(DefaultBodyLimit::max(state.inner.config.body_limit))
        .layer(middleware::from_fn_with_state(state.clone(), require_token))
        .layer(TimeoutLayer::with_status_code(
            StatusCode::REQUEST_TIMEOUT,
            state.inner.config.request_timeout,
        ));
    if !state.inner.cors.is_empty() {
        router = router.layer(
            CorsLayer::new()
                .allow_origin(AllowOrigin::list(state.inner.cors.clone()))
                .allow_methods([Method::GET, Method::POST, Method::DELETE])
                .allow_headers([header::CONTENT_TYPE, header::AUTHORIZATION])
                .expose_headers([header::LOCATION, header::RETRY_AFTER]),
        );
    }
    router
        .layer(middleware::from_fn(error_shape))
        .layer(middleware::from_fn_with_state(state.clone(), track))
        .layer(TraceLayer::new_for_http())
        .with_state(state)
}

/// Writes need the bearer token when one is set (compared in constant time).
async fn require_token(State(state): State<AppState>, request: Request, next: Next) -> Response {
    let Some(token) = &state.inner.config.token else {
        return next.run(request).await;
    };
    let write = matches!(
        *request.method(),
        Method::POST | Method::DELETE | Method::PUT | Method::PATCH
    );
    if !write {
        return next.run(request).await;
    }
    let given = request
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split_once(' '))
        .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
        .map(|(_, t)| t.trim());
    match given {
        Some(t) if bool::from(t.as_bytes().ct_eq(token.as_bytes())) => next.run(request).await,
        Some(_) => unauthorized("the bearer token is wrong"),
        None => unauthorized("writes need `Authorization: Bearer <token>`"),
    }
}

fn unauthorized(message: &str) -> Response {
    ApiError::new(StatusCode::UNAUTHORIZED, "unauthorized", message)
        .with_header(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"))
        .into_response()
}

/// Gives every error response the one error shape, including those axum and tower-http make
/// themselves (404 routes, 405, 408, 413, bad path parameters).
async fn error_shape(request: Request, next: Next) -> Response {
    let method = request.method().clone();
    let path = request.uri().path().to_string();
    let response = next.run(request).await;
    let status = response.status();
    if !(status.is_client_error() || status.is_server_error()) {
        return response;
    }
    let is_json = response
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/json"));
    if is_json {
        return response;
    }
    let (mut parts, body) = response.into_parts();
    let text = axum::body::to_bytes(body, 16 * 1024)
        .await
        .ok()
        .map(|b| String::from_utf8_lossy(&b).trim().to_string())
        .unwrap_or_default();
    let message = match status {
        StatusCode::METHOD_NOT_ALLOWED => format!("method {method} is not allowed on {path}"),
        StatusCode::NOT_FOUND if text.is_empty() => format!("no route for {method} {path}"),
        StatusCode::REQUEST_TIMEOUT => "the request took too long".to_string(),
        s if s.is_server_error() => error::INTERNAL_MESSAGE.to_string(),
        _ if !text.is_empty() => text,
        s => s.canonical_reason().unwrap_or("error").to_string(),
    };
    if status.is_server_error() {
        tracing::error!(%method, %path, status = status.as_u16(), "server error without an error body");
    }
    let mut shaped = ApiError::new(status, error::code_for_status(status), message).into_response();
    parts.headers.remove(header::CONTENT_LENGTH);
    parts.headers.remove(header::CONTENT_TYPE);
    for (name, value) in parts.headers.iter() {
        shaped.headers_mut().entry(name).or_insert(value.clone());
    }
    shaped
}

/// Counts requests by route, method and status, and times them.
async fn track(State(state): State<AppState>, request: Request, next: Next) -> Response {
    let route = request
        .extensions()
        .get::<MatchedPath>()
        .map_or_else(|| "unmatched".to_string(), |m| m.as_str().to_string());
    let method = match *request.method() {
        Method::GET => "GET",
        Method::POST => "POST",
        Method::DELETE => "DELETE",
        Method::HEAD => "HEAD",
        Method::OPTIONS => "OPTIONS",
        Method::PUT => "PUT",
        Method::PATCH => "PATCH",
        _ => "other",
    };
    let started = Instant::now();
    let response = next.run(request).await;
    let m = &state.inner.metrics;
    m.requests
        .with_label_values(&[route.as_str(), method, response.status().as_str()])
        .inc();
    m.request_seconds
        .with_label_values(&[route.as_str()])
        .observe(started.elapsed().as_secs_f64());
    response
}

/// Serves `state` on `listener` until `shutdown` resolves, then stops gracefully: waiting
/// requests answer at once, open requests finish, and the store is closed to writes.
pub async fn serve_on(
    listener: tokio::net::TcpListener,
    state: AppState,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), ServerError> {
    let stopping = state.clone();
    let router = app(state.clone());
    axum::serve(listener, router)
        .with_graceful_shutdown(async move {
            shutdown.await;
            tracing::info!("shutting down");
            stopping.inner.shutting_down.send_replace(true);
        })
        .await?;
    state.shutdown();
    Ok(())
}

/// `remat serve`: opens the store, starts the workers, binds, prints the URL and serves until
/// Ctrl-C or SIGTERM.
pub async fn serve(args: ServeArgs, engine: Arc<dyn Engine>) -> Result<(), ServerError> {
    // Logs to stderr (`RUST_LOG` filters; default: requests and the service at info/debug),
    // unless the binary installed its own subscriber already.
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info,tower_http=debug"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .try_init();
    let config = Config::from_args(&args)?;
    let store = Store::open(&args.db).map_err(|source| ServerError::OpenStore {
        path: args.db.display().to_string(),
        source,
    })?;
    let interrupted = store.interrupted_on_open();
    let state = AppState::new(engine, Arc::new(store), config)?;
    let listener = tokio::net::TcpListener::bind(&args.addr)
        .await
        .map_err(|source| ServerError::Bind {
            addr: args.addr.clone(),
            source,
        })?;
    let addr = listener.local_addr()?;
    if !addr.ip().is_loopback() && state.inner.config.token.is_none() {
        tracing::warn!(%addr, "listening beyond loopback without a token: anyone who can reach it can post and delete");
    }
    println!(
        "remat serve: http://{addr}/ (store {}, {} workers, queue {})",
        args.db.display(),
        state.inner.jobs.workers(),
        state.inner.config.queue
    );
    if interrupted > 0 {
        println!("remat serve: {interrupted} job(s) left in flight by the last run are marked failed (interrupted)");
    }
    serve_on(listener, state, shutdown_signal()).await
}

/// Resolves on Ctrl-C or SIGTERM.
async fn shutdown_signal() {
    let ctrl_c = async {
        if let Err(e) = tokio::signal::ctrl_c().await {
            tracing::error!(error = %e, "cannot listen for Ctrl-C");
            std::future::pending::<()>().await;
        }
    };
    #[cfg(unix)]
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(e) => {
                tracing::error!(error = %e, "cannot listen for SIGTERM");
                std::future::pending::<()>().await;
            }
        }
    };
    #[cfg(not(unix))]
    let terminate = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => {}
        _ = terminate => {}
    }
}

#[cfg(test)]
mod tests {
    use super::parse_size;

    #[test]
    fn sizes() {
        let cases = [
            ("512MiB", Some(512 * 1024 * 1024)),
            ("1000", Some(1000)),
            ("2GiB", Some(2 * 1024 * 1024 * 1024)),
            ("100MB", Some(100_000_000)),
            ("1.5KiB", Some(1536)),
            ("12 parsecs", None),
            ("", None),
            ("0", None),
            ("MiB", None),
        ];
        for (text, want) in cases {
            assert_eq!(parse_size(text).ok(), want, "{text}");
        }
    }
}
