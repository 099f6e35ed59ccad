//! The pointer drawn into a screenshot: its image as the X server draws it
//! (XFIXES `GetCursorImage`), or a marker at `QueryPointer` without XFIXES,
//! blended into the screen's rows as they arrive. It never reads the screen
//! itself.

use x11rb::protocol::xproto::{self, ConnectionExt as _};
use x11rb::rust_connection::RustConnection;

use super::ScreenshotError;
use crate::x_client::XError;

/// Largest pointer image drawn (sides); a bigger one is drawn as the marker.
const MAX_CURSOR_SIDE: u16 = 256;

/// The pointer's image at its place on the screen, premultiplied ARGB.
#[derive(Debug)]
pub(super) struct Overlay {
    left: i64,
    top: i64,
    width: usize,
    argb: Vec<u32>,
}

impl Overlay {
    /// The pointer as the server draws it (XFIXES), or a marker where it is.
    pub(super) fn of_pointer(
        conn: &RustConnection,
        root: xproto::Window,
    ) -> Result<Self, ScreenshotError> {
        use x11rb::connection::RequestConnection as _;
        use x11rb::protocol::xfixes::{self, ConnectionExt as _};
        let has_xfixes = conn
            .extension_information(xfixes::X11_EXTENSION_NAME)
            .map_err(XError::from)?
            .is_some();
        if has_xfixes {
            // The version must be negotiated before other XFIXES requests.
            conn.xfixes_query_version(4, 0)
                .map_err(XError::from)?
                .reply()
                .map_err(XError::from)?;
            let image = conn
                .xfixes_get_cursor_image()
                .map_err(XError::from)?
                .reply()
                .map_err(XError::from)?;
            let (w, h) = (image.width, image.height);
            if w > 0
                && h > 0
                && w <= MAX_CURSOR_SIDE
                && h <= MAX_CURSOR_SIDE
                && image.cursor_image.len() == usize::from(w) * usize::from(h)
            {
                return Ok(Self {
                    left: i64::from(image.x) - i64::from(image.xhot),
                    top: i64::from(image.y) - i64::from(image.yhot),
                    width: usize::from(w),
                    argb: image.cursor_image,
                });
            }
        }
        let p = conn
            .query_pointer(root)
            .map_err(XError::from)?
            .reply()
            .map_err(XError::from)?;
        Ok(Self::marker(i64::from(p.root_x), i64::from(p.root_y)))
    }

    /// A 15×15 cross, black with a white rim, centred on the point.
    pub(super) fn marker(x: i64, y: i64) -> Self {
        const SIDE: usize = 15;
        const MID: usize = SIDE / 2;
        const MID_I: i64 = 7;
        let mut argb = vec![0u32; SIDE * SIDE];
        for (i, px) in argb.iter_mut().enumerate() {
            let (r, c) = (i / SIDE, i % SIDE);
            if r == MID || c == MID {
                *px = 0xff00_0000;
            } else if r.abs_diff(MID) == 1 || c.abs_diff(MID) == 1 {
                *px = 0xffff_ffff;
            }
        }
        Self {
            left: x - MID_I,
            top: y - MID_I,
            width: SIDE,
            argb,
        }
    }

    /// Blends the pointer into screen row `y` (whose first pixel is screen
    /// column `x0`).
    pub(super) fn draw(&self, y: u32, x0: u32, rgb: &mut [u8]) {
        let Ok(r) = usize::try_from(i64::from(y) - self.top) else {
            return;
        };
        let Some(line) = self.argb.get(r * self.width..(r + 1) * self.width) else {
            return;
        };
        for (c, &px) in (0i64..).zip(line) {
            let a = px >> 24;
            if a == 0 {
                continue;
            }
            let Ok(col) = usize::try_from(self.left + c - i64::from(x0)) else {
                continue;
            };
            let Some(dst) = rgb.get_mut(col * 3..col * 3 + 3) else {
                continue;
            };
            for (k, shift) in [16u32, 8, 0].into_iter().enumerate() {
                let src = (px >> shift) & 0xff;
                let under = u32::from(dst[k]);
                let v = src + (under * (255 - a) + 127) / 255;
                dst[k] = u8::try_from(v.min(255)).unwrap_or(u8::MAX);
            }
        }
    }
}
