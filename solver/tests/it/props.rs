//! Property tests: every schedule every algorithm returns is valid; the chain DP is exact.

use crate::common::{arb_chain, arb_plain_dag, arb_training_dag, brute_force, chain};
use proptest::prelude::*;
use remat_solver::baselines::{
    baselines, schedule_with_checkpoints, schedule_with_checkpoints_eager,
    schedule_with_checkpoints_within, BASELINE_NAMES,
};
use remat_solver::budget::{descend_to_budget, min_feasible_budget, prune_recomputations};
use remat_solver::dp::{
    as_training_chain, chain_frontier, min_peak_chain, solve_chain, solve_chain_with, DpMode,
    PROVEN_STAGES,
};
use remat_solver::plan::{plan, plan_reusing, sweep, Earlier, PlanOptions, Status};
use remat_solver::{simulate, store_all_peak, Problem};
use std::time::Duration;

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-9 * a.abs().max(b.abs()).max(1.0)
}

fn budget_of(p: &Problem, frac: f64) -> u64 {
    (frac * store_all_peak(p) as f64).ceil() as u64
}

fn check_baselines(p: &Problem, budget: u64) -> Result<(), TestCaseError> {
    let all = baselines(p, budget);
    let names: Vec<&str> = all.iter().map(|b| b.name).collect();
    prop_assert_eq!(names, BASELINE_NAMES.to_vec());
    for b in &all {
        let stats = simulate(p, &b.schedule)
            .map_err(|e| TestCaseError::fail(format!("{}: invalid schedule: {e}", b.name)))?;
        prop_assert_eq!(&stats, &b.stats, "{} stats", b.name);
        prop_assert_eq!(
            b.feasible,
            stats.peak_bytes <= budget,
            "{} feasible flag",
            b.name
        );
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    #[test]
    fn baselines_valid_on_training_dags(p in arb_training_dag(12), frac in 0.2f64..1.1) {
        check_baselines(&p, budget_of(&p, frac))?;
    }

    #[test]
    fn baselines_valid_on_chains(p in arb_chain(12), frac in 0.2f64..1.1) {
        check_baselines(&p, budget_of(&p, frac))?;
    }

    #[test]
    fn baselines_valid_on_plain_dags(p in arb_plain_dag(20), frac in 0.2f64..1.1) {
        check_baselines(&p, budget_of(&p, frac))?;
    }

    #[test]
    fn keep_set_generators_are_valid(
        p in arb_training_dag(12),
        keep in prop::collection::vec(any::<bool>(), 0..40),
        budget in 0u64..400,
    ) {
        for s in [
            schedule_with_checkpoints(&p, &keep),
            schedule_with_checkpoints_eager(&p, &keep),
            schedule_with_checkpoints_within(&p, &keep, budget),
        ] {
            simulate(&p, &s).map_err(|e| TestCaseError::fail(e.to_string()))?;
        }
    }

    #[test]
    fn keep_set_generators_are_valid_on_plain_dags(
        p in arb_plain_dag(20),
        keep in prop::collection::vec(any::<bool>(), 0..20),
    ) {
        for s in [schedule_with_checkpoints(&p, &keep), schedule_with_checkpoints_eager(&p, &keep)] {
            simulate(&p, &s).map_err(|e| TestCaseError::fail(e.to_string()))?;
        }
    }

    #[test]
    fn generated_chains_are_chains(p in arb_chain(12)) {
        prop_assert!(as_training_chain(&p).is_some());
    }

    #[test]
    fn dp_predictions_equal_simulate(p in arb_chain(10)) {
        let front = chain_frontier(&p, u64::MAX).map_err(|e| TestCaseError::fail(e.to_string()))?;
        prop_assert!(!front.is_empty());
        for w in front.windows(2) {
            prop_assert!(w[0].peak_bytes < w[1].peak_bytes && w[0].compute_cost > w[1].compute_cost);
        }
        for pt in &front {
            let s = solve_chain(&p, pt.peak_bytes).unwrap().expect("frontier point is feasible");
            let st = simulate(&p, &s).map_err(|e| TestCaseError::fail(e.to_string()))?;
            prop_assert_eq!(st.peak_bytes, pt.peak_bytes);
            prop_assert!(close(st.compute_cost, pt.compute_cost), "{} vs {}", st.compute_cost, pt.compute_cost);
        }
        // Below the first point nothing fits.
        let first = front[0].peak_bytes;
        prop_assert_eq!(solve_chain(&p, first - 1).unwrap(), None);
        // Enough memory for store-all: the DP computes every node once.
        let last = front[front.len() - 1];
        prop_assert!(close(last.compute_cost, p.base_cost()));
        prop_assert!(last.peak_bytes <= store_all_peak(&p));
    }

    #[test]
    fn dp_beats_every_feasible_baseline(p in arb_chain(12), frac in 0.2f64..1.1) {
        let budget = budget_of(&p, frac);
        let dp = solve_chain(&p, budget).unwrap();
        let dp_stats = dp.as_ref().map(|s| simulate(&p, s).unwrap());
        if let Some(st) = &dp_stats {
            prop_assert!(st.peak_bytes <= budget);
        }
        for b in baselines(&p, budget) {
            if b.feasible {
                let st = dp_stats.as_ref().ok_or_else(|| TestCaseError::fail(format!(
                    "{} is feasible at {budget} but the DP found nothing", b.name)))?;
                prop_assert!(st.compute_cost <= b.stats.compute_cost + 1e-9,
                    "dp {} > {} {}", st.compute_cost, b.name, b.stats.compute_cost);
            }
        }
    }

    #[test]
    fn restricted_dp_is_valid_and_never_beats_the_exact_one(p in arb_chain(12), frac in 0.2f64..1.1) {
        let budget = budget_of(&p, frac);
        let exact = solve_chain_with(&p, budget, DpMode::Exact).unwrap();
        let fast = solve_chain_with(&p, budget, DpMode::Restricted).unwrap();
        // Optimal is claimed only where exhaustive search checked the program.
        let stages = as_training_chain(&p).unwrap().backward.len();
        prop_assert!(!exact.optimal || stages <= PROVEN_STAGES, "{stages} stages");
        prop_assert!(!fast.optimal);
        for sol in [&exact, &fast] {
            if let Some(s) = &sol.schedule {
                let st = simulate(&p, s).map_err(|e| TestCaseError::fail(e.to_string()))?;
                prop_assert!(st.peak_bytes <= budget);
                prop_assert_eq!(st.peak_bytes, sol.peak_bytes);
                prop_assert!(close(st.compute_cost, sol.compute_cost));
            }
        }
        match (&exact.schedule, &fast.schedule) {
            (None, Some(_)) => prop_assert!(false, "restricted DP fits a budget the exact one does not"),
            (Some(_), Some(_)) => prop_assert!(exact.compute_cost <= fast.compute_cost + 1e-9),
            _ => {}
        }
    }

    #[test]
    fn dp_equals_brute_force_on_tiny_chains(p in arb_chain(5), fracs in prop::collection::vec(0.0f64..1.0, 3)) {
        let chain = as_training_chain(&p).unwrap();
        prop_assert!(chain.forward.len() - 1 <= 4);
        let sa = store_all_peak(&p);
        let exact = brute_force(&p, 0).min_peak;
        let (dp_min, _, exact_dp) = min_peak_chain(&p).unwrap();
        prop_assert!(exact_dp);
        prop_assert_eq!(dp_min, exact);
        let mut budgets: Vec<u64> = fracs.iter().map(|f| exact + (f * (sa - exact) as f64) as u64).collect();
        budgets.extend([exact.saturating_sub(1), exact, sa]);
        for budget in budgets {
            let bf = brute_force(&p, budget);
            let dp = solve_chain(&p, budget).unwrap().map(|s| simulate(&p, &s).unwrap());
            match (&bf.min_cost, &dp) {
                (None, None) => {}
                (Some(c), Some(st)) => {
                    prop_assert!(st.peak_bytes <= budget);
                    prop_assert!(close(*c, st.compute_cost), "budget {budget}: brute {c} vs dp {}", st.compute_cost);
                }
                _ => prop_assert!(false, "budget {budget}: brute {:?} vs dp {:?}", bf.min_cost, dp.map(|s| s.compute_cost)),
            }
        }
    }

    #[test]
    fn min_budget_sound(p in arb_training_dag(10)) {
        let mb = min_feasible_budget(&p);
        prop_assert!(mb.bytes >= mb.lower_bound);
        let st = simulate(&p, &mb.schedule).map_err(|e| TestCaseError::fail(e.to_string()))?;
        prop_assert_eq!(st.peak_bytes, mb.bytes);
        prop_assert!(mb.bytes <= store_all_peak(&p));
        if mb.exact {
            prop_assert!(mb.bytes == mb.lower_bound || as_training_chain(&p).is_some());
        }
    }

    #[test]
    fn descent_is_valid_and_never_worse_than_store_all(p in arb_plain_dag(20), frac in 0.3f64..1.0) {
        let sa = store_all_peak(&p);
        let s = descend_to_budget(&p, budget_of(&p, frac));
        let st = simulate(&p, &s).map_err(|e| TestCaseError::fail(e.to_string()))?;
        prop_assert!(st.peak_bytes <= sa);
    }

    /// Pruning keeps a schedule valid and within the budget and never makes it costlier.
    #[test]
    fn pruned_schedules_are_valid_and_never_costlier(p in arb_training_dag(10), frac in 0.3f64..1.0) {
        let budget = budget_of(&p, frac);
        for b in baselines(&p, budget).iter().filter(|b| b.feasible) {
            let pruned = prune_recomputations(&p, &b.schedule, budget, 1_000_000);
            let st = simulate(&p, &pruned).map_err(|e| TestCaseError::fail(format!("{}: {e}", b.name)))?;
            prop_assert!(st.peak_bytes <= budget, "{}", b.name);
            prop_assert!(st.compute_cost <= b.stats.compute_cost, "{}", b.name);
        }
    }

    /// `auto` finds a schedule at the least peak `min_feasible_budget` reports, on graphs
    /// that are not chains too (where the search alone can miss budgets that tight).
    #[test]
    fn auto_fits_the_min_feasible_budget(p in arb_plain_dag(14)) {
        let mb = min_feasible_budget(&p);
        let mut opts = PlanOptions::new(mb.bytes);
        opts.time_limit = Duration::from_millis(200);
        let (s, r) = plan(&p, &opts).map_err(|e| TestCaseError::fail(e.to_string()))?;
        prop_assert_ne!(r.status, Status::Infeasible);
        let st = simulate(&p, &s).map_err(|e| TestCaseError::fail(e.to_string()))?;
        prop_assert!(st.peak_bytes <= mb.bytes);
    }

    /// A budget of "min" is met: `auto` at `least_budget` fits it (with the same limits).
    #[test]
    fn auto_fits_the_least_budget_it_names(p in arb_plain_dag(14)) {
        let mut opts = PlanOptions::new(0);
        opts.time_limit = Duration::from_millis(300);
        let least = remat_solver::plan::least_budget(&p, &opts)
            .map_err(|e| TestCaseError::fail(e.to_string()))?;
        opts.budget = least;
        let (s, r) = plan(&p, &opts).map_err(|e| TestCaseError::fail(e.to_string()))?;
        prop_assert_ne!(r.status, Status::Infeasible, "least budget {}", least);
        let st = simulate(&p, &s).map_err(|e| TestCaseError::fail(e.to_string()))?;
        prop_assert!(st.peak_bytes <= least);
    }

    /// The search's greedy phase follows the same path whatever the budget until it fits
    /// it: the least peak an unsuccessful search passed through (which `auto` reports as the
    /// minimum feasible budget) is a budget the same search then meets.
    #[test]
    fn search_meets_the_least_peak_it_reported(p in arb_plain_dag(14), frac in 0.0f64..0.6) {
        use remat_solver::search::{horizon_search, SearchLimits};
        let limits = SearchLimits { work: 100_000, time: Duration::from_secs(3600), cancel: Default::default() };
        let budget = budget_of(&p, frac);
        let out = horizon_search(&p, budget, limits.clone(), 3)
            .map_err(|e| TestCaseError::fail(e.to_string()))?;
        prop_assume!(out.best.is_none());
        let (_, low) = out.lowest.expect("the search evaluates at least one schedule");
        prop_assert!(low.peak_bytes > budget);
        let again = horizon_search(&p, low.peak_bytes, limits, 3)
            .map_err(|e| TestCaseError::fail(e.to_string()))?;
        let (s, st) = again.best.expect("a schedule within the least peak reported");
        prop_assert!(st.peak_bytes <= low.peak_bytes);
        prop_assert_eq!(simulate(&p, &s).map_err(|e| TestCaseError::fail(e.to_string()))?, st);
    }

    /// The least peak `auto` reports when nothing fits (the portfolio's greedy descents,
    /// stopped when the peak stops falling) is a budget the portfolio then meets: a point on
    /// the paths of its full runs, never below the least peak those pass through.
    #[test]
    fn portfolio_meets_the_least_peak_of_its_descents(p in arb_plain_dag(14), runs in 1usize..=4) {
        use remat_solver::search::{min_peak_portfolio, portfolio_search, SearchLimits};
        let limits = SearchLimits { work: 400_000, time: Duration::from_secs(3600), cancel: Default::default() };
        let low = min_peak_portfolio(&p, limits.clone(), runs)
            .map_err(|e| TestCaseError::fail(e.to_string()))?;
        prop_assert!(low.best.is_none());
        let (_, least) = low.lowest.expect("the descents evaluate at least one schedule");
        let full = portfolio_search(&p, p.footprint_lower_bound(), limits.clone(), runs)
            .map_err(|e| TestCaseError::fail(e.to_string()))?;
        if full.best.is_none() {
            let (_, full_low) = full.lowest.expect("the search evaluates a schedule");
            prop_assert!(least.peak_bytes >= full_low.peak_bytes);
        }
        let again = portfolio_search(&p, least.peak_bytes, limits, runs)
            .map_err(|e| TestCaseError::fail(e.to_string()))?;
        let (s, st) = again.best.expect("a schedule within the least peak reported");
        prop_assert!(st.peak_bytes <= least.peak_bytes);
        prop_assert_eq!(simulate(&p, &s).map_err(|e| TestCaseError::fail(e.to_string()))?, st);
    }

    #[test]
    fn min_budget_sound_on_plain_dags(p in arb_plain_dag(14)) {
        let mb = min_feasible_budget(&p);
        let st = simulate(&p, &mb.schedule).map_err(|e| TestCaseError::fail(e.to_string()))?;
        prop_assert_eq!(st.peak_bytes, mb.bytes);
        prop_assert!(mb.bytes >= mb.lower_bound && mb.bytes <= store_all_peak(&p));
    }

    #[test]
    fn min_budget_at_least_brute_force(p in arb_training_dag(3)) {
        prop_assume!(p.len() <= 16);
        let mb = min_feasible_budget(&p);
        let bf = brute_force(&p, 0);
        prop_assert!(mb.bytes >= bf.min_peak);
        prop_assert!(bf.min_peak >= mb.lower_bound);
    }

    #[test]
    fn min_budget_exact_on_chains(p in arb_chain(5)) {
        let mb = min_feasible_budget(&p);
        prop_assert!(mb.exact);
        prop_assert_eq!(mb.bytes, brute_force(&p, 0).min_peak);
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 16, ..ProptestConfig::default() })]

    /// Five-stage chains, where delaying a backward stage starts to pay (a few cases: the
    /// exhaustive search has up to 2^22 states).
    #[test]
    fn dp_equals_brute_force_on_five_stage_chains(
        f in prop::collection::vec((1u32..=10, 1u64..=20), 6),
        b in prop::collection::vec((1u32..=10, 1u64..=40), 5),
        frac in 0.0f64..1.0,
    ) {
        let f: Vec<(f64, u64)> = f.into_iter().map(|(c, s)| (c as f64, s)).collect();
        let b: Vec<(f64, u64)> = b.into_iter().map(|(c, s)| (c as f64, s)).collect();
        let p = chain(&f, &b, 0);
        let exact = brute_force(&p, 0).min_peak;
        let sa = store_all_peak(&p);
        let budget = exact + (frac * (sa - exact) as f64) as u64;
        let bf = brute_force(&p, budget).min_cost.expect("at least the minimum peak fits");
        let st = simulate(&p, &solve_chain(&p, budget).unwrap().expect("feasible")).unwrap();
        prop_assert!(close(bf, st.compute_cost), "budget {budget}: brute {bf} vs dp {}", st.compute_cost);
    }
}

/// The five-stage chain on which the DP without delayed stages cost 84 where 75 is optimal.
#[test]
fn dp_delays_a_stage_when_that_is_cheaper() {
    let p = chain(
        &[
            (5.0, 17),
            (2.0, 16),
            (9.0, 3),
            (1.0, 3),
            (2.0, 12),
            (6.0, 16),
        ],
        &[(10.0, 8), (6.0, 8), (3.0, 18), (9.0, 2), (10.0, 14)],
        0,
    );
    let st = simulate(&p, &solve_chain(&p, 49).unwrap().expect("feasible")).unwrap();
    assert_eq!(brute_force(&p, 49).min_cost, Some(75.0));
    assert!(close(st.compute_cost, 75.0), "{}", st.compute_cost);
}

#[test]
fn pruning_drops_a_recomputation_the_budget_does_not_need() {
    use remat_solver::Step;
    // A chain of three nodes; recomputing the first before the third is pointless at a
    // budget that holds everything.
    let p = chain(
        &[(1.0, 10), (2.0, 10), (3.0, 10)],
        &[(1.0, 10), (1.0, 10)],
        0,
    );
    let sa = remat_solver::store_all(&p);
    let full = simulate(&p, &sa).unwrap();
    let mut steps = Vec::new();
    for s in &sa.steps {
        if let Step::Compute(v) = *s {
            if v == 2 {
                // Free node 0 and compute it again just before node 2.
                steps.push(Step::Compute(0));
            }
            steps.push(Step::Compute(v));
        }
    }
    let wasteful = remat_solver::with_frees(
        &p,
        &steps
            .iter()
            .filter_map(|s| match s {
                Step::Compute(v) => Some(*v),
                Step::Free(_) => None,
            })
            .collect::<Vec<_>>(),
    );
    let before = simulate(&p, &wasteful).unwrap();
    assert_eq!(before.recomputations, 1);
    let pruned = prune_recomputations(&p, &wasteful, full.peak_bytes.max(before.peak_bytes), 1_000);
    let after = simulate(&p, &pruned).unwrap();
    assert_eq!(after.recomputations, 0);
    assert_eq!(after.compute_cost, full.compute_cost);
    // A schedule over the budget comes back unchanged.
    assert_eq!(
        prune_recomputations(&p, &wasteful, before.peak_bytes - 1, 1_000),
        wasteful
    );
}

#[test]
fn dp_handles_a_hand_checked_chain() {
    // x0 -> x1 -> x2, backward b1 (reads x1, x2), b0 (reads x0, x1, b1). Sizes 10, 1, 1; grads 1.
    let p = chain(&[(1.0, 10), (1.0, 1), (1.0, 1)], &[(1.0, 1), (1.0, 1)], 0);
    let front = chain_frontier(&p, u64::MAX).unwrap();
    let bf = brute_force(&p, u64::MAX);
    assert_eq!(front[0].peak_bytes, brute_force(&p, 0).min_peak);
    assert!(close(
        front[front.len() - 1].compute_cost,
        bf.min_cost.unwrap()
    ));
    assert!(close(front[front.len() - 1].compute_cost, 5.0));
}

#[test]
fn solve_chain_rejects_non_chains_naming_why() {
    let p = crate::common::training_dag(
        &[(1.0, 1), (1.0, 1), (1.0, 1)],
        &[vec![], vec![0], vec![0, 1]],
        &[],
    );
    let err = solve_chain(&p, u64::MAX).unwrap_err().to_string();
    assert!(err.contains("not a training chain"), "{err}");
}

proptest! {
    // Each case plans several times with `auto` (time limits of 100-150 ms).
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    /// A sweep's overhead never goes up with the budget (each point is offered the one below
    /// it), on training DAGs, chains and plain DAGs, whatever order the fractions come in;
    /// every point's schedule is what `plan` reports at that budget, and fits it.
    #[test]
    fn sweeps_never_cost_more_at_a_larger_budget(
        p in prop_oneof![arb_training_dag(9), arb_chain(9), arb_plain_dag(14)],
        mut fracs in proptest::collection::vec(0.05f64..1.1, 2..6),
    ) {
        fracs.reverse();
        let mut opts = PlanOptions::new(0);
        opts.time_limit = Duration::from_millis(150);
        let points = sweep(&p, &fracs, &opts).map_err(|e| TestCaseError::fail(e.to_string()))?;
        prop_assert_eq!(points.len(), fracs.len());
        let mut by_budget: Vec<_> = points.iter().collect();
        by_budget.sort_by_key(|q| q.budget_bytes);
        let mut last: Option<f64> = None;
        for q in by_budget {
            match (q.overhead, last) {
                (Some(o), Some(l)) => prop_assert!(o <= l + 1e-12, "{} at {}: {o} > {l}", q.solver, q.budget_bytes),
                (None, Some(_)) => prop_assert!(false, "infeasible at {} above a feasible budget", q.budget_bytes),
                _ => {}
            }
            if let Some(from) = q.reused_from_budget_bytes {
                prop_assert!(from <= q.budget_bytes, "from {from} at {}", q.budget_bytes);
            }
            last = q.overhead.or(last);
        }
    }

    /// `plan_reusing` never returns a costlier schedule than the earlier one it is offered,
    /// says when it returns that one, and refuses a schedule of another problem by its budget.
    #[test]
    fn a_plan_reusing_an_earlier_one_never_costs_more(
        p in prop_oneof![arb_training_dag(9), arb_chain(9)],
        lo in 0.3f64..0.9,
        step in 0.0f64..0.3,
    ) {
        let low = budget_of(&p, lo);
        let high = budget_of(&p, lo + step);
        let (s, r) = plan(&p, &PlanOptions { time_limit: Duration::from_millis(100), ..PlanOptions::new(low) })
            .map_err(|e| TestCaseError::fail(e.to_string()))?;
        prop_assume!(r.status != Status::Infeasible);
        let earlier = Earlier { budget_bytes: low, solver: r.solver.clone(), schedule: s.clone() };
        let opts = PlanOptions { time_limit: Duration::from_millis(100), ..PlanOptions::new(high) };
        let (s2, r2) = plan_reusing(&p, &opts, std::slice::from_ref(&earlier))
            .map_err(|e| TestCaseError::fail(e.to_string()))?;
        let st = simulate(&p, &s2).map_err(|e| TestCaseError::fail(e.to_string()))?;
        prop_assert!(st.peak_bytes <= high);
        prop_assert!(st.compute_cost <= r.predicted.compute_cost + 1e-9);
        if r2.reused_from_budget_bytes.is_some() {
            prop_assert_eq!(r2.reused_from_budget_bytes, Some(low));
            prop_assert_eq!(&r2.solver, &r.solver);
        }
        let other = chain(&[(1.0, 8)], &[], 0);
        let bad = Earlier { budget_bytes: 7, solver: "search".into(), schedule: s };
        let e = plan_reusing(&other, &PlanOptions::new(1 << 20), &[bad]).unwrap_err().to_string();
        prop_assert!(e.contains("budget 7 bytes"), "{e}");
    }
}

/// The cheapest of the segment program's schedules that fits `budget` (each checked valid).
fn segment_best(p: &Problem, budget: u64) -> Result<Option<f64>, TestCaseError> {
    let mut best: Option<f64> = None;
    for s in remat_solver::segments::solve(p, budget) {
        let st = simulate(p, &s).map_err(|e| TestCaseError::fail(e.to_string()))?;
        if st.peak_bytes <= budget {
            best = Some(best.map_or(st.compute_cost, |b: f64| b.min(st.compute_cost)));
        }
    }
    Ok(best)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    /// The segment program's schedules are valid on any training DAG with split points, and
    /// at store-all's peak it finds store-all's cost (keeping every stage is in its class).
    #[test]
    fn segment_dp_schedules_are_valid(p in arb_training_dag(16), frac in 0.2f64..1.1) {
        segment_best(&p, budget_of(&p, frac))?;
        if remat_solver::segments::structure(&p).is_ok() {
            let full = store_all_peak(&p);
            let best = segment_best(&p, full)?;
            prop_assert!(best.is_some_and(|c| close(c, p.base_cost())), "{best:?} vs {}", p.base_cost());
        }
    }

    /// On training chains the exact chain DP is a lower bound on what the segment program
    /// finds (its schedules are scored by the simulator, not by its own arithmetic).
    #[test]
    fn segment_dp_is_never_below_the_exact_chain_dp(p in arb_chain(10), frac in 0.2f64..1.1) {
        let budget = budget_of(&p, frac);
        if let Some(c) = segment_best(&p, budget)? {
            let exact = solve_chain(&p, budget).unwrap().expect("what the segments fit, the DP fits");
            let dp = simulate(&p, &exact).unwrap().compute_cost;
            prop_assert!(dp <= c * (1.0 + 1e-9), "dp {dp} vs segments {c}");
        }
    }

    /// With no time at all, `auto` still answers from what its time limit does not cut (the
    /// baselines, the chain DP, the segment program, the first peak descent): its plan fits,
    /// costs no more than any of the baselines and segment schedules that fit, and is bounded
    /// by what it reports. What the limit cuts only ever adds candidates.
    #[test]
    fn auto_with_no_time_answers_from_what_the_limit_does_not_cut(
        p in arb_training_dag(16),
        frac in 0.2f64..1.1,
    ) {
        let budget = budget_of(&p, frac);
        let opts = PlanOptions { time_limit: Duration::ZERO, ..PlanOptions::new(budget) };
        let (s, r) = plan(&p, &opts).map_err(|e| TestCaseError::fail(e.to_string()))?;
        let mut uncut = segment_best(&p, budget)?;
        for b in baselines(&p, budget).iter().filter(|b| b.feasible) {
            uncut = Some(uncut.map_or(b.stats.compute_cost, |c: f64| c.min(b.stats.compute_cost)));
        }
        match uncut {
            Some(c) => {
                prop_assert_ne!(r.status, Status::Infeasible);
                let st = simulate(&p, &s).map_err(|e| TestCaseError::fail(e.to_string()))?;
                prop_assert!(st.peak_bytes <= budget);
                prop_assert!(st.compute_cost <= c * (1.0 + 1e-9), "{} over {c}", st.compute_cost);
                let lb = r.lower_bound.expect("a feasible plan has a bound").compute_cost;
                prop_assert!(lb <= st.compute_cost * (1.0 + 1e-9), "bound {lb} over {}", st.compute_cost);
            }
            None if r.status == Status::Infeasible => prop_assert!(s.steps.is_empty()),
            None => {
                let st = simulate(&p, &s).map_err(|e| TestCaseError::fail(e.to_string()))?;
                prop_assert!(st.peak_bytes <= budget);
            }
        }
    }
}
