//! The scaling rule between the caller's space and the screen (see the
//! module [`super`]): [`Space::fit`] and the point mappings both ways.

use serde::{Deserialize, Serialize};

use super::types::{Coordinate, Scale};

/// A size in pixels.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Size {
    /// Pixels across.
    pub width: u32,
    /// Pixels down.
    pub height: u32,
}

/// The caller's space on a screen: its size and the mapping of points
/// between it and the screen (see the module's scaling rule).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Space {
    /// The screen.
    pub screen: Size,
    /// The caller's space (equal to `screen` without `scale`).
    pub caller: Size,
}

impl Space {
    /// The caller's space for `scale` on `screen`: `screen` shrunk to fit
    /// inside `scale` with its aspect kept (each side at least 1), never
    /// enlarged; `screen` itself without `scale`.
    pub fn fit(screen: Size, scale: Option<Scale>) -> Self {
        let Some(scale) = scale else {
            return Self {
                screen,
                caller: screen,
            };
        };
        let (sw, sh) = (u64::from(screen.width), u64::from(screen.height));
        let (bw, bh) = (u64::from(scale.width), u64::from(scale.height));
        if sw == 0 || sh == 0 || (bw >= sw && bh >= sh) {
            return Self {
                screen,
                caller: screen,
            };
        }
        // Width limits when bw/sw <= bh/sh.
        let (w, h) = if bw * sh <= bh * sw {
            (bw, (sh * bw + sw / 2) / sw)
        } else {
            ((sw * bh + sh / 2) / sh, bh)
        };
        let side = |v: u64, max: u32| u32::try_from(v.clamp(1, u64::from(max))).unwrap_or(max);
        Self {
            screen,
            caller: Size {
                width: side(w, screen.width),
                height: side(h, screen.height),
            },
        }
    }

    /// Whether the caller's space is the screen itself.
    pub fn is_native(&self) -> bool {
        self.screen == self.caller
    }

    /// A caller's point on the screen (the caller's point must be inside
    /// its space; the result is clamped to the screen either way).
    pub fn to_screen(&self, [x, y]: Coordinate) -> [u32; 2] {
        [
            to_native(x, self.caller.width, self.screen.width),
            to_native(y, self.caller.height, self.screen.height),
        ]
    }

    /// A region's corner on the screen: exclusive ends map to exclusive
    /// ends, so a region covering the caller's whole space covers the
    /// whole screen.
    pub fn edge_to_screen(&self, [x, y]: Coordinate) -> [u32; 2] {
        [
            edge_to_native(x, self.caller.width, self.screen.width),
            edge_to_native(y, self.caller.height, self.screen.height),
        ]
    }

    /// A screen point in the caller's space.
    pub fn to_caller(&self, [x, y]: [i64; 2]) -> [i64; 2] {
        [
            to_scaled(x, self.screen.width, self.caller.width),
            to_scaled(y, self.screen.height, self.caller.height),
        ]
    }
}

/// `floor((v + ½)·native/scaled)`, clamped to the screen.
fn to_native(v: i64, scaled: u32, native: u32) -> u32 {
    if scaled == 0 || native == 0 {
        return 0;
    }
    let v = v.clamp(0, i64::from(scaled) - 1);
    let n = (2 * v + 1) * i64::from(native) / (2 * i64::from(scaled));
    u32::try_from(n.clamp(0, i64::from(native) - 1)).unwrap_or(0)
}

/// `round(v·native/scaled)` for region edges, clamped to `0..=native`.
fn edge_to_native(v: i64, scaled: u32, native: u32) -> u32 {
    if scaled == 0 {
        return 0;
    }
    let v = v.clamp(0, i64::from(scaled));
    let n = (2 * v * i64::from(native) + i64::from(scaled)) / (2 * i64::from(scaled));
    u32::try_from(n.clamp(0, i64::from(native))).unwrap_or(0)
}

/// The nearest scaled point, halves rounding down: `ceil(n·s/N − ½)`,
/// clamped to the caller's space.
fn to_scaled(n: i64, native: u32, scaled: u32) -> i64 {
    if native == 0 || scaled == 0 {
        return 0;
    }
    let (native, scaled) = (i64::from(native), i64::from(scaled));
    let q = 2 * n.clamp(0, native - 1) * scaled - native;
    let v = if q <= 0 {
        0
    } else {
        (q + 2 * native - 1) / (2 * native)
    };
    v.clamp(0, scaled - 1)
}
