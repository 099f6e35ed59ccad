//! The live screen's viewer: the standalone viewer page
//! (`/panel/screen.html`, the link `dormouse screen` prints; embedded in the
//! binary) and the noVNC library (Debian's `novnc` package), served from a
//! directory on the host, `/usr/share/novnc` by default, under `/novnc/`
//! for the panel (and any frontend of the same origin).
//!
//! It serves only the library (`core/`, `vendor/`), only regular `.js`
//! files reached without a symlink, and never anything outside that
//! directory. When the directory is absent every path is a 404 and the
//! panel falls back to still screenshots. It holds no secret and needs no
//! token (the files are the same for everyone).

use std::io::Read;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Component, Path, PathBuf};

use super::panel::asset;
use axum::extract::{Path as UrlPath, State};
use axum::http::header;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use dormouse_protocol::api::ErrorCode;

use crate::HttpError;

const SCREEN_HTML: &str = include_str!("panel/screen.html");
const SCREEN_JS: &str = include_str!("panel/screen.js");

/// Path of the viewer page.
pub const PAGE_PATH: &str = "/panel/screen.html";
/// Path of the viewer page's script.
pub const SCRIPT_PATH: &str = "/panel/screen.js";

/// `GET /panel/screen.html`: the viewer page; the capability is in the
/// link's fragment, which never reaches a server.
pub async fn page() -> Response {
    asset("text/html; charset=utf-8", SCREEN_HTML)
}

/// `GET /panel/screen.js`.
pub async fn script() -> Response {
    asset("text/javascript; charset=utf-8", SCREEN_JS)
}

/// Where noVNC is installed by default (Debian's `novnc` package).
pub const DEFAULT_NOVNC_DIR: &str = "/usr/share/novnc";

/// URL prefix the noVNC library is served under: `/novnc/core/rfb.js`.
pub const NOVNC_ROUTE: &str = "/novnc/{*path}";

/// [`NOVNC_ROUTE`] as an OpenAPI path template (which has no wildcard: its
/// `path` parameter stands for the rest, slashes and all).
pub const NOVNC_DOC: &str = "/novnc/{path}";

/// The parts of the noVNC tree the viewer needs.
const NOVNC_SUBTREES: &[&str] = &["core", "vendor"];

/// Largest file served from the noVNC directory (its biggest is ~100 KiB).
const MAX_NOVNC_FILE: u64 = 2 * 1024 * 1024;

/// Where the noVNC library lives; `None` serves nothing (404), and the
/// panel then shows still screenshots.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NovncDir(pub Option<PathBuf>);

impl Default for NovncDir {
    fn default() -> Self {
        Self(Some(PathBuf::from(DEFAULT_NOVNC_DIR)))
    }
}

/// `GET /novnc/{*path}`: one file of the noVNC library.
pub async fn novnc(State(dir): State<NovncDir>, UrlPath(path): UrlPath<String>) -> Response {
    let Some(root) = dir.0 else {
        return not_found();
    };
    let Some(relative) = library_path(&path) else {
        return not_found();
    };
    match tokio::task::spawn_blocking(move || read_library_file(&root, &relative)).await {
        Ok(Some(body)) => (
            [
                (header::CONTENT_TYPE, "text/javascript; charset=utf-8"),
                (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
                (header::CACHE_CONTROL, "public, max-age=3600"),
            ],
            body,
        )
            .into_response(),
        _ => not_found(),
    }
}

/// The route on its own (for tests and for mounting with `merge`).
pub fn router(dir: NovncDir) -> Router {
    Router::new()
        .route(NOVNC_ROUTE, get(novnc))
        .route(PAGE_PATH, get(page))
        .route(SCRIPT_PATH, get(script))
        .with_state(dir)
}

fn not_found() -> Response {
    HttpError::new(
        ErrorCode::NoRoute,
        "no such file of the viewer (is the novnc package installed?)",
    )
    .into_response()
}

/// The relative path of a library file, if `raw` names one: a known
/// subtree, plain names (`[A-Za-z0-9_.-]`, no leading dot), ending `.js`.
fn library_path(raw: &str) -> Option<PathBuf> {
    let parts: Vec<&str> = raw.split('/').collect();
    if parts.len() < 2 || parts.len() > 8 || !NOVNC_SUBTREES.contains(&parts[0]) {
        return None;
    }
    let plain = |p: &&str| {
        !p.is_empty()
            && !p.starts_with('.')
            && p.len() <= 64
            && p.bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'))
    };
    if !parts.iter().all(plain) || !raw.ends_with(".js") {
        return None;
    }
    let path: PathBuf = parts.iter().collect();
    path.components()
        .all(|c| matches!(c, Component::Normal(_)))
        .then_some(path)
}

/// Reads `root/relative` if every step below `root` is a real directory and
/// the file a regular file within bounds, opened without following a link.
pub(crate) fn read_library_file(root: &Path, relative: &Path) -> Option<Vec<u8>> {
    let mut at = root.to_path_buf();
    let mut components = relative.components().peekable();
    while let Some(c) = components.next() {
        at.push(c);
        let meta = std::fs::symlink_metadata(&at).ok()?;
        let last = components.peek().is_none();
        if meta.file_type().is_symlink() || (last != meta.is_file()) || (!last && !meta.is_dir()) {
            return None;
        }
    }
    let mut file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(nix::fcntl::OFlag::O_NOFOLLOW.bits())
        .open(&at)
        .ok()?;
    let meta = file.metadata().ok()?;
    if !meta.is_file() || meta.len() > MAX_NOVNC_FILE {
        return None;
    }
    let mut body = Vec::with_capacity(usize::try_from(meta.len()).ok()?);
    file.by_ref()
        .take(MAX_NOVNC_FILE)
        .read_to_end(&mut body)
        .ok()?;
    Some(body)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_library_files_are_named() {
        assert!(library_path("core/rfb.js").is_some());
        assert!(library_path("vendor/pako/lib/zlib/inflate.js").is_some());
        for bad in [
            "rfb.js",
            "app/ui.js",
            "core/../../etc/passwd.js",
            "core/.hidden.js",
            "core//rfb.js",
            "core/rfb.html",
            "core/rfb.js/",
            "core/r%2e.js",
            "core/a b.js",
            "vnc.html",
        ] {
            assert!(library_path(bad).is_none(), "{bad}");
        }
    }

    #[test]
    fn links_and_other_kinds_are_not_served() {
        let dir = std::env::temp_dir().join(format!("dormouse-novnc-{}", std::process::id()));
        let core = dir.join("core");
        std::fs::create_dir_all(&core).unwrap();
        std::fs::write(core.join("rfb.js"), b"export default 1;").unwrap();
        std::fs::write(dir.join("secret.js"), b"no").unwrap();
        std::os::unix::fs::symlink(dir.join("secret.js"), core.join("link.js")).unwrap();
        std::fs::create_dir_all(core.join("dir.js")).unwrap();
        std::os::unix::fs::symlink(&core, dir.join("vendor")).unwrap();
        assert_eq!(
            read_library_file(&dir, Path::new("core/rfb.js")).as_deref(),
            Some(&b"export default 1;"[..])
        );
        assert!(read_library_file(&dir, Path::new("core/link.js")).is_none());
        assert!(read_library_file(&dir, Path::new("core/dir.js")).is_none());
        assert!(read_library_file(&dir, Path::new("vendor/rfb.js")).is_none());
        assert!(read_library_file(&dir, Path::new("core/missing.js")).is_none());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
