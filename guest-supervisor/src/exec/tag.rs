//! The tags of running execs: one supplementary group id per exec, held
//! from its spawn until every process of it is confirmed gone.
//!
//! Owns the pool of tag gids and nothing else. It never looks at processes;
//! [`super::kill`] reads the tags back from `/proc/<pid>/status`.

use std::collections::BTreeSet;
use std::ops::Range;
use std::sync::{Arc, Mutex, MutexGuard};

/// The tag gids the supervisor hands out, by default: the Debian range
/// 65000..65533 is reserved and never assigned to a group of the image, and
/// it lies inside the first 65536 ids, so a user-namespace-remapped engine
/// maps it too.
pub const DEFAULT_TAG_GIDS: Range<u32> = 65000..65512;

/// The free and the taken tag gids.
#[derive(Debug)]
pub(crate) struct TagPool {
    range: Range<u32>,
    taken: Mutex<BTreeSet<u32>>,
}

/// One exec's tag: released back to the pool on drop, unless
/// [`Tag::retire`]d because a process of it could not be killed (a later
/// exec must never share a tag with a live stranger).
#[derive(Debug)]
pub(crate) struct Tag {
    gid: u32,
    pool: Arc<TagPool>,
    retired: bool,
}

impl TagPool {
    pub(crate) fn new(range: Range<u32>) -> Arc<Self> {
        Arc::new(Self {
            range,
            taken: Mutex::new(BTreeSet::new()),
        })
    }

    fn taken(&self) -> MutexGuard<'_, BTreeSet<u32>> {
        // A poisoned set is still a valid set.
        self.taken.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The lowest free gid, or `None` when all are taken.
    pub(crate) fn take(self: &Arc<Self>) -> Option<Tag> {
        let mut taken = self.taken();
        let gid = self.range.clone().find(|g| !taken.contains(g))?;
        taken.insert(gid);
        Some(Tag {
            gid,
            pool: self.clone(),
            retired: false,
        })
    }

    /// How many tags are out (held or retired).
    pub(crate) fn in_use(&self) -> usize {
        self.taken().len()
    }
}

impl Tag {
    /// The supplementary group every process of the exec carries.
    pub(crate) fn gid(&self) -> u32 {
        self.gid
    }

    /// Keeps the gid out of the pool for good.
    pub(crate) fn retire(mut self) {
        self.retired = true;
    }
}

impl Drop for Tag {
    fn drop(&mut self) {
        if !self.retired {
            self.pool.taken().remove(&self.gid);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tags_are_unique_reused_after_release_and_never_after_retirement() {
        let pool = TagPool::new(10..13);
        let a = pool.take().expect("free");
        let b = pool.take().expect("free");
        assert_eq!((a.gid(), b.gid()), (10, 11));
        drop(a);
        let c = pool.take().expect("free");
        assert_eq!(c.gid(), 10, "released gids come back");
        c.retire();
        let d = pool.take().expect("free");
        assert_eq!(d.gid(), 12);
        assert!(pool.take().is_none(), "10 retired, 11 and 12 held");
        assert_eq!(pool.in_use(), 3);
    }
}
