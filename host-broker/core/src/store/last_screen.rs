//! The last screen of a desktop: a small WebP the broker takes just before
//! each stop it makes, so that a stopped desktop can be shown without
//! starting it.
//!
//! Owns the file's format and bounds: one image, written atomically, its
//! time being the file's modification time (set when it is written, kept by
//! the rename). It never asks the guest for anything: the stop does, and
//! hands the bytes here. A file that is not a WebP of at most
//! [`MAX_LAST_SCREEN`] bytes is refused on read, never served.

use std::fs::OpenOptions;
use std::io::Read;
use std::os::unix::fs::OpenOptionsExt;

use chrono::{DateTime, Utc};
use dormouse_protocol::image::ImageFormat;
use uuid::Uuid;

use super::{libc_o_nofollow, remove_file, write_atomic, Paths, StoreError};

/// Largest last screen kept or served (a 640×400 WebP is 10–40 KiB).
pub const MAX_LAST_SCREEN: u64 = 1024 * 1024;

/// The box the kept image fits in, its aspect ratio kept.
pub const LAST_SCREEN_BOX: (u32, u32) = (640, 400);

/// The format it is kept in.
pub const LAST_SCREEN_FORMAT: ImageFormat = ImageFormat::Webp;

/// A desktop's screen as it was before the broker last stopped it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LastScreen {
    /// The image, a WebP ([`LAST_SCREEN_FORMAT`]).
    pub image: Vec<u8>,
    /// When it was taken (written).
    pub taken_at: DateTime<Utc>,
}

/// Keeps `image` as computer `id`'s last screen, replacing the one before.
/// Blocking: call it on the blocking pool.
///
/// # Errors
/// An image that is not a WebP or is over [`MAX_LAST_SCREEN`] is refused
/// (as [`StoreError::Corrupt`]); the file system's errors as they come.
pub fn save(paths: &Paths, id: Uuid, image: &[u8]) -> Result<(), StoreError> {
    let path = paths.last_screen(id);
    check(image).map_err(|message| StoreError::Corrupt {
        path: path.clone(),
        message,
    })?;
    write_atomic(&path, image)
}

/// Computer `id`'s last screen, if one is kept. Blocking: call it on the
/// blocking pool.
///
/// # Errors
/// A file that is a link, too large or not a WebP is [`StoreError::Corrupt`]
/// or an I/O error; it is never served.
pub fn load(paths: &Paths, id: Uuid) -> Result<Option<LastScreen>, StoreError> {
    let path = paths.last_screen(id);
    let file = match OpenOptions::new()
        .read(true)
        .custom_flags(libc_o_nofollow())
        .open(&path)
    {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(StoreError::io("open", &path, e)),
    };
    let modified = file
        .metadata()
        .and_then(|m| m.modified())
        .map_err(|e| StoreError::io("stat", &path, e))?;
    let mut image = Vec::new();
    file.take(MAX_LAST_SCREEN + 1)
        .read_to_end(&mut image)
        .map_err(|e| StoreError::io("read", &path, e))?;
    check(&image).map_err(|message| StoreError::Corrupt {
        path: path.clone(),
        message,
    })?;
    Ok(Some(LastScreen {
        image,
        taken_at: modified.into(),
    }))
}

/// Forgets computer `id`'s last screen (a missing one is fine).
///
/// # Errors
/// The file system's.
pub fn forget(paths: &Paths, id: Uuid) -> Result<(), StoreError> {
    remove_file(&paths.last_screen(id))
}

fn check(image: &[u8]) -> Result<(), String> {
    if image.len() as u64 > MAX_LAST_SCREEN {
        return Err(format!("larger than {MAX_LAST_SCREEN} bytes"));
    }
    if !LAST_SCREEN_FORMAT.is_signature_of(image) {
        return Err(format!("not a {LAST_SCREEN_FORMAT} image"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The smallest thing with a WebP signature (`RIFF....WEBP`).
    fn webp(len: usize) -> Vec<u8> {
        let mut image = b"RIFF\0\0\0\0WEBPVP8L".to_vec();
        image.resize(len.max(image.len()), 7);
        image
    }

    #[test]
    fn a_kept_screen_reads_back_with_the_time_it_was_written() {
        let tmp = tempfile::tempdir().unwrap();
        let paths = Paths::new(tmp.path());
        let id = Uuid::new_v4();
        super::super::ensure_dir(&paths.computer_dir(id)).unwrap();
        assert_eq!(load(&paths, id).unwrap(), None);
        let before = Utc::now() - chrono::Duration::seconds(1);
        save(&paths, id, &webp(300)).unwrap();
        let kept = load(&paths, id).unwrap().unwrap();
        assert_eq!(kept.image, webp(300));
        assert!(kept.taken_at >= before && kept.taken_at <= Utc::now());
        save(&paths, id, &webp(400)).unwrap();
        assert_eq!(load(&paths, id).unwrap().unwrap().image.len(), 400);
        forget(&paths, id).unwrap();
        assert_eq!(load(&paths, id).unwrap(), None);
        forget(&paths, id).unwrap();
    }

    #[test]
    fn what_is_not_a_small_webp_is_neither_kept_nor_served() {
        let tmp = tempfile::tempdir().unwrap();
        let paths = Paths::new(tmp.path());
        let id = Uuid::new_v4();
        super::super::ensure_dir(&paths.computer_dir(id)).unwrap();
        let png = b"\x89PNG\r\n\x1a\n....".to_vec();
        let huge = webp(usize::try_from(MAX_LAST_SCREEN).unwrap() + 1);
        for bad in [&png, &huge] {
            forget(&paths, id).unwrap();
            assert!(matches!(
                save(&paths, id, bad),
                Err(StoreError::Corrupt { .. })
            ));
            assert_eq!(load(&paths, id).unwrap(), None, "nothing was written");
            std::fs::write(paths.last_screen(id), bad).unwrap();
            assert!(matches!(load(&paths, id), Err(StoreError::Corrupt { .. })));
        }
        // A link is refused, not followed.
        std::fs::remove_file(paths.last_screen(id)).unwrap();
        let elsewhere = tmp.path().join("elsewhere.webp");
        std::fs::write(&elsewhere, webp(100)).unwrap();
        std::os::unix::fs::symlink(&elsewhere, paths.last_screen(id)).unwrap();
        assert!(load(&paths, id).is_err());
    }
}
