//! `cargo run --release -p remat-exec --example optimes -- MODEL.onnx [NAME=VALUE...]`: one
//! line per training node (tab-separated: kind, op (the one its roofline rates are looked up
//! by: `TrainingGraph::rate_ops`), FLOPs, bytes moved, output bytes, seconds, id),
//! the seconds the fastest of three store-all runs on the CPU. The data the roofline rates of
//! `remat_planner::cost` were fitted to (docs/cost-model.md).

use remat_exec::{measured_costs, ExecDevice};

mod common;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    // First, as the `remat` binary does: glibc fixes its arena count when a second thread allocates.
    remat_exec::alloc::reuse_freed_pages();
    let mut args = std::env::args().skip(1);
    let path = args
        .next()
        .ok_or("usage: optimes MODEL.onnx [NAME=VALUE...]")?;
    let (bytes, model, tg) = common::load_model(&path, args)?;
    // A first run warms the threads' packing buffers; the next three are measured.
    measured_costs(&model, &tg, &bytes, ExecDevice::Cpu, 0, 1)?;
    let secs = measured_costs(&model, &tg, &bytes, ExecDevice::Cpu, 0, 3)?;
    for (i, n) in tg.nodes.iter().enumerate() {
        println!(
            "{:?}\t{}\t{}\t{}\t{}\t{:.9}\t{}",
            n.kind, tg.rate_ops[i], n.cost, tg.traffic[i], n.bytes, secs[i], n.id
        );
    }
    Ok(())
}
