//! The one error type of `remat-exec`.

use remat_planner::PlannerError;
use thiserror::Error;

/// Everything that can go wrong while running a schedule: the model did not import (the
/// planner's error, unchanged), or the run failed at a node (named, with its op) for a reason
/// of the kind [`ExecFault`] says.
#[derive(Debug, Error, Clone, PartialEq)]
pub enum ExecError {
    /// Importing the model (or reading its stored weights) failed.
    #[error(transparent)]
    Planner(#[from] PlannerError),
    #[error("executor{}: {message}", exec_where(node, op))]
    Run {
        node: String,
        op: String,
        message: String,
        fault: ExecFault,
    },
}

/// What kind of executor failure an [`ExecError::Run`] is, so that callers can tell the
/// user's input from a fault of remat's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExecFault {
    /// The request asks for what this build cannot run: an op without a kernel, a device not
    /// compiled in or not present.
    Unsupported,
    /// The schedule does not belong to the model or is invalid for it.
    InvalidSchedule,
    /// The run needs more memory than the machine has available.
    Memory,
    /// A kernel or the runner failed on input it accepted.
    Failed,
    /// The run's [`remat_solver::Cancel`] was raised ([`crate::Executor::cancel`]): it stopped
    /// after the step it was running.
    Cancelled,
}

impl ExecError {
    /// An error of `fault`'s kind, about no node in particular.
    pub fn new(fault: ExecFault, message: impl Into<String>) -> ExecError {
        ExecError::Run {
            node: String::new(),
            op: String::new(),
            message: message.into(),
            fault,
        }
    }

    /// The fault's kind; an import error is the caller's input.
    pub fn fault(&self) -> Option<ExecFault> {
        match self {
            ExecError::Planner(_) => None,
            ExecError::Run { fault, .. } => Some(*fault),
        }
    }
}

pub type Result<T, E = ExecError> = std::result::Result<T, E>;

fn exec_where(node: &str, op: &str) -> String {
    match (node.is_empty(), op.is_empty()) {
        (true, true) => String::new(),
        (false, true) => format!(", node {node:?}"),
        (true, false) => format!(", {op}"),
        (false, false) => format!(", node {node:?} ({op})"),
    }
}
