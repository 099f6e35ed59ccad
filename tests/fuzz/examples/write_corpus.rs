//! Writes the seed corpus of every fuzz target into `corpus/<target>/`
//! (the directory given as the first argument, `corpus` by default), from
//! the project's own encoders where there is one: frames by the frame
//! encoder, archives by the workspace exporter (plain, gzip, zstd) beside
//! hand-made hostile ones, the action batches and RFB sessions of the unit
//! tests. Run by `scripts/fuzz --write-corpus`; the files are committed.

use std::fs;
use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};

use dormouse_core::workspace::archive::{export_archive, ImportLimits};
use dormouse_core::workspace::{Compression, WorkspaceRoot};
use dormouse_protocol::frame;
use dormouse_protocol::{Request, Response};

type Result<T = ()> = std::result::Result<T, Box<dyn std::error::Error>>;

struct Out {
    dir: PathBuf,
    count: usize,
}

impl Out {
    fn new(base: &Path, target: &str) -> Result<Self> {
        let dir = base.join(target);
        fs::create_dir_all(&dir)?;
        Ok(Self { dir, count: 0 })
    }

    fn put(&mut self, name: &str, bytes: &[u8]) -> Result {
        fs::write(self.dir.join(format!("seed-{name}")), bytes)?;
        self.count += 1;
        Ok(())
    }
}

/// Guest requests, as JSON without `v` (the encoder adds it).
const REQUESTS: &[(&str, &str)] = &[
    ("hello", r#"{"kind":"hello"}"#),
    ("status", r#"{"kind":"status"}"#),
    ("watch", r#"{"kind":"watch"}"#),
    ("screenshot", r#"{"kind":"screenshot"}"#),
    (
        "screenshot-webp",
        r#"{"kind":"screenshot","encoding":{"format":"webp","quality":80}}"#,
    ),
    ("quiesce", r#"{"kind":"quiesce","timeout_ms":5000}"#),
    (
        "quiesce-hold",
        r#"{"kind":"quiesce_hold","timeout_ms":5000}"#,
    ),
    ("activity", r#"{"kind":"activity"}"#),
    (
        "exec",
        r#"{"kind":"exec","argv":["sh","-c","echo hi"],"cwd":"/home/desk","env":{"A":"b"},"timeout_ms":1000,"max_output_bytes":4096}"#,
    ),
    (
        "exec-command",
        r#"{"kind":"exec","command":"ls -la | wc -l","timeout_ms":1000,"max_output_bytes":4096}"#,
    ),
    (
        "pty-open",
        r#"{"kind":"pty_open","argv":["bash"],"rows":24,"cols":80}"#,
    ),
    (
        "actions",
        r#"{"kind":"actions","batch":{"actions":[{"action":"left_click","coordinate":[640,400]},{"action":"type","text":"hi"},{"action":"key","text":"ctrl+l"},{"action":"screenshot"}],"scale":{"width":1024,"height":768}}}"#,
    ),
    ("clipboard-get", r#"{"kind":"clipboard_get"}"#),
    ("egress-accept", r#"{"kind":"egress_accept"}"#),
];

const PNG: &[u8] = b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR";
const JPEG: &[u8] = b"\xff\xd8\xff\xdb\0\x43";
const WEBP: &[u8] = b"RIFF\x04\0\0\0WEBPVP8L";

/// Guest responses, as JSON without `v`, and their payloads.
fn responses() -> Vec<(&'static str, &'static str, &'static [u8])> {
    vec![
        (
            "hello",
            r#"{"kind":"hello","protocol_version":1,"supervisor_version":"0.1.0","identity":{"boot_id":"b0","pid_ns_inode":4026531836,"pid1_start_time":1234}}"#,
            b"",
        ),
        (
            "status",
            r#"{"kind":"status","phase":"ready","ready":true,"ready_since":"2026-01-01T00:00:00Z","identity":{"boot_id":"b0","pid_ns_inode":1,"pid1_start_time":2},"services":[{"name":"xvfb","state":"running","pid":12,"restarts":0,"last_exit":null,"ready_since":null}],"health":null,"problem":null,"taskbar_height":30}"#,
            b"",
        ),
        (
            "screenshot-png",
            r#"{"kind":"screenshot","width":2,"height":2}"#,
            PNG,
        ),
        (
            "screenshot-jpeg",
            r#"{"kind":"screenshot","width":2,"height":2,"format":"jpeg"}"#,
            JPEG,
        ),
        (
            "screenshot-webp",
            r#"{"kind":"screenshot","width":2,"height":2,"format":"webp"}"#,
            WEBP,
        ),
        (
            "quiesced",
            r#"{"kind":"quiesced","closed":["chromium"],"complete":true,"elapsed_ms":120}"#,
            b"",
        ),
        (
            "activity",
            r#"{"kind":"activity","input_idle_ms":1500,"busy":true,"busy_processes":[{"pid":42,"comm":"make","cpu_percent":97.5}]}"#,
            b"",
        ),
        (
            "exec-result",
            r#"{"kind":"exec_result","exit_code":0,"signal":null,"timed_out":false,"stdout_len":3,"stdout_truncated":false,"stderr_truncated":false,"duration_ms":5}"#,
            b"hi\nerr\n",
        ),
        (
            "pty-opened",
            r#"{"kind":"pty_opened","id":7,"pid":99}"#,
            b"",
        ),
        (
            "action-results",
            r#"{"kind":"action_results","results":[{"action":"screenshot","ok":true,"image":{"type":"base64","media_type":"image/png","data":""},"size":[2,2]}],"image_lens":[16]}"#,
            PNG,
        ),
        (
            "action-results-clipboard",
            r#"{"kind":"action_results","results":[{"action":"clipboard_get","ok":true}],"image_lens":[],"text_lens":[5]}"#,
            b"copi\xc3\xa9",
        ),
        (
            "clipboard",
            r#"{"kind":"clipboard","has_text":true,"truncated":false}"#,
            "copié".as_bytes(),
        ),
        (
            "egress-open",
            r#"{"kind":"egress_open","id":1,"host":"pypi.org","port":443,"form":{"type":"connect"},"hand_over":true}"#,
            b"",
        ),
        (
            "egress-open-http",
            r#"{"kind":"egress_open","id":2,"host":"example.com","port":80,"form":{"type":"http","method":"GET"}}"#,
            b"GET / HTTP/1.1\r\nHost: example.com\r\nConnection: close\r\n\r\n",
        ),
        (
            "error",
            r#"{"kind":"error","code":"busy","message":"try again"}"#,
            b"",
        ),
    ]
}

fn frames(base: &Path) -> Result {
    let mut out = Out::new(base, "frame")?;
    let mut guest = Out::new(base, "guest_messages")?;
    let batch = br#"{"actions":[{"action":"screenshot"}]}"#;
    for (name, json) in REQUESTS {
        let request: Request = serde_json::from_str(json).map_err(|e| format!("{name}: {e}"))?;
        let payload: &[u8] = if *name == "exec" { b"stdin bytes" } else { b"" };
        let bytes = frame::encode(&request, payload)?;
        out.put(&format!("request-{name}"), &bytes)?;
        let mut msg = batch.to_vec();
        msg.push(0);
        msg.extend_from_slice(&bytes[frame::HEADER_LEN..bytes.len() - payload.len()]);
        guest.put(&format!("request-{name}"), &msg)?;
    }
    for (name, json, payload) in responses() {
        let response: Response = serde_json::from_str(json).map_err(|e| format!("{name}: {e}"))?;
        let bytes = frame::encode(&response, payload)?;
        out.put(&format!("response-{name}"), &bytes)?;
        // Two frames back to back, as a stream carries them.
        let mut two = bytes.clone();
        two.extend_from_slice(&bytes);
        if name == "status" {
            out.put("response-status-twice", &two)?;
        }
        let mut msg = batch.to_vec();
        msg.push(0);
        msg.extend_from_slice(&bytes[frame::HEADER_LEN..bytes.len() - payload.len()]);
        msg.push(0);
        msg.extend_from_slice(payload);
        guest.put(&format!("response-{name}"), &msg)?;
    }
    let zoom = br#"{"actions":[{"action":"zoom","region":[0,0,10,10],"format":"jpeg","quality":50},{"action":"clipboard_get"}]}"#;
    let mut msg = zoom.to_vec();
    msg.push(0);
    msg.extend_from_slice(br#"{"v":1,"kind":"action_results","results":[{"action":"zoom","ok":true,"image":{"type":"base64","media_type":"image/jpeg","data":""},"size":[10,10]},{"action":"clipboard_get","ok":true}],"image_lens":[6],"text_lens":[2]}"#);
    msg.push(0);
    msg.extend_from_slice(JPEG);
    msg.extend_from_slice(b"ok");
    guest.put("response-zoom-clipboard", &msg)?;
    // Hostile frames: a header announcing too much, an empty message, a
    // newer version, an unknown kind, a payload on a message without one.
    out.put("hostile-huge", &[0xff, 0xff, 0xff, 0xff, 0, 0, 0, 0])?;
    out.put("hostile-empty", &[0, 0, 0, 0, 0, 0, 0, 1, 0])?;
    out.put(
        "hostile-newer",
        &frame::frame_unchecked(br#"{"v":999,"kind":"hello"}"#, b""),
    )?;
    out.put(
        "hostile-kind",
        &frame::frame_unchecked(br#"{"v":1,"kind":"nope"}"#, b""),
    )?;
    out.put(
        "hostile-payload",
        &frame::frame_unchecked(br#"{"v":1,"kind":"hello"}"#, b"xx"),
    )?;
    println!(
        "frame: {} seeds, guest_messages: {} seeds",
        out.count, guest.count
    );
    Ok(())
}

/// One ustar header (and data padded to 512), written byte by byte so that
/// hostile entries can be made (as `tests/src/archive.rs` does).
fn tar_entry(name: &[u8], kind: u8, data: &[u8], link: &[u8]) -> Vec<u8> {
    let mut h = [0u8; 512];
    h[..name.len()].copy_from_slice(name);
    let octal = |h: &mut [u8; 512], at: usize, len: usize, v: u64| {
        let text = format!("{v:0width$o}\0", width = len - 1);
        h[at..at + len].copy_from_slice(text.as_bytes());
    };
    octal(&mut h, 100, 8, 0o644);
    octal(&mut h, 108, 8, 1000);
    octal(&mut h, 116, 8, 1000);
    octal(&mut h, 124, 12, data.len() as u64);
    octal(&mut h, 136, 12, 1_700_000_000);
    h[156] = kind;
    h[157..157 + link.len()].copy_from_slice(link);
    h[257..263].copy_from_slice(b"ustar\0");
    h[263..265].copy_from_slice(b"00");
    h[148..156].copy_from_slice(b"        ");
    let sum: u64 = h.iter().map(|b| u64::from(*b)).sum();
    octal(&mut h, 148, 7, sum);
    h[155] = b' ';
    let mut v = h.to_vec();
    v.extend_from_slice(data);
    v.resize(v.len().div_ceil(512) * 512, 0);
    v
}

fn tar(entries: &[Vec<u8>]) -> Vec<u8> {
    let mut v: Vec<u8> = entries.concat();
    v.extend_from_slice(&[0u8; 1024]);
    v
}

fn compressed(bytes: &[u8], compression: Compression) -> Result<Vec<u8>> {
    use std::io::Write as _;
    Ok(match compression {
        Compression::None => bytes.to_vec(),
        Compression::Gzip => {
            let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
            e.write_all(bytes)?;
            e.finish()?
        }
        Compression::Zstd => zstd::encode_all(bytes, 3)?,
    })
}

fn archives(base: &Path) -> Result {
    let mut out = Out::new(base, "tar_import")?;
    // A workspace exported by the broker's own exporter.
    let dir = tempfile::tempdir()?;
    let ws = dir.path().join("ws");
    fs::create_dir_all(ws.join("docs/deep/er"))?;
    fs::write(ws.join("docs/a.txt"), b"hello\n")?;
    fs::write(ws.join("docs/deep/er/b.bin"), [0u8, 1, 2, 255])?;
    fs::write(ws.join("Grüße.txt"), "ü".repeat(10))?;
    fs::write(ws.join(format!("{}.txt", "n".repeat(120))), b"long name")?;
    fs::hard_link(ws.join("docs/a.txt"), ws.join("docs/a-again.txt"))?;
    symlink("docs/a.txt", ws.join("link"))?;
    symlink("/etc/passwd", ws.join("abs-link"))?;
    fs::create_dir_all(ws.join(".browser-profiles/chromium/Cache"))?;
    fs::write(ws.join(".browser-profiles/chromium/Cache/x"), b"cache")?;
    let root = WorkspaceRoot::open(&ws)?;
    for (name, compression) in [
        ("export.tar", Compression::None),
        ("export.tar.gz", Compression::Gzip),
        ("export.tar.zst", Compression::Zstd),
    ] {
        let mut bytes = Vec::new();
        export_archive(&root, &mut bytes, compression, &ImportLimits::default())?;
        out.put(name, &bytes)?;
    }
    // Hand-made ones, each plain, gzip and zstd.
    let hostile: Vec<(&str, Vec<u8>)> = vec![
        ("file", tar(&[tar_entry(b"a.txt", b'0', b"data", b"")])),
        (
            "dir-file",
            tar(&[
                tar_entry(b"d/", b'5', b"", b""),
                tar_entry(b"d/f", b'0', b"x", b""),
            ]),
        ),
        ("dot-slash", tar(&[tar_entry(b"./x", b'0', b"x", b"")])),
        ("parent", tar(&[tar_entry(b"../evil", b'0', b"x", b"")])),
        ("absolute", tar(&[tar_entry(b"/tmp/evil", b'0', b"x", b"")])),
        (
            "through-symlink",
            tar(&[
                tar_entry(b"l", b'2', b"", b"/tmp"),
                tar_entry(b"l/evil", b'0', b"x", b""),
            ]),
        ),
        (
            "symlink-dotdot",
            tar(&[
                tar_entry(b"up", b'2', b"", b".."),
                tar_entry(b"up/x", b'0', b"x", b""),
            ]),
        ),
        (
            "hardlink",
            tar(&[
                tar_entry(b"f", b'0', b"x", b""),
                tar_entry(b"g", b'1', b"", b"f"),
            ]),
        ),
        (
            "hardlink-outside",
            tar(&[tar_entry(b"g", b'1', b"", b"/etc/passwd")]),
        ),
        ("device", tar(&[tar_entry(b"dev", b'3', b"", b"")])),
        ("fifo", tar(&[tar_entry(b"fifo", b'6', b"", b"")])),
        (
            "duplicate",
            tar(&[
                tar_entry(b"f", b'0', b"x", b""),
                tar_entry(b"f", b'0', b"y", b""),
            ]),
        ),
        (
            "file-then-dir",
            tar(&[
                tar_entry(b"f", b'0', b"x", b""),
                tar_entry(b"f/g", b'0', b"y", b""),
            ]),
        ),
        (
            "gnu-longname",
            tar(&[
                tar_entry(b"././@LongLink", b'L', &[b'n'; 300], b""),
                tar_entry(b"short", b'0', b"x", b""),
            ]),
        ),
        (
            "pax-path",
            tar(&[
                tar_entry(b"PaxHeader", b'x', b"20 path=pax/name.t\n", b""),
                tar_entry(b"ignored", b'0', b"x", b""),
            ]),
        ),
        (
            "pax-global",
            tar(&[tar_entry(b"global", b'g', b"15 path=abcdef\n", b"")]),
        ),
        ("no-end", tar_entry(b"a", b'0', b"x", b"")),
        ("empty", vec![0u8; 1024]),
    ];
    for (name, bytes) in hostile {
        out.put(&format!("{name}.tar"), &bytes)?;
        out.put(
            &format!("{name}.tar.gz"),
            &compressed(&bytes, Compression::Gzip)?,
        )?;
        out.put(
            &format!("{name}.tar.zst"),
            &compressed(&bytes, Compression::Zstd)?,
        )?;
    }
    println!("tar_import: {} seeds", out.count);
    Ok(())
}

fn actions(base: &Path) -> Result {
    let mut out = Out::new(base, "actions")?;
    let batches: &[(&str, &str)] = &[
        (
            "contract",
            r#"{"actions": [
            {"action": "left_click", "coordinate": [640, 400]},
            {"action": "type", "text": "Grüße"},
            {"action": "key", "text": "ctrl+l"},
            {"action": "scroll", "coordinate": [10, 20], "scroll_direction": "down", "scroll_amount": 3},
            {"action": "left_click_drag", "start_coordinate": [1, 2], "coordinate": [3, 4]},
            {"action": "mouse_move", "coordinate": [5, 6]},
            {"action": "cursor_position"},
            {"action": "screenshot"},
            {"action": "zoom", "region": [0, 0, 100, 50]},
            {"action": "wait", "duration": 0.5},
            {"action": "hold_key", "text": "shift", "duration": 1},
            {"action": "left_mouse_down"},
            {"action": "left_mouse_up"},
            {"action": "right_click", "coordinate": [7, 8]},
            {"action": "middle_click"},
            {"action": "double_click", "coordinate": [9, 9], "text": "ctrl"},
            {"action": "triple_click", "coordinate": [9, 9]},
            {"action": "left_click", "coordinate": [1, 1], "text": "shift"}
        ], "scale": {"width": 1024, "height": 768}}"#,
        ),
        (
            "keys",
            r#"{"actions": [{"action": "key", "text": "ctrl+shift+t KP_Enter ctrl++ super+Return XF86Back a A 1 F12 BackSpace"}]}"#,
        ),
        (
            "clipboard",
            r#"{"actions": [{"action": "clipboard_set", "text": "copié"}, {"action": "clipboard_get"}], "cursor": true}"#,
        ),
        (
            "formats",
            r#"{"actions": [{"action": "screenshot", "format": "jpeg", "quality": 70}, {"action": "zoom", "region": [10, 10, 20, 30], "format": "webp", "quality": 90}]}"#,
        ),
        (
            "edge",
            r#"{"actions": [{"action": "left_click", "coordinate": [1279, 799]}, {"action": "zoom", "region": [0, 0, 1280, 800]}], "scale": {"width": 1, "height": 1}}"#,
        ),
        (
            "openai-all",
            r#"{"openai_actions": [
            {"type": "click", "button": "left", "x": 10, "y": 20},
            {"type": "click", "button": "wheel", "x": 1, "y": 2, "keys": null},
            {"type": "click", "button": "back", "x": 1, "y": 2},
            {"type": "double_click", "x": 5, "y": 6},
            {"type": "drag", "path": [{"x": 1, "y": 1}, {"x": 5, "y": 5}, {"x": 9, "y": 9}]},
            {"type": "keypress", "keys": ["CTRL", "A"]},
            {"type": "move", "x": 3, "y": 4},
            {"type": "screenshot"},
            {"type": "scroll", "x": 7, "y": 8, "scroll_x": 0, "scroll_y": -250},
            {"type": "type", "text": "Grüße"},
            {"type": "wait"}
        ], "scale": {"width": 1024, "height": 640}}"#,
        ),
        (
            "openai-keys",
            r#"{"openai_actions": [{"type": "keypress", "keys": ["ARROWLEFT", "ENTER", "SHIFT", "ESC", "PAGEDOWN", "é"]}, {"type": "click", "button": "right", "x": 1, "y": 1, "keys": ["ALT"]}]}"#,
        ),
        (
            "openai-scroll",
            r#"{"openai_actions": [{"type": "scroll", "x": 1, "y": 1, "scroll_x": 1000000, "scroll_y": -1}], "cursor": true}"#,
        ),
    ];
    for (name, json) in batches {
        out.put(name, json.as_bytes())?;
    }
    println!("actions: {} seeds", out.count);
    Ok(())
}

fn paths(base: &Path) -> Result {
    let mut out = Out::new(base, "workspace_path")?;
    for (name, path) in [
        ("plain", "a/b/c"),
        ("file", "a/f"),
        ("link", "l/b"),
        ("up", "up/outside"),
        ("upup", "a/b/upup/outside"),
        ("out", "out/secret"),
        ("abs", "abs/secret"),
        ("root-link", "root/etc"),
        ("etc", "a/b/c/etc"),
        ("lb", "a/lb/c"),
        ("dangling", "e/dangling/x"),
        ("dotdot", "a/../../x"),
        ("dot", "a/./b"),
        ("empty-component", "a//b"),
        ("absolute", "/etc/passwd"),
        ("percent", "a%2Fb%2Fc?recursive=true&overwrite=1"),
        ("percent-dotdot", "%2e%2e/x"),
        ("percent-nul", "a%00b"),
        ("percent-bad", "a%zz"),
        ("space", "sp%20ace/x?mkdir=true"),
        ("hidden", ".hidden/..x"),
        ("query", "a/b?mode=0644&+x=y%3D"),
    ] {
        out.put(name, path.as_bytes())?;
    }
    println!("workspace_path: {} seeds", out.count);
    Ok(())
}

/// `flags`, the viewer's part's length, the viewer's bytes, the desktop's.
fn rfb_input(control: bool, chunk: u8, viewer: &[u8], desktop: &[u8]) -> Vec<u8> {
    let mut v = vec![u8::from(control) | (chunk << 1)];
    v.extend_from_slice(
        &u16::try_from(viewer.len())
            .unwrap_or(u16::MAX)
            .to_be_bytes(),
    );
    v.extend_from_slice(viewer);
    v.extend_from_slice(desktop);
    v
}

fn rfb(base: &Path) -> Result {
    let mut out = Out::new(base, "rfb")?;
    let mut viewer = b"RFB 003.008\n".to_vec();
    viewer.extend_from_slice(&[1, 0]);
    // SetPixelFormat 32 bpp, SetEncodings (raw, copyrect, tight, zrle,
    // cursor, desktop size), a full update request, continuous updates.
    viewer.extend_from_slice(&[
        0, 0, 0, 0, 32, 24, 0, 1, 0, 255, 0, 255, 0, 255, 16, 8, 0, 0, 0, 0,
    ]);
    viewer.extend_from_slice(&[2, 0, 0, 6]);
    for e in [0i32, 1, 7, 16, -239, -223] {
        viewer.extend_from_slice(&e.to_be_bytes());
    }
    viewer.extend_from_slice(&[3, 0, 0, 0, 0, 0, 5, 0, 3, 32]);
    viewer.extend_from_slice(&[150, 1, 0, 0, 0, 0, 5, 0, 3, 32]);
    let handshake = viewer.clone();
    // Input: a key, the pointer, clipboard text, a fence, a resize, xvp,
    // a QEMU key event and audio.
    viewer.extend_from_slice(&[4, 1, 0, 0, 0, 0, 0xff, 0x0d]);
    viewer.extend_from_slice(&[5, 1, 0, 10, 0, 20]);
    viewer.extend_from_slice(&[6, 0, 0, 0, 0, 0, 0, 5]);
    viewer.extend_from_slice(b"hello");
    viewer.extend_from_slice(&[248, 0, 0, 0, 0, 0, 0, 1, 2, 0xaa, 0xbb]);
    viewer.extend_from_slice(&[251, 0, 5, 0, 3, 32, 1, 0]);
    viewer.extend_from_slice(&[0u8; 16]);
    viewer.extend_from_slice(&[250, 0, 1, 2]);
    viewer.extend_from_slice(&[255, 0, 0, 1, 0, 0, 0, 0x41, 0, 0, 0, 30]);
    viewer.extend_from_slice(&[255, 1, 0, 0]);
    // The desktop: version, security None, its result, ServerInit, an
    // update with a raw and a copyrect rectangle, a bell, clipboard text.
    let mut desktop = b"RFB 003.008\n".to_vec();
    desktop.extend_from_slice(&[1, 1, 0, 0, 0, 0]);
    desktop.extend_from_slice(&[
        5, 0, 3, 32, 32, 24, 0, 1, 0, 255, 0, 255, 0, 255, 16, 8, 0, 0, 0,
    ]);
    desktop.extend_from_slice(&[0, 0, 0, 6]);
    desktop.extend_from_slice(b"desk:1");
    desktop.extend_from_slice(&[0, 0, 0, 2]);
    desktop.extend_from_slice(&[0, 1, 0, 2, 0, 2, 0, 1, 0, 0, 0, 0]);
    desktop.extend_from_slice(&[0x11; 8]);
    desktop.extend_from_slice(&[0, 8, 0, 8, 0, 8, 0, 8, 0, 0, 0, 1, 0, 4, 0, 5]);
    desktop.push(2);
    desktop.extend_from_slice(&[3, 0, 0, 0, 0, 0, 0, 4]);
    desktop.extend_from_slice(b"copy");
    for (name, control, chunk, v) in [
        ("view-session", false, 0, &viewer),
        ("control-session", true, 3, &viewer),
        ("view-handshake", false, 7, &handshake),
    ] {
        out.put(name, &rfb_input(control, chunk, v, &desktop))?;
    }
    let mut v33 = b"RFB 003.003\n".to_vec();
    v33.push(0);
    v33.extend_from_slice(&[3, 1, 0, 0, 0, 0, 0, 10, 0, 10]);
    let mut d33 = b"RFB 003.003\n".to_vec();
    d33.extend_from_slice(&[0, 0, 0, 1]);
    d33.extend_from_slice(&[
        0, 10, 0, 10, 16, 16, 0, 1, 0, 31, 0, 63, 0, 31, 11, 5, 0, 0, 0, 0,
    ]);
    d33.extend_from_slice(&[0, 0, 0, 0]);
    out.put("view-3.3", &rfb_input(false, 1, &v33, &d33))?;
    println!("rfb: {} seeds", out.count);
    Ok(())
}

fn egress(base: &Path) -> Result {
    let mut out = Out::new(base, "egress_head")?;
    for (name, head) in [
        ("connect", "CONNECT pypi.org:443 HTTP/1.1\r\nHost: pypi.org:443\r\nUser-Agent: pip\r\n\r\n"),
        ("connect-v6", "CONNECT [2001:db8::1]:22 HTTP/1.1\r\n\r\n"),
        ("get", "GET http://example.com/path?q=1 HTTP/1.1\r\nHost: example.com\r\nAccept: */*\r\nProxy-Authorization: Basic eA==\r\nConnection: keep-alive, x-hop\r\nx-hop: 1\r\nKeep-Alive: 5\r\n\r\nbody"),
        ("post", "POST http://Example.COM.:8080 HTTP/1.0\r\nContent-Length: 4\r\n\r\nbody"),
        ("query-only", "GET http://example.com?x=1 HTTP/1.1\r\n\r\n"),
        ("origin-form", "GET / HTTP/1.1\r\nHost: example.com\r\n\r\n"),
        ("https", "GET https://example.com/ HTTP/1.1\r\n\r\n"),
        ("credentials", "GET http://user:pw@example.com/ HTTP/1.1\r\n\r\n"),
        ("trace", "TRACE http://example.com/ HTTP/1.1\r\n\r\n"),
        ("folded", "GET http://example.com/ HTTP/1.1\r\nA: b\r\n c\r\n\r\n"),
        ("bare-lf", "GET http://example.com/ HTTP/1.1\nA: b\n\r\n\r\n"),
        ("port-0", "CONNECT example.com:0 HTTP/1.1\r\n\r\n"),
        ("numeric", "CONNECT 999.1.1.1:80 HTTP/1.1\r\n\r\n"),
        ("lower-connect", "connect http://example.com/ HTTP/1.1\r\n\r\n"),
    ] {
        let mut bytes = vec![3u8];
        bytes.extend_from_slice(head.as_bytes());
        out.put(name, &bytes)?;
    }
    println!("egress_head: {} seeds", out.count);
    Ok(())
}

fn auth(base: &Path) -> Result {
    let mut out = Out::new(base, "auth_headers")?;
    for (name, text) in [
        ("bearer", "/v1/computers\nauthorization: Bearer s3cret\ndormouse-generation: 12\n"),
        ("bearer-spaces", "/v1/computers\nauthorization: bearer   t0k  \n"),
        ("basic", "/v1/computers\nauthorization: Basic dXNlcjpwdw==\n"),
        ("events-query", "/v1/events?a=1&token=ab%2Fc+d\n"),
        ("events-subprotocol", "/v1/events\nsec-websocket-protocol: dormouse.v1, dormouse.bearer.s3cret\n"),
        ("exec-ws", "/v1/computers/67e55044-10b1-426f-9247-bb680e5fe0c8/exec/ws?rows=24&cols=80&argv=bash&generation=7&token=t\nsec-websocket-protocol: dormouse.v1\nsec-websocket-protocol: dormouse.bearer.x\n"),
        ("screen", "/v1/screens/67e55044-10b1-426f-9247-bb680e5fe0c8/rfb?token=zzz\nsec-websocket-protocol: binary, dormouse.screen.abc\n"),
        ("generation-twice", "/v1/computers/x/actions\ndormouse-generation: 12\ndormouse-generation: 12\n"),
        ("generation-sign", "/\ndormouse-generation: +12\n"),
        ("generation-huge", "/\ndormouse-generation: 99999999999999999999999\n"),
        ("generation-space", "/\ndormouse-generation:  7 \n"),
        ("percent", "/v1/events?token=%zz%4\n"),
    ] {
        out.put(name, text.as_bytes())?;
    }
    println!("auth_headers: {} seeds", out.count);
    Ok(())
}

fn main() -> Result {
    let base = PathBuf::from(std::env::args().nth(1).unwrap_or_else(|| "corpus".into()));
    frames(&base)?;
    archives(&base)?;
    actions(&base)?;
    paths(&base)?;
    rfb(&base)?;
    egress(&base)?;
    auth(&base)?;
    Ok(())
}
