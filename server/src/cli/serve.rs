//! `remat serve`: the planning service on the real engine.

use super::common::Failure;
use anyhow::Context;
use remat_server::http;
pub use remat_server::http::ServeArgs;
use remat_server::pipeline::Pipeline;
use std::sync::Arc;

/// Serves until Ctrl-C or SIGTERM on an async runtime of its own.
pub fn exec(args: ServeArgs) -> Result<(), Failure> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    runtime
        .block_on(http::serve(args, Arc::new(Pipeline::new())))
        .map_err(|e| Failure {
            code: 1,
            error: anyhow::Error::new(e),
        })
}
