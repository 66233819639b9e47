//! Store-all peaks of the published graphs match the budgets the Moccasin paper derives from
//! them (B = ceil(M x store-all peak)).

use remat_solver::{io::read_node_link, simulate, store_all, store_all_peak};
use std::path::PathBuf;

fn graphs_dir() -> PathBuf {
    crate::common::manifest_dir().join("../../shared/bench/graphs")
}

#[test]
fn store_all_peaks_match_published_budgets() {
    let dir = graphs_dir();
    if !dir.exists() {
        panic!("shared graphs not found at {}", dir.display());
    }
    // (file prefix, M, published B)
    let cases = [
        ("VGG16 (MLSys)", 0.9, 14242598093u64),
        ("VGG19 (MLSys)", 0.8, 13646587495),
        ("MobileNet (MLSys)", 0.9, 31230950400),
        ("ResNet50 (MLSys)", 0.8, 30447484928),
        ("vgg_unet (MLSys)", 0.9, 18863515239),
        ("fcn_8_vgg (MLSys)", 0.8, 10787836416),
        ("segnet (MLSys)", 0.9, 17949495860),
        ("random_layered_n100_", 0.8, 37056),
        ("random_layered_n250_", 0.9, 132156),
        ("random_layered_n500_", 0.8, 227552),
        ("random_layered_n1000_", 0.9, 547758),
    ];
    for (prefix, m, budget) in cases {
        let path = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().path())
            .find(|p| {
                let f = p.file_name().unwrap().to_string_lossy().to_string();
                f.starts_with(prefix) && !f.contains("_test_")
            })
            .unwrap_or_else(|| panic!("no graph for {prefix}"));
        let problem = read_node_link(&path).unwrap();
        let peak = store_all_peak(&problem);
        assert_eq!((m * peak as f64).ceil() as u64, budget, "{prefix}");
        let stats = simulate(&problem, &store_all(&problem)).unwrap();
        assert_eq!(stats.recomputations, 0);
        assert_eq!(stats.compute_cost, problem.base_cost());
    }
}
