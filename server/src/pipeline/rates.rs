//! The roofline rates this process plans with (`remat_planner::Roofline`): remat's CPU
//! defaults unless `--rates FILE` or `REMAT_RATES` named a file that `remat calibrate` wrote.
//! Set once, before the first model loads; every ONNX model's problem is lowered with them.

use remat_planner::Roofline;
use std::sync::OnceLock;

static RATES: OnceLock<Roofline> = OnceLock::new();

/// The rates models load with: those [`set`] installed, else remat's CPU defaults.
pub fn roofline() -> &'static Roofline {
    RATES.get_or_init(Roofline::cpu_default)
}

/// Installs the rates of this process; an error naming the rates in use when a model has
/// already loaded with others.
pub fn set(rates: Roofline) -> Result<(), String> {
    match RATES.set(rates) {
        Ok(()) => Ok(()),
        Err(rates) if &rates == roofline() => Ok(()),
        Err(_) => Err(format!(
            "the roofline rates are already set ({})",
            roofline().source
        )),
    }
}

/// Reads a rates file (what `remat calibrate` writes), naming the file in any error.
pub fn read(path: &std::path::Path) -> Result<Roofline, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    Roofline::from_json(&text).map_err(|e| format!("{}: {e}", path.display()))
}
