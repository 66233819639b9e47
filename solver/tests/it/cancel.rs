//! A raised `Cancel` stops a plan and a sweep where they look at it, long before their time
//! limit.

use crate::common::training_dag;
use remat_solver::plan::{plan, sweep, PlanOptions, Status};
use remat_solver::{simulate, store_all_peak, Cancel, Problem, SolverError};
use std::time::{Duration, Instant};

/// A training DAG of `n` forward nodes with skip connections from a fixed generator: too
/// large for the exact MILP and not a chain, so `auto` searches for its whole time limit.
fn skip_dag(n: usize) -> Problem {
    let mut state = 0x2545_f491_4f6c_dd1d_u64;
    let mut next = move |m: usize| {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        (state % m as u64) as usize
    };
    let fwd: Vec<(f64, u64)> = (0..n)
        .map(|_| ((1 + next(9)) as f64, (1 + next(50)) as u64))
        .collect();
    let deps: Vec<Vec<usize>> = (0..n)
        .map(|j| {
            let mut d: Vec<usize> = j.checked_sub(1).into_iter().collect();
            if j > 2 && next(3) == 0 {
                d.push(next(j - 1));
            }
            d
        })
        .collect();
    training_dag(&fwd, &deps, &vec![(2.0, 5); n])
}

/// Runs `work` with `cancel` raised after `after`; returns its result and how long it took.
fn cancelled_after<T>(cancel: &Cancel, after: Duration, work: impl FnOnce() -> T) -> (T, Duration) {
    let start = Instant::now();
    std::thread::scope(|s| {
        let raiser = cancel.clone();
        s.spawn(move || {
            std::thread::sleep(after);
            raiser.cancel();
        });
        let out = work();
        (out, start.elapsed())
    })
}

#[test]
fn a_cancelled_plan_stops_long_before_its_time_limit() {
    let p = skip_dag(300);
    let cancel = Cancel::armed();
    let opts = PlanOptions {
        time_limit: Duration::from_secs(120),
        cancel: cancel.clone(),
        ..PlanOptions::new(store_all_peak(&p) * 55 / 100)
    };
    let (out, took) = cancelled_after(&cancel, Duration::from_millis(300), || plan(&p, &opts));
    assert_eq!(out.err(), Some(SolverError::Cancelled));
    // Generous: the phases that look at the flag do so every few milliseconds; the limit is
    // two minutes.
    assert!(took < Duration::from_secs(20), "stopped after {took:?}");
}

#[test]
fn a_cancelled_sweep_stops_between_and_within_its_points() {
    let p = skip_dag(300);
    let cancel = Cancel::armed();
    let opts = PlanOptions {
        time_limit: Duration::from_secs(60),
        cancel: cancel.clone(),
        ..PlanOptions::new(store_all_peak(&p))
    };
    let (out, took) = cancelled_after(&cancel, Duration::from_millis(300), || {
        sweep(&p, &[0.5, 0.6, 0.7, 0.8, 0.9], &opts)
    });
    assert_eq!(out.err(), Some(SolverError::Cancelled));
    assert!(took < Duration::from_secs(20), "stopped after {took:?}");
}

#[test]
fn a_flag_never_raised_lets_the_plan_end() {
    let p = skip_dag(60);
    let budget = store_all_peak(&p) * 7 / 10;
    let opts = PlanOptions {
        time_limit: Duration::from_millis(500),
        cancel: Cancel::armed(),
        ..PlanOptions::new(budget)
    };
    let (schedule, report) = plan(&p, &opts).unwrap();
    assert_ne!(report.status, Status::Infeasible);
    assert!(simulate(&p, &schedule).unwrap().peak_bytes <= budget);
}
