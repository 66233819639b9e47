//! The service's early check of a posted ONNX body (`onnx::check_model_bytes`) against a full
//! parse (`onnx::parse_model`, what the check used to be), side by side on one model with
//! weights: time (median of 7 runs each) and the heap each allocates at its peak, counted by
//! this binary's allocator.
//!
//! `cargo run --release -p remat-planner --example early_check -- [MiB of weights, default 256]`

use onnx_protobuf::{GraphProto, Message, ModelProto, NodeProto, OperatorSetIdProto, TensorProto};
use remat_planner::onnx::{check_model_bytes, parse_model};
use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

/// The system allocator, counting the bytes live and their peak.
struct Counting;

static LIVE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            let now = LIVE.fetch_add(layout.size(), Ordering::Relaxed) + layout.size();
            PEAK.fetch_max(now, Ordering::Relaxed);
        }
        p
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) };
        LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;

/// A chain of `layers` MatMuls whose weights hold `mib` MiB in all, as raw bytes.
fn model(mib: usize, layers: usize) -> Vec<u8> {
    let per = (mib << 20) / layers / 4;
    let side = (per as f64).sqrt() as i64;
    let mut g = GraphProto::new();
    for i in 0..layers {
        let mut t = TensorProto::new();
        t.name = format!("w{i}");
        t.data_type = 1;
        t.dims = vec![side, side];
        t.raw_data = vec![0x3c; (side * side * 4) as usize];
        g.initializer.push(t);
        let mut n = NodeProto::new();
        n.op_type = "MatMul".into();
        n.input = vec![
            if i == 0 { "x".into() } else { format!("h{i}") },
            format!("w{i}"),
        ];
        n.output = vec![format!("h{}", i + 1)];
        g.node.push(n);
    }
    let mut m = ModelProto::new();
    m.ir_version = 8;
    let mut o = OperatorSetIdProto::new();
    o.version = 17;
    m.opset_import.push(o);
    m.graph = Some(g).into();
    m.write_to_bytes().expect("serializes")
}

/// Median seconds of `runs` calls and the heap `f` allocated at its peak over the live bytes
/// before it.
fn measure(runs: usize, f: &dyn Fn() -> bool) -> (f64, usize) {
    let mut times = vec![];
    let mut extra = 0;
    for _ in 0..runs {
        let before = LIVE.load(Ordering::Relaxed);
        PEAK.store(before, Ordering::Relaxed);
        let t = Instant::now();
        assert!(f(), "the model is refused");
        times.push(t.elapsed().as_secs_f64());
        extra = extra.max(PEAK.load(Ordering::Relaxed) - before);
    }
    times.sort_by(f64::total_cmp);
    (times[runs / 2], extra)
}

fn main() {
    let mib: usize = std::env::args()
        .nth(1)
        .map(|a| a.parse().expect("MiB of weights, a whole number"))
        .unwrap_or(256);
    let bytes = model(mib, 16);
    let mb = bytes.len() as f64 / (1 << 20) as f64;
    let (t_parse, m_parse) = measure(7, &|| parse_model(&bytes).is_ok());
    let (t_check, m_check) = measure(7, &|| check_model_bytes(&bytes).is_ok());
    println!("model: {mb:.1} MiB, 16 MatMuls");
    println!(
        "parse_model:       {:8.2} ms, heap at its peak {:10} bytes",
        t_parse * 1e3,
        m_parse
    );
    println!(
        "check_model_bytes: {:8.2} ms, heap at its peak {:10} bytes",
        t_check * 1e3,
        m_check
    );
    println!(
        "check / parse: time {:.4}x, heap {:.6}x",
        t_check / t_parse,
        m_check as f64 / m_parse as f64
    );
}
