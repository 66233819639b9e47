//! `cargo run --release -p remat-exec --example plan_steps -- MODEL.onnx PLAN.json ROUNDS
//! [NAME=VALUE...]`: store-all and a plan (a `remat plan --json` document) run ROUNDS times
//! each in one process, alternating; every step at its least over the rounds; then, by node
//! kind, the seconds of store-all's computations, the plan's first computations of the same
//! nodes and the plan's recomputations, nodes that the plan recomputes apart. Where a plan's
//! measured overhead differs from its recomputations' cost, this says whether the rest of its
//! steps ran faster or slower than store-all's (docs/cost-model.md, "The executor's
//! measurement").

use remat_exec::validate::Timed;
use remat_exec::{ExecDevice, Executor};
use remat_solver::schedule::{store_all, Schedule, Step, StepJson};
use std::collections::HashMap;

mod common;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    remat_exec::alloc::reuse_freed_pages();
    const USAGE: &str = "usage: plan_steps MODEL.onnx PLAN.json ROUNDS [NAME=VALUE...]";
    let mut args = std::env::args().skip(1);
    let path = args.next().ok_or(USAGE)?;
    let plan = args.next().ok_or(USAGE)?;
    let rounds: usize = args.next().ok_or(USAGE)?.parse()?;
    let (bytes, model, tg) = common::load_model(&path, args)?;
    let problem = tg.to_problem();
    let doc: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&plan)?)?;
    let steps: Vec<StepJson> = serde_json::from_value(doc["schedule"].clone())?;
    let plan = Schedule::from_json_steps(&problem, &steps)?;
    let sa = store_all(&problem);
    let mut ex = Executor::new(&model, &tg, &bytes, ExecDevice::Cpu, 0)?;
    ex.run(&sa, &mut |_, _| {})?;
    ex.run(&plan, &mut |_, _| {})?;
    let (mut tsa, mut tpl) = (Timed::default(), Timed::default());
    for _ in 0..rounds {
        tsa.add(&ex.run(&sa, &mut |_, _| {})?);
        tpl.add(&ex.run(&plan, &mut |_, _| {})?);
    }
    let (lsa, lpl) = (tsa.least_steps(), tpl.least_steps());
    // Per node: store-all's computation, the plan's first computation, the plan's recomputations.
    let n = tg.nodes.len();
    let mut sa_t = vec![0.0; n];
    for (s, st) in sa.steps.iter().enumerate() {
        if let Step::Compute(i) = *st {
            sa_t[i] += lsa[s];
        }
    }
    let mut first = vec![None; n];
    let mut recomp = vec![0.0; n];
    let mut frees = (0.0, 0.0);
    for (s, st) in sa.steps.iter().enumerate() {
        if let Step::Free(_) = *st {
            frees.0 += lsa[s];
        }
    }
    for (s, st) in plan.steps.iter().enumerate() {
        match *st {
            Step::Compute(i) => {
                if first[i].is_none() {
                    first[i] = Some(lpl[s]);
                } else {
                    recomp[i] += lpl[s];
                }
            }
            Step::Free(_) => frees.1 += lpl[s],
        }
    }
    let mut agg: HashMap<String, (f64, f64, f64, usize)> = HashMap::new();
    for i in 0..n {
        let k = format!(
            "{:?}{}",
            tg.nodes[i].kind,
            if recomp[i] > 0.0 { " (recomputed)" } else { "" }
        );
        let e = agg.entry(k).or_default();
        e.0 += sa_t[i];
        e.1 += first[i].unwrap_or(0.0);
        e.2 += recomp[i];
        e.3 += 1;
    }
    let mut keys: Vec<_> = agg.keys().cloned().collect();
    keys.sort();
    println!("class\tnodes\tstore-all\tplan first\tplan recomputations");
    for k in keys {
        let e = agg[&k];
        println!("{k}\t{}\t{:.4}\t{:.4}\t{:.4}", e.3, e.0, e.1, e.2);
    }
    println!("frees\t\t{:.4}\t{:.4}", frees.0, frees.1);
    println!(
        "total\t\t{:.4}\t{:.4}",
        tsa.least_step_total(),
        tpl.least_step_total()
    );
    Ok(())
}
