//! `remat`: plan activation checkpointing for training.
//!
//! Exit codes: 0 success, 1 internal failure (or a validation that failed its checks), 2 usage
//! or input error, 3 infeasible budget.

mod cli;

use clap::Parser;
use std::process::ExitCode;

/// The counting allocator: `remat validate` reports the process's real heap peak beside the
/// executor's live-tensor accounting.
#[global_allocator]
static ALLOC: remat_exec::Counting = remat_exec::Counting;

/// Lets a command whose output is piped into `head` end quietly, as command-line tools do, instead
/// of failing on a closed pipe. Not for `serve`, which must outlive clients that hang up.
fn exit_quietly_on_closed_pipe() {
    #[cfg(unix)]
    // SAFETY: restoring the default action of one signal at start-up, before any thread exists.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
}

fn main() -> ExitCode {
    // Before any other thread allocates: glibc fixes its arena count then (see the function).
    remat_exec::alloc::reuse_freed_pages();
    let parsed = cli::Cli::parse();
    if let Err(f) = parsed.install_rates() {
        eprintln!("error: {:#}", f.error);
        return ExitCode::from(f.code);
    }
    let command = parsed.command;
    if !command.serves() {
        exit_quietly_on_closed_pipe();
        // Warnings only unless RUST_LOG says more (`remat_solver=debug`: each plan's phases
        // and their times); `serve` and `worker` install their own.
        remat_server::http::init_logging("warn");
    }
    match command.exec() {
        Ok(()) => ExitCode::SUCCESS,
        Err(f) => {
            eprintln!("error: {:#}", f.error);
            ExitCode::from(f.code)
        }
    }
}
