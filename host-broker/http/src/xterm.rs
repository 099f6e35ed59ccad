//! The panel's terminal library: xterm.js from Debian, served under
//! `/xterm/` like noVNC is under `/novnc/` ([`crate::screen_viewer`]).
//!
//! Debian's `libjs-xterm` ships `xterm.js` only as a stub that `require`s
//! the CommonJS modules of `node-xterm` (`/usr/share/nodejs/xterm/lib`),
//! which a browser cannot load. `GET /xterm/xterm.js` therefore serves one
//! script made of those modules, each wrapped in a function and linked by a
//! small `require` of its own, plus libjs-xterm's fit addon when it is
//! there; it defines `window.DormouseXterm = {Terminal, fit}`. Nothing is
//! evaluated on the server and no source is rewritten (only its source-map
//! comment is left out), so the page's CSP (`script-src 'self'`) holds.
//!
//! The directory is read on every request, so installing the packages
//! after the broker started needs no restart; without them both routes are
//! 404 and the panel says the terminal is unavailable. Only regular `.js`
//! files reached without a symlink are read (tests are skipped), within
//! bounds on their number and size. No token: the files are the same for
//! everyone.

use std::path::{Path, PathBuf};

use axum::extract::{FromRef, State};
use axum::http::header;
use axum::response::{IntoResponse, Response};
use dormouse_protocol::api::ErrorCode;

use crate::screen_viewer::read_library_file;
use crate::{ApiState, HttpError};

/// Where node-xterm is installed by default.
pub const DEFAULT_XTERM_DIR: &str = "/usr/share/nodejs/xterm";
/// libjs-xterm's fit addon (sizes the terminal to its element).
pub const DEFAULT_FIT_ADDON: &str = "/usr/share/javascript/xterm/addons/fit/fit.js";

/// Path of the bundled library.
pub const SCRIPT_PATH: &str = "/xterm/xterm.js";
/// Path of its style sheet.
pub const STYLE_PATH: &str = "/xterm/xterm.css";

/// Most modules the bundle takes (node-xterm 3.8 has 60).
const MAX_MODULES: usize = 400;
/// Most bytes of source the bundle takes (node-xterm 3.8 has 370 KB).
const MAX_BUNDLE: usize = 8 * 1024 * 1024;
/// Deepest directory the walk enters below `lib/`.
const MAX_DEPTH: usize = 6;

/// Where xterm.js lives: node-xterm's root (with `lib/`) and the fit
/// addon; `None` serves nothing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct XtermDir {
    /// node-xterm's directory, holding `lib/` and `lib/xterm.css`.
    pub root: Option<PathBuf>,
    /// The fit addon's file; a missing one leaves `fit` false.
    pub fit_addon: Option<PathBuf>,
}

impl Default for XtermDir {
    fn default() -> Self {
        Self {
            root: Some(PathBuf::from(DEFAULT_XTERM_DIR)),
            fit_addon: Some(PathBuf::from(DEFAULT_FIT_ADDON)),
        }
    }
}

impl XtermDir {
    /// Serves nothing.
    pub fn none() -> Self {
        Self {
            root: None,
            fit_addon: None,
        }
    }
}

impl FromRef<ApiState> for XtermDir {
    fn from_ref(state: &ApiState) -> Self {
        state.xterm.clone()
    }
}

/// `GET /xterm/xterm.js`: the bundle.
pub async fn script(State(dir): State<XtermDir>) -> Response {
    match tokio::task::spawn_blocking(move || bundle(&dir)).await {
        Ok(Some(body)) => served("text/javascript; charset=utf-8", body),
        _ => not_found(),
    }
}

/// `GET /xterm/xterm.css`: xterm's own style sheet.
pub async fn style(State(dir): State<XtermDir>) -> Response {
    let Some(root) = dir.root else {
        return not_found();
    };
    let read = move || read_library_file(&root, Path::new("lib/xterm.css"));
    match tokio::task::spawn_blocking(read).await {
        Ok(Some(body)) => served("text/css; charset=utf-8", body),
        _ => not_found(),
    }
}

fn served(content_type: &'static str, body: Vec<u8>) -> Response {
    (
        [
            (header::CONTENT_TYPE, content_type),
            (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
            (header::CACHE_CONTROL, "public, max-age=3600"),
        ],
        body,
    )
        .into_response()
}

fn not_found() -> Response {
    HttpError::new(
        ErrorCode::NoRoute,
        "the terminal library is not installed on the broker's host (Debian's node-xterm)",
    )
    .into_response()
}

/// The module loader the wrapped sources are registered with. Relative
/// names resolve against the requiring module's directory, as in Node.
const PRELUDE: &str = r#"(function () {
var sources = Object.create(null), cache = Object.create(null);
function resolve(from, name) {
  if (name.charAt(0) !== ".") return name;
  var parts = from.split("/");
  parts.pop();
  name.split("/").forEach(function (p) {
    if (p === "..") parts.pop(); else if (p !== ".") parts.push(p);
  });
  return parts.join("/");
}
function load(id) {
  if (cache[id]) return cache[id].exports;
  var factory = sources[id];
  if (!factory) throw new Error("xterm bundle: no module " + id);
  var module = { exports: {} };
  cache[id] = module;
  factory.call(module.exports, module.exports, function (name) { return load(resolve(id, name)); }, module);
  return module.exports;
}
"#;

const EPILOGUE: &str = r#"var Terminal = load("public/Terminal").Terminal;
var fit = Boolean(sources["addons/fit/fit"]);
if (fit) Terminal.applyAddon(load("addons/fit/fit"));
window.DormouseXterm = { Terminal: Terminal, fit: fit };
})();
"#;

/// The bundle, or `None` when node-xterm is absent, incomplete or over
/// the bounds.
fn bundle(dir: &XtermDir) -> Option<Vec<u8>> {
    let root = dir.root.as_ref()?;
    let mut modules = Vec::new();
    walk(root, Path::new("lib"), 0, &mut modules)?;
    if !modules.iter().any(|(id, _)| id == "public/Terminal") {
        return None;
    }
    if let Some(fit) = dir.fit_addon.as_ref().and_then(|p| read_single(p)) {
        modules.push(("addons/fit/fit".to_owned(), fit));
    }
    modules.sort();
    let mut out = String::from(PRELUDE);
    for (id, source) in &modules {
        out.push_str(&format!(
            "sources[{}] = function (exports, require, module) {{\n",
            json_string(id)
        ));
        for line in source.lines() {
            if !line.starts_with("//# sourceMappingURL=") {
                out.push_str(line);
                out.push('\n');
            }
        }
        out.push_str("};\n");
        if out.len() > MAX_BUNDLE {
            return None;
        }
    }
    out.push_str(EPILOGUE);
    Some(out.into_bytes())
}

/// Collects `(module id, source)` of every `.js` below `root/rel`, tests
/// left out; `None` when a bound is passed or a file cannot be read.
fn walk(root: &Path, rel: &Path, depth: usize, out: &mut Vec<(String, String)>) -> Option<()> {
    if depth > MAX_DEPTH {
        return None;
    }
    let mut names: Vec<_> = std::fs::read_dir(root.join(rel))
        .ok()?
        .filter_map(Result::ok)
        .collect();
    names.sort_by_key(|e| e.file_name());
    for entry in names {
        let name = entry.file_name().into_string().ok()?;
        if name.starts_with('.') {
            continue;
        }
        let kind = entry.file_type().ok()?;
        let child = rel.join(&name);
        if kind.is_dir() {
            walk(root, &child, depth + 1, out)?;
        } else if kind.is_file() && name.ends_with(".js") && !name.ends_with(".test.js") {
            if out.len() >= MAX_MODULES {
                return None;
            }
            let body = read_library_file(root, &child)?;
            let source = String::from_utf8(body).ok()?;
            let id = child.strip_prefix("lib").ok()?.with_extension("");
            let id = id.to_str()?.to_owned();
            out.push((id, source));
        }
    }
    Some(())
}

/// A single file given by its full path, read as the library files are.
fn read_single(path: &Path) -> Option<String> {
    let parent = path.parent()?;
    let name = path.file_name()?;
    String::from_utf8(read_library_file(parent, Path::new(name))?).ok()
}

fn json_string(s: &str) -> String {
    serde_json::Value::String(s.to_owned()).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tree(name: &str) -> PathBuf {
        let dir =
            std::env::temp_dir().join(format!("dormouse-xterm-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("lib/public")).unwrap();
        std::fs::create_dir_all(dir.join("lib/common")).unwrap();
        std::fs::write(
            dir.join("lib/public/Terminal.js"),
            "var T = require(\"../common/T\");\nexports.Terminal = T.T;\n//# sourceMappingURL=Terminal.js.map",
        )
        .unwrap();
        std::fs::write(dir.join("lib/common/T.js"), "exports.T = 1;\n").unwrap();
        std::fs::write(dir.join("lib/common/T.test.js"), "require('chai');\n").unwrap();
        std::fs::write(dir.join("lib/xterm.css"), ".xterm {}\n").unwrap();
        dir
    }

    #[test]
    fn the_bundle_wraps_every_module_but_the_tests() {
        let dir = tree("bundle");
        let xterm = XtermDir {
            root: Some(dir.clone()),
            fit_addon: Some(dir.join("absent-fit.js")),
        };
        let out = String::from_utf8(bundle(&xterm).unwrap()).unwrap();
        assert!(out.contains("sources[\"public/Terminal\"] = function (exports, require, module) {\nvar T = require(\"../common/T\");"));
        assert!(out.contains("sources[\"common/T\"]"));
        assert!(!out.contains("chai"), "tests are left out");
        assert!(!out.contains("sourceMappingURL"));
        assert!(!out.contains("addons/fit/fit\"] ="), "no fit addon here");
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn links_an_incomplete_tree_or_nothing_serve_nothing() {
        let dir = tree("links");
        std::os::unix::fs::symlink("/etc/passwd", dir.join("lib/common/leak.js")).unwrap();
        let xterm = XtermDir {
            root: Some(dir.clone()),
            fit_addon: None,
        };
        let out = String::from_utf8(bundle(&xterm).unwrap()).unwrap();
        assert!(!out.contains("leak"), "a link is not a module");
        std::fs::remove_file(dir.join("lib/public/Terminal.js")).unwrap();
        assert!(bundle(&xterm).is_none(), "no Terminal, no bundle");
        assert!(bundle(&XtermDir::none()).is_none());
        std::fs::remove_dir_all(dir).unwrap();
    }
}
