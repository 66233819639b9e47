//! Embeds the viewer (`web/`: `index.html` and its assets, not `web/tests/`) in the binary.
//! Writes `$OUT_DIR/web_assets.rs` with one `(path, bytes)` entry per file; the list is empty
//! when there is no `web/index.html`, and the server then answers `/` with a built-in page.

use std::path::{Path, PathBuf};

fn collect(root: &Path, dir: &Path, files: &mut Vec<(String, PathBuf)>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        let name = entry.file_name().to_string_lossy().to_string();
        if name.starts_with('.') || name == "node_modules" || (dir == root && name == "tests") {
            continue;
        }
        if path.is_dir() {
            println!("cargo::rerun-if-changed={}", path.display());
            collect(root, &path, files);
        } else if let Ok(rel) = path.strip_prefix(root) {
            let rel: Vec<String> = rel
                .components()
                .map(|c| c.as_os_str().to_string_lossy().to_string())
                .collect();
            println!("cargo::rerun-if-changed={}", path.display());
            files.push((rel.join("/"), path.canonicalize().unwrap_or(path)));
        }
    }
}

fn main() {
    let manifest = std::env::var("CARGO_MANIFEST_DIR").unwrap_or_else(|_| ".".to_string());
    let web = Path::new(&manifest).join("../web");
    println!(
        "cargo::rerun-if-changed={}",
        web.join("index.html").display()
    );
    let mut files = Vec::new();
    if web.join("index.html").is_file() {
        collect(&web, &web, &mut files);
    }
    files.sort();
    let mut out = String::from(
        "/// The files of `web/`, sorted by path.\npub static ASSETS: &[(&str, &[u8])] = &[\n",
    );
    for (rel, abs) in &files {
        out.push_str(&format!(
            "    ({rel:?}, include_bytes!({:?})),\n",
            abs.display().to_string()
        ));
    }
    out.push_str("];\n");
    let out_dir = std::env::var("OUT_DIR").expect("cargo sets OUT_DIR for build scripts");
    std::fs::write(Path::new(&out_dir).join("web_assets.rs"), out)
        .expect("cannot write web_assets.rs");
}
