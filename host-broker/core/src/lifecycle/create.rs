//! `create`: a new computer from an image with a compatible protocol, in a
//! hardened desktop, with its workspace and run directory on the host.
//!
//! The image is resolved to its immutable ID first; the record is persisted
//! (by the owner) before the desktop is provisioned; only then does the
//! backend create and start it (how it is hardened is the backend's own
//! business, behind [`Backend::provision`]). A workspace adopted from a removed
//! computer is moved only after the record naming it is on disk.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use dormouse_protocol::api::CreateComputer;
use dormouse_protocol::{LABEL_PROTOCOL, PROTOCOL_VERSION};
use uuid::Uuid;

use super::OpContext;
use crate::engine::{hostname, Backend, Desktop, Image};
use crate::error::BrokerError;
use crate::faults;
use crate::store::{ensure_dir, ComputerRecord, Paths, StoreError};

/// uid and gid of the desk user in the guest.
pub const DESK_UID: u32 = 1000;

/// Longest computer name.
pub const MAX_NAME_LEN: usize = 64;
/// Longest owner key.
pub const MAX_OWNER_LEN: usize = 128;

/// The validated name and owner of a create request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Naming {
    /// Human name.
    pub name: String,
    /// Owner key.
    pub owner: String,
}

/// Validates a create request's name and owner (defaults: a short form of
/// the id, `default`).
pub fn validate(req: &CreateComputer, id: Uuid) -> Result<Naming, BrokerError> {
    let name = match &req.name {
        Some(n) => {
            if n.trim().is_empty() || n.len() > MAX_NAME_LEN || n.chars().any(refused_in_names) {
                return Err(BrokerError::BadRequest(format!(
                    "name must be 1 to {MAX_NAME_LEN} printable characters"
                )));
            }
            n.clone()
        }
        None => hostname(id),
    };
    let owner = match &req.owner {
        Some(o) => {
            let ok = !o.is_empty()
                && o.len() <= MAX_OWNER_LEN
                && o.chars()
                    .all(|c| c.is_ascii_alphanumeric() || "._@:-".contains(c));
            if !ok {
                return Err(BrokerError::BadRequest(format!(
                    "owner must be 1 to {MAX_OWNER_LEN} characters of A-Z a-z 0-9 . _ @ : -"
                )));
            }
            o.clone()
        }
        None => "default".into(),
    };
    Ok(Naming { name, owner })
}

/// Characters a name must not hold: controls, and the invisible format
/// characters (Unicode category Cf: bidi overrides and isolates, zero-width
/// joiners, soft hyphens, tags…) that make a name read differently from what
/// it is.
fn refused_in_names(c: char) -> bool {
    c.is_control() || is_format(c)
}

/// Unicode general category Cf (Unicode 15), plus the bidi marks of other
/// categories.
fn is_format(c: char) -> bool {
    matches!(
        u32::from(c),
        0x00AD
            | 0x0600..=0x0605
            | 0x061C
            | 0x06DD
            | 0x070F
            | 0x0890..=0x0891
            | 0x08E2
            | 0x180E
            | 0x200B..=0x200F
            | 0x202A..=0x202E
            | 0x2060..=0x2064
            | 0x2066..=0x206F
            | 0xFEFF
            | 0xFFF9..=0xFFFB
            | 0x110BD
            | 0x110CD
            | 0x13430..=0x1343F
            | 0x1BCA0..=0x1BCA3
            | 0x1D173..=0x1D17A
            | 0xE0001
            | 0xE0020..=0xE007F
    )
}

/// Whether an image's protocol label is one this broker speaks.
pub fn check_protocol_label(image: &Image) -> Result<(), BrokerError> {
    let Some(raw) = image.labels.get(LABEL_PROTOCOL) else {
        return Err(BrokerError::Image(format!(
            "image {} has no {LABEL_PROTOCOL} label: not a Dormouse desktop image",
            image.id
        )));
    };
    match raw.trim().parse::<u32>() {
        Ok(v) if (1..=PROTOCOL_VERSION).contains(&v) => Ok(()),
        Ok(v) => Err(BrokerError::Image(format!(
            "image {} speaks protocol {v}; this broker speaks 1 to {PROTOCOL_VERSION}",
            image.id
        ))),
        Err(_) => Err(BrokerError::Image(format!(
            "image {} has a malformed {LABEL_PROTOCOL} label",
            image.id
        ))),
    }
}

/// Resolves the configured image to its immutable ID and checks its label.
pub async fn resolve_image(backend: &dyn Backend, reference: &str) -> Result<Image, BrokerError> {
    let image = backend
        .image(reference)
        .await?
        .ok_or_else(|| BrokerError::Image(format!("image {reference} is not present")))?;
    if !image.id.starts_with("sha256:") {
        return Err(BrokerError::Image(format!(
            "image {reference} has no immutable content ID"
        )));
    }
    check_protocol_label(&image)?;
    Ok(image)
}

/// Makes the computer's directories: its directory in the store and the
/// run directory (0700, the broker's; both the store's layout, from
/// `paths`) and `workspace`, the path the backend gives it
/// ([`Backend::workspace`](crate::engine::Backend::workspace), as the record
/// holds it), owned by the desk user so uid 1000 can use it in the guest.
/// `None` when it adopts one: an adopted workspace is moved in later
/// ([`adopt`]), once the record that names it is on disk.
pub fn prepare_dirs(paths: &Paths, id: Uuid, workspace: Option<&Path>) -> Result<(), StoreError> {
    ensure_dir(&paths.computer_dir(id))?;
    ensure_dir(&paths.run_dir(id))?;
    let Some(workspace) = workspace else {
        return Ok(());
    };
    let workspace = workspace.to_owned();
    match fs::create_dir(&workspace) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => {
            return Err(StoreError::Io {
                op: "create workspace",
                path: workspace,
                source: e,
            })
        }
    }
    fs::set_permissions(&workspace, fs::Permissions::from_mode(0o700)).map_err(|e| {
        StoreError::Io {
            op: "chmod workspace",
            path: workspace.clone(),
            source: e,
        }
    })?;
    chown_to_desk(&workspace);
    Ok(())
}

/// Moves `from`, the kept workspace of a removed computer (the path the
/// backend gives it, [`Backend::workspace`](crate::engine::Backend::workspace)),
/// into computer `id`, whose record, naming it, is already persisted.
///
/// Where it lands is the store's (`paths`), not the backend's: the store's
/// crash recovery (`ComputerStore::finish_adoption`) finishes an
/// interrupted move at start-up, before any backend is asked, and must find
/// the same place.
pub fn adopt(paths: &Paths, id: Uuid, from: &Path) -> Result<(), StoreError> {
    crate::store::computer::adopt_workspace(paths, from, id)?;
    chown_to_desk(&paths.workspace(id));
    Ok(())
}

fn chown_to_desk(workspace: &Path) {
    if let Err(e) = std::os::unix::fs::chown(workspace, Some(DESK_UID), Some(DESK_UID)) {
        // A broker without CAP_CHOWN (rootless) leaves it to the supervisor,
        // which owns the workspace as root in the guest and fixes it there.
        tracing::warn!(path = %workspace.display(), error = %e, "cannot chown the workspace to 1000:1000");
    }
}

/// Provisions the desktop of a persisted record; returns what the backend
/// says of it after the start.
pub async fn run(ctx: &OpContext, record: &ComputerRecord) -> Result<Desktop, BrokerError> {
    faults::step("create: before provisioning");
    ctx.backend.provision(record.origin()).await?;
    faults::step("create: provisioned and started");
    let seen = ctx.backend.observe(record.id).await?;
    faults::step("create: observed");
    seen.ok_or_else(|| BrokerError::Internal("the desktop vanished right after its start".into()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    #[test]
    fn protocol_labels_are_checked() {
        let image = |v: Option<&str>| Image {
            id: "sha256:x".into(),
            process: Default::default(),
            labels: v
                .map(|v| BTreeMap::from([(LABEL_PROTOCOL.to_string(), v.to_string())]))
                .unwrap_or_default(),
        };
        assert!(check_protocol_label(&image(Some("1"))).is_ok());
        assert!(matches!(
            check_protocol_label(&image(None)),
            Err(BrokerError::Image(_))
        ));
        assert!(check_protocol_label(&image(Some("0"))).is_err());
        assert!(check_protocol_label(&image(Some("99"))).is_err());
        assert!(check_protocol_label(&image(Some("one"))).is_err());
    }

    #[test]
    fn names_and_owners_are_validated() {
        let id = Uuid::new_v4();
        let ok = validate(&CreateComputer::default(), id).expect("defaults");
        assert_eq!(ok.owner, "default");
        assert_eq!(ok.name, hostname(id));
        let bad_owner = CreateComputer {
            owner: Some("a b".into()),
            ..Default::default()
        };
        assert!(validate(&bad_owner, id).is_err());
        let long = CreateComputer {
            name: Some("x".repeat(65)),
            ..Default::default()
        };
        assert!(validate(&long, id).is_err());
    }

    #[test]
    fn names_with_bidi_or_format_characters_are_refused() {
        let id = Uuid::new_v4();
        for name in [
            "audit-1\u{202e}evil",
            "a\u{2066}b\u{2069}",
            "zero\u{200b}width",
            "joined\u{200d}x",
            "mark\u{200f}",
            "bom\u{feff}",
            "soft\u{ad}hyphen",
            "tag\u{e0041}",
            "bell\u{7}",
        ] {
            let req = CreateComputer {
                name: Some(name.into()),
                ..Default::default()
            };
            assert!(validate(&req, id).is_err(), "{name:?} was accepted");
        }
        let fine = CreateComputer {
            name: Some("Ada's desk — café 日本".into()),
            ..Default::default()
        };
        assert!(validate(&fine, id).is_ok());
    }

    #[test]
    fn directories_are_made_and_a_workspace_can_be_adopted() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let paths = Paths::new(tmp.path());
        let old = Uuid::new_v4();
        prepare_dirs(&paths, old, Some(&paths.workspace(old))).expect("dirs");
        fs::write(paths.workspace(old).join("kept"), "x").expect("write");
        let meta = fs::metadata(paths.run_dir(old)).expect("meta");
        assert_eq!(meta.permissions().mode() & 0o777, 0o700);
        let new = Uuid::new_v4();
        prepare_dirs(&paths, new, None).expect("dirs");
        adopt(&paths, new, &paths.workspace(old)).expect("adopt");
        assert!(paths.workspace(new).join("kept").exists());
        assert!(!paths.workspace(old).exists());
    }
}
