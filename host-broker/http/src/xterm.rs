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
//! The bundle is built once and kept ([`BundleCache`]); a request only
//! stats the tree (at most once a second), and the bundle is built again
//! only when a file's or directory's mtime or size changed, so installing
//! the packages after the broker started needs no restart, and the public,
//! unauthenticated route costs no rebuild per request. Without the
//! packages both routes are 404 and the panel says the terminal is
//! unavailable. Only regular `.js` files reached without a symlink are
//! read (tests are skipped), within bounds on their number and size. No
//! token: the files are the same for everyone.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use axum::body::Bytes;
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
/// Most entries the tree's stamp notes (modules, directories, the addon).
const MAX_STAMPED: usize = 4 * MAX_MODULES;
/// How long a stamp is trusted before the tree is statted again.
const RECHECK: Duration = Duration::from_secs(1);

/// Where xterm.js lives: node-xterm's root (with `lib/`) and the fit
/// addon; `None` serves nothing.
#[derive(Debug, Clone)]
pub struct XtermDir {
    /// node-xterm's directory, holding `lib/` and `lib/xterm.css`.
    pub root: Option<PathBuf>,
    /// The fit addon's file; a missing one leaves `fit` false.
    pub fit_addon: Option<PathBuf>,
    /// The bundle last built from them (shared by the state's clones).
    pub cache: BundleCache,
}

impl PartialEq for XtermDir {
    /// The same files (the cache is no part of what they are).
    fn eq(&self, other: &Self) -> bool {
        (&self.root, &self.fit_addon) == (&other.root, &other.fit_addon)
    }
}

impl Eq for XtermDir {}

impl Default for XtermDir {
    fn default() -> Self {
        Self {
            root: Some(PathBuf::from(DEFAULT_XTERM_DIR)),
            fit_addon: Some(PathBuf::from(DEFAULT_FIT_ADDON)),
            cache: BundleCache::default(),
        }
    }
}

impl XtermDir {
    /// Serves nothing.
    pub fn none() -> Self {
        Self {
            root: None,
            fit_addon: None,
            cache: BundleCache::default(),
        }
    }
}

/// The bundle as last built, with the stamp of the tree it was built from.
/// Clones share it.
#[derive(Debug, Clone, Default)]
pub struct BundleCache(Arc<Mutex<Option<Cached>>>);

/// One built bundle.
#[derive(Debug)]
struct Cached {
    /// The tree it was built from ([`stamp`]).
    stamp: Stamp,
    /// The bundle, `None` when the tree made none.
    body: Option<Bytes>,
    /// When the stamp was last compared with the tree.
    checked: Instant,
    /// How many times a bundle was built (for the tests).
    builds: u64,
}

/// Each directory, module and addon file the bundle reads, with its mtime
/// and size (`None` when it cannot be statted), in walk order.
type Stamp = Vec<(PathBuf, Option<(SystemTime, u64)>)>;

impl BundleCache {
    /// The bundle of `dir`: the one kept while its stamp is younger than
    /// [`RECHECK`] or still matches the tree, otherwise built again. One
    /// build at a time (a request that comes meanwhile waits for it).
    fn get(&self, dir: &XtermDir, now: Instant) -> Option<Bytes> {
        let mut kept = self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(c) = kept.as_ref() {
            if now.saturating_duration_since(c.checked) < RECHECK {
                return c.body.clone();
            }
        }
        let stamp = stamp(dir);
        if let Some(c) = kept.as_mut().filter(|c| c.stamp == stamp) {
            c.checked = now;
            return c.body.clone();
        }
        let body = bundle(dir).map(Bytes::from);
        let builds = kept.as_ref().map_or(0, |c| c.builds) + 1;
        *kept = Some(Cached {
            stamp,
            body: body.clone(),
            checked: now,
            builds,
        });
        body
    }

    /// How many bundles were built so far.
    #[cfg(test)]
    fn builds(&self) -> u64 {
        self.0
            .lock()
            .map(|c| c.as_ref().map_or(0, |c| c.builds))
            .unwrap_or(0)
    }
}

/// What the bundle of `dir` is built from, statted without reading it and
/// without following links: every directory below `lib/` and every `.js`
/// there, and the fit addon. A new, removed or changed file changes it.
fn stamp(dir: &XtermDir) -> Stamp {
    let mut out = Vec::new();
    if let Some(root) = &dir.root {
        stamp_tree(&root.join("lib"), 0, &mut out);
    }
    if let Some(fit) = &dir.fit_addon {
        note(fit, &mut out);
    }
    out
}

fn note(path: &Path, out: &mut Stamp) {
    let meta = std::fs::symlink_metadata(path)
        .ok()
        .and_then(|m| Some((m.modified().ok()?, m.len())));
    out.push((path.to_owned(), meta));
}

fn stamp_tree(dir: &Path, depth: usize, out: &mut Stamp) {
    note(dir, out);
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    let mut names: Vec<_> = entries.filter_map(Result::ok).collect();
    names.sort_by_key(|e| e.file_name());
    for entry in names {
        if out.len() >= MAX_STAMPED {
            return;
        }
        let Ok(kind) = entry.file_type() else {
            continue;
        };
        let path = entry.path();
        if kind.is_dir() && depth < MAX_DEPTH {
            stamp_tree(&path, depth + 1, out);
        } else if kind.is_file() && path.extension().is_some_and(|e| e == "js") {
            note(&path, out);
        }
    }
}

impl FromRef<ApiState> for XtermDir {
    fn from_ref(state: &ApiState) -> Self {
        state.xterm.clone()
    }
}

/// `GET /xterm/xterm.js`: the bundle, built once ([`BundleCache`]).
pub async fn script(State(dir): State<XtermDir>) -> Response {
    let built = move || dir.cache.get(&dir, Instant::now());
    match tokio::task::spawn_blocking(built).await {
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

fn served(content_type: &'static str, body: impl Into<Bytes>) -> Response {
    (
        [
            (header::CONTENT_TYPE, content_type),
            (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
            (header::CACHE_CONTROL, "public, max-age=3600"),
        ],
        body.into(),
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
            cache: BundleCache::default(),
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
            cache: BundleCache::default(),
        };
        let out = String::from_utf8(bundle(&xterm).unwrap()).unwrap();
        assert!(!out.contains("leak"), "a link is not a module");
        std::fs::remove_file(dir.join("lib/public/Terminal.js")).unwrap();
        assert!(bundle(&xterm).is_none(), "no Terminal, no bundle");
        assert!(bundle(&XtermDir::none()).is_none());
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn the_bundle_is_built_once_until_a_file_changes() {
        let dir = tree("cache");
        let xterm = XtermDir {
            root: Some(dir.clone()),
            fit_addon: None,
            cache: BundleCache::default(),
        };
        let t0 = Instant::now();
        let first = xterm.cache.get(&xterm, t0).unwrap();
        // Within the recheck interval, and after it with nothing changed:
        // the kept bundle, not a new build.
        let again = xterm.cache.get(&xterm, t0).unwrap();
        let later = xterm.cache.get(&xterm, t0 + RECHECK * 2).unwrap();
        assert_eq!(xterm.cache.builds(), 1, "two requests, one build");
        assert_eq!((&first, &again), (&later, &later));
        // A clone of the state shares the cache.
        let clone = xterm.clone();
        clone.cache.get(&clone, t0 + RECHECK * 2).unwrap();
        assert_eq!(xterm.cache.builds(), 1);

        // Touch a module (its mtime moves, its content changes).
        let module = dir.join("lib/common/T.js");
        std::fs::write(&module, "exports.T = 2;\n").unwrap();
        let file = std::fs::File::options().write(true).open(&module).unwrap();
        file.set_modified(SystemTime::now() + Duration::from_secs(10))
            .unwrap();
        let stale = xterm.cache.get(&xterm, t0 + RECHECK * 2).unwrap();
        assert_eq!(stale, first, "within the recheck interval the kept one");
        let fresh = xterm.cache.get(&xterm, t0 + RECHECK * 4).unwrap();
        assert_eq!(xterm.cache.builds(), 2, "touching a file rebuilds");
        assert!(String::from_utf8_lossy(&fresh).contains("exports.T = 2;"));

        // Only the mtime, the same bytes: built again too.
        file.set_modified(SystemTime::now() + Duration::from_secs(20))
            .unwrap();
        xterm.cache.get(&xterm, t0 + RECHECK * 6).unwrap();
        assert_eq!(xterm.cache.builds(), 3);

        // A new module shows through its directory.
        std::fs::write(dir.join("lib/common/U.js"), "exports.U = 3;\n").unwrap();
        let grown = xterm.cache.get(&xterm, t0 + RECHECK * 8).unwrap();
        assert_eq!(xterm.cache.builds(), 4);
        assert!(String::from_utf8_lossy(&grown).contains("sources[\"common/U\"]"));

        // Gone: nothing is served, and that is kept as well.
        std::fs::remove_file(dir.join("lib/public/Terminal.js")).unwrap();
        assert!(xterm.cache.get(&xterm, t0 + RECHECK * 10).is_none());
        assert!(xterm.cache.get(&xterm, t0 + RECHECK * 12).is_none());
        assert_eq!(xterm.cache.builds(), 5);
        std::fs::remove_dir_all(dir).unwrap();
    }
}
