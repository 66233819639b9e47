//! Stopping a plan that nobody waits for any more.
//!
//! A [`Cancel`] is shared between whoever runs a plan (a service's worker) and whoever may give
//! up on it (a `DELETE` of the job). The plan looks at it where it would look at its clock: the
//! search every few evaluations, the MILP's wait each tenth of a second, `auto` between its
//! phases, a sweep between its budgets. A cancelled plan answers [`SolverError::Cancelled`]
//! there; what runs to its end regardless of the time limit (the baselines, the segment
//! program, one peak descent) also runs to its end regardless of a cancel.

use crate::error::{Result, SolverError};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// A flag that asks a running plan to stop. [`Cancel::default`] is never cancelled and costs
/// nothing to look at; clones of one [`Cancel::armed`] share its flag.
#[derive(Debug, Clone, Default)]
pub struct Cancel(Option<Arc<AtomicBool>>);

impl Cancel {
    /// A flag that [`Cancel::cancel`] raises, for this value and all its clones.
    pub fn armed() -> Self {
        Cancel(Some(Arc::new(AtomicBool::new(false))))
    }

    /// Asks every holder of this flag to stop.
    pub fn cancel(&self) {
        if let Some(flag) = &self.0 {
            flag.store(true, Ordering::SeqCst);
        }
    }

    /// Whether [`Cancel::cancel`] was called.
    pub fn is_cancelled(&self) -> bool {
        self.0.as_ref().is_some_and(|f| f.load(Ordering::Relaxed))
    }

    /// `Err(SolverError::Cancelled)` once cancelled.
    pub fn check(&self) -> Result<()> {
        if self.is_cancelled() {
            Err(SolverError::Cancelled)
        } else {
            Ok(())
        }
    }
}

/// Two cancels are the same when they share a flag (or neither has one): what is planned does
/// not depend on it.
impl PartialEq for Cancel {
    fn eq(&self, other: &Self) -> bool {
        match (&self.0, &other.0) {
            (None, None) => true,
            (Some(a), Some(b)) => Arc::ptr_eq(a, b),
            _ => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clones_share_the_flag_and_the_default_never_stops() {
        let c = Cancel::armed();
        let held = c.clone();
        assert!(held.check().is_ok());
        c.cancel();
        assert!(held.is_cancelled());
        assert_eq!(held.check(), Err(SolverError::Cancelled));
        let never = Cancel::default();
        never.cancel();
        assert!(!never.is_cancelled());
        assert_eq!(c, held);
        assert_ne!(c, Cancel::armed());
        assert_eq!(never, Cancel::default());
    }
}
