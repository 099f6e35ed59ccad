//! A witness page for computer-use actions, and the guest's own view of it.
//!
//! [`PAGE`] is an HTML page for Chromium on the desktop that mirrors what it
//! receives (text, clicks with their screen position and modifiers, wheel,
//! drags, held keys, the selection) into its window title, as
//! percent-encoded JSON so the title stays ASCII. The title is read with
//! `xprop` through `docker exec` ([`page_state`]), never through Dormouse;
//! the guest socket is reached directly ([`guest_call`]) only to compare the
//! broker's relay with the socket itself and to read the guest's input idle
//! time.

use std::path::Path;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use dormouse_protocol::frame::{self, Frame};
use dormouse_protocol::{Request, Response};
use serde_json::Value;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::time::Instant;

use crate::guest::{Guest, GuestUser};

/// The page: a text area (page y 0..200), a button (220..420), a line of
/// text (440..480), a drag area (500..620). `EXPECTED` (a JSON string or
/// `null`) makes the title carry how many characters of the text area
/// match it in place (`m`) and its length (`n`) instead of the text.
pub const PAGE: &str = r#"<!doctype html><html><head><meta charset="utf-8"><title>loading</title>
<style>body{margin:0;height:3000px;font:24px sans-serif}
#t{position:absolute;left:0;top:0;width:100%;height:200px;border:0;background:#eef}
#b{position:absolute;left:0;top:220px;width:100%;height:200px}
#p{position:absolute;left:20px;top:440px;margin:0;height:40px}
#d{position:absolute;left:0;top:500px;width:100%;height:120px;background:#fee}</style></head>
<body><textarea id="t"></textarea><button id="b">button</button>
<p id="p">The quick brown fox jumps over the lazy dog</p><div id="d"></div>
<script>
const EXPECTED = /*EXPECTED*/null;
const s = {wx: 0, wy: 0, k: 0};
const t = document.getElementById('t');
// Reports are coalesced: many events in a row cost one title change (a
// title change is work for the browser process and the window manager,
// which would otherwise be measured as the typing's).
let pending = false;
function report() {
  if (!pending) { pending = true; setTimeout(flush, 5); }
}
function flush() {
  pending = false;
  if (EXPECTED === null) { s.t = t.value; } else {
    const a = Array.from(t.value), e = Array.from(EXPECTED);
    let m = 0; for (let i = 0; i < Math.min(a.length, e.length); i++) if (a[i] === e[i]) m++;
    s.m = m; s.n = a.length;
  }
  document.title = 'S:' + encodeURIComponent(JSON.stringify(s));
}
t.addEventListener('keydown', e => {
  if (e.key === 'Tab') { e.preventDefault(); t.setRangeText('\t', t.selectionStart, t.selectionEnd, 'end'); report(); }
});
t.addEventListener('input', report);
document.addEventListener('mousemove', e => {
  s.o = [e.screenX - e.clientX, e.screenY - e.clientY];
  if (e.buttons & 1) s.moved = (s.moved || 0) + 1;
  report();
});
document.getElementById('b').addEventListener('click', e => {
  s.k++; s.c = [e.target.id, e.screenX, e.screenY, e.shiftKey ? 1 : 0, s.k]; report();
});
const d = document.getElementById('d');
d.addEventListener('mousedown', e => { s.moved = 0; s.down = [e.clientX, e.clientY]; delete s.up; report(); });
document.addEventListener('mouseup', e => {
  if (s.down && !s.up) { s.up = [e.clientX, e.clientY]; }
  const sel = window.getSelection().toString(); if (sel) s.sel = sel; report();
});
document.addEventListener('wheel', e => { s.wx += e.deltaX; s.wy += e.deltaY; report(); }, {passive: true});
const held = {};
document.addEventListener('keydown', e => { if (!(e.key in held)) held[e.key] = e.timeStamp; });
document.addEventListener('keyup', e => {
  if (e.key in held) { s.hold = [e.key, Math.round(e.timeStamp - held[e.key])]; delete held[e.key]; report(); }
});
document.addEventListener('mousedown', e => { s.md = [e.target.id, e.clientX, e.clientY, e.button]; report(); });
t.focus();
report();
</script></body></html>"#;

/// The page with `expected` embedded (see [`PAGE`]).
pub fn page_expecting(expected: &str) -> String {
    let json = serde_json::to_string(expected).unwrap_or_else(|_| "null".into());
    PAGE.replace("/*EXPECTED*/null", &json)
}

/// Writes `html` as `name` into the workspace (host side, readable by the
/// desktop user) and opens it in a Chromium app window at 0,0 filling the
/// screen, as the desktop user; waits until the page is the active window.
pub async fn open_page(guest: &Guest, workspace: &Path, name: &str, html: &str) -> Result<()> {
    let file = workspace.join(name);
    std::fs::write(&file, html).with_context(|| format!("writing {}", file.display()))?;
    {
        use std::os::unix::fs::PermissionsExt as _;
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o644))?;
    }
    let script = format!(
        "exec chromium --no-sandbox --no-first-run --no-default-browser-check --disable-gpu \
         --user-data-dir=/tmp/chromium-{name} --window-position=0,0 --window-size=1280,800 \
         --app=file:///home/desk/workspace/{name} >/tmp/chromium-{name}.log 2>&1"
    );
    guest.sh_detached(GuestUser::Desk, &script).await?;
    let started = Instant::now();
    loop {
        if page_state(guest).await.is_ok() {
            return Ok(());
        }
        if started.elapsed() > Duration::from_secs(90) {
            let log = guest
                .sh(
                    GuestUser::Desk,
                    &format!("tail -c 2000 /tmp/chromium-{name}.log"),
                )
                .await
                .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
                .unwrap_or_default();
            bail!("the page never became the active window; chromium says:\n{log}");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The active window's title as the guest's X server has it, read with
/// `xprop` (`_NET_ACTIVE_WINDOW`, then its `_NET_WM_NAME`).
pub async fn active_title(guest: &Guest) -> Result<String> {
    let out = guest
        .sh_ok(
            GuestUser::Desk,
            "w=$(xprop -root _NET_ACTIVE_WINDOW | sed -n 's/.*# \\(0x[0-9a-fA-F]*\\).*/\\1/p') \
             && [ -n \"$w\" ] && xprop -id \"$w\" _NET_WM_NAME",
        )
        .await?;
    let Some((_, quoted)) = out.split_once(" = ") else {
        bail!("no title in {out:?}");
    };
    let title = quoted.trim().trim_matches('"');
    Ok(title.replace("\\\"", "\"").replace("\\\\", "\\"))
}

/// The page's state from the active window's title.
pub async fn page_state(guest: &Guest) -> Result<Value> {
    let title = active_title(guest).await?;
    let Some(encoded) = title.strip_prefix("S:") else {
        bail!("the active window is not the page: {title:?}");
    };
    let json = percent_decode(encoded).context("title encoding")?;
    serde_json::from_str(&json).with_context(|| format!("title {json:?}"))
}

/// Waits (up to `within`) until `pred` holds for the page's state; the
/// last state either way.
pub async fn page_state_when(
    guest: &Guest,
    within: Duration,
    pred: impl Fn(&Value) -> bool,
) -> Result<Value> {
    let started = Instant::now();
    loop {
        let state = page_state(guest).await?;
        if pred(&state) || started.elapsed() > within {
            return Ok(state);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn percent_decode(s: &str) -> Option<String> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            out.push(u8::from_str_radix(s.get(i + 1..i + 3)?, 16).ok()?);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

/// One request on the guest socket of a computer, straight (as root on the
/// host, the socket's owner): the answer and its payload.
pub async fn guest_call(socket: &Path, request: &Request) -> Result<Frame<Response>> {
    let mut stream = tokio::net::UnixStream::connect(socket)
        .await
        .with_context(|| format!("connecting to {}", socket.display()))?;
    stream.write_all(&frame::encode(request, &[])?).await?;
    let mut buf = Vec::new();
    let mut chunk = vec![0u8; 1 << 16];
    loop {
        if let Some((frame, _)) = frame::decode::<Response>(&buf)? {
            return Ok(frame);
        }
        let n = tokio::time::timeout(Duration::from_secs(120), stream.read(&mut chunk))
            .await
            .context("guest answer")??;
        if n == 0 {
            bail!("the guest closed the connection");
        }
        buf.extend_from_slice(&chunk[..n]);
    }
}

/// The width and height in a PNG's header.
pub fn png_size(png: &[u8]) -> Option<(u32, u32)> {
    if !png.starts_with(b"\x89PNG\r\n\x1a\n") || png.len() < 24 {
        return None;
    }
    let be = |i: usize| u32::from_be_bytes([png[i], png[i + 1], png[i + 2], png[i + 3]]);
    Some((be(16), be(20)))
}

/// The RGB of the pixel at `x`, `y` of an 8-bit RGB or RGBA PNG; `None`
/// for anything else or outside it.
pub fn png_pixel(png: &[u8], x: u32, y: u32) -> Option<[u8; 3]> {
    let mut reader = png::Decoder::new(std::io::Cursor::new(png))
        .read_info()
        .ok()?;
    let mut buf = vec![0u8; reader.output_buffer_size()];
    let info = reader.next_frame(&mut buf).ok()?;
    if info.bit_depth != png::BitDepth::Eight || x >= info.width || y >= info.height {
        return None;
    }
    let channels = info.color_type.samples();
    let at = usize::try_from(y).ok()? * info.line_size + usize::try_from(x).ok()? * channels;
    match (info.color_type, buf.get(at..at + 3)) {
        (png::ColorType::Rgb | png::ColorType::Rgba, Some(p)) => Some([p[0], p[1], p[2]]),
        _ => None,
    }
}

/// Standard base64 (padding optional); `None` on anything else.
pub fn base64_decode(text: &str) -> Option<Vec<u8>> {
    use base64::engine::{DecodePaddingMode, GeneralPurpose, GeneralPurposeConfig};
    use base64::Engine as _;
    const LENIENT: GeneralPurpose = GeneralPurpose::new(
        &base64::alphabet::STANDARD,
        GeneralPurposeConfig::new().with_decode_padding_mode(DecodePaddingMode::Indifferent),
    );
    LENIENT.decode(text).ok()
}
