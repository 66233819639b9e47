//! `cargo run -p remat-planner --example inspect -- MODEL.onnx [NAME=VALUE...] [--values]`:
//! prints the inspect summary; `--values` also lists parameters and buffers.

use remat_planner::{load, ImportOptions, ValueKind};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let path = args
        .next()
        .ok_or("usage: inspect MODEL.onnx [NAME=VALUE...] [--values]")?;
    let mut opts = ImportOptions::default();
    let mut values = false;
    for a in args {
        if a == "--values" {
            values = true;
        } else if let Some((k, v)) = a.split_once('=') {
            opts.dims.insert(k.to_string(), v.parse()?);
        }
    }
    let bytes = std::fs::read(&path)?;
    println!("{}", remat_planner::inspect(&bytes, &opts)?);
    if values {
        let model = load(&bytes, &opts)?;
        for s in &model.training_graph()?.saved {
            println!("saved {} {} by {}", s.name, s.bytes, s.by.join(","));
        }
        for v in &model.values {
            if matches!(v.kind, ValueKind::Param | ValueKind::Buffer) {
                let f = v.fact.as_ref();
                println!(
                    "{:?} {} {:?} {:?}",
                    v.kind,
                    v.name,
                    f.map(|f| f.dtype),
                    f.map(|f| &f.shape)
                );
            }
        }
    }
    Ok(())
}
