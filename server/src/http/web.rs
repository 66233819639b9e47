//! Static files at `/`: the `web/` viewer embedded by `build.rs` when the binary was built with
//! one, else a small index page that lists the API. Files come from memory only (never the file system),
//! and paths with `.`/`..` segments, backslashes or percent escapes are refused, so no path
//! can reach outside the embedded set.

use super::error::ApiError;
use super::state::AppState;
use axum::http::{header, HeaderValue, Method, Uri};
use axum::response::{IntoResponse, Response};
use axum::Router;

mod assets {
    include!(concat!(env!("OUT_DIR"), "/web_assets.rs"));
}

/// An embedded file, or the built-in index page when the binary has no viewer.
fn embedded(path: &str) -> Option<&'static [u8]> {
    if let Ok(i) = assets::ASSETS.binary_search_by(|(p, _)| (*p).cmp(path)) {
        return assets::ASSETS.get(i).map(|(_, bytes)| *bytes);
    }
    (path == "index.html" && assets::ASSETS.is_empty()).then_some(BUILTIN_INDEX.as_bytes())
}

const BUILTIN_INDEX: &str = r#"<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>remat</title></head>
<body>
<h1>remat</h1>
<p>Plans activation checkpointing for neural-network training. The viewer is not built into this binary; the API is:</p>
<ul>
<li><code>POST /v1/plans</code> &mdash; post an ONNX model or a node-link graph JSON; options as query parameters
(<code>budget=0.6x</code>, <code>dim=batch=8</code>, <code>solver</code>, <code>time_limit</code>, <code>validate</code>, <code>wait</code>, <code>refresh</code>)</li>
<li><code>GET /v1/plans/{id}</code>, <code>GET /v1/plans?model=HASH</code>, <code>DELETE /v1/plans/{id}</code></li>
<li><code>POST /v1/sweeps</code>, <code>GET /v1/sweeps/{id}</code> &mdash; budget vs overhead frontier</li>
<li><code>GET /v1/models/{hash}/history</code></li>
<li><a href="/v1/openapi.json"><code>GET /v1/openapi.json</code></a>, <a href="/healthz"><code>/healthz</code></a>, <a href="/metrics"><code>/metrics</code></a></li>
</ul>
</body></html>
"#;

/// The embedded file for a request path, if any.
pub fn lookup(request_path: &str) -> Option<&'static [u8]> {
    let rel = request_path.strip_prefix('/').unwrap_or(request_path);
    let rel = if rel.is_empty() || rel.ends_with('/') {
        format!("{rel}index.html")
    } else {
        rel.to_string()
    };
    let unsafe_segment =
        |seg: &str| seg.is_empty() || seg == "." || seg == ".." || seg.contains(['\\', '%', '\0']);
    if rel.split('/').any(unsafe_segment) {
        return None;
    }
    embedded(&rel)
}

fn content_type(path: &str) -> &'static str {
    let ext = path.rsplit_once('.').map(|(_, e)| e).unwrap_or("");
    match ext {
        "html" | "" => "text/html; charset=utf-8",
        "js" | "mjs" => "text/javascript; charset=utf-8",
        "css" => "text/css; charset=utf-8",
        "json" => "application/json",
        "svg" => "image/svg+xml",
        "png" => "image/png",
        "ico" => "image/x-icon",
        "wasm" => "application/wasm",
        "txt" => "text/plain; charset=utf-8",
        _ => "application/octet-stream",
    }
}

/// Whether `path` is one of the viewer's pages: `/plans/{id}` with a plain id.
fn is_app_page(path: &str) -> bool {
    path.strip_prefix("/plans/").is_some_and(|id| {
        !id.is_empty()
            && id
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
    })
}

/// Everything no other resource routes: [`fallback`].
pub fn router() -> Router<AppState> {
    Router::new().fallback(fallback)
}

/// The router's fallback: static files for GET/HEAD outside `/v1/`, the error shape otherwise.
pub async fn fallback(method: Method, uri: Uri) -> Response {
    let path = uri.path();
    let no_route = || ApiError::not_found(format!("no route for {method} {path}")).into_response();
    if path == "/v1" || path.starts_with("/v1/") {
        return no_route();
    }
    if method != Method::GET && method != Method::HEAD {
        // A page of the viewer takes GET and HEAD only: another method is 405, with `Allow`.
        let page = is_app_page(path) || lookup(path).is_some();
        if !page {
            return no_route();
        }
        let mut r = ApiError::new(
            axum::http::StatusCode::METHOD_NOT_ALLOWED,
            "method_not_allowed",
            format!("method {method} is not allowed on {path}"),
        )
        .into_response();
        r.headers_mut()
            .insert(header::ALLOW, HeaderValue::from_static("GET,HEAD"));
        return r;
    }
    // The viewer's own pages (`/plans/{id}`) are rendered by `index.html` (a single-page app).
    let found = if is_app_page(path) {
        lookup("/")
    } else {
        lookup(path)
    };
    match found {
        Some(bytes) => {
            let ct = if path.ends_with('/') || is_app_page(path) {
                "text/html; charset=utf-8"
            } else {
                content_type(path)
            };
            (
                [
                    (header::CONTENT_TYPE, HeaderValue::from_static(ct)),
                    (
                        header::X_CONTENT_TYPE_OPTIONS,
                        HeaderValue::from_static("nosniff"),
                    ),
                ],
                bytes,
            )
                .into_response()
        }
        None => no_route(),
    }
}

#[cfg(test)]
mod tests {
    use super::{is_app_page, lookup};

    #[test]
    fn plan_pages_are_the_viewer() {
        assert!(is_app_page("/plans/0123abcd-ef"));
        assert!(!is_app_page("/plans/"));
        assert!(!is_app_page("/plans/../Cargo.toml"));
        assert!(!is_app_page("/plans/a/b"));
        assert!(!is_app_page("/v1/plans/abc"));
    }

    #[test]
    fn traversal_is_refused() {
        for path in [
            "/../Cargo.toml",
            "/a/../../etc/passwd",
            "/%2e%2e/Cargo.toml",
            "/.\\..\\x",
            "//etc/passwd",
            "/./index.html",
        ] {
            assert!(lookup(path).is_none(), "{path}");
        }
        assert!(lookup("/").is_some());
        assert!(lookup("/index.html").is_some());
    }
}
