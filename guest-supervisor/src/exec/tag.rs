//! The tags of running execs: one supplementary group id per exec, held
//! from its spawn until every process of it is confirmed gone.
//!
//! Owns the pool of tag gids and nothing else. The set of taken gids is one
//! per process, so runners that share a range (clones, or separate runners
//! of one supervisor) never hand out the same gid twice. It never looks at
//! processes; [`super::kill`] reads the tags back from `/proc/<pid>/status`.

use std::collections::BTreeSet;
use std::ops::Range;
use std::sync::{Arc, Mutex, MutexGuard};

/// The tag gids the supervisor hands out, by default: the Debian range
/// 65000..65533 is reserved and never assigned to a group of the image, and
/// it lies inside the first 65536 ids, so a user-namespace-remapped engine
/// maps it too.
pub const DEFAULT_TAG_GIDS: Range<u32> = 65000..65512;

/// Tag gids taken in this process, by any pool.
static TAKEN: Mutex<BTreeSet<u32>> = Mutex::new(BTreeSet::new());

/// The tag gids of one runner.
#[derive(Debug)]
pub(crate) struct TagPool {
    range: Range<u32>,
    /// The gids this pool holds (held or retired), a subset of `TAKEN`.
    mine: Mutex<BTreeSet<u32>>,
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
            mine: Mutex::new(BTreeSet::new()),
        })
    }

    fn mine(&self) -> MutexGuard<'_, BTreeSet<u32>> {
        lock(&self.mine)
    }

    /// The lowest free gid, or `None` when all are taken.
    pub(crate) fn take(self: &Arc<Self>) -> Option<Tag> {
        let mut mine = self.mine();
        let mut taken = lock(&TAKEN);
        let gid = self.range.clone().find(|g| !taken.contains(g))?;
        taken.insert(gid);
        mine.insert(gid);
        Some(Tag {
            gid,
            pool: self.clone(),
            retired: false,
        })
    }

    /// How many of this pool's tags are out (held or retired).
    pub(crate) fn in_use(&self) -> usize {
        self.mine().len()
    }
}

fn lock(set: &Mutex<BTreeSet<u32>>) -> MutexGuard<'_, BTreeSet<u32>> {
    // A poisoned set is still a valid set.
    set.lock().unwrap_or_else(|e| e.into_inner())
}

impl Tag {
    /// The supplementary group every process of the exec carries.
    pub(crate) fn gid(&self) -> u32 {
        self.gid
    }

    /// Keeps the gid out of the pool for good, once this tag is dropped.
    pub(crate) fn retire(&mut self) {
        self.retired = true;
    }
}

impl Drop for Tag {
    fn drop(&mut self) {
        if !self.retired {
            // The pool's lock first, as in `take`.
            let mut mine = self.pool.mine();
            lock(&TAKEN).remove(&self.gid);
            mine.remove(&self.gid);
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
        let mut c = c;
        c.retire();
        drop(c);
        let d = pool.take().expect("free");
        assert_eq!(d.gid(), 12);
        assert!(pool.take().is_none(), "10 retired, 11 and 12 held");
        assert_eq!(pool.in_use(), 3);
        // Another pool on an overlapping range never gets a gid in use.
        let other = TagPool::new(11..14);
        let e = other.take().expect("free");
        assert_eq!(e.gid(), 13);
        assert!(other.take().is_none());
        drop(b);
        assert_eq!(other.take().expect("free").gid(), 11);
    }
}
