//! What an archive's headers and PAX records say: the member's path (a
//! leading `./` dropped, `..` and absolute paths refused), its time with
//! its fraction, its size and link target, and which global records may
//! stand. Parsing only: nothing here touches the disk.

use nix::sys::time::TimeSpec;

use super::Refusal;
use crate::workspace::path::{PathError, WorkspacePath};

/// A modification time: seconds and nanoseconds since the epoch.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Mtime {
    pub(crate) secs: i64,
    pub(crate) nanos: i64,
}

impl Mtime {
    pub(crate) fn spec(self) -> TimeSpec {
        TimeSpec::new(self.secs, self.nanos)
    }
}

/// A pending PAX extension for the next member.
#[derive(Debug, Default)]
pub(crate) struct Pax {
    pub(crate) path: Option<Vec<u8>>,
    pub(crate) linkpath: Option<Vec<u8>>,
    pub(crate) size: Option<u64>,
    pub(crate) mtime: Option<Mtime>,
}

/// A global PAX header is accepted only when it changes nothing: the
/// `comment` that `git archive` writes.
pub(crate) fn check_global(data: &[u8]) -> Result<(), Refusal> {
    for record in tar::PaxExtensions::new(data) {
        let record = record.map_err(|_| Refusal::BadExtension("unparsable pax record"))?;
        if record.key_bytes() != b"comment" {
            return Err(Refusal::PaxGlobal);
        }
    }
    Ok(())
}

pub(crate) fn parse_pax(data: &[u8]) -> Result<Pax, Refusal> {
    let mut pax = Pax::default();
    for record in tar::PaxExtensions::new(data) {
        let record = record.map_err(|_| Refusal::BadExtension("unparsable pax record"))?;
        let key = record.key_bytes();
        let value = record.value_bytes();
        match key {
            b"path" if pax.path.is_some() => {
                return Err(Refusal::BadExtension("pax path given twice"))
            }
            b"path" => pax.path = Some(value.to_vec()),
            b"linkpath" if pax.linkpath.is_some() => {
                return Err(Refusal::BadExtension("pax linkpath given twice"))
            }
            b"linkpath" => pax.linkpath = Some(value.to_vec()),
            b"size" => {
                let size = std::str::from_utf8(value)
                    .ok()
                    .and_then(|v| v.parse::<u64>().ok())
                    .ok_or(Refusal::BadExtension("pax size is not a number"))?;
                if pax.size.replace(size).is_some() {
                    return Err(Refusal::BadExtension("pax size given twice"));
                }
            }
            b"mtime" => {
                let t = parse_pax_time(value)
                    .ok_or(Refusal::BadExtension("pax mtime is not a time"))?;
                pax.mtime = Some(t);
            }
            k if k.starts_with(b"GNU.sparse") => {
                return Err(Refusal::PaxKey(String::from_utf8_lossy(k).into_owned()))
            }
            // Access and change times, owners, charsets, comments, xattrs
            // and ACLs: ignored, never applied.
            _ => {}
        }
    }
    Ok(pax)
}

/// `[-]seconds[.fraction]`, the fraction cut to nanoseconds.
fn parse_pax_time(value: &[u8]) -> Option<Mtime> {
    let text = std::str::from_utf8(value).ok()?;
    let (negative, text) = match text.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, text),
    };
    let (whole, frac) = text.split_once('.').unwrap_or((text, ""));
    if whole.is_empty() || !whole.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    if !frac.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let secs: i64 = whole.parse().ok()?;
    let digits: String = frac.chars().chain(std::iter::repeat('0')).take(9).collect();
    let nanos: i64 = digits.parse().ok()?;
    Some(match (negative, nanos) {
        (false, _) => Mtime { secs, nanos },
        (true, 0) => Mtime { secs: -secs, nanos },
        (true, _) => Mtime {
            secs: -secs - 1,
            nanos: 1_000_000_000 - nanos,
        },
    })
}

/// The workspace path of an archive name: a leading `./` is dropped, a
/// trailing `/` allowed on a directory; `None` is the root itself.
pub(crate) fn archive_path(raw: &[u8], is_dir: bool) -> Result<Option<WorkspacePath>, Refusal> {
    let mut p = raw;
    if p == b"." {
        return if is_dir {
            Ok(None)
        } else {
            Err(Refusal::FileIsRoot)
        };
    }
    if let Some(rest) = p.strip_prefix(b"./") {
        p = rest;
    }
    if let Some(rest) = p.strip_suffix(b"/") {
        if !is_dir {
            return Err(Refusal::FileWithSlash);
        }
        p = rest;
    }
    if p.is_empty() {
        return if raw.is_empty() {
            Err(Refusal::Path(PathError::EmptyComponent))
        } else if is_dir {
            Ok(None)
        } else {
            Err(Refusal::FileIsRoot)
        };
    }
    WorkspacePath::parse(p).map(Some).map_err(Refusal::Path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn archive_names_are_cleaned_or_refused() {
        let ok = |raw: &[u8], dir| archive_path(raw, dir).map(|p| p.map(|p| p.to_string()));
        assert_eq!(ok(b"./", true), Ok(None));
        assert_eq!(ok(b".", true), Ok(None));
        assert_eq!(ok(b"./a/b", false), Ok(Some("a/b".into())));
        assert_eq!(ok(b"a/", true), Ok(Some("a".into())));
        assert_eq!(ok(b"a/", false), Err(Refusal::FileWithSlash));
        assert_eq!(ok(b"../x", false), Err(Refusal::Path(PathError::ParentDir)));
        assert_eq!(
            ok(b"/etc/x", false),
            Err(Refusal::Path(PathError::Absolute))
        );
        assert_eq!(
            ok(b".//etc/x", false),
            Err(Refusal::Path(PathError::Absolute))
        );
        assert_eq!(
            ok(b"a/../../x", false),
            Err(Refusal::Path(PathError::ParentDir))
        );
        assert_eq!(
            ok(b"", false),
            Err(Refusal::Path(PathError::EmptyComponent))
        );
        assert_eq!(ok(b"./", false), Err(Refusal::FileIsRoot));
    }

    #[test]
    fn pax_records_are_read_and_tricks_refused() {
        let rec = |k: &str, v: &str| {
            let body = format!(" {k}={v}\n");
            let mut len = body.len() + 1;
            while body.len() + len.to_string().len() != len {
                len = body.len() + len.to_string().len();
            }
            format!("{len}{body}")
        };
        let data = format!("{}{}", rec("path", "a/b"), rec("size", "12"));
        let pax = parse_pax(data.as_bytes()).unwrap();
        assert_eq!(pax.path.as_deref(), Some(&b"a/b"[..]));
        assert_eq!(pax.size, Some(12));
        let twice = format!("{}{}", rec("path", "a"), rec("path", "b"));
        assert!(parse_pax(twice.as_bytes()).is_err());
        assert!(matches!(
            parse_pax(rec("GNU.sparse.map", "0,1").as_bytes()),
            Err(Refusal::PaxKey(_))
        ));
        let pax = parse_pax(
            format!(
                "{}{}",
                rec("linkpath", "/etc"),
                rec("mtime", "1700000000.25")
            )
            .as_bytes(),
        )
        .unwrap();
        assert_eq!(pax.linkpath.as_deref(), Some(&b"/etc"[..]));
        assert_eq!(
            pax.mtime,
            Some(Mtime {
                secs: 1_700_000_000,
                nanos: 250_000_000
            })
        );
        assert!(parse_pax(rec("mtime", "soon").as_bytes()).is_err());
    }

    #[test]
    fn pax_times_keep_their_fraction_and_sign() {
        let t = |s: &str| parse_pax_time(s.as_bytes()).map(|m| (m.secs, m.nanos));
        assert_eq!(t("12"), Some((12, 0)));
        assert_eq!(t("12.5"), Some((12, 500_000_000)));
        assert_eq!(t("12.1234567891"), Some((12, 123_456_789)));
        assert_eq!(t("-1.25"), Some((-2, 750_000_000)));
        assert_eq!(t("-3"), Some((-3, 0)));
        assert_eq!(t("1e9"), None);
        assert_eq!(t(".5"), None);
    }

    #[test]
    fn only_a_comment_may_stand_in_a_global_header() {
        assert_eq!(
            check_global(b"52 comment=0123456789012345678901234567890123456789\n"),
            Ok(())
        );
        assert_eq!(check_global(b"11 path=ab\n"), Err(Refusal::PaxGlobal));
    }
}
