//! Tests of the screenshot encoder: pixel layouts, shrinking, the pointer
//! marker and the bounded buffers.

use super::*;

#[test]
fn bounded_vec_stops_at_its_limit() {
    let mut v = BoundedVec::new(8);
    v.write_all(&[1; 8]).expect("fits");
    let err = v.write_all(&[1]).expect_err("over the limit");
    assert_eq!(err.kind(), std::io::ErrorKind::FileTooLarge);
    assert_eq!(v.into_inner().len(), 8);
}

fn format(bpp: u8, lsb_first: bool, masks: (u32, u32, u32)) -> PixelFormat {
    PixelFormat {
        bits_per_pixel: bpp,
        stride: 0,
        pad_bits: 32,
        lsb_first,
        red: Channel::from_mask(masks.0).expect("red"),
        green: Channel::from_mask(masks.1).expect("green"),
        blue: Channel::from_mask(masks.2).expect("blue"),
    }
}

#[test]
fn bgrx_rows_become_rgb() {
    let f = format(32, true, (0xff0000, 0xff00, 0xff));
    assert!(f.is_bgrx());
    let row = [0x30, 0x20, 0x10, 0x00, 0xff, 0x00, 0x80, 0x00];
    let mut out = [0u8; 6];
    f.row_to_rgb(&row, 2, &mut out);
    assert_eq!(out, [0x10, 0x20, 0x30, 0x80, 0x00, 0xff]);
}

#[test]
fn other_layouts_decode_through_the_masks() {
    // 16-bit 5-6-5, most significant byte first: pure red, then white.
    let f = format(16, false, (0xf800, 0x07e0, 0x001f));
    assert!(!f.is_bgrx());
    let row = [0xf8, 0x00, 0xff, 0xff];
    let mut out = [0u8; 6];
    f.row_to_rgb(&row, 2, &mut out);
    assert_eq!(out, [0xff, 0x00, 0x00, 0xff, 0xff, 0xff]);
    // 32-bit big-endian 0x00RRGGBB takes the slow path and agrees.
    let f = format(32, false, (0xff0000, 0xff00, 0xff));
    let row = [0x00, 0x10, 0x20, 0x30];
    let mut out = [0u8; 3];
    f.row_to_rgb(&row, 1, &mut out);
    assert_eq!(out, [0x10, 0x20, 0x30]);
}

#[test]
fn shrinking_averages_the_pixels_of_each_box() {
    // 4x2 → 2x1: each target pixel is the mean of a 2x2 box.
    let mut s = Shrink::new(4, 2, 2, 1);
    assert_eq!(
        s.push(&[0, 0, 0, 100, 100, 100, 10, 20, 30, 10, 20, 30]),
        None
    );
    let row = s
        .push(&[100, 100, 100, 200, 200, 200, 30, 40, 50, 30, 40, 50])
        .expect("the last source row ends the target row")
        .to_vec();
    assert_eq!(row, [100, 100, 100, 20, 30, 40]);
}

#[test]
fn shrinking_by_an_odd_ratio_yields_every_target_row() {
    let (sw, sh, ow, oh) = (7u32, 5u32, 3u32, 2u32);
    let mut s = Shrink::new(sw, sh, ow, oh);
    let src = vec![77u8; sw as usize * 3];
    let mut rows = 0;
    for _ in 0..sh {
        if let Some(row) = s.push(&src) {
            assert_eq!(row.len(), ow as usize * 3);
            assert!(row.iter().all(|v| *v == 77), "{row:?}");
            rows += 1;
        }
    }
    assert_eq!(rows, oh);
}

#[test]
fn the_marker_is_drawn_centred_on_the_pointer() {
    let marker = Overlay::marker(20, 10);
    let mut row = vec![255u8; 40 * 3];
    marker.draw(10, 0, &mut row);
    // Row 10 is the cross's bar: black from x = 13 to 27.
    assert_eq!(&row[12 * 3..12 * 3 + 3], &[255, 255, 255]);
    assert_eq!(&row[13 * 3..13 * 3 + 3], &[0, 0, 0]);
    assert_eq!(&row[27 * 3..27 * 3 + 3], &[0, 0, 0]);
    assert_eq!(&row[28 * 3..28 * 3 + 3], &[255, 255, 255]);
    // Rows outside it and a row starting right of it are untouched.
    let mut far = vec![255u8; 40 * 3];
    marker.draw(30, 0, &mut far);
    marker.draw(10, 100, &mut far);
    assert!(far.iter().all(|v| *v == 255));
}

#[test]
fn counting_writer_counts() {
    let mut w = CountingWriter {
        inner: std::io::sink(),
        count: 0,
    };
    w.write_all(&[0; 10]).expect("write");
    assert_eq!(w.count, 10);
}
