//! `cargo run --release -p remat-planner --example fit_rates -- [--rust] OPTIMES.tsv...`: fits
//! the roofline's rates ([`remat_planner::Roofline::fit`]) to op times written by remat-exec's
//! `optimes` example and prints them as JSON, or with `--rust` as the two tables of
//! `Roofline::CPU_DEFAULT_RATES` and `CPU_DEFAULT_OP_RATES` (how they were made;
//! docs/cost-model.md). Where a file is given twice or more under the same name in different
//! folders (runs of `optimes` on the same model), each op's time is its least over them.

use remat_planner::{OpClass, Rates, Roofline, Sample};
use remat_solver::NodeKind;
use std::collections::BTreeMap;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut rust = false;
    let mut files = Vec::new();
    for a in std::env::args().skip(1) {
        if a == "--rust" {
            rust = true;
        } else {
            files.push(a);
        }
    }
    if files.is_empty() {
        return Err("usage: fit_rates [--rust] OPTIMES.tsv...".into());
    }
    // Runs of one model (same file name): the least time of each op over them.
    let mut models: BTreeMap<String, Vec<Sample>> = BTreeMap::new();
    for f in &files {
        let name = std::path::Path::new(f)
            .file_name()
            .map_or_else(|| f.clone(), |n| n.to_string_lossy().into_owned());
        let samples = read(f)?;
        match models.get_mut(&name) {
            None => {
                models.insert(name, samples);
            }
            Some(prev) => {
                if prev.len() != samples.len() {
                    return Err(format!("{f}: not the same nodes as another {name}").into());
                }
                for (p, s) in prev.iter_mut().zip(samples) {
                    p.seconds = p.seconds.min(s.seconds);
                }
            }
        }
    }
    let samples: Vec<Sample> = models.into_values().flatten().collect();
    let r = Roofline::fit(
        &samples,
        format!("{} op times from {} files", samples.len(), files.len()),
    );
    if rust {
        print_rust(&r);
    } else {
        println!("{}", serde_json::to_string_pretty(&r)?);
    }
    Ok(())
}

fn read(f: &str) -> Result<Vec<Sample>, Box<dyn std::error::Error>> {
    let mut out = Vec::new();
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
        out.push(Sample {
            op: c[1].to_string(),
            kind,
            flops: c[2].parse()?,
            bytes: c[3].parse()?,
            seconds: c[5].parse()?,
        });
    }
    Ok(out)
}

fn lit(r: &Rates) -> String {
    let gb = r.bytes_per_second / 1e9;
    let gb = if gb >= 1e5 {
        "UNBOUND / G".to_string()
    } else {
        format!("{gb:?}")
    };
    format!(
        "rates({:?}, {gb}, {:?})",
        r.flops_per_second / 1e9,
        (r.seconds_per_op * 1e6).round()
    )
}

fn print_rust(r: &Roofline) {
    println!("    pub const CPU_DEFAULT_RATES: [(OpClass, Rates); 8] = [");
    for c in OpClass::ALL {
        println!("        (OpClass::{c:?}, {}),", lit(&r.rates(c)));
    }
    println!("    ];");
    println!("    pub const CPU_DEFAULT_OP_RATES: &'static [(&'static str, Rates)] = &[");
    for (k, x) in &r.ops {
        println!("        ({k:?}, {}),", lit(x));
    }
    println!("    ];");
}
