//! `remat-server`: the `remat` binary's library — the CLI's commands, the planning pipeline that
//! joins planner and solver, and the HTTP service with its plan store.
//!
//! Architecture invariant: this is the only crate that knows HTTP and the store.

pub mod engine;
pub mod gate;
pub mod pipeline;

// The HTTP service: routes, jobs, store.
pub mod http;

/// Bytes for humans: "512 B", "1.5 GiB" (the planner's formatter, so every output agrees).
pub use remat_planner::inspect::human_bytes;
