//! `remat-server`: the `remat` binary's library — the CLI's commands, the planning pipeline that
//! joins planner and solver, and the HTTP service with its plan store.
//!
//! Architecture invariant: this is the only crate that knows HTTP and the store.

pub mod engine;
pub mod pipeline;

// The HTTP service: routes, jobs, store.
pub mod http;
