//! The one integration-test binary of `remat-planner`.

mod build;
mod errors;
mod external;
mod fixtures;
mod fuzz;
mod hostile;
mod ops;
mod shapes;
mod training;

/// The package's directory: cargo's at run time, else the build's. A test binary built in
/// another clone that shares the cargo target folder (as CI's does) is reused here unchanged,
/// with that clone's path in `env!`.
pub fn manifest_dir() -> std::path::PathBuf {
    std::env::var_os("CARGO_MANIFEST_DIR")
        .map_or_else(|| env!("CARGO_MANIFEST_DIR").into(), Into::into)
}
