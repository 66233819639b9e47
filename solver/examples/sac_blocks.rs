//! `cargo run --release -p remat-solver --example sac_blocks -- GRAPH.torch.json...`: the
//! torch-sac planner's candidates without the block plans and the chain program, with the
//! block plans ([`remat_solver::sac::block_plans`]), and with both ([`remat_solver::sac::ChainModel`])
//! on captured steps, at 41 budgets from the least peak (0/40) to the unplanned peak (40/40):
//! the predicted overhead of each, the lower bound where the chain program proves one (not the
//! unplanned step's cost, the bound elsewhere), its
//! bound on the peak against the simulated one, and the time to build the candidates. The graphs come from
//! `python python/bench/torch_bench.py --graphs DIR` (docs/bench/torch.md, "Block plans").

use remat_solver::sac::{simulate, Candidates, ChainModel, SacPlan, TorchGraph};
use std::time::Instant;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("| graph | ops | regions | at | budget | neither | block plans | both | lower bound | chain bound | candidates s (neither, blocks, both) |");
    println!("|---|---|---|---|---|---|---|---|---|---|---|");
    for file in std::env::args().skip(1) {
        let g = TorchGraph::from_json(&std::fs::read_to_string(&file)?)?;
        let mut sets = Vec::new();
        let mut secs = Vec::new();
        for (blocks, chain) in [(false, false), (true, false), (true, true)] {
            let t0 = Instant::now();
            sets.push(Candidates::with_parts(&g, blocks, chain)?);
            secs.push(t0.elapsed().as_secs_f64());
        }
        let model = ChainModel::build(&g)?;
        let base = simulate(&g, &SacPlan::default())?;
        let least = sets.iter().map(|c| c.least_peak()).min().unwrap_or(0);
        let name = std::path::Path::new(&file)
            .file_name()
            .map_or(file.clone(), |f| f.to_string_lossy().into_owned());
        let pct = |c: f64| format!("{:+.2}%", (c / base.compute_cost - 1.0) * 100.0);
        for i in 0..=40 {
            let budget = least + ((base.peak_bytes - least) as f64 * i as f64 / 40.0) as u64;
            let mut cells = Vec::new();
            let mut lower = "none".to_string();
            for c in &sets {
                let (_, r) = c.select(budget)?;
                if let Some(b) = r.lower_bound.filter(|b| b.source == "chain_program") {
                    lower = pct(b.compute_cost);
                }
                cells.push(if r.status == "fits" {
                    pct(r.predicted.compute_cost)
                } else {
                    "does not fit".into()
                });
            }
            // The chain program's own choice: its bound against the simulated peak.
            let bound = match model.as_ref().and_then(|m| m.solve(&g, budget)) {
                Some(c) => {
                    let s = simulate(&g, &c.plan)?;
                    format!("{} / {}", c.bound_bytes, s.peak_bytes)
                }
                None => "none".into(),
            };
            println!(
                "| {name} | {} | {} | {i}/40 | {budget} | {} | {} | {} | {lower} | {bound} | {:.2}, {:.2}, {:.2} |",
                g.ops.len(),
                g.regions.len(),
                cells[0],
                cells[1],
                cells[2],
                secs[0],
                secs[1],
                secs[2],
            );
        }
        if let Some(m) = &model {
            println!(
                "<!-- {name}: {} regions, {} keepable ops per region enumerated, slot {} bytes, exact shape {}, additive {} -->",
                m.regions(),
                m.keepable_ops,
                m.slot_bytes(),
                m.exact_shape,
                m.additive
            );
        }
    }
    Ok(())
}
