//! One HiGHS solve with a deadline that holds.
//!
//! HiGHS checks its `time_limit` at fixed points: in simplex iterations and between the MIP
//! solver's phases. A MIP's root node waits, without checking the clock, for an
//! analytic-centre computation (an interior-point solve with no time limit of its own, always
//! on in HiGHS 1.16), and long separation rounds run between two checks; so a MILP can answer
//! well after its time limit (by how much: `docs/bench/solver-tuning.md`). A service that
//! promised an answer in `time_limit` seconds must not.
//!
//! [`solve`] runs HiGHS on a thread of its own and waits for it until the deadline (the time
//! limit plus a small grace). Through HiGHS's C callbacks it keeps, as the solve goes, the
//! best solution found (`MipImprovingSolution`, in the model's own columns) and the MIP's dual
//! bound (`MipInterrupt`, which HiGHS raises at each of its limit checks). When the deadline
//! passes first, [`solve`] answers with those and asks HiGHS to stop at its next check (the
//! interrupt flag); the thread ends on its own then, owning the model until it does.

use crate::cancel::Cancel;
use crate::error::{Result, SolverError};
use highs_sys::{
    kHighsCallbackMipImprovingSolution, kHighsCallbackMipInterrupt, HighsCallbackDataIn,
    HighsCallbackDataOut, Highs_setCallback, Highs_startCallback,
};
use std::ffi::{c_char, c_int, c_void};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

/// What the callbacks saw of a MIP solve so far.
#[derive(Debug, Default, Clone)]
pub(crate) struct Progress {
    /// The best solution found: its objective and its column values.
    pub incumbent: Option<(f64, Vec<f64>)>,
    /// The MIP's dual bound at HiGHS's last limit check (`None` before one).
    pub dual_bound: Option<f64>,
}

/// How a solve ended.
// `Done`'s progress is read by the tests, which check the callbacks against HiGHS's answer.
#[cfg_attr(not(test), allow(dead_code))]
pub(crate) enum Run {
    /// HiGHS returned in time (with what the callbacks saw on the way).
    Done(highs::SolvedModel, Progress),
    /// The deadline passed first: what the solve had found by then.
    Overran(Progress),
}

#[derive(Default)]
struct Shared {
    progress: Progress,
    stop: bool,
}

/// The models move to the solving thread and back; a HiGHS instance belongs to no thread.
struct Sendable<T>(T);
// SAFETY: a `Highs` object holds no thread-affine state; HiGHS's task scheduler is per calling
// thread and lives on the thread that runs the solve. The value is used by one thread at a time.
unsafe impl<T> Send for Sendable<T> {}

/// The C callback: records improving solutions and the dual bound, and answers HiGHS's limit
/// checks with "interrupt" once the caller has given up waiting.
unsafe extern "C" fn on_event(
    kind: c_int,
    _message: *const c_char,
    out: *const HighsCallbackDataOut,
    input: *mut HighsCallbackDataIn,
    user: *mut c_void,
) {
    // A panic must never unwind into C++.
    let _ = std::panic::catch_unwind(|| {
        if out.is_null() || user.is_null() {
            return;
        }
        // SAFETY: `user` is the `Mutex<Shared>` inside the `Arc` that the solving thread keeps
        // alive until HiGHS has returned; `out` and `input` are HiGHS's, valid for this call.
        let (shared, out) = unsafe { (&*(user as *const Mutex<Shared>), &*out) };
        let Ok(mut s) = shared.lock() else { return };
        if kind == kHighsCallbackMipImprovingSolution as c_int {
            let n = usize::try_from(out.mip_solution_size).unwrap_or(0);
            if !out.mip_solution.is_null() && n > 0 {
                // SAFETY: HiGHS hands `mip_solution_size` doubles at `mip_solution`.
                let x = unsafe { std::slice::from_raw_parts(out.mip_solution, n) }.to_vec();
                // HiGHS reports only improvements (in the model's sense): the latest is best.
                s.progress.incumbent = Some((out.objective_function_value, x));
            }
        } else if kind == kHighsCallbackMipInterrupt as c_int {
            if out.mip_dual_bound.is_finite() {
                s.progress.dual_bound = Some(out.mip_dual_bound);
            }
            if s.stop && !input.is_null() {
                // SAFETY: as above.
                unsafe { (*input).user_interrupt = 1 };
            }
        }
    });
}

/// Solves `model` (its `time_limit` option already set to `limit`), waiting at most `limit`
/// plus a grace of 0.25 s and 2%, or until `cancel` is raised ([`SolverError::Cancelled`]:
/// HiGHS is asked to stop, as at the deadline, and its thread ends on its own).
pub(crate) fn solve(model: highs::Model, limit: Duration, cancel: &Cancel) -> Result<Run> {
    solve_waiting(
        model,
        limit + Duration::from_millis(250) + limit.mul_f64(0.02),
        cancel,
    )
}

/// How often the wait for HiGHS looks at the cancel flag.
const CANCEL_POLL: Duration = Duration::from_millis(100);

/// [`solve`], waiting at most `wait`.
fn solve_waiting(mut model: highs::Model, wait: Duration, cancel: &Cancel) -> Result<Run> {
    cancel.check()?;
    let shared = Arc::new(Mutex::new(Shared::default()));
    let user = Arc::as_ptr(&shared) as *mut c_void;
    // SAFETY: the pointer is HiGHS's own; `user` outlives the solve (the thread holds an `Arc`).
    unsafe {
        let ptr = model.as_mut_ptr();
        let ok = Highs_setCallback(ptr, Some(on_event), user) == 0
            && Highs_startCallback(ptr, kHighsCallbackMipImprovingSolution) == 0
            && Highs_startCallback(ptr, kHighsCallbackMipInterrupt) == 0;
        if !ok {
            return Err(SolverError::Ilp("HiGHS refused its callbacks".into()));
        }
    }
    let (tx, rx) = mpsc::channel();
    let keep = Arc::clone(&shared);
    let job = Sendable(model);
    std::thread::Builder::new()
        .name("highs".into())
        // HiGHS's presolve and symmetry detection recurse; give them the main thread's room.
        .stack_size(64 << 20)
        .spawn(move || {
            let job = job;
            let solved = job.0.try_solve().map(Sendable);
            // The receiver is gone when the caller stopped waiting: the model drops here.
            let _ = tx.send(solved);
            drop(keep);
        })
        .map_err(|e| SolverError::Ilp(format!("cannot start the HiGHS thread: {e}")))?;
    let deadline = Instant::now() + wait;
    let answer = loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left.min(CANCEL_POLL)) {
            Err(mpsc::RecvTimeoutError::Timeout) if !left.is_zero() && !cancel.is_cancelled() => {
                continue
            }
            other => break other,
        }
    };
    if cancel.is_cancelled() && answer.is_err() {
        let mut s = shared
            .lock()
            .map_err(|_| SolverError::Ilp("HiGHS callback state poisoned".into()))?;
        s.stop = true;
        return Err(SolverError::Cancelled);
    }
    match answer {
        Ok(Ok(solved)) => {
            let progress = shared
                .lock()
                .map(|s| s.progress.clone())
                .unwrap_or_default();
            Ok(Run::Done(solved.0, progress))
        }
        Ok(Err(e)) => Err(SolverError::Ilp(format!("HiGHS failed: {e:?}"))),
        Err(mpsc::RecvTimeoutError::Timeout) => {
            let mut s = shared
                .lock()
                .map_err(|_| SolverError::Ilp("HiGHS callback state poisoned".into()))?;
            s.stop = true;
            Ok(Run::Overran(s.progress.clone()))
        }
        Err(mpsc::RecvTimeoutError::Disconnected) => Err(SolverError::Ilp(
            "the HiGHS thread ended without an answer".into(),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use highs::{RowProblem, Sense};

    /// A 0/1 knapsack of `n` items with awkward weights (HiGHS needs a little search).
    fn knapsack(n: usize) -> (highs::Model, Vec<f64>, Vec<f64>, f64) {
        let mut p = RowProblem::default();
        let value: Vec<f64> = (0..n).map(|i| ((i * 37 + 11) % 53 + 10) as f64).collect();
        let weight: Vec<f64> = (0..n).map(|i| ((i * 29 + 7) % 47 + 12) as f64).collect();
        let cols: Vec<_> = value
            .iter()
            .map(|v| p.add_integer_column(*v, 0..=1))
            .collect();
        let cap = weight.iter().sum::<f64>() / 3.0;
        p.add_row(..=cap, cols.iter().zip(&weight).map(|(c, w)| (*c, *w)));
        let mut m = p.optimise(Sense::Maximise);
        m.make_quiet();
        m.set_option("threads", 1);
        (m, value, weight, cap)
    }

    #[test]
    fn the_callbacks_see_the_final_solution_and_a_valid_bound() {
        let (m, value, weight, cap) = knapsack(40);
        let Run::Done(solved, progress) =
            solve(m, Duration::from_secs(60), &Cancel::default()).expect("solves")
        else {
            panic!("a 40-item knapsack overran a minute");
        };
        let x = solved.get_solution().columns().to_vec();
        let (obj, seen) = progress
            .incumbent
            .expect("an improving solution was reported");
        assert_eq!(seen.len(), x.len());
        assert!((obj - solved.objective_value()).abs() < 1e-6, "{obj}");
        let got: f64 = seen.iter().zip(&value).map(|(a, b)| a * b).sum();
        assert!((got - obj).abs() < 1e-6, "the columns are the model's own");
        let w: f64 = seen.iter().zip(&weight).map(|(a, b)| a * b).sum();
        assert!(w <= cap + 1e-6);
        // Maximising: the dual bound is an upper bound on the optimum.
        let b = progress
            .dual_bound
            .expect("a limit check reported the bound");
        assert!(b >= obj - 1e-6, "bound {b} below the optimum {obj}");
    }

    #[test]
    fn a_solve_past_its_deadline_answers_with_what_it_had() {
        let (m, value, weight, cap) = knapsack(400);
        match solve_waiting(m, Duration::ZERO, &Cancel::default()).expect("runs") {
            Run::Overran(p) => {
                // Whatever had been found is a solution of the model.
                if let Some((obj, x)) = p.incumbent {
                    let got: f64 = x.iter().zip(&value).map(|(a, b)| a * b).sum();
                    assert!((got - obj).abs() < 1e-6);
                    let w: f64 = x.iter().zip(&weight).map(|(a, b)| a * b).sum();
                    assert!(w <= cap + 1e-6);
                }
            }
            Run::Done(..) => panic!("a 400-item knapsack solved before the thread started"),
        }
    }

    #[test]
    fn a_cancelled_solve_does_not_start() {
        let (m, ..) = knapsack(40);
        let cancel = Cancel::armed();
        cancel.cancel();
        assert!(matches!(
            solve(m, Duration::from_secs(60), &cancel),
            Err(SolverError::Cancelled)
        ));
    }
}
