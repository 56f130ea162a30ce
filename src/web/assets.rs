//! The pages' static files, embedded in the binary: one style sheet, htmx (vendored, 0BSD, for
//! the parts that refresh themselves) and a few lines of our own. Served from `/ui/assets/`
//! with a long cache life: the path carries the version.

use axum::extract::Path;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};

/// The version in the assets' path: a new build is a new path, so caches never serve stale.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");

const HTMX: &[u8] = include_bytes!("assets/htmx.min.js");
const CSS: &[u8] = include_bytes!("assets/app.css");
const JS: &[u8] = include_bytes!("assets/app.js");

/// The path of an asset, as pages link it.
pub fn path(name: &str) -> String {
    format!("/ui/assets/{VERSION}/{name}")
}

pub async fn serve(Path((_version, name)): Path<(String, String)>) -> Response {
    let (body, kind) = match name.as_str() {
        "htmx.min.js" => (HTMX, "text/javascript; charset=utf-8"),
        "app.js" => (JS, "text/javascript; charset=utf-8"),
        "app.css" => (CSS, "text/css; charset=utf-8"),
        _ => return StatusCode::NOT_FOUND.into_response(),
    };
    (
        [
            (header::CONTENT_TYPE, HeaderValue::from_static(kind)),
            (
                header::CACHE_CONTROL,
                HeaderValue::from_static("public, max-age=31536000, immutable"),
            ),
        ],
        body,
    )
        .into_response()
}
