//! The Checkmate MILP and the `plan` API: agreement with the exact chain DP, with the
//! baselines, with `simulate`; infeasible budgets; the schedule interchange format.
#![cfg(feature = "highs")]

use crate::common::{arb_chain, arb_plain_dag, arb_training_dag, brute_force, chain};
use proptest::prelude::*;
use remat_solver::baselines::baselines;
use remat_solver::ilp::{self, IlpOptions, IlpStatus};
use remat_solver::plan::{self, parse_budget, plan, sweep, Algorithm, PlanOptions, Status};
use remat_solver::{io::read_node_link, simulate, store_all_peak, Problem, Schedule};
use std::time::Duration;

const TIME: Duration = Duration::from_secs(60);

fn solve(p: &Problem, budget: u64) -> ilp::IlpOutcome {
    ilp::solve(p, &IlpOptions::new(budget, TIME)).expect("the MILP runs")
}

/// A budget between the footprint lower bound and the store-all peak, `f` of the way.
fn budget_at(p: &Problem, f: f64) -> u64 {
    let lo = p.footprint_lower_bound();
    let hi = store_all_peak(p);
    lo + ((hi - lo) as f64 * f).round() as u64
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-6 * a.abs().max(b.abs()).max(1.0)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    /// On training chains the MILP's optimum is the exact DP's optimum.
    #[test]
    fn ilp_matches_chain_dp(p in arb_chain(6), f in 0.0f64..1.0) {
        let budget = budget_at(&p, f);
        let dp = remat_solver::dp::solve_chain(&p, budget).unwrap();
        let out = solve(&p, budget);
        match dp {
            None => prop_assert_eq!(out.status, IlpStatus::Infeasible),
            Some(s) => {
                let dp_cost = simulate(&p, &s).unwrap().compute_cost;
                prop_assert_eq!(out.status, IlpStatus::Optimal);
                let stats = out.stats.unwrap();
                prop_assert!(stats.peak_bytes <= budget);
                prop_assert!(close(stats.compute_cost, dp_cost),
                    "ilp {} dp {}", stats.compute_cost, dp_cost);
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 16, ..ProptestConfig::default() })]

    /// The MILP is never worse than any baseline that fits, and its objective is what
    /// `simulate` measures of its schedule.
    #[test]
    fn ilp_beats_feasible_baselines_on_training_dags(p in arb_training_dag(5), f in 0.0f64..1.0) {
        let budget = budget_at(&p, f);
        let out = solve(&p, budget);
        for b in baselines(&p, budget).iter().filter(|b| b.feasible) {
            prop_assert_eq!(out.status, IlpStatus::Optimal, "{} fits", b.name);
            let cost = out.stats.as_ref().unwrap().compute_cost;
            prop_assert!(cost <= b.stats.compute_cost * (1.0 + 1e-9),
                "ilp {} > {} {}", cost, b.name, b.stats.compute_cost);
        }
        if let (Some(obj), Some(stats)) = (out.objective, &out.stats) {
            prop_assert!(close(obj, stats.compute_cost), "objective {} simulate {}", obj, stats.compute_cost);
            prop_assert!(stats.peak_bytes <= budget);
        }
    }

    /// On tiny plain DAGs the MILP never beats exhaustive search (which sees every schedule),
    /// and it finds a schedule whenever the budget admits one in stage form.
    #[test]
    fn ilp_is_bounded_by_brute_force_on_plain_dags(p in arb_plain_dag(7), f in 0.0f64..1.0) {
        let budget = budget_at(&p, f);
        let bf = brute_force(&p, budget);
        let out = solve(&p, budget);
        match (bf.min_cost, &out.stats) {
            (None, s) => prop_assert!(s.is_none()),
            (Some(best), Some(stats)) => {
                prop_assert!(stats.compute_cost >= best - 1e-9);
                prop_assert!(stats.peak_bytes <= budget);
                prop_assert!(close(out.objective.unwrap(), stats.compute_cost));
            }
            (Some(_), None) => prop_assert_eq!(out.status, IlpStatus::Infeasible),
        }
    }
}

#[test]
fn objective_equals_simulated_cost_under_recomputation() {
    // Costs with fractions and bytes with large magnitudes exercise both scalings.
    let fwd: Vec<(f64, u64)> = (0..8)
        .map(|i| (0.5 + i as f64 * 1.25, (3 + i % 4) * 1_000_000_007))
        .collect();
    let bwd: Vec<(f64, u64)> = (0..7)
        .map(|i| (2.0 + i as f64, 1_000_000_007 * (1 + i % 2)))
        .collect();
    let p = chain(&fwd, &bwd, 123_456);
    for f in [0.2, 0.5, 0.8] {
        let budget = budget_at(&p, f);
        let out = solve(&p, budget);
        let stats = out.stats.expect("feasible");
        assert!(stats.recomputations > 0 || f > 0.5);
        assert!(close(out.objective.unwrap(), stats.compute_cost));
        assert!(stats.peak_bytes <= budget);
        assert_eq!(simulate(&p, out.schedule.as_ref().unwrap()).unwrap(), stats);
        let lb = out.lower_bound.expect("bound");
        assert!(lb <= stats.compute_cost * (1.0 + 1e-9));
    }
}

#[test]
fn infeasible_budget_is_reported_with_the_minimum() {
    let fwd = [(1.0, 10), (2.0, 20), (3.0, 30), (1.0, 10)];
    let bwd = [(2.0, 10), (2.0, 20), (2.0, 30)];
    let p = chain(&fwd, &bwd, 5);
    let (min_peak, _, exact) = remat_solver::dp::min_peak_chain(&p).unwrap();
    assert!(exact);
    let out = solve(&p, min_peak - 1);
    assert_eq!(out.status, IlpStatus::Infeasible);
    assert!(out.schedule.is_none());
    assert_eq!(solve(&p, min_peak).status, IlpStatus::Optimal);

    let (schedule, report) = plan(&p, &PlanOptions::new(min_peak - 1)).unwrap();
    assert_eq!(report.status, Status::Infeasible);
    assert!(schedule.steps.is_empty() && report.schedule.is_empty());
    assert_eq!(report.min_feasible_budget_bytes, Some(min_peak));
    let json = serde_json::to_value(&report).unwrap();
    assert_eq!(json["status"], "infeasible");
    assert_eq!(json["min_feasible_budget_bytes"], min_peak);
}

#[test]
fn time_out_without_solution_is_a_status() {
    let fwd: Vec<(f64, u64)> = (0..30)
        .map(|i| (1.0 + (i % 5) as f64, 10 + i % 7))
        .collect();
    let bwd: Vec<(f64, u64)> = (0..29).map(|i| (2.0, 10 + i % 3)).collect();
    let p = chain(&fwd, &bwd, 0);
    let mut o = IlpOptions::new(budget_at(&p, 0.1), Duration::from_millis(1));
    o.threads = 1;
    let out = ilp::solve(&p, &o).unwrap();
    match out.status {
        IlpStatus::NoSolution => assert!(out.schedule.is_none()),
        IlpStatus::Feasible | IlpStatus::Optimal => {
            assert!(out.stats.unwrap().peak_bytes <= o.budget)
        }
        IlpStatus::Infeasible => panic!("a feasible budget reported infeasible"),
    }
}

/// Every algorithm through `plan`: the report's figures are what `simulate` says of the
/// schedule, the steps round-trip through the interchange format, and `auto` is never worse
/// than any feasible baseline.
#[test]
fn plan_reports_round_trip_for_every_algorithm() {
    let fwd: Vec<(f64, u64)> = (0..7).map(|i| (1.0 + i as f64, 10 + 3 * i)).collect();
    let bwd: Vec<(f64, u64)> = (0..6).map(|i| (2.0 + i as f64, 10 + i)).collect();
    let p = chain(&fwd, &bwd, 7);
    let budget = budget_at(&p, 0.5);
    let mut auto_cost = None;
    for algorithm in Algorithm::ALL {
        let opts = PlanOptions {
            budget,
            algorithm,
            time_limit: Duration::from_secs(10),
            threads: 1,
            bound_time: Duration::ZERO,
            cancel: Default::default(),
        };
        let (schedule, report) = plan(&p, &opts).unwrap();
        if report.status == Status::Infeasible {
            assert!(matches!(
                algorithm,
                Algorithm::StoreAll
                    | Algorithm::ChenSqrt
                    | Algorithm::ChenGreedy
                    | Algorithm::EveryK
                    | Algorithm::Revolve
            ));
            continue;
        }
        let back = Schedule::from_json_steps(&p, &report.schedule).unwrap();
        assert_eq!(back, schedule);
        let text = serde_json::to_string(&report.schedule).unwrap();
        let parsed: Vec<remat_solver::schedule::StepJson> = serde_json::from_str(&text).unwrap();
        let stats = simulate(&p, &Schedule::from_json_steps(&p, &parsed).unwrap()).unwrap();
        assert_eq!(stats.peak_bytes, report.predicted.peak_bytes);
        assert_eq!(stats.compute_cost, report.predicted.compute_cost);
        assert_eq!(stats.memory, report.predicted.memory);
        assert!(stats.peak_bytes <= budget);
        assert!(close(
            report.predicted.overhead,
            stats.compute_cost / report.store_all_cost - 1.0
        ));
        if algorithm == Algorithm::Auto {
            auto_cost = Some(stats.compute_cost);
            assert_eq!(report.status, Status::Optimal, "a chain is solved exactly");
        }
        if algorithm == Algorithm::Ilp || algorithm == Algorithm::Dp {
            assert_eq!(report.status, Status::Optimal, "{algorithm}");
        }
    }
    let auto_cost = auto_cost.unwrap();
    for b in baselines(&p, budget).iter().filter(|b| b.feasible) {
        assert!(auto_cost <= b.stats.compute_cost + 1e-9, "{}", b.name);
    }
}

#[test]
fn auto_on_a_training_dag_is_at_least_as_good_as_the_baselines() {
    // Forward DAG with skip connections (not a chain, so the DP does not apply).
    let fwd: Vec<(f64, u64)> = (0..10)
        .map(|i| (1.0 + (i % 4) as f64, 20 + 5 * (i % 3)))
        .collect();
    let deps: Vec<Vec<usize>> = (0..10)
        .map(|j| match j {
            0 => vec![],
            j if j >= 3 && j % 3 == 0 => vec![j - 1, j - 3],
            j => vec![j - 1],
        })
        .collect();
    let bwd: Vec<(f64, u64)> = (0..10).map(|i| (2.0, 15 + (i % 2) * 10)).collect();
    let p = crate::common::training_dag(&fwd, &deps, &bwd);
    for f in [0.3, 0.6, 0.9] {
        let budget = budget_at(&p, f);
        let opts = PlanOptions {
            budget,
            algorithm: Algorithm::Auto,
            time_limit: Duration::from_secs(20),
            threads: 1,
            bound_time: Duration::ZERO,
            cancel: Default::default(),
        };
        let (schedule, report) = plan(&p, &opts).unwrap();
        let stats = simulate(&p, &schedule).unwrap();
        assert!(stats.peak_bytes <= budget);
        assert_eq!(report.status, Status::Optimal, "small: proven by the MILP");
        assert!(report.gap.unwrap() <= 1e-4);
        for b in report.baselines.iter().filter(|b| b.feasible) {
            assert!(stats.compute_cost <= b.compute_cost + 1e-9, "{}", b.name);
        }
    }
}

#[test]
fn sweep_is_monotone_and_names_every_baseline() {
    let fwd: Vec<(f64, u64)> = (0..6).map(|i| (1.0 + i as f64, 10 + 4 * i)).collect();
    let bwd: Vec<(f64, u64)> = (0..5).map(|_| (2.0, 12)).collect();
    let p = chain(&fwd, &bwd, 0);
    let points = sweep(&p, &[1.0, 0.8, 0.6, 0.4, 0.05], &PlanOptions::new(0)).unwrap();
    assert_eq!(points.len(), 5);
    assert_eq!(points[0].overhead, Some(0.0));
    let last = points.last().unwrap();
    assert_eq!(last.status, Status::Infeasible);
    assert_eq!(last.overhead, None);
    // An infeasible point says the least budget, as the plan at its budget does; a feasible
    // one has none.
    let (_, at_last) = plan(&p, &PlanOptions::new(last.budget_bytes)).unwrap();
    assert!(at_last.min_feasible_budget_bytes.is_some());
    assert_eq!(
        last.min_feasible_budget_bytes,
        at_last.min_feasible_budget_bytes
    );
    assert!(points
        .iter()
        .all(|q| q.overhead.is_some() == q.min_feasible_budget_bytes.is_none()));
    let feasible: Vec<f64> = points.iter().filter_map(|q| q.overhead).collect();
    assert!(
        feasible.windows(2).all(|w| w[0] <= w[1] + 1e-12),
        "{feasible:?}"
    );
    for q in &points {
        assert_eq!(
            q.budget_bytes,
            parse_budget(&format!("{}x", q.fraction), store_all_peak(&p)).unwrap()
        );
        assert_eq!(
            q.baselines.iter().map(|b| b.0.as_str()).collect::<Vec<_>>(),
            remat_solver::baselines::BASELINE_NAMES.to_vec()
        );
        // The gap names what it is against: the plan's bound at that budget.
        assert_eq!(q.gap.is_some(), q.bound_source.is_some(), "{q:?}");
        if q.gap.is_some() {
            let (_, r) = plan(&p, &PlanOptions::new(q.budget_bytes)).unwrap();
            assert_eq!(
                q.bound_source.as_deref(),
                r.lower_bound.map(|b| b.source.name()),
                "{q:?}"
            );
        }
    }
    assert!(sweep(&p, &[0.0], &PlanOptions::new(0)).is_err());
}

fn graph(prefix: &str) -> Problem {
    let dir = crate::common::manifest_dir().join("../../shared/bench/graphs");
    let path = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("shared graphs at {}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .find(|p| {
            let f = p.file_name().unwrap().to_string_lossy().to_string();
            f.starts_with(prefix) && !f.contains("_test_")
        })
        .unwrap_or_else(|| panic!("no graph for {prefix}"));
    read_node_link(&path).unwrap()
}

/// Data-driven: published graphs at published budgets. The plan must fit, beat or match every
/// feasible baseline, and report a gap when a bound is known.
#[test]
fn published_graphs_plan_within_budget() {
    // (graph, M, published budget)
    let cases = [
        ("VGG16 (MLSys)", 0.9, 14242598093u64),
        ("fcn_8_vgg (MLSys)", 0.8, 10787836416),
        ("random_layered_n100_", 0.8, 37056),
    ];
    for (prefix, m, published) in cases {
        let p = graph(prefix);
        let budget = parse_budget(&format!("{m}x"), store_all_peak(&p)).unwrap();
        assert_eq!(budget, published, "{prefix}");
        let opts = PlanOptions {
            budget,
            algorithm: Algorithm::Auto,
            time_limit: Duration::from_secs(15),
            threads: 1,
            bound_time: Duration::ZERO,
            cancel: Default::default(),
        };
        let (schedule, report) = plan(&p, &opts).unwrap();
        let stats = simulate(&p, &schedule).unwrap();
        assert!(stats.peak_bytes <= budget, "{prefix}");
        assert_ne!(report.status, Status::Infeasible, "{prefix}");
        for b in report.baselines.iter().filter(|b| b.feasible) {
            assert!(
                stats.compute_cost <= b.compute_cost + 1e-9,
                "{prefix}: {}",
                b.name
            );
        }
        if let (Some(lb), Some(gap)) = (report.lower_bound, report.gap) {
            assert!(
                lb.compute_cost <= stats.compute_cost * (1.0 + 1e-9),
                "{prefix}"
            );
            assert!((0.0..=1.0).contains(&gap), "{prefix}");
        }
    }
}

#[test]
fn ilp_is_unavailable_only_without_highs() {
    // With the feature on, the explicit algorithm runs.
    let p = chain(&[(1.0, 5), (1.0, 5), (1.0, 5)], &[(1.0, 5), (1.0, 5)], 0);
    let opts = PlanOptions {
        algorithm: Algorithm::Ilp,
        ..PlanOptions::new(store_all_peak(&p))
    };
    let (_, report) = plan::plan(&p, &opts).unwrap();
    assert_eq!(report.status, Status::Optimal);
    assert_eq!(report.predicted.overhead, 0.0);
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 12, ..ProptestConfig::default() })]

    /// The boundary model's MILP bound lies between its LP relaxation's and the exact optimum
    /// (the MILP's, on training DAGs and chains); the loose model's LP bound is at most the
    /// boundary model's.
    #[test]
    fn boundary_bound_lies_between_the_lp_and_the_optimum(p in prop_oneof![arb_training_dag(5), arb_chain(6)], f in 0.0f64..1.0) {
        let budget = budget_at(&p, f);
        let out = solve(&p, budget);
        let mut o = IlpOptions::new(budget, TIME);
        o.warm_start = out.schedule.clone();
        let b = ilp::boundary_bound(&p, &o).unwrap();
        let lp = ilp::lp_bound(&p, ilp::Model::Boundary, budget, TIME, 1).unwrap();
        let loose = ilp::lp_bound(&p, ilp::Model::Loose, budget, TIME, 1).unwrap();
        if let (Some(l), Some(b)) = (loose.bound, lp.bound) {
            prop_assert!(l <= b * (1.0 + 1e-6), "loose {} > boundary {}", l, b);
        }
        if b.status == IlpStatus::Infeasible {
            // A relaxation: infeasible only where the stage model is.
            prop_assert!(out.stats.is_none());
        }
        if let Some(st) = out.stats {
            {
                prop_assert_eq!(out.status, IlpStatus::Optimal);
                prop_assert_eq!(b.status, IlpStatus::Optimal);
                let bound = b.bound.unwrap();
                prop_assert!(bound <= st.compute_cost * (1.0 + 1e-6), "{} > optimum {}", bound, st.compute_cost);
                prop_assert!(bound >= lp.bound.unwrap() * (1.0 - 1e-6), "{} < LP {:?}", bound, lp.bound);
            }
        }
    }
}

#[test]
fn lp_relaxation_bounds_the_milp() {
    let fwd: Vec<(f64, u64)> = (0..6).map(|i| (1.0 + i as f64, 10 + 4 * i)).collect();
    let bwd: Vec<(f64, u64)> = (0..5).map(|i| (2.0 + i as f64, 12)).collect();
    let p = chain(&fwd, &bwd, 3);
    for f in [0.1, 0.5, 0.9] {
        let budget = budget_at(&p, f);
        let lp = ilp::lp_bound(&p, ilp::Model::Boundary, budget, TIME, 1).unwrap();
        let out = solve(&p, budget);
        let cost = out.stats.expect("feasible").compute_cost;
        let bound = lp.bound.expect("the LP is solved");
        assert!(
            bound >= p.base_cost() - 1e-9 && bound <= cost + 1e-9,
            "{bound} {cost}"
        );
    }
    let lp = ilp::lp_bound(
        &p,
        ilp::Model::Boundary,
        p.footprint_lower_bound() - 1,
        TIME,
        1,
    )
    .unwrap();
    assert_eq!(lp.status, IlpStatus::Infeasible);
}

/// `bound_time`: where `auto` does not run the MILP (171 nodes), the LP relaxation bounds the
/// schedule after it is found, and the report says so; without it, the time-point relaxation
/// (which every plan runs) is the bound.
#[test]
fn bound_time_adds_the_lp_bound_where_the_milp_does_not_run() {
    let fwd: Vec<(f64, u64)> = (0..86)
        .map(|i| (1.0 + (i % 7) as f64, 10 + (i % 5) as u64 * 4))
        .collect();
    let bwd: Vec<(f64, u64)> = (0..85).map(|i| (2.0 + (i % 3) as f64, 12)).collect();
    let p = chain(&fwd, &bwd, 0);
    let budget = budget_at(&p, 0.2);
    let base = PlanOptions {
        time_limit: Duration::from_secs(3),
        ..PlanOptions::new(budget)
    };
    let (_, plain) = plan(&p, &base).unwrap();
    let (schedule, bounded) = plan(
        &p,
        &PlanOptions {
            bound_time: Duration::from_secs(5),
            ..base.clone()
        },
    )
    .unwrap();
    assert_eq!(plain.bound_seconds, 0.0);
    let lb0 = plain.lower_bound.expect("a bound");
    assert_eq!(lb0.source, plan::BoundSource::TimePoints);
    assert!(lb0.compute_cost > p.base_cost());
    let lb = bounded.lower_bound.expect("a bound");
    // The LP relaxation, then (for the rest of the time) the same model as a MILP, where
    // they beat the time points.
    assert!(
        matches!(
            lb.source,
            plan::BoundSource::Lp | plan::BoundSource::BoundaryMilp | plan::BoundSource::TimePoints
        ),
        "{bounded:?}"
    );
    let cost = simulate(&p, &schedule).unwrap().compute_cost;
    assert!(lb.compute_cost >= lb0.compute_cost && lb.compute_cost <= cost + 1e-9);
    assert!(bounded.bound_seconds > 0.0 && bounded.bound_seconds <= bounded.solve_seconds);
}

/// The explicit MILP where no baseline fits (a random layered graph): it starts from the peak
/// descent, so even a short limit returns a schedule close to `auto`'s instead of whatever
/// HiGHS found alone.
#[test]
fn explicit_ilp_starts_from_the_peak_descent_where_no_baseline_fits() {
    let p = graph("random_layered_n100_");
    let budget = parse_budget("0.8x", store_all_peak(&p)).unwrap();
    let opts = PlanOptions {
        algorithm: Algorithm::Ilp,
        time_limit: Duration::from_secs(2),
        ..PlanOptions::new(budget)
    };
    let (schedule, report) = plan(&p, &opts).unwrap();
    assert!(report.baselines.iter().all(|b| !b.feasible));
    assert_ne!(report.status, Status::Infeasible);
    let stats = simulate(&p, &schedule).unwrap();
    assert!(stats.peak_bytes <= budget);
    assert!(
        report.predicted.overhead < 0.10,
        "{}",
        report.predicted.overhead
    );
}

fn options(budget: u64, algorithm: Algorithm, seconds: u64) -> PlanOptions {
    PlanOptions {
        budget,
        algorithm,
        time_limit: Duration::from_secs(seconds),
        threads: 1,
        bound_time: Duration::ZERO,
        cancel: Default::default(),
    }
}

/// The chain DP is checked against exhaustive search up to `PROVEN_STAGES` stages; on this
/// 12-stage chain at 247 bytes it returns a schedule of cost 173 where the MILP (and
/// exhaustive search) find 170. It called 173 optimal, and `auto` returned it at once. Now
/// only the MILP's optimum is (a chain has one order, so the stage model's optimum is every
/// schedule's), and `--solver dp` says feasible, with its gap.
#[test]
fn the_chain_dp_is_not_called_optimal_beyond_the_stages_it_is_proven_for() {
    let fwd = [
        (7.0, 1),
        (1.0, 85),
        (3.0, 99),
        (10.0, 23),
        (5.0, 13),
        (7.0, 14),
        (10.0, 24),
        (7.0, 30),
        (9.0, 77),
        (6.0, 6),
        (4.0, 16),
        (8.0, 28),
    ];
    let bwd = [
        (9.0, 86),
        (3.0, 33),
        (10.0, 56),
        (9.0, 17),
        (1.0, 22),
        (5.0, 2),
        (3.0, 30),
        (6.0, 70),
        (6.0, 21),
        (7.0, 42),
        (1.0, 7),
    ];
    let p = chain(&fwd, &bwd, 0);
    assert!(p.order_is_forced());
    let dp = remat_solver::dp::solve_chain_with(&p, 247, remat_solver::dp::DpMode::Auto).unwrap();
    assert_eq!(dp.compute_cost, 173.0);
    assert!(!dp.optimal, "12 stages: more than the DP is proven for");
    let (_, by_dp) = plan(&p, &options(247, Algorithm::Dp, 10)).unwrap();
    assert_eq!(by_dp.status, Status::Feasible);
    assert!(by_dp.lower_bound.unwrap().compute_cost <= 170.0);
    let (_, auto) = plan(&p, &options(247, Algorithm::Auto, 30)).unwrap();
    assert_eq!(auto.predicted.compute_cost, 170.0, "{auto:?}");
    assert_eq!(auto.status, Status::Optimal);
    assert!(
        auto.order_bound.is_none(),
        "one order: the MILP's bound is every schedule's"
    );
}

/// Checkmate's stage model fixes the order in which nodes are first computed. On this
/// 10-node DAG at 190 bytes its MILP's optimum is 107 (+101.9%), which the plan called
/// optimal with a lower bound of 107, while the schedule below, in another order, fits at
/// cost 58 (found by exhaustive search). A bound of the stage model is now the report's
/// `order_bound`, never its `lower_bound`, and proves no `optimal`.
#[test]
fn stage_model_bounds_do_not_bound_schedules_in_another_order() {
    let links: Vec<serde_json::Value> = [
        [0, 1],
        [0, 2],
        [1, 7],
        [1, 9],
        [2, 4],
        [2, 6],
        [2, 8],
        [3, 4],
        [4, 5],
        [4, 6],
        [4, 7],
        [4, 9],
        [5, 6],
        [6, 8],
        [7, 9],
    ]
    .iter()
    .map(|[s, t]| serde_json::json!({"source": s, "target": t}))
    .collect();
    let graph = serde_json::json!({
        "directed": true,
        "nodes": [
            {"id": 0, "cost_cpu": 5, "cost_ram": 98}, {"id": 1, "cost_cpu": 3, "cost_ram": 23},
            {"id": 2, "cost_cpu": 9, "cost_ram": 89}, {"id": 3, "cost_cpu": 6, "cost_ram": 60},
            {"id": 4, "cost_cpu": 9, "cost_ram": 41}, {"id": 5, "cost_cpu": 4, "cost_ram": 29},
            {"id": 6, "cost_cpu": 4, "cost_ram": 20, "backward": true},
            {"id": 7, "cost_cpu": 1, "cost_ram": 33}, {"id": 8, "cost_cpu": 7, "cost_ram": 22},
            {"id": 9, "cost_cpu": 5, "cost_ram": 83}
        ],
        "links": links,
    });
    let p = remat_solver::io::parse_node_link(&graph.to_string(), "pdag0").unwrap();
    assert!(!p.order_is_forced());
    let steps: Vec<remat_solver::schedule::StepJson> = serde_json::from_value(serde_json::json!([
        {"op": "compute", "node": "0"}, {"op": "compute", "node": "2"}, {"op": "free", "node": "0"},
        {"op": "compute", "node": "3"}, {"op": "compute", "node": "4"}, {"op": "free", "node": "3"},
        {"op": "compute", "node": "5"}, {"op": "compute", "node": "6"}, {"op": "free", "node": "5"},
        {"op": "compute", "node": "8"}, {"op": "free", "node": "8"}, {"op": "free", "node": "2"},
        {"op": "free", "node": "6"}, {"op": "compute", "node": "0"}, {"op": "compute", "node": "1"},
        {"op": "free", "node": "0"}, {"op": "compute", "node": "7"}, {"op": "compute", "node": "9"}
    ]))
    .unwrap();
    let other_order = simulate(&p, &Schedule::from_json_steps(&p, &steps).unwrap()).unwrap();
    assert!(other_order.peak_bytes <= 190);
    assert_eq!(other_order.compute_cost, 58.0);
    for algorithm in [Algorithm::Auto, Algorithm::Ilp] {
        let (_, r) = plan(&p, &options(190, algorithm, 5)).unwrap();
        let cost = r.predicted.compute_cost;
        let bound = r.lower_bound.unwrap().compute_cost;
        assert!(
            bound <= 58.0,
            "{algorithm}: lower bound {bound} above a schedule of 58"
        );
        assert!(
            r.status != Status::Optimal || cost <= 58.0,
            "{algorithm}: {cost} called optimal"
        );
        if cost > 58.0 {
            assert!(r.gap.unwrap() >= (cost - 58.0) / cost - 1e-9, "{algorithm}");
        }
        let order = r
            .order_bound
            .expect("the stage model's bound, reported apart");
        assert!(order.compute_cost > 58.0, "{algorithm}: {order:?}");
    }
}

/// A chain longer than the DP takes is planned as any graph: the program's `(N+1)·N²·8`
/// frontiers are allocated whatever its mode (a 600-node chain asked for 41 GB and aborted
/// the process, a service's with it). `--solver dp` says why it cannot run.
#[test]
fn a_chain_longer_than_the_dp_takes_is_planned_without_it() {
    use remat_solver::dp::{as_training_chain, chain_structure, MAX_FORWARD};
    let n = MAX_FORWARD + 1;
    let fwd: Vec<(f64, u64)> = (0..n)
        .map(|i| (1.0 + (i % 3) as f64, 10 + (i % 5) as u64))
        .collect();
    let bwd: Vec<(f64, u64)> = (0..n - 1).map(|i| (2.0, 8 + (i % 4) as u64)).collect();
    let p = chain(&fwd, &bwd, 0);
    assert!(as_training_chain(&p).is_none());
    let why = chain_structure(&p).unwrap_err();
    assert!(
        why.contains(&format!("{n} nodes")) && why.contains("100"),
        "{why}"
    );
    let e = plan(&p, &options(store_all_peak(&p), Algorithm::Dp, 5))
        .unwrap_err()
        .to_string();
    assert!(e.contains("longer than the chain DP takes"), "{e}");
    let budget = budget_at(&p, 0.5);
    let (schedule, r) = plan(&p, &options(budget, Algorithm::Auto, 2)).unwrap();
    assert!(simulate(&p, &schedule).unwrap().peak_bytes <= budget);
    assert_ne!(r.status, Status::Infeasible);
}

/// fcn_8_vgg allows other orders; `--solver ilp` at 0.8x proves its schedule optimal in the
/// graph's order, which used to skip the time-point bound: the plan reported store-all's cost as
/// its bound (the gap was the whole overhead, 0.14%). The time-point bound still runs.
#[test]
fn an_optimum_in_the_graphs_order_still_gets_the_time_point_bound() {
    let p = graph("fcn_8_vgg");
    assert!(!p.order_is_forced());
    let budget = parse_budget("0.8x", store_all_peak(&p)).unwrap();
    let (_, r) = plan(&p, &options(budget, Algorithm::Ilp, 20)).unwrap();
    let lb = r.lower_bound.unwrap();
    assert_eq!(
        lb.source,
        remat_solver::plan::BoundSource::TimePoints,
        "{r:?}"
    );
    assert!(lb.compute_cost > r.store_all_cost);
    assert!(lb.compute_cost <= r.predicted.compute_cost);
}
