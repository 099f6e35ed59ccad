//! Crash points for the crash-at-every-step test: with the cargo feature
//! `fault-injection` (only the test binary `dormoused-faults` has it), the
//! broker aborts (`std::process::abort`: no destructor, no flush, no
//! cleanup, as a `kill -9` or a power cut of the process would) at the Nth
//! step of one named operation. Without the feature every function here is
//! an empty inline function and the shipped `dormoused` carries none of it.
//!
//! An operation names itself once, where it begins: [`within`] around its
//! future (a task-local, so every `.await` inside counts for it) or
//! [`scope`] around synchronous code (a thread-local, for the owner task's
//! own work and the blocking pool). [`step`] marks a point between two
//! effects (an engine call, a write, an fsync, a rename); it counts for the
//! operation in whose scope it runs and does nothing outside one, so a
//! shared helper (the store's atomic write) counts for whichever operation
//! calls it.
//!
//! Armed by `DORMOUSE_FAULT=<operation>:<N>` (read once, at the first
//! step or at [`arm_from_env`]). Every step of the armed operation is
//! written to stderr as `dormouse-fault: <operation> step <k>: <label>`, so a
//! run that ends without a crash says how many steps the operation took.
//!
//! What it must never do: run in the shipped binary (the feature is only
//! enabled by `dormoused-faults`' own cargo invocation), or act on an
//! operation that was not armed.

use std::future::Future;
use std::marker::PhantomData;

/// The operations the crash test walks, as `DORMOUSE_FAULT` names them.
pub mod op {
    /// `POST /v1/computers`.
    pub const CREATE: &str = "create";
    /// `POST /v1/computers/{id}/start`.
    pub const RESUME: &str = "resume";
    /// `POST /v1/computers/{id}/stop` (also idle and fenced stops).
    pub const STOP: &str = "stop";
    /// `DELETE /v1/computers/{id}`.
    pub const REMOVE: &str = "remove";
    /// `PUT /v1/computers/{id}/workspace`.
    pub const IMPORT: &str = "import";
    /// `GET /v1/computers/{id}/workspace`.
    pub const EXPORT: &str = "export";
    /// `PUT /v1/computers/{id}/files/{path}`.
    pub const FILE_WRITE: &str = "file-write";
    /// `POST /v1/computers/{id}/lease` that takes the lease over.
    pub const LEASE_TAKEOVER: &str = "lease-takeover";
    /// `POST /v1/computers/{id}/screens`.
    pub const SCREEN_MINT: &str = "screen-mint";
}

/// Whether this build can crash on purpose (the `fault-injection` feature).
pub const ENABLED: bool = cfg!(feature = "fault-injection");

/// Marks the synchronous code until it is dropped as part of `op`
/// ([`scope`]). Not `Send`: it cannot be held across an `.await`, where the
/// task may move to another thread.
#[derive(Debug)]
#[must_use = "the scope ends when this is dropped"]
pub struct Scope {
    #[cfg(feature = "fault-injection")]
    previous: Option<&'static str>,
    _not_send: PhantomData<*const ()>,
}

#[cfg(not(feature = "fault-injection"))]
mod imp {
    use super::*;

    #[inline(always)]
    pub fn step(_label: &'static str) {}

    #[inline(always)]
    pub fn scope(_op: &'static str) -> Scope {
        Scope {
            _not_send: PhantomData,
        }
    }

    #[inline(always)]
    pub fn within<F: Future>(_op: &'static str, work: F) -> impl Future<Output = F::Output> {
        work
    }

    #[inline(always)]
    pub fn current() -> Option<&'static str> {
        None
    }

    #[inline(always)]
    pub fn arm_from_env() -> Option<(String, u32)> {
        None
    }
}

#[cfg(feature = "fault-injection")]
mod imp {
    use super::*;
    use std::cell::Cell;
    use std::io::Write as _;
    use std::sync::atomic::{AtomicU32, Ordering};
    use std::sync::OnceLock;

    tokio::task_local! {
        static TASK_OP: &'static str;
    }

    thread_local! {
        static THREAD_OP: Cell<Option<&'static str>> = const { Cell::new(None) };
    }

    static ARMED: OnceLock<Option<(String, u32)>> = OnceLock::new();
    static TAKEN: AtomicU32 = AtomicU32::new(0);

    fn armed() -> Option<&'static (String, u32)> {
        ARMED
            .get_or_init(|| {
                let raw = std::env::var("DORMOUSE_FAULT").ok()?;
                let (op, n) = raw.rsplit_once(':')?;
                let n: u32 = n.trim().parse().ok()?;
                (n > 0).then(|| (op.trim().to_owned(), n))
            })
            .as_ref()
    }

    pub fn arm_from_env() -> Option<(String, u32)> {
        armed().cloned()
    }

    pub fn current() -> Option<&'static str> {
        TASK_OP
            .try_with(|op| *op)
            .ok()
            .or_else(|| THREAD_OP.with(Cell::get))
    }

    pub fn step(label: &'static str) {
        let Some(op) = current() else {
            return;
        };
        let Some((armed_op, n)) = armed() else {
            return;
        };
        if op != armed_op {
            return;
        }
        let k = TAKEN.fetch_add(1, Ordering::SeqCst).saturating_add(1);
        let mut err = std::io::stderr().lock();
        let _ = writeln!(err, "dormouse-fault: {op} step {k}: {label}");
        if k == *n {
            let _ = writeln!(err, "dormouse-fault: aborting at {op} step {k}: {label}");
            let _ = err.flush();
            std::process::abort();
        }
    }

    pub fn scope(op: &'static str) -> Scope {
        let previous = THREAD_OP.with(|c| c.replace(Some(op)));
        Scope {
            previous,
            _not_send: PhantomData,
        }
    }

    impl Drop for Scope {
        fn drop(&mut self) {
            THREAD_OP.with(|c| c.set(self.previous));
        }
    }

    pub fn within<F: Future>(op: &'static str, work: F) -> impl Future<Output = F::Output> {
        TASK_OP.scope(op, work)
    }
}

/// A point between two effects of the operation in scope: with the feature
/// and `DORMOUSE_FAULT` naming that operation and this step's number, the
/// process aborts here.
#[inline(always)]
pub fn step(label: &'static str) {
    imp::step(label);
}

/// The synchronous code until the guard drops is part of `op`.
#[inline(always)]
pub fn scope(op: &'static str) -> Scope {
    imp::scope(op)
}

/// [`scope`] for `op` if there is one (to carry the operation of a task
/// into the blocking pool: `let op = current();` before `spawn_blocking`).
#[inline(always)]
pub fn scope_of(op: Option<&'static str>) -> Option<Scope> {
    op.map(scope)
}

/// `work`, every step of which counts for `op`.
#[inline(always)]
pub fn within<F: Future>(op: &'static str, work: F) -> impl Future<Output = F::Output> {
    imp::within(op, work)
}

/// The operation in scope here, if any (always `None` without the feature).
#[inline(always)]
pub fn current() -> Option<&'static str> {
    imp::current()
}

/// The armed fault (`DORMOUSE_FAULT`), read now if it was not yet; `None`
/// without the feature.
#[inline(always)]
pub fn arm_from_env() -> Option<(String, u32)> {
    imp::arm_from_env()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scopes_nest_and_steps_outside_any_operation_do_nothing() {
        step("outside");
        assert_eq!(current(), None);
        {
            let _outer = scope(op::CREATE);
            assert_eq!(current(), ENABLED.then_some(op::CREATE));
            {
                let _inner = scope(op::STOP);
                assert_eq!(current(), ENABLED.then_some(op::STOP));
            }
            assert_eq!(current(), ENABLED.then_some(op::CREATE));
        }
        assert_eq!(current(), None);
    }

    #[tokio::test]
    async fn a_task_carries_its_operation_across_awaits() {
        let seen = within(op::IMPORT, async {
            tokio::task::yield_now().await;
            current()
        })
        .await;
        assert_eq!(seen, ENABLED.then_some(op::IMPORT));
        assert_eq!(current(), None);
    }
}
