//! The viewer, end to end: `web/tests/run-e2e.sh` starts this build's `remat serve` on a free
//! loopback port with a temporary store, drives Debian's headless Chromium with playwright-core
//! (uploads a Checkmate graph and an ONNX fixture, waits for the plans, compares the cards with the
//! API, checks the timeline, Pareto curve and DAG rendered, runs axe-core, fails on console errors)
//! and saves screenshots under `web/tests/out/`. The script installs chromium (apt) and the npm
//! test dependencies when they are missing. The viewer's unit tests run first (`node --test`).

use std::path::PathBuf;
use std::process::Command;

fn web_tests() -> PathBuf {
    crate::common::manifest_dir().join("../web/tests")
}

#[test]
fn viewer_in_headless_chromium() {
    let dir = web_tests();
    let out = Command::new("bash")
        .arg(dir.join("run-e2e.sh"))
        .env("REMAT_BIN", env!("CARGO_BIN_EXE_remat"))
        .output()
        .expect("run web/tests/run-e2e.sh (needs bash and node)");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success(),
        "viewer end-to-end test failed:\n{text}"
    );

    let unit = Command::new("npm")
        .args(["test", "--silent"])
        .current_dir(&dir)
        .output()
        .expect("run the viewer's unit tests (npm test)");
    assert!(
        unit.status.success(),
        "viewer unit tests failed:\n{}{}",
        String::from_utf8_lossy(&unit.stdout),
        String::from_utf8_lossy(&unit.stderr)
    );
}
