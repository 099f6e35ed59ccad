//! Tar archives written byte by byte for the tests (a ustar header per
//! entry, data padded to 512, the end-of-archive marker), so a test can
//! make exactly the entry it means, hostile ones included. No tar crate:
//! what the broker refuses must be made without one smoothing it over.

/// A ustar header (and data padded to 512) for one entry: `kind` is the
/// type flag (`b'0'` a file, `b'5'` a directory, `b'2'` a symlink to
/// `link`, …), owned 1000:1000, mode 0644.
pub fn tar_entry(name: &str, kind: u8, data: &[u8], link: &str) -> Vec<u8> {
    let mut h = [0u8; 512];
    h[..name.len()].copy_from_slice(name.as_bytes());
    let octal = |h: &mut [u8; 512], at: usize, len: usize, v: u64| {
        let text = format!("{v:0width$o}\0", width = len - 1);
        h[at..at + len].copy_from_slice(text.as_bytes());
    };
    octal(&mut h, 100, 8, 0o644);
    octal(&mut h, 108, 8, 1000);
    octal(&mut h, 116, 8, 1000);
    octal(&mut h, 124, 12, u64::try_from(data.len()).unwrap());
    octal(&mut h, 136, 12, 1_700_000_000);
    h[156] = kind;
    h[157..157 + link.len()].copy_from_slice(link.as_bytes());
    h[257..263].copy_from_slice(b"ustar\0");
    h[263..265].copy_from_slice(b"00");
    h[148..156].copy_from_slice(b"        ");
    let sum: u32 = h.iter().map(|b| u32::from(*b)).sum();
    let text = format!("{sum:06o}\0 ");
    h[148..156].copy_from_slice(text.as_bytes());
    let mut out = h.to_vec();
    out.extend_from_slice(data);
    out.resize(out.len().div_ceil(512) * 512, 0);
    out
}

/// The entries, then the end-of-archive marker.
pub fn tar(entries: &[Vec<u8>]) -> Vec<u8> {
    let mut out: Vec<u8> = entries.concat();
    out.extend_from_slice(&[0u8; 1024]);
    out
}
