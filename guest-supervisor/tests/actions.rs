//! Computer-use actions against a real X server: Xvfb of the desktop image
//! in a hardened container whose X socket directory is a bind mount, driven
//! from this process through `dormouse_supervisor::input::execute`.
//!
//! The witness is a separate X client in this process: a window that takes
//! the keyboard focus and records every key press as the character the
//! keyboard mapping of that moment gives it (it re-reads the mapping on every
//! `MappingNotify`, as Xlib clients do), and every button press with its
//! position. Layouts are switched with `setxkbmap` inside the container.
//! Skips visibly without Docker or the image (fails under `CI=true`).
//! Numbers (typing speed) are printed: run with `--nocapture`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::os::unix::fs::PermissionsExt as _;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use dormouse_e2e::{
    desktop_image, docker, docker_available, docker_ok, unique_name, ContainerGuard, TempDir,
    TEST_LABEL,
};
use dormouse_protocol::actions::{keysym, ActionBatch, ActionResult};
use dormouse_supervisor::input::{self, ExecuteError, InputOptions};
use dormouse_supervisor::{screenshot, Config};
use serde_json::json;
use x11rb::connection::Connection as _;
use x11rb::protocol::xproto::{
    ConnectionExt as _, CreateWindowAux, EventMask, InputFocus, Mapping, WindowClass,
};
use x11rb::protocol::Event;
use x11rb::rust_connection::{DefaultStream, RustConnection};
use x11rb::wrapper::ConnectionExt as _;

const DISPLAY: u32 = 7;
const WIDTH: u32 = 1280;
const HEIGHT: u32 = 800;
const SAMPLE: &str = "Grüße, 世界 ✓ — ¿qué? «ok»\t\n";

/// Xvfb of the desktop image, its socket directory on the host.
struct XServer {
    name: String,
    config: Config,
    /// Mounted at `/srv/www` in the container.
    www: std::path::PathBuf,
    _dir: TempDir,
    _guard: ContainerGuard,
}

impl XServer {
    fn start(test: &str) -> Option<Self> {
        if !docker_available(test) {
            return None;
        }
        let image = desktop_image(test)?;
        let name = unique_name("dm-input");
        let guard = ContainerGuard::new(&name);
        let dir = TempDir::new("dm-input-x");
        let sockets = dir.path().join(".X11-unix");
        std::fs::create_dir_all(&sockets).unwrap();
        std::fs::set_permissions(&sockets, std::fs::Permissions::from_mode(0o1777)).unwrap();
        let mount = format!("{}:/tmp/.X11-unix", sockets.display());
        // Pages for a browser in the container, read-only.
        let www = dir.path().join("www");
        std::fs::create_dir_all(&www).unwrap();
        let www_mount = format!("{}:/srv/www:ro", www.display());
        let label = format!("{TEST_LABEL}=1");
        let display = format!(":{DISPLAY}");
        let screen = format!("{WIDTH}x{HEIGHT}x24");
        docker_ok(&[
            "run",
            "-d",
            "--name",
            &name,
            "--label",
            &label,
            "--network",
            "none",
            "--cap-drop",
            "ALL",
            "--security-opt",
            "no-new-privileges",
            "-u",
            "1000:1000",
            "-v",
            &mount,
            "-v",
            &www_mount,
            "--shm-size",
            "256m",
            "--entrypoint",
            "Xvfb",
            &image,
            &display,
            "-screen",
            "0",
            &screen,
            "-nolisten",
            "tcp",
            "-noreset",
        ]);
        let config = Config {
            tmp_dir: dir.path().to_owned(),
            display: DISPLAY,
            width: WIDTH,
            height: HEIGHT,
            ..Config::default()
        };
        let started = Instant::now();
        while std::os::unix::net::UnixStream::connect(config.x_socket_path()).is_err() {
            assert!(
                started.elapsed() < Duration::from_secs(60),
                "Xvfb did not come up: {}",
                String::from_utf8_lossy(&docker(&["logs", &name]).stderr)
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        Some(Self {
            name,
            config,
            www,
            _dir: dir,
            _guard: guard,
        })
    }

    fn connect(&self) -> RustConnection {
        let stream = std::os::unix::net::UnixStream::connect(self.config.x_socket_path()).unwrap();
        let (stream, _) = DefaultStream::from_unix_stream(stream).unwrap();
        RustConnection::connect_to_stream(stream, 0).unwrap()
    }

    /// `setxkbmap <layout>` in the container, checked with `-query`.
    fn layout(&self, layout: &str) {
        let display = format!(":{DISPLAY}");
        let out = docker(&[
            "exec",
            "-e",
            &format!("DISPLAY={display}"),
            &self.name,
            "setxkbmap",
            layout,
        ]);
        assert!(
            out.status.success(),
            "setxkbmap {layout}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let query = docker_ok(&[
            "exec",
            "-e",
            &format!("DISPLAY={display}"),
            &self.name,
            "setxkbmap",
            "-query",
        ]);
        assert!(
            query
                .lines()
                .any(|l| l.starts_with("layout:") && l.ends_with(layout)),
            "{query}"
        );
    }

    async fn run(&self, batch: serde_json::Value) -> Result<Vec<ActionResult>, ExecuteError> {
        let batch: ActionBatch = serde_json::from_value(batch).unwrap();
        let outcome = input::execute(&self.config, batch, InputOptions::default()).await?;
        assert_eq!(
            outcome.images.len(),
            outcome.answer.image_lens.len(),
            "images and their lengths"
        );
        Ok(outcome.answer.results)
    }
}

/// What the witness saw.
#[derive(Debug, Default)]
struct Seen {
    text: String,
    buttons: Vec<(u8, i16, i16)>,
}

/// A full-screen window with the focus that records what it receives.
struct Witness {
    seen: Arc<Mutex<Seen>>,
}

impl Witness {
    fn start(x: &XServer) -> Self {
        let conn = x.connect();
        let seen = Arc::new(Mutex::new(Seen::default()));
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let shared = seen.clone();
        std::thread::spawn(move || {
            let screen = &conn.setup().roots[0];
            let window = conn.generate_id().unwrap();
            conn.create_window(
                screen.root_depth,
                window,
                screen.root,
                0,
                0,
                u16::try_from(WIDTH).unwrap(),
                u16::try_from(HEIGHT).unwrap(),
                0,
                WindowClass::INPUT_OUTPUT,
                screen.root_visual,
                &CreateWindowAux::new()
                    .background_pixel(screen.white_pixel)
                    .override_redirect(1)
                    .event_mask(
                        EventMask::KEY_PRESS | EventMask::BUTTON_PRESS | EventMask::EXPOSURE,
                    ),
            )
            .unwrap();
            conn.map_window(window).unwrap();
            conn.set_input_focus(InputFocus::PARENT, window, 0u32)
                .unwrap();
            conn.sync().unwrap();
            let min = conn.setup().min_keycode;
            let count = conn.setup().max_keycode - min + 1;
            let mut mapping = conn
                .get_keyboard_mapping(min, count)
                .unwrap()
                .reply()
                .unwrap();
            ready_tx.send(()).unwrap();
            while let Ok(event) = conn.wait_for_event() {
                match event {
                    Event::MappingNotify(m) if m.request == Mapping::KEYBOARD => {
                        mapping = conn
                            .get_keyboard_mapping(min, count)
                            .unwrap()
                            .reply()
                            .unwrap();
                    }
                    Event::KeyPress(k) => {
                        let per = usize::from(mapping.keysyms_per_keycode);
                        let row = &mapping.keysyms[usize::from(k.detail - min) * per..][..per];
                        let shift = u16::from(k.state) & 1 != 0;
                        let mut sym = if shift { row[1] } else { row[0] };
                        if sym == 0 {
                            sym = row[0];
                        }
                        if let Some(c) = keysym::char_of_keysym(sym) {
                            shared.lock().unwrap().text.push(c);
                        }
                    }
                    Event::ButtonPress(b) => {
                        shared
                            .lock()
                            .unwrap()
                            .buttons
                            .push((b.detail, b.event_x, b.event_y));
                    }
                    _ => {}
                }
            }
        });
        ready_rx.recv_timeout(Duration::from_secs(10)).unwrap();
        Self { seen }
    }

    fn clear(&self) {
        *self.seen.lock().unwrap() = Seen::default();
    }

    /// Waits until the text is as long as `expected` (or 10 s), returns it.
    fn text_when(&self, expected: &str) -> String {
        let started = Instant::now();
        loop {
            let text = self.seen.lock().unwrap().text.clone();
            if text.chars().count() >= expected.chars().count()
                || started.elapsed() > Duration::from_secs(10)
            {
                return text;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    fn buttons_when(&self, n: usize) -> Vec<(u8, i16, i16)> {
        let started = Instant::now();
        loop {
            let b = self.seen.lock().unwrap().buttons.clone();
            if b.len() >= n || started.elapsed() > Duration::from_secs(10) {
                return b;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

async fn type_and_witness(x: &XServer, w: &Witness, text: &str) -> Duration {
    let keymap = input::keymap::Keymap::load(&x.connect()).unwrap();
    println!("spare keycodes: {}", keymap.spare_count());
    w.clear();
    let started = Instant::now();
    let results = x
        .run(json!({"actions": [{"action": "type", "text": text}]}))
        .await
        .unwrap();
    let took = started.elapsed();
    assert!(results[0].ok, "{results:?}");
    let got = w.text_when(text);
    assert_eq!(got, text, "typed text as the witness read it");
    took
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn typing_is_exact_under_us_de_fr_and_ru_layouts() {
    let Some(x) = XServer::start("typing_is_exact_under_us_de_fr_and_ru_layouts") else {
        return;
    };
    let w = Witness::start(&x);
    type_and_witness(&x, &w, SAMPLE).await;
    for layout in ["de", "fr", "ru"] {
        x.layout(layout);
        type_and_witness(&x, &w, SAMPLE).await;
    }
    // A long mixed text: speed and exactness in one go, under `ru` (Latin
    // letters are bound, Cyrillic come from the layout).
    let unit = "Grüße, 世界 ✓ — ¿qué? «ok» Привет abc XYZ 0123 ";
    let long: String = unit.chars().cycle().take(1000).collect();
    let took = type_and_witness(&x, &w, &long).await;
    println!(
        "typing 1000 chars (ru layout, mixed): {:.0} ms, {:.0} chars/s, exact",
        took.as_secs_f64() * 1000.0,
        1000.0 / took.as_secs_f64()
    );
    x.layout("us");
    // ASCII only: no binding, so no settle; the raw pace.
    let ascii: String = "The quick brown fox jumps over the lazy dog. 0123456789 !?\n"
        .chars()
        .cycle()
        .take(1000)
        .collect();
    let took = type_and_witness(&x, &w, &ascii).await;
    println!(
        "typing 1000 ASCII chars (us layout, nothing to bind): {:.0} ms, {:.0} chars/s, exact",
        took.as_secs_f64() * 1000.0,
        1000.0 / took.as_secs_f64()
    );
    let took = type_and_witness(&x, &w, &long).await;
    println!(
        "typing 1000 chars (us layout, mixed): {:.0} ms, {:.0} chars/s, exact",
        took.as_secs_f64() * 1000.0,
        1000.0 / took.as_secs_f64()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_pointer_scaling_and_refusals() {
    let Some(x) = XServer::start("keys_pointer_scaling_and_refusals") else {
        return;
    };
    let w = Witness::start(&x);

    // Key combinations: shift+a is "A", Return and KP_Enter are newlines.
    let results = x
        .run(json!({"actions": [{"action": "key", "text": "shift+a Return KP_Enter Tab"}, {"action": "key", "text": "ctrl+shift+t"}]}))
        .await
        .unwrap();
    assert!(results.iter().all(|r| r.ok), "{results:?}");
    assert_eq!(w.text_when("A\n\n\tT"), "A\n\n\tT");

    // Move, then the position answers the same point; natively and scaled.
    let results = x
        .run(json!({"actions": [{"action": "mouse_move", "coordinate": [100, 200]}, {"action": "cursor_position"}]}))
        .await
        .unwrap();
    assert_eq!(results[1].coordinate, Some([100, 200]));
    let results = x
        .run(json!({"actions": [
            {"action": "mouse_move", "coordinate": [511, 333]},
            {"action": "cursor_position"},
            {"action": "left_click", "coordinate": [256, 160]},
            {"action": "screenshot"},
            {"action": "zoom", "region": [0, 0, 100, 50]}],
            "scale": {"width": 1024, "height": 768}}))
        .await
        .unwrap();
    assert!(results.iter().all(|r| r.ok), "{results:?}");
    assert_eq!(results[1].coordinate, Some([511, 333]));
    // The click landed on the screen pixel under the scaled point's centre.
    let buttons = w.buttons_when(1);
    assert_eq!(buttons, vec![(1, 320, 200)], "floor((256.5, 160.5) * 1.25)");
    assert_eq!(results[3].size, Some([1024, 640]));
    assert_eq!(results[4].size, Some([125, 63]), "zoom is at native size");

    // Scroll and clicks of every button reach the window at the point.
    w.clear();
    let results = x
        .run(json!({"actions": [
            {"action": "scroll", "coordinate": [10, 20], "scroll_direction": "down", "scroll_amount": 2},
            {"action": "scroll", "coordinate": [10, 20], "scroll_direction": "left", "scroll_amount": 1, "text": "shift"},
            {"action": "right_click", "coordinate": [30, 40]},
            {"action": "middle_click"},
            {"action": "double_click", "coordinate": [50, 60]},
            {"action": "triple_click"},
            {"action": "left_click_drag", "start_coordinate": [70, 80], "coordinate": [170, 180]}]}))
        .await
        .unwrap();
    assert!(results.iter().all(|r| r.ok), "{results:?}");
    let buttons = w.buttons_when(11);
    assert_eq!(
        buttons,
        vec![
            (5, 10, 20),
            (5, 10, 20),
            (6, 10, 20),
            (3, 30, 40),
            (2, 30, 40),
            (1, 50, 60),
            (1, 50, 60),
            (1, 50, 60),
            (1, 50, 60),
            (1, 50, 60),
            (1, 70, 80),
        ]
    );

    // Refused before anything runs, naming the key; nothing typed.
    w.clear();
    let err = x
        .run(json!({"actions": [{"action": "type", "text": "x"}, {"action": "key", "text": "ctrl+Nope"}]}))
        .await
        .expect_err("unknown key");
    assert!(err.to_string().contains("\"Nope\""), "{err}");
    assert!(err.to_string().contains("actions[1]"), "{err}");
    let err = x
        .run(json!({"actions": [{"action": "mouse_move", "coordinate": [1100, 10]}], "scale": {"width": 1024, "height": 768}}))
        .await
        .expect_err("off the scaled screen");
    assert!(matches!(err, ExecuteError::Invalid(_)), "{err}");
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(w.seen.lock().unwrap().text, "", "nothing typed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn injected_input_resets_the_idle_timer_and_the_cursor_is_drawn() {
    let Some(x) = XServer::start("injected_input_resets_the_idle_timer") else {
        return;
    };
    let _w = Witness::start(&x);
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let idle = dormouse_supervisor::activity::input_idle_ms(&x.config)
        .await
        .unwrap();
    assert!(idle >= 1000, "idle {idle} ms before any input");
    x.run(json!({"actions": [{"action": "mouse_move", "coordinate": [300, 300]}]}))
        .await
        .unwrap();
    let idle = dormouse_supervisor::activity::input_idle_ms(&x.config)
        .await
        .unwrap();
    assert!(idle < 500, "idle {idle} ms right after a mouse_move");

    // On the white window, the pointer drawn in makes the pixels at the
    // hot spot differ from a capture without it.
    let shot = |cursor: bool| {
        let x = &x;
        async move {
            let batch: ActionBatch =
                serde_json::from_value(json!({"actions": [{"action": "zoom", "region": [290, 290, 330, 330]}], "cursor": cursor}))
                    .unwrap();
            let out = input::execute(&x.config, batch, InputOptions::default())
                .await
                .unwrap();
            let decoder = png::Decoder::new(std::io::Cursor::new(out.images[0].clone()));
            let mut reader = decoder.read_info().unwrap();
            let mut buf = vec![0; reader.output_buffer_size()];
            let info = reader.next_frame(&mut buf).unwrap();
            assert_eq!((info.width, info.height), (40, 40));
            buf
        }
    };
    let plain = shot(false).await;
    let with_cursor = shot(true).await;
    assert!(plain.iter().all(|b| *b == 255), "the window is white");
    assert_ne!(plain, with_cursor, "the pointer is drawn");
}

/// Runs `xev` in the container (Xlib's own reading of the keyboard: its
/// `XmbLookupString` line, UTF-8 under `C.UTF-8`) while `text` is typed
/// into it, and returns what it read.
async fn typed_as_xev_reads_it(x: &XServer, text: &str) -> String {
    let display = format!("DISPLAY=:{DISPLAY}");
    let child = std::process::Command::new("docker")
        .args([
            "exec",
            "-e",
            &display,
            "-e",
            "LANG=C.UTF-8",
            &x.name,
            "xev",
            "-geometry",
            "1280x800+0+0",
            "-event",
            "keyboard",
        ])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    // Its window, once mapped: the focus follows the pointer (no window
    // manager), so the pointer goes there.
    let conn = x.connect();
    let root = conn.setup().roots[0].root;
    let started = Instant::now();
    let window = loop {
        let tree = conn.query_tree(root).unwrap().reply().unwrap();
        let mapped = tree.children.iter().copied().find(|w| {
            conn.get_window_attributes(*w)
                .unwrap()
                .reply()
                .map(|a| a.map_state == x11rb::protocol::xproto::MapState::VIEWABLE)
                .unwrap_or(false)
        });
        if let Some(w) = mapped {
            break w;
        }
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "xev never mapped"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    let results = x
        .run(json!({"actions": [{"action": "mouse_move", "coordinate": [640, 400]}, {"action": "type", "text": text}]}))
        .await
        .unwrap();
    assert!(results.iter().all(|r| r.ok), "{results:?}");
    // Let xev read everything, then end it through the server: it exits,
    // flushing what it printed.
    tokio::time::sleep(Duration::from_millis(500)).await;
    conn.kill_client(window).unwrap();
    conn.sync().unwrap();
    let out = child.wait_with_output().unwrap();
    let out = String::from_utf8_lossy(&out.stdout);
    let mut bytes = Vec::new();
    let mut in_press = false;
    for line in out.lines() {
        if line.starts_with("KeyPress event") {
            in_press = true;
        } else if line.starts_with("KeyRelease event") {
            in_press = false;
        } else if in_press && line.trim_start().starts_with("XmbLookupString gives") {
            if let Some(hex) = line.split_once('(').and_then(|(_, r)| r.split_once(')')) {
                for b in hex.0.split_whitespace() {
                    let b = u8::from_str_radix(b, 16).unwrap();
                    bytes.push(if b == b'\r' { b'\n' } else { b });
                }
            }
        }
    }
    String::from_utf8(bytes).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn typing_is_exact_as_xlib_reads_it_under_us_de_and_ru() {
    let Some(x) = XServer::start("typing_is_exact_as_xlib_reads_it") else {
        return;
    };
    assert_eq!(typed_as_xev_reads_it(&x, SAMPLE).await, SAMPLE, "us");
    for layout in ["de", "ru"] {
        x.layout(layout);
        assert_eq!(typed_as_xev_reads_it(&x, SAMPLE).await, SAMPLE, "{layout}");
    }
}

/// A page whose title mirrors its text area, percent-encoded (`T:<text>`);
/// Tab is inserted, not moved on.
const PAGE: &str = r#"<!doctype html><html><head><meta charset="utf-8"><title>ready</title></head>
<body style="margin:0"><textarea id="t" style="width:100vw;height:100vh;border:0"></textarea>
<script>
const t = document.getElementById('t');
function report() { document.title = 'T:' + encodeURIComponent(t.value); }
t.addEventListener('keydown', e => {
  if (e.key === 'Tab') { e.preventDefault(); t.setRangeText('\t', t.selectionStart, t.selectionEnd, 'end'); report(); }
});
t.addEventListener('input', report);
t.focus();
</script></body></html>"#;

/// The `_NET_WM_NAME` of the first top-level window that has one starting
/// with `prefix`.
fn title_with(conn: &RustConnection, prefix: &str) -> Option<String> {
    let root = conn.setup().roots[0].root;
    let utf8 = conn
        .intern_atom(false, b"UTF8_STRING")
        .unwrap()
        .reply()
        .unwrap()
        .atom;
    let name = conn
        .intern_atom(false, b"_NET_WM_NAME")
        .unwrap()
        .reply()
        .unwrap()
        .atom;
    let tree = conn.query_tree(root).unwrap().reply().unwrap();
    tree.children.iter().find_map(|w| {
        let reply = conn
            .get_property(false, *w, name, utf8, 0, 1 << 16)
            .ok()?
            .reply()
            .ok()?;
        let title = String::from_utf8(reply.value).ok()?;
        title.starts_with(prefix).then_some(title)
    })
}

fn percent_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' && i + 3 <= b.len() {
            out.push(u8::from_str_radix(&s[i + 1..i + 3], 16).unwrap());
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8(out).unwrap()
}

/// Waits (20 s at most) for the page's title to hold `expected`; answers
/// what it holds last.
fn page_text_when(conn: &RustConnection, expected: &str) -> String {
    let started = Instant::now();
    loop {
        let text = title_with(conn, "T:")
            .map(|t| percent_decode(&t[2..]))
            .unwrap_or_default();
        if text == expected || started.elapsed() > Duration::from_secs(20) {
            return text;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn typing_into_chromium_is_exact_under_us_de_and_ru() {
    let Some(x) = XServer::start("typing_into_chromium_is_exact") else {
        return;
    };
    std::fs::write(x.www.join("page.html"), PAGE).unwrap();
    let display = format!("DISPLAY=:{DISPLAY}");
    docker_ok(&[
        "exec",
        "-d",
        "-u",
        "1000:1000",
        "-e",
        &display,
        "-e",
        "HOME=/home/desk",
        &x.name,
        "chromium",
        "--no-sandbox",
        "--no-first-run",
        "--no-default-browser-check",
        "--disable-gpu",
        "--user-data-dir=/tmp/chromium",
        "--window-position=0,0",
        "--window-size=1280,800",
        "--app=file:///srv/www/page.html",
    ]);
    let conn = x.connect();
    let started = Instant::now();
    while title_with(&conn, "ready").is_none() {
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "the page never loaded"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    // Focus by clicking into the text area (the focus follows the pointer).
    x.run(json!({"actions": [{"action": "left_click", "coordinate": [640, 400]}]}))
        .await
        .unwrap();
    for layout in ["us", "de", "ru"] {
        x.layout(layout);
        let results = x
            .run(json!({"actions": [
                {"action": "key", "text": "ctrl+a BackSpace"},
                {"action": "type", "text": SAMPLE}]}))
            .await
            .unwrap();
        assert!(results.iter().all(|r| r.ok), "{results:?}");
        assert_eq!(page_text_when(&conn, SAMPLE), SAMPLE, "{layout}");
    }
    // 1000 characters, ASCII and not: how fast they are sent and
    // how soon the page holds all of them, exactly (the layout is still ru).
    let unit = "Grüße, 世界 ✓ — ¿qué? «ok» Привет abc XYZ 0123 @€{}|~\n";
    let long: String = unit.chars().cycle().take(1000).collect();
    x.run(json!({"actions": [{"action": "key", "text": "ctrl+a BackSpace"}]}))
        .await
        .unwrap();
    assert_eq!(page_text_when(&conn, ""), "");
    let started = Instant::now();
    let results = x
        .run(json!({"actions": [{"action": "type", "text": long}]}))
        .await
        .unwrap();
    let sent = started.elapsed();
    assert!(results[0].ok, "{results:?}");
    let got = page_text_when(&conn, &long);
    let arrived = started.elapsed();
    let same = got
        .chars()
        .zip(long.chars())
        .filter(|(a, b)| a == b)
        .count();
    println!(
        "chromium, ru layout, 1000 mixed chars: batch {:.0} ms ({:.0} chars/s), page complete after {:.0} ms, {same}/1000 in place",
        sent.as_secs_f64() * 1000.0,
        1000.0 / sent.as_secs_f64(),
        arrived.as_secs_f64() * 1000.0
    );
    assert_eq!(got, long);
}

/// Median milliseconds of `n` captures of `spec` into a sink.
fn capture_ms(conn: &RustConnection, spec: &screenshot::CaptureSpec, n: usize) -> f64 {
    let mut times: Vec<f64> = (0..n)
        .map(|_| {
            let started = Instant::now();
            let sink = screenshot::CountingWriter {
                inner: std::io::sink(),
                count: 0,
            };
            screenshot::encode(conn, 0, spec, sink).unwrap();
            started.elapsed().as_secs_f64() * 1000.0
        })
        .collect();
    times.sort_by(f64::total_cmp);
    times[n / 2]
}

#[test]
fn screenshot_variants_and_their_cost() {
    let Some(x) = XServer::start("screenshot_variants_and_their_cost") else {
        return;
    };
    let conn = x.connect();
    // Something to encode: the witness's white window is too easy, so a
    // pattern is drawn over the root window.
    let screen = &conn.setup().roots[0];
    let gc = conn.generate_id().unwrap();
    conn.create_gc(
        gc,
        screen.root,
        &x11rb::protocol::xproto::CreateGCAux::new(),
    )
    .unwrap();
    for i in 0..200u32 {
        conn.change_gc(
            gc,
            &x11rb::protocol::xproto::ChangeGCAux::new().foreground(i.wrapping_mul(0x010305)),
        )
        .unwrap();
        let rect = x11rb::protocol::xproto::Rectangle {
            x: i16::try_from(i * 6).unwrap(),
            y: i16::try_from(i * 4).unwrap(),
            width: 200,
            height: 120,
        };
        conn.poly_fill_rectangle(screen.root, gc, &[rect]).unwrap();
    }
    conn.sync().unwrap();
    let full = screenshot::CaptureSpec::default();
    let root_ms = {
        let mut times: Vec<f64> = (0..7)
            .map(|_| {
                let started = Instant::now();
                screenshot::encode_root(&conn, 0, std::io::sink()).unwrap();
                started.elapsed().as_secs_f64() * 1000.0
            })
            .collect();
        times.sort_by(f64::total_cmp);
        times[3]
    };
    let scaled = screenshot::CaptureSpec {
        size: Some((1024, 640)),
        ..full
    };
    let zoom = screenshot::CaptureSpec {
        region: Some(screenshot::Rect {
            x: 100,
            y: 100,
            width: 320,
            height: 200,
        }),
        ..full
    };
    let cursor = screenshot::CaptureSpec {
        cursor: true,
        ..full
    };
    println!(
        "capture medians ({WIDTH}x{HEIGHT}): encode_root {root_ms:.1} ms, full {:.1} ms, scaled to 1024x640 {:.1} ms, zoom 320x200 {:.1} ms, full with cursor {:.1} ms",
        capture_ms(&conn, &full, 7),
        capture_ms(&conn, &scaled, 7),
        capture_ms(&conn, &zoom, 7),
        capture_ms(&conn, &cursor, 7)
    );
    // A region outside the screen or an enlarged size are refused.
    let outside = screenshot::CaptureSpec {
        region: Some(screenshot::Rect {
            x: 1200,
            y: 0,
            width: 100,
            height: 10,
        }),
        ..full
    };
    assert!(screenshot::encode(&conn, 0, &outside, std::io::sink()).is_err());
    let bigger = screenshot::CaptureSpec {
        size: Some((WIDTH + 1, HEIGHT)),
        ..full
    };
    assert!(screenshot::encode(&conn, 0, &bigger, std::io::sink()).is_err());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_failing_part_way_reports_what_ran() {
    let Some(x) = XServer::start("a_batch_failing_part_way_reports_what_ran") else {
        return;
    };
    let w = Witness::start(&x);
    // hold_key holds for its duration and releases: typing afterwards is
    // plain again.
    let started = Instant::now();
    let results = x
        .run(json!({"actions": [{"action": "hold_key", "text": "shift", "duration": 0.3}, {"action": "type", "text": "a"}]}))
        .await
        .unwrap();
    assert!(started.elapsed() >= Duration::from_millis(300));
    assert!(results.iter().all(|r| r.ok), "{results:?}");
    assert_eq!(w.text_when("a"), "a");

    // Control held by another client: typing would send shortcuts, so the
    // type action fails, the move before it ran, the one after did not.
    w.clear();
    let conn = x.connect();
    use x11rb::protocol::xtest::ConnectionExt as _;
    let root = conn.setup().roots[0].root;
    let control = 37; // Control_L in the evdev keymap of Xvfb
    conn.xtest_fake_input(2, control, 0, root, 0, 0, 0).unwrap();
    conn.sync().unwrap();
    let results = x
        .run(json!({"actions": [
            {"action": "mouse_move", "coordinate": [5, 5]},
            {"action": "type", "text": "b"},
            {"action": "mouse_move", "coordinate": [600, 600]}]}))
        .await
        .unwrap();
    conn.xtest_fake_input(3, control, 0, root, 0, 0, 0).unwrap();
    conn.sync().unwrap();
    assert_eq!(results.len(), 2, "{results:?}");
    assert!(results[0].ok);
    assert!(!results[1].ok);
    assert_eq!(results[1].error.as_ref().unwrap().code, "modifiers_active");
    let pointer = conn.query_pointer(root).unwrap().reply().unwrap();
    assert_eq!(
        (pointer.root_x, pointer.root_y),
        (5, 5),
        "the last move did not run"
    );
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(w.seen.lock().unwrap().text, "", "nothing typed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn typing_into_xterm_is_exact_under_us_de_and_ru() {
    let Some(x) = XServer::start("typing_into_xterm_is_exact") else {
        return;
    };
    let display = format!("DISPLAY=:{DISPLAY}");
    // The terminal of the image, its shell's `cat` writing every line it
    // reads to a file (the terminal's line discipline passes tabs as is).
    docker_ok(&[
        "exec",
        "-d",
        "-u",
        "1000:1000",
        "-e",
        &display,
        "-e",
        "LANG=C.UTF-8",
        "-e",
        "HOME=/home/desk",
        &x.name,
        "xterm",
        "-geometry",
        "100x20+0+0",
        "-e",
        "sh",
        "-c",
        "stty -echo; cat > /tmp/typed",
    ]);
    let conn = x.connect();
    let root = conn.setup().roots[0].root;
    let started = Instant::now();
    loop {
        let tree = conn.query_tree(root).unwrap().reply().unwrap();
        let mapped = tree.children.iter().any(|w| {
            conn.get_window_attributes(*w)
                .unwrap()
                .reply()
                .is_ok_and(|a| a.map_state == x11rb::protocol::xproto::MapState::VIEWABLE)
        });
        if mapped
            && docker(&["exec", &x.name, "test", "-e", "/tmp/typed"])
                .status
                .success()
        {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "xterm never came up"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    x.run(json!({"actions": [{"action": "mouse_move", "coordinate": [100, 100]}]}))
        .await
        .unwrap();
    let mut expected = String::new();
    for layout in ["us", "de", "ru"] {
        x.layout(layout);
        let results = x
            .run(json!({"actions": [{"action": "type", "text": SAMPLE}]}))
            .await
            .unwrap();
        assert!(results.iter().all(|r| r.ok), "{results:?}");
        expected.push_str(SAMPLE);
        let started = Instant::now();
        let got = loop {
            let out = docker(&["exec", &x.name, "cat", "/tmp/typed"]);
            let got = String::from_utf8_lossy(&out.stdout).into_owned();
            if got == expected || started.elapsed() > Duration::from_secs(10) {
                break got;
            }
            std::thread::sleep(Duration::from_millis(50));
        };
        assert_eq!(got, expected, "{layout}");
    }
}
