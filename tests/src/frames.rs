//! Timing the live screen's first frame as a viewer meets it: a WebSocket
//! to the broker's gateway with a capability's token, the RFB handshake,
//! then one whole-screen update read to its last byte. Shared by
//! `dormouse-bench-screen` and `dormouse-bench-load`.

use std::time::{Duration, Instant};

use anyhow::Result;
use dormouse_protocol::screen::ScreenGrant;

use crate::broker::BrokerProcess;
use crate::rfb::{set_encodings, set_pixel_format_bgrx, update_request, Rect, RfbViewer, TokenIn};

/// The desktop's screen width.
pub const W: u16 = 1280;
/// The desktop's screen height.
pub const H: u16 = 800;

/// Raw pixels only.
pub const RAW: &[i32] = &[0];
/// ZRLE preferred, Raw otherwise.
pub const ZRLE: &[i32] = &[16, 0];

/// Bytes an update of these rectangles took on the wire.
pub fn rect_bytes(rects: &[Rect]) -> u64 {
    4 + rects.iter().map(|r| 12 + r.wire as u64).sum::<u64>()
}

/// A viewer on `grant` through `broker`, handshaken, asking for 32-bit
/// pixels in `encodings`.
pub async fn viewer_with(
    broker: &BrokerProcess,
    grant: &ScreenGrant,
    encodings: &[i32],
) -> Result<RfbViewer> {
    let mut v = RfbViewer::connect(
        &format!("ws://{}{}", broker.addr(), grant.websocket),
        &grant.token,
        TokenIn::Subprotocol,
    )
    .await?;
    v.handshake().await?;
    v.send(&set_pixel_format_bgrx()).await?;
    v.send(&set_encodings(encodings)).await?;
    Ok(v)
}

/// Reads one whole-screen update; returns its byte count.
pub async fn full_update(v: &mut RfbViewer) -> Result<u64> {
    Ok(full_update_lit(v).await?.0)
}

/// Reads one whole-screen update; returns its byte count and how many of
/// its Raw pixels are not black (a frame sent before the VNC server first
/// read the screen is all black).
pub async fn full_update_lit(v: &mut RfbViewer) -> Result<(u64, usize)> {
    v.send(&update_request(false, 0, 0, W, H)).await?;
    let mut covered = 0usize;
    let mut bytes = 0;
    let mut lit = 0;
    while covered < usize::from(W) * usize::from(H) {
        let rects = v.read_update().await?;
        bytes += rect_bytes(&rects);
        covered += rects
            .iter()
            .filter(|r| r.encoding >= 0)
            .map(|r| usize::from(r.w) * usize::from(r.h))
            .sum::<usize>();
        lit += rects
            .iter()
            .flat_map(|r| r.pixels.chunks(4))
            .filter(|p| p[0] | p[1] | p[2] != 0)
            .count();
    }
    Ok((bytes, lit))
}

/// The first frame: from opening the WebSocket to the last byte of the
/// first whole-screen update in `encodings`; with its byte count.
pub async fn first_frame(
    broker: &BrokerProcess,
    grant: &ScreenGrant,
    encodings: &[i32],
) -> Result<(Duration, u64)> {
    let started = Instant::now();
    let mut v = viewer_with(broker, grant, encodings).await?;
    let bytes = full_update(&mut v).await?;
    let took = started.elapsed();
    v.close().await;
    Ok((took, bytes))
}
