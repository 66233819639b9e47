//! Import + shape inference + training graph (+ store-all peak) of the fixture models, in
//! release. Writes `docs/bench/import.md`. Run: `cargo bench -p remat-planner --bench import`.

use remat_planner::{inspect, ImportOptions};
use std::fmt::Write as _;
use std::path::PathBuf;
use std::time::{Duration, Instant};

fn main() {
    let root = PathBuf::from(
        std::env::var_os("CARGO_MANIFEST_DIR").unwrap_or_else(|| env!("CARGO_MANIFEST_DIR").into()),
    )
    .join("..");
    let models: [(&str, &[(&str, u64)]); 5] = [
        (
            "fixtures/models/gpt2.legacy.onnx",
            &[("batch", 8), ("seq", 128)],
        ),
        (
            "fixtures/models/bert.legacy.onnx",
            &[("batch", 8), ("seq", 128)],
        ),
        ("fixtures/models/resnet50.legacy.onnx", &[("batch", 32)]),
        ("fixtures/models/light/light_densenet121.onnx", &[]),
        ("fixtures/models/light/light_inception_v2.onnx", &[]),
    ];
    let mut table = String::from(
        "| model | ONNX nodes | training nodes | median | min | max | runs |\n|---|---:|---:|---:|---:|---:|---:|\n",
    );
    let mut measured = 0;
    for (file, dims) in models {
        let Ok(bytes) = std::fs::read(root.join(file)) else {
            eprintln!("skipping {file}: not found");
            continue;
        };
        let mut opts = ImportOptions::default();
        for (k, v) in dims {
            opts.dims.insert(k.to_string(), *v);
        }
        let report = match inspect(&bytes, &opts) {
            Ok(r) => r,
            Err(e) => {
                eprintln!("skipping {file}: {e}");
                continue;
            }
        };
        let mut times: Vec<Duration> = vec![];
        let start = Instant::now();
        while times.len() < 5 || (start.elapsed() < Duration::from_secs(3) && times.len() < 200) {
            let t = Instant::now();
            let r = inspect(&bytes, &opts);
            times.push(t.elapsed());
            assert!(r.is_ok());
        }
        times.sort();
        let ms = |d: Duration| d.as_secs_f64() * 1e3;
        let dims_s: Vec<String> = dims.iter().map(|(k, v)| format!("{k}={v}")).collect();
        let name = format!(
            "{} {}",
            file.rsplit('/').next().unwrap_or(file),
            dims_s.join(" ")
        );
        let line = format!(
            "| {} | {} | {} | {:.1} ms | {:.1} ms | {:.1} ms | {} |\n",
            name.trim(),
            report.nodes,
            report.training_nodes.unwrap_or(0),
            ms(times[times.len() / 2]),
            ms(times[0]),
            ms(times[times.len() - 1]),
            times.len()
        );
        print!("{line}");
        table.push_str(&line);
        measured += 1;
    }
    if measured == 0 {
        eprintln!("no fixture model found; nothing written");
        return;
    }
    let mut doc = String::new();
    let _ = writeln!(doc, "# Import benchmark\n");
    let _ = writeln!(
        doc,
        "`cargo bench -p remat-planner --bench import` (release): `remat_planner::inspect` = parse + \
         shape inference with constant folding + fusions + training graph + lowering + \
         `store_all_peak`, per model. Goal: < 200 ms for a ~1,000-node model.\n"
    );
    let _ = writeln!(
        doc,
        "Machine: {} logical CPUs shared with other builds; times are wall clock.\n",
        std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1)
    );
    doc.push_str(&table);
    let out = root.join("docs/bench/import.md");
    if let Some(dir) = out.parent() {
        let _ = std::fs::create_dir_all(dir);
    }
    match std::fs::write(&out, doc) {
        Ok(()) => println!("wrote {}", out.display()),
        Err(e) => eprintln!("could not write {}: {e}", out.display()),
    }
}
