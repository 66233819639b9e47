//! `cargo run -p remat-planner --example problem -- MODEL.onnx [NAME=VALUE...] > problem.json`:
//! writes the solver's problem of a model's training step as JSON (`remat_solver::Problem`).

use remat_planner::{load, ImportOptions};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let path = args
        .next()
        .ok_or("usage: problem MODEL.onnx [NAME=VALUE...]")?;
    let mut opts = ImportOptions::default();
    for a in args {
        let (k, v) = a.split_once('=').ok_or("dims are NAME=VALUE")?;
        opts.dims.insert(k.to_string(), v.parse()?);
    }
    let model = load(&std::fs::read(&path)?, &opts)?;
    let problem = model.training_graph()?.to_problem();
    println!("{}", serde_json::to_string(&problem)?);
    Ok(())
}
