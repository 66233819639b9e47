//! Property tests of the torch-sac model on random chains of blocks, each captured step built
//! the way `remat.torch.capture` would record it: every plan the planner returns fits its budget
//! and is scored by the simulator; full checkpointing never holds more at the forward's end than
//! the unplanned step and the regions' inputs; a plan's document reads back to the same plan.

use proptest::prelude::*;
use remat_solver::sac::{
    self, SacPlan, TorchGraph, TorchOp, TorchRegion, TorchSave, TorchStorage, FORMAT, VERSION,
};

/// A step of `blocks.len()` regions: block `b` runs ops `f(b, 0..m)`, op `j` allocates `s(b, j)`
/// of `bytes[b][j]` and saves its input (the previous op's output) when `saves[b][j]`; a loss op;
/// then the backward in reverse, one gradient op per forward op, which releases the save.
#[allow(clippy::type_complexity)]
fn build(blocks: &[Vec<(u64, f64, bool)>]) -> TorchGraph {
    let mut ops: Vec<TorchOp> = Vec::new();
    let mut storages: Vec<TorchStorage> = Vec::new();
    let mut regions = Vec::new();
    let mut fwd_storage: Vec<Vec<usize>> = Vec::new();
    let op = |name: &str, region: Option<usize>, occurrence: Option<usize>, cost: f64| TorchOp {
        op: name.into(),
        phase: String::new(),
        module: String::new(),
        region,
        occurrence,
        cost,
        outputs: vec![],
        random: false,
        transient: 0,
    };
    for (b, block) in blocks.iter().enumerate() {
        let first = ops.len();
        let mut ids = Vec::new();
        for (j, &(bytes, cost, _)) in block.iter().enumerate() {
            let i = ops.len();
            let mut o = op("aten.f.default", Some(b), Some(j), cost);
            let s = storages.len();
            o.outputs.push(s);
            ops.push(o);
            storages.push(TorchStorage {
                bytes,
                producer: i,
                free_after: None,
                natural_free_after: None,
                saves: vec![],
                mutated: false,
            });
            ids.push(s);
        }
        regions.push(TorchRegion {
            fqn: format!("blocks.{b}"),
            call: 0,
            class_name: "Block".into(),
            first_op: first,
            last_op: ops.len() - 1,
            stop_op: None,
            trigger_op: None,
            inputs: if b > 0 {
                vec![*fwd_storage[b - 1].last().unwrap()]
            } else {
                vec![]
            },
            rerun_extra_bytes: 0,
            writes_input: None,
        });
        fwd_storage.push(ids);
    }
    let loss = ops.len();
    let mut o = op("aten.loss.default", None, None, 1.0);
    o.outputs.push(storages.len());
    ops.push(o);
    storages.push(TorchStorage {
        bytes: 4,
        producer: loss,
        free_after: None,
        natural_free_after: None,
        saves: vec![],
        mutated: false,
    });
    let forward_ops = ops.len();
    // Natural deaths: each value dies after its consumer (the next op), the last after the loss.
    let all: Vec<usize> = fwd_storage.iter().flatten().copied().collect();
    for &s in &all {
        storages[s].natural_free_after = Some(storages[s].producer + 1);
    }
    storages[*all.last().unwrap()].natural_free_after = Some(loss);
    // Saves: op j of block b saves its input: s(b, j-1), or the previous block's output.
    let mut save_of: Vec<(usize, usize, usize)> = Vec::new(); // (storage, saving op, region)
    for (b, block) in blocks.iter().enumerate() {
        for (j, &(_, _, saves)) in block.iter().enumerate() {
            let input = if j > 0 {
                Some(fwd_storage[b][j - 1])
            } else if b > 0 {
                Some(*fwd_storage[b - 1].last().unwrap())
            } else {
                None
            };
            if let (true, Some(input)) = (saves, input) {
                let op_index = regions[b].first_op + j;
                save_of.push((input, op_index, b));
                regions[b].stop_op = Some(
                    regions[b]
                        .stop_op
                        .map_or(op_index - 1, |s: usize| s.max(op_index - 1)),
                );
            }
        }
    }
    // Backward: one op per forward op in reverse; gradient storages die after the next one.
    let mut prev_grad: Option<usize> = None;
    for (b, block) in blocks.iter().enumerate().rev() {
        for j in (0..block.len()).rev() {
            let i = ops.len();
            let fwd = regions[b].first_op + j;
            // The unpack of f's save happens before its gradient op.
            for &(s, saving, r) in &save_of {
                if saving == fwd {
                    if regions[r].trigger_op.is_none() {
                        regions[r].trigger_op = Some(i);
                    }
                    storages[s].saves.push(TorchSave {
                        after_op: saving - 1,
                        region: Some(r),
                        released_after: Some(i),
                    });
                }
            }
            let mut o = op("aten.f_backward.default", None, None, 2.0 * ops[fwd].cost);
            let g = storages.len();
            o.outputs.push(g);
            ops.push(o);
            storages.push(TorchStorage {
                bytes: storages[fwd_storage[b][j]].bytes,
                producer: i,
                free_after: None,
                natural_free_after: None,
                saves: vec![],
                mutated: false,
            });
            if let Some(p) = prev_grad {
                storages[p].free_after = Some(i);
                storages[p].natural_free_after = Some(i);
            }
            prev_grad = Some(g);
        }
    }
    let last = ops.len() - 1;
    if let Some(p) = prev_grad {
        storages[p].free_after = Some(last);
        storages[p].natural_free_after = Some(last);
    }
    let loss_storage = ops[loss].outputs[0];
    storages[loss_storage].free_after = Some(forward_ops);
    // The unplanned death: the last of the natural death and the saves' releases.
    for s in all {
        let natural = storages[s].natural_free_after.unwrap();
        let released = storages[s]
            .saves
            .iter()
            .filter_map(|sv| sv.released_after)
            .max();
        storages[s].free_after = Some(released.map_or(natural, |r| r.max(natural)));
    }
    TorchGraph {
        format: FORMAT.into(),
        version: VERSION,
        name: "random".into(),
        device: "cpu".into(),
        cost_unit: "flop".into(),
        fingerprint: "f".into(),
        signature: serde_json::Value::Null,
        fixed_bytes: 1000,
        forward_ops,
        regions,
        ops,
        storages,
        wrap_cost: None,
    }
}

/// `g` with a tensor of `bytes` made before the first block (op 0, outside every region) that
/// every block takes as an input, as a decoder's position tensors are; when `saved`, each
/// block's first op saves it too, released at the block's trigger. Its life then depends on
/// every block's option (the last wrapped block's frame holds it).
fn with_shared_input(mut g: TorchGraph, bytes: u64, saved: bool) -> TorchGraph {
    let shift = |x: &mut usize| *x += 1;
    let shift_opt = |x: &mut Option<usize>| {
        if let Some(v) = x {
            *v += 1;
        }
    };
    for r in &mut g.regions {
        shift(&mut r.first_op);
        shift(&mut r.last_op);
        shift_opt(&mut r.stop_op);
        shift_opt(&mut r.trigger_op);
    }
    for st in &mut g.storages {
        shift(&mut st.producer);
        shift_opt(&mut st.free_after);
        shift_opt(&mut st.natural_free_after);
        for sv in &mut st.saves {
            shift(&mut sv.after_op);
            shift_opt(&mut sv.released_after);
        }
    }
    g.forward_ops += 1;
    let id = g.storages.len();
    g.ops.insert(
        0,
        TorchOp {
            op: "aten.arange.default".into(),
            phase: String::new(),
            module: String::new(),
            region: None,
            occurrence: None,
            cost: 0.0,
            outputs: vec![id],
            random: false,
            transient: 0,
        },
    );
    let natural = g.forward_ops - 1; // the loss
    let mut saves = Vec::new();
    for (r, reg) in g.regions.iter_mut().enumerate() {
        reg.inputs.push(id);
        if let (true, Some(trigger)) = (saved, reg.trigger_op) {
            saves.push(TorchSave {
                after_op: reg.first_op,
                region: Some(r),
                released_after: Some(trigger),
            });
        }
    }
    let free_after = saves
        .iter()
        .filter_map(|sv| sv.released_after)
        .fold(natural, usize::max);
    g.storages.push(TorchStorage {
        bytes,
        producer: 0,
        free_after: Some(free_after),
        natural_free_after: Some(natural),
        saves,
        mutated: false,
    });
    g
}

fn arb_graph() -> impl Strategy<Value = TorchGraph> {
    let block = prop::collection::vec((1u64..200, 0.0f64..10.0, prop::bool::weighted(0.7)), 2..6);
    // Half the graphs price checkpointing's own work, as a `cost="measured"` capture does:
    // a price per dispatched op, and the unplanned step's time a little above its ops'.
    let wrap = prop::option::of((0.0f64..3.0, 0.0f64..20.0));
    (prop::collection::vec(block, 1..6), prop::bool::ANY, wrap).prop_map(|(blocks, same, wrap)| {
        let mut g = if same {
            let first = blocks[0].clone();
            build(&vec![first; blocks.len()])
        } else {
            build(&blocks)
        };
        g.wrap_cost = wrap.map(|(per_op, python)| sac::WrapCost {
            per_op,
            step: g.base_cost() + python,
            source: "test".into(),
            pairs: vec![],
        });
        g
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 128, ..ProptestConfig::default() })]

    #[test]
    fn plans_fit_and_are_scored_by_the_simulator(g in arb_graph(), frac in 0.0f64..1.2) {
        g.check().map_err(|e| TestCaseError::fail(e.to_string()))?;
        let unplanned = sac::simulate(&g, &SacPlan::default()).unwrap();
        let full = sac::simulate(&g, &SacPlan::full(&g)).unwrap();
        // Full checkpointing may hold more only by the regions' inputs, which each checkpoint
        // holds whether or not a save of its region does.
        let inputs: u64 = g
            .regions
            .iter()
            .flat_map(|r| &r.inputs)
            .map(|&s| g.storages[s].bytes)
            .sum();
        prop_assert!(full.forward_end_bytes <= unplanned.forward_end_bytes + inputs);
        prop_assert!(full.compute_cost >= unplanned.compute_cost);
        // The least peak of the planner's candidates: at most full checkpointing's and the
        // unplanned step's (a plan keeping a little can peak lower than both).
        let lo = sac::Candidates::new(&g).unwrap().least_peak();
        prop_assert!(lo <= full.peak_bytes.min(unplanned.peak_bytes));
        let budget = lo + ((unplanned.peak_bytes - lo) as f64 * frac) as u64;
        let (plan, report) = sac::plan(&g, budget).unwrap();
        let s = sac::simulate(&g, &plan).unwrap();
        prop_assert_eq!(&s, &report.predicted);
        prop_assert_eq!(report.status, "fits");
        prop_assert!(s.peak_bytes <= budget, "{} > {budget}", s.peak_bytes);
        prop_assert!(s.compute_cost >= g.base_cost() - 1e-9);
        prop_assert!(s.compute_cost <= full.compute_cost.max(unplanned.compute_cost) + 1e-9);
        // The document names the same plan.
        let doc = sac::document(&g, &plan, &report);
        prop_assert_eq!(sac::plan_from_document(&g, &doc).unwrap(), plan);
        if lo > 0 {
            let (low, r) = sac::plan(&g, lo - 1).unwrap();
            prop_assert_eq!(r.status, "infeasible");
            prop_assert_eq!(sac::simulate(&g, &low).unwrap().peak_bytes, lo);
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 128, ..ProptestConfig::default() })]

    #[test]
    fn a_larger_budget_never_costs_more(g in arb_graph(), a in 0.0f64..1.0, b in 0.0f64..1.0) {
        let unplanned = sac::simulate(&g, &SacPlan::default()).unwrap().peak_bytes;
        let lo = sac::simulate(&g, &SacPlan::full(&g)).unwrap().peak_bytes.min(unplanned);
        let (small, large) = if a <= b { (a, b) } else { (b, a) };
        let at = |f: f64| lo + ((unplanned - lo) as f64 * f) as u64;
        let (_, r1) = sac::plan(&g, at(small)).unwrap();
        let (_, r2) = sac::plan(&g, at(large)).unwrap();
        prop_assert!(
            r2.predicted.compute_cost <= r1.predicted.compute_cost + 1e-9,
            "{} at {} > {} at {}",
            r2.predicted.compute_cost,
            at(large),
            r1.predicted.compute_cost,
            at(small)
        );
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    /// `remat sweep` on a captured graph: at budgets in any order, the overhead never rises
    /// with the budget, a feasible point costs no more than the plan at its budget, and a point
    /// is infeasible exactly below the candidates' least peak.
    #[test]
    fn a_sweep_never_rises_with_the_budget(g in arb_graph(), fracs in prop::collection::vec(0.05f64..1.2, 1..6)) {
        let least = sac::Candidates::new(&g).unwrap().least_peak();
        let points = sac::sweep(&g, &fracs).unwrap().points;
        prop_assert_eq!(points.len(), fracs.len());
        for p in &points {
            let (_, r) = sac::plan(&g, p.budget_bytes).unwrap();
            prop_assert_eq!(p.overhead.is_some(), p.budget_bytes >= least);
            if let Some(o) = p.overhead {
                prop_assert!(o <= r.predicted.overhead() + 1e-12, "{} > plan's {}", o, r.predicted.overhead());
            }
            for q in &points {
                if let (Some(a), Some(b)) = (p.overhead, q.overhead) {
                    if p.budget_bytes <= q.budget_bytes {
                        prop_assert!(b <= a + 1e-12, "{} at {} > {} at {}", b, q.budget_bytes, a, p.budget_bytes);
                    }
                }
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    /// The ops the planner keeps at some budgets, marked as drawing random numbers, are kept
    /// by no plan at those budgets (SAC does not run a kept op again: a random op after it
    /// would draw other numbers in the re-run). Cases where nothing is kept are rejected, so
    /// the property is checked on graphs where keeping pays.
    #[test]
    fn a_random_op_is_never_kept(g in arb_graph(), fracs in prop::collection::vec(0.0f64..1.0, 1..4)) {
        let lo = sac::Candidates::new(&g).unwrap().least_peak();
        let unplanned = sac::simulate(&g, &SacPlan::default()).unwrap().peak_bytes;
        let budgets: Vec<u64> = fracs.iter().map(|f| lo + ((unplanned - lo) as f64 * f) as u64).collect();
        let kept: std::collections::BTreeSet<usize> = budgets
            .iter()
            .flat_map(|&b| sac::plan(&g, b).unwrap().0.wrapped.into_values().flatten())
            .collect();
        prop_assume!(!kept.is_empty());
        let mut g = g;
        for &j in &kept {
            g.ops[j].random = true;
        }
        for &b in &budgets {
            let (p, _) = sac::plan(&g, b).unwrap();
            let again: Vec<usize> = p.wrapped.values().flatten().filter(|j| kept.contains(j)).copied().collect();
            prop_assert!(again.is_empty(), "budget {b}: kept random ops {again:?}");
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    /// `remat gate`'s `best_peak_within_overhead_bytes` for captured graphs: between the least
    /// peak and the unplanned one, never larger for a larger cap, and a plan at that budget
    /// stays within the cap (the planner picks the cheapest candidate that fits).
    #[test]
    fn the_least_peak_within_an_overhead_is_reached_by_a_plan(
        g in arb_graph(), a in 0.0f64..0.6, b in 0.0f64..0.6,
    ) {
        let (small, large) = if a <= b { (a, b) } else { (b, a) };
        let unplanned = sac::simulate(&g, &SacPlan::default()).unwrap().peak_bytes;
        let candidates = sac::Candidates::new(&g).unwrap();
        let p_small = candidates.least_peak_within_overhead(small);
        let p_large = candidates.least_peak_within_overhead(large);
        prop_assert!(p_large <= p_small && p_small <= unplanned, "{p_large} {p_small} {unplanned}");
        let (_, report) = sac::plan(&g, p_small).unwrap();
        prop_assert!(report.min_peak_bytes <= p_small);
        prop_assert_eq!(report.status, "fits");
        prop_assert!(report.predicted.peak_bytes <= p_small);
        prop_assert!(report.predicted.overhead() <= small + 1e-9, "{} > {small}", report.predicted.overhead());
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    /// The block plans are exhaustive over uniform plans: for copies of one block, every keep
    /// set of its keepable ops given to every copy (and every copy unwrapped) is matched or
    /// beaten by the planner at that plan's peak.
    #[test]
    fn no_uniform_plan_of_a_repeated_block_beats_the_planner(
        block in prop::collection::vec((1u64..200, 0.0f64..10.0, prop::bool::weighted(0.7)), 2..6),
        copies in 2usize..5,
    ) {
        let g = build(&vec![block; copies]);
        let candidates = sac::Candidates::new(&g).unwrap();
        let reg = &g.regions[0];
        let offsets: Vec<usize> = (reg.first_op..=reg.last_op)
            .filter(|&j| sac::keepable(&g, 0, j))
            .map(|j| j - reg.first_op)
            .collect();
        let mut uniform = vec![SacPlan::default()];
        for mask in 0u32..(1 << offsets.len()) {
            let mut plan = SacPlan::full(&g);
            for (r, region) in g.regions.iter().enumerate() {
                let keep = (0..offsets.len())
                    .filter(|b| mask & (1 << b) != 0)
                    .map(|b| region.first_op + offsets[b])
                    .collect();
                plan.wrapped.insert(r, keep);
            }
            uniform.push(plan);
        }
        for plan in uniform {
            let s = sac::simulate(&g, &plan).unwrap();
            let (_, report) = candidates.select(s.peak_bytes).unwrap();
            prop_assert!(
                report.predicted.compute_cost <= s.compute_cost + 1e-9,
                "{:?}: {} against {}", plan.wrapped, report.predicted.compute_cost, s.compute_cost
            );
        }
    }
}

/// Every plan of the chain program's class on `g`: each region unwrapped, or wrapped keeping
/// one subset of its keepable ops.
fn per_region_plans(g: &TorchGraph) -> Vec<SacPlan> {
    let mut plans = vec![SacPlan::default()];
    for (r, reg) in g.regions.iter().enumerate() {
        let ops: Vec<usize> = (reg.first_op..=reg.last_op)
            .filter(|&j| sac::keepable(g, r, j))
            .collect();
        let mut next = Vec::new();
        for p in &plans {
            next.push(p.clone());
            for mask in 0u32..(1 << ops.len()) {
                let mut q = p.clone();
                let keep = (0..ops.len())
                    .filter(|b| mask & (1 << b) != 0)
                    .map(|b| ops[b])
                    .collect();
                q.wrapped.insert(r, keep);
                next.push(q);
            }
        }
        plans = next;
    }
    plans
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    /// The chain program on random chains: its bound is never below the simulated peak of
    /// what it chooses, and where its figures have the exact shape, no plan giving each region
    /// one of its options beats the planner at that plan's peak plus the program's rounding
    /// (one slot per region): exact on its class; and its lower bound at each such plan's peak
    /// is at most that plan's cost.
    #[test]
    fn the_chain_program_is_exact_on_its_class(
        blocks in prop::collection::vec(
            prop::collection::vec((1u64..200, 0.0f64..10.0, prop::bool::weighted(0.7)), 2..5),
            1..4,
        ),
        same in prop::bool::ANY,
        scale in prop::sample::select(vec![1u64, 4099, 1_000_003]),
    ) {
        // Large sizes make the program's grid coarser than a byte (its rounding matters).
        let blocks: Vec<Vec<(u64, f64, bool)>> = blocks
            .iter()
            .map(|b| b.iter().map(|&(bytes, c, sv)| (bytes * scale, c, sv)).collect())
            .collect();
        let g = if same { build(&vec![blocks[0].clone(); blocks.len()]) } else { build(&blocks) };
        let model = sac::ChainModel::build(&g).unwrap().expect("a chain of regions");
        let unplanned = sac::simulate(&g, &SacPlan::default()).unwrap().peak_bytes;
        for i in 0..=8u64 {
            let budget = unplanned * i / 8;
            if let Some(c) = model.solve(&g, budget) {
                let s = sac::simulate(&g, &c.plan).unwrap();
                prop_assert!(s.peak_bytes <= c.bound_bytes, "{} > bound {}", s.peak_bytes, c.bound_bytes);
                prop_assert!((s.compute_cost - c.cost).abs() <= 1e-9 * c.cost.max(1.0));
                prop_assert!(c.bound_bytes <= budget);
            }
        }
        prop_assert!(model.additive, "a value of these chains is decided by one region");
        prop_assume!(model.exact_shape);
        let candidates = sac::Candidates::new(&g).unwrap();
        let slack = model.slot_bytes() * g.regions.len() as u64;
        for plan in per_region_plans(&g) {
            let s = sac::simulate(&g, &plan).unwrap();
            // The lower bound holds for every plan of the class at its own peak.
            if model.complete() {
                let bound = model.lower_bound(&g, s.peak_bytes).expect("exact and complete");
                prop_assert!(
                    bound <= s.compute_cost + 1e-9,
                    "bound {bound} above {:?} at its peak {}: {}", plan.wrapped, s.peak_bytes, s.compute_cost
                );
            }
            let (_, report) = candidates.select(s.peak_bytes + slack).unwrap();
            prop_assert!(
                report.predicted.compute_cost <= s.compute_cost + 1e-9,
                "{:?} (peak {}): {} against {}",
                plan.wrapped, s.peak_bytes, report.predicted.compute_cost, s.compute_cost
            );
        }
    }
}

/// The chain program's own check of what its exactness rests on: a value saved by two regions,
/// neither taking it as an input, lives as long as either holds it, so its life depends on both
/// regions' options and the regions' additions no longer add up.
#[test]
fn a_value_two_regions_decide_is_found_by_the_additivity_check() {
    let mut g = build(&[vec![(10, 1.0, true); 3], vec![(10, 1.0, true); 3]]);
    assert!(sac::ChainModel::build(&g).unwrap().unwrap().additive);
    let s = g.ops[g.regions[0].first_op].outputs[0];
    let release = g.regions[1].trigger_op.expect("block 1 saves");
    g.storages[s].saves.push(TorchSave {
        after_op: g.regions[1].first_op,
        region: Some(1),
        released_after: Some(release),
    });
    g.check().unwrap();
    assert!(!sac::ChainModel::build(&g).unwrap().unwrap().additive);
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    /// With a tensor every block takes (its life decided by several blocks), every plan that
    /// fits a budget costs at least the bound the planner reports there, whatever its source
    /// (the chain program on the graph with that tensor pinned, where it is exact there).
    #[test]
    fn the_bound_holds_where_a_shared_input_makes_lives_depend_on_several_blocks(
        blocks in prop::collection::vec(
            prop::collection::vec((1u64..200, 0.0f64..10.0, prop::bool::weighted(0.7)), 2..4),
            2..4,
        ),
        same in prop::bool::ANY,
        shared in 1u64..300,
        saved in prop::bool::ANY,
    ) {
        let g = if same { build(&vec![blocks[0].clone(); blocks.len()]) } else { build(&blocks) };
        let g = with_shared_input(g, shared, saved);
        g.check().map_err(|e| TestCaseError::fail(e.to_string()))?;
        let candidates = sac::Candidates::new(&g).unwrap();
        for plan in per_region_plans(&g) {
            let s = sac::simulate(&g, &plan).unwrap();
            let (_, report) = candidates.select(s.peak_bytes).unwrap();
            let bound = report.lower_bound.expect("a plan fits");
            prop_assert!(
                bound.compute_cost <= s.compute_cost * (1.0 + 1e-12) + 1e-9,
                "{} bound {} above {:?} at its peak {}: {}",
                bound.source, bound.compute_cost, plan.wrapped, s.peak_bytes, s.compute_cost
            );
        }
    }
}

/// The bound of a pinned program on a chain of identical blocks with a shared input: given, and
/// below the cost of every plan that fits.
#[test]
fn a_shared_input_gets_the_pinned_programs_bound() {
    let block = vec![(100, 5.0, true), (60, 1.0, true), (80, 3.0, true)];
    let g = with_shared_input(build(&vec![block; 3]), 50, false);
    g.check().unwrap();
    assert!(!g.storages_decided_apart().unwrap().is_empty());
    let candidates = sac::Candidates::new(&g).unwrap();
    let mut pinned = 0;
    for plan in per_region_plans(&g) {
        let s = sac::simulate(&g, &plan).unwrap();
        let (_, report) = candidates.select(s.peak_bytes).unwrap();
        let bound = report.lower_bound.unwrap();
        assert!(
            bound.compute_cost <= s.compute_cost + 1e-9,
            "{bound:?} vs {s:?}"
        );
        pinned += usize::from(bound.source == "pinned_chain_program");
    }
    assert!(pinned > 0, "no bound from the pinned program");
}

/// `g` with the forward ops' kernels drawing `transients` (cycled) beyond their outputs, so a
/// re-run op that is skipped (kept) takes a high point away.
fn with_transients(mut g: TorchGraph, transients: &[u64]) -> TorchGraph {
    for (i, op) in g.ops.iter_mut().take(g.forward_ops).enumerate() {
        op.transient = transients[i % transients.len()];
    }
    g
}

/// The resident bytes at each point of `plan`'s timeline, by (op, re-run of).
fn points_of(
    g: &TorchGraph,
    plan: &SacPlan,
) -> std::collections::HashMap<(usize, Option<usize>), u64> {
    sac::timeline(g, plan)
        .unwrap()
        .into_iter()
        .map(|p| ((p.op, p.rerun_of), p.bytes))
        .collect()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    /// What the chain program's relaxation rests on: keeping more ops of a wrapped region (the
    /// other regions' options unchanged) never lowers the resident bytes at a point both plans
    /// run; only the re-run points of the ops kept are gone.
    #[test]
    fn keeping_more_never_lowers_a_point_both_plans_run(
        g in arb_graph(),
        transients in prop::collection::vec(0u64..300, 1..5),
        masks in prop::collection::vec((any::<u32>(), any::<u32>()), 1..6),
    ) {
        let g = with_transients(g, &transients);
        let base = sac::Candidates::new(&g).unwrap();
        // Around the full plan, and around one the planner chose (other regions kept or unwrapped).
        let (chosen, _) = base.select(sac::simulate(&g, &SacPlan::default()).unwrap().peak_bytes / 2 + 1).unwrap();
        for around in [SacPlan::full(&g), chosen] {
            for (r, reg) in g.regions.iter().enumerate() {
                if !around.wrapped.contains_key(&r) {
                    continue;
                }
                let ops: Vec<usize> = (reg.first_op..=reg.last_op)
                    .filter(|&j| sac::keepable(&g, r, j))
                    .collect();
                for &(a, b) in &masks {
                    let subset = |m: u32| -> std::collections::BTreeSet<usize> {
                        ops.iter().enumerate().filter(|(i, _)| m & (1 << i) != 0).map(|(_, &j)| j).collect()
                    };
                    let (small, large) = (subset(a & b), subset(a));
                    let mut p_small = around.clone();
                    p_small.wrapped.insert(r, small.clone());
                    let mut p_large = around.clone();
                    p_large.wrapped.insert(r, large.clone());
                    let (lo, hi) = (points_of(&g, &p_small), points_of(&g, &p_large));
                    for (key, &bytes) in &lo {
                        match hi.get(key) {
                            Some(&more) => prop_assert!(
                                more >= bytes,
                                "region {r}, keeping {large:?} over {small:?}: {more} < {bytes} at {key:?}"
                            ),
                            None => prop_assert!(
                                key.1 == Some(r) && large.contains(&key.0) && !small.contains(&key.0),
                                "{key:?} gone keeping {large:?} over {small:?}"
                            ),
                        }
                    }
                    prop_assert_eq!(hi.len() + large.len() - small.len(), lo.len());
                }
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    /// The chain program enumerating the keep sets of fewer keepable ops than the regions have
    /// (its relaxation standing for the others): its lower bound at each plan's peak is at most
    /// that plan's cost, for every plan giving each region any keep set or none, and at most
    /// the bound of the program that enumerates every keep set.
    #[test]
    fn the_relaxed_program_bounds_every_keep_set(
        blocks in prop::collection::vec(
            prop::collection::vec((1u64..200, 0.1f64..10.0, prop::bool::weighted(0.8)), 3..6),
            1..4,
        ),
        same in prop::bool::ANY,
        transients in prop::collection::vec(0u64..300, 1..4),
        enumerated in 0usize..3,
    ) {
        let g = if same { build(&vec![blocks[0].clone(); blocks.len()]) } else { build(&blocks) };
        let g = with_transients(g, &transients);
        let relaxed = sac::ChainModel::build_enumerating(&g, enumerated).unwrap().expect("a chain");
        let complete = sac::ChainModel::build(&g).unwrap().expect("a chain");
        prop_assert!(complete.complete());
        prop_assume!(relaxed.exact() && !relaxed.complete());
        for plan in per_region_plans(&g) {
            let s = sac::simulate(&g, &plan).unwrap();
            let bound = relaxed.lower_bound(&g, s.peak_bytes).expect("exact");
            prop_assert!(
                bound <= s.compute_cost + 1e-9,
                "bound {bound} above {:?} at its peak {}: {}", plan.wrapped, s.peak_bytes, s.compute_cost
            );
            if let Some(full) = complete.lower_bound(&g, s.peak_bytes) {
                prop_assert!(bound <= full + 1e-9, "relaxed {bound} above enumerated {full}");
            }
        }
    }
}
