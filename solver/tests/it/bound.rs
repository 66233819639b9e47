//! The time-point relaxation ([`remat_solver::bound`]) bounds every schedule: checked against
//! exhaustive search over all schedules of tiny problems, and against what the planners find.
#![cfg(feature = "highs")]

use crate::common::{arb_chain, arb_training_dag, brute_force, chain};
use proptest::prelude::*;
use remat_solver::bound::time_point_bound;
use remat_solver::plan::{plan, PlanOptions, Status};
use remat_solver::{store_all_peak, Problem};
use std::time::Duration;

const LIMIT: Duration = Duration::from_secs(20);

/// The bound against the least cost of any schedule (exhaustive search): never above it,
/// and infeasible only where nothing fits.
fn check_against_brute_force(p: &Problem, budget: u64) -> Result<(), TestCaseError> {
    let tp = time_point_bound(p, budget, LIMIT)
        .map_err(|e| TestCaseError::fail(format!("bound: {e}")))?;
    let exact = brute_force(p, budget);
    match exact.min_cost {
        Some(cost) => {
            prop_assert!(
                !tp.infeasible,
                "the relaxation says infeasible, a schedule of cost {cost} fits {budget}"
            );
            let b = tp.bound.expect("an LP of this size solves in time");
            prop_assert!(
                b <= cost * (1.0 + 1e-7) + 1e-9,
                "bound {b} above the least cost {cost} at budget {budget}"
            );
            prop_assert!(
                b >= p.base_cost() * (1.0 - 1e-9),
                "bound {b} below the store-all cost"
            );
        }
        None => {
            // No schedule fits: the relaxation may or may not see it.
            if let Some(b) = tp.bound {
                prop_assert!(b >= p.base_cost() * (1.0 - 1e-9));
            }
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, ..ProptestConfig::default() })]

    #[test]
    fn bounds_every_schedule_of_training_dags(p in arb_training_dag(7), frac in 0.3f64..1.05) {
        let budget = (frac * store_all_peak(&p) as f64).ceil() as u64;
        check_against_brute_force(&p, budget)?;
    }

    #[test]
    fn bounds_every_schedule_of_chains(p in arb_chain(8), frac in 0.3f64..1.05) {
        let budget = (frac * store_all_peak(&p) as f64).ceil() as u64;
        check_against_brute_force(&p, budget)?;
    }

    /// On larger graphs: never above what `auto` finds, and never infeasible where it fits.
    #[test]
    fn bounds_the_planned_schedules(p in arb_training_dag(40), frac in 0.3f64..1.05) {
        let budget = (frac * store_all_peak(&p) as f64).ceil() as u64;
        let tp = time_point_bound(&p, budget, LIMIT)
            .map_err(|e| TestCaseError::fail(format!("bound: {e}")))?;
        let mut o = PlanOptions::new(budget);
        o.time_limit = Duration::from_millis(300);
        let (_, r) = plan(&p, &o).map_err(|e| TestCaseError::fail(format!("plan: {e}")))?;
        if r.status != Status::Infeasible {
            prop_assert!(!tp.infeasible);
            let b = tp.bound.expect("solves in time");
            prop_assert!(b <= r.predicted.compute_cost * (1.0 + 1e-7));
        }
    }
}

/// A chain of equal layers at 60% of its store-all peak must recompute: the bound says so
/// (above the store-all cost) and equals the least cost exhaustive search finds.
#[test]
fn the_bound_sees_recomputation_on_a_chain() {
    let fwd = [
        (1.0, 10),
        (4.0, 10),
        (4.0, 10),
        (4.0, 10),
        (4.0, 10),
        (1.0, 2),
    ];
    let bwd = [(1.0, 2), (1.0, 2), (1.0, 2), (1.0, 2), (1.0, 2)];
    let p = chain(&fwd, &bwd, 0);
    let budget = store_all_peak(&p) * 6 / 10;
    let exact = brute_force(&p, budget).min_cost.expect("fits");
    let tp = time_point_bound(&p, budget, LIMIT).unwrap();
    let b = tp.bound.unwrap();
    assert!(exact > p.base_cost(), "the case needs recomputation");
    assert!(
        b > p.base_cost(),
        "bound {b} sees none (store-all {})",
        p.base_cost()
    );
    assert!(b <= exact + 1e-9, "bound {b} above the least cost {exact}");
}

/// Below every value's footprint the relaxation itself is infeasible.
#[test]
fn a_budget_below_a_footprint_is_infeasible() {
    let fwd = [(1.0, 10), (1.0, 10), (1.0, 10)];
    let bwd = [(1.0, 2), (1.0, 2)];
    let p = chain(&fwd, &bwd, 0);
    let tp = time_point_bound(&p, p.footprint_lower_bound() - 1, LIMIT).unwrap();
    assert!(tp.infeasible);
    assert_eq!(tp.bound, None);
}

/// With two threads `auto` runs the time-point bound beside the segment program, the descent
/// and the search on graphs of thousands of nodes (here a chain of 200 blocks of 6 forward
/// nodes, 2,401 needed nodes): the plan and its bound are the ones of one thread, where it
/// runs between the descent and the search.
#[test]
fn the_bound_beside_the_segment_program_is_the_bound_after_it() {
    let p = crate::common::chain_of_blocks(200, 6, |j| (1.0 + (j % 5) as f64, 8 + (j % 7) as u64));
    let budget = store_all_peak(&p) / 3;
    let run = |threads| {
        let opts = PlanOptions {
            time_limit: Duration::from_secs(60),
            threads,
            ..PlanOptions::new(budget)
        };
        plan(&p, &opts).expect("plan").1
    };
    let (one, two) = (run(1), run(2));
    assert_eq!(two.status, Status::Feasible, "{:?}", two.status);
    assert!(two.predicted.peak_bytes <= budget);
    let bound = |r: &remat_solver::plan::PlanReport| {
        r.lower_bound
            .as_ref()
            .map(|b| (b.source.name(), b.compute_cost))
    };
    assert_eq!(
        bound(&one).map(|b| b.0),
        Some("time_points"),
        "{:?}",
        bound(&one)
    );
    assert_eq!(bound(&two), bound(&one));
    assert_eq!(two.predicted.compute_cost, one.predicted.compute_cost);
}
