//! `cargo run --release -p remat-solver --example sac_blocks -- GRAPH.torch.json...`: the
//! torch-sac planner with and without its block plans ([`remat_solver::sac::block_plans`]) on
//! captured steps, at 41 budgets from the least peak (0/40) to the unplanned peak (40/40): the
//! predicted overhead of each, and the time to build the candidates. The graphs come from
//! `python python/bench/torch_bench.py --graphs DIR` (docs/bench/torch.md, "Block plans").

use remat_solver::sac::{block_plans, simulate, Candidates, SacPlan, TorchGraph};
use std::time::Instant;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("| graph | ops | regions | at | budget | without block plans | with | candidates s (without, with) |");
    println!("|---|---|---|---|---|---|---|---|");
    for file in std::env::args().skip(1) {
        let g = TorchGraph::from_json(&std::fs::read_to_string(&file)?)?;
        let t0 = Instant::now();
        let with = Candidates::with_blocks(&g, true)?;
        let t_with = t0.elapsed().as_secs_f64();
        let t0 = Instant::now();
        let without = Candidates::with_blocks(&g, false)?;
        let t_without = t0.elapsed().as_secs_f64();
        let blocks = block_plans(&g, &SacPlan::full(&g))?.len();
        let base = simulate(&g, &SacPlan::default())?;
        let least = with.least_peak();
        let name = std::path::Path::new(&file)
            .file_name()
            .map_or(file.clone(), |f| f.to_string_lossy().into_owned());
        let pct = |c: f64| format!("{:+.2}%", (c / base.compute_cost - 1.0) * 100.0);
        for i in 0..=40 {
            let budget = least + ((base.peak_bytes - least) as f64 * i as f64 / 40.0) as u64;
            let (_, before) = without.select(budget)?;
            let (_, after) = with.select(budget)?;
            let before = if before.status == "fits" {
                pct(before.predicted.compute_cost)
            } else {
                "does not fit".into()
            };
            println!(
                "| {name} | {} | {} ({blocks} block plans) | {i}/40 | {budget} | {before} | {} | {t_without:.2}, {t_with:.2} |",
                g.ops.len(),
                g.regions.len(),
                pct(after.predicted.compute_cost),
            );
        }
    }
    Ok(())
}
