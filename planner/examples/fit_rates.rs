//! `cargo run --release -p remat-planner --example fit_rates -- OPTIMES.tsv...`: fits the
//! roofline's rates ([`remat_planner::Roofline::fit`]) to op times written by remat-exec's
//! `optimes` example and prints them as JSON (how `Roofline::CPU_DEFAULT_RATES` were made;
//! docs/cost-model.md).

use remat_planner::{OpClass, Roofline, Sample};
use remat_solver::NodeKind;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let files: Vec<String> = std::env::args().skip(1).collect();
    if files.is_empty() {
        return Err("usage: fit_rates OPTIMES.tsv...".into());
    }
    let mut samples = Vec::new();
    for f in &files {
        for (n, line) in std::fs::read_to_string(f)?.lines().enumerate() {
            let c: Vec<&str> = line.split('\t').collect();
            if c.len() < 6 {
                return Err(format!("{f}:{}: expected 6 or more columns", n + 1).into());
            }
            let kind = match c[0] {
                "Backward" => NodeKind::Backward,
                "Loss" => NodeKind::Loss,
                _ => NodeKind::Forward,
            };
            samples.push(Sample {
                class: OpClass::of(c[1], kind),
                flops: c[2].parse()?,
                bytes: c[3].parse()?,
                seconds: c[5].parse()?,
            });
        }
    }
    let r = Roofline::fit(
        &samples,
        format!("{} op times from {} files", samples.len(), files.len()),
    );
    println!("{}", serde_json::to_string_pretty(&r)?);
    Ok(())
}
