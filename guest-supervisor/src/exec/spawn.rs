//! Preparing an exec's process: the desktop user, its own session, its tag,
//! its working directory, its environment.
//!
//! Owns the `Command` of an exec and the code that runs in the child
//! between `fork` and `exec`. That code only makes async-signal-safe system
//! calls on values prepared before the fork (no allocation, no locks), and
//! it drops root before it touches the file system, so the working
//! directory is resolved with the desktop user's rights, never root's.
//! It never spawns: [`crate::init::spawn`] does, so the status is routed to
//! the exec and not reaped blindly.

use std::ffi::CString;
use std::os::unix::ffi::OsStrExt as _;
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::Command;

use nix::libc;

/// Errors of the child's setup come back through std's exec-error pipe as
/// one number: `stage * STAGE_UNIT + errno` (errno values stay far below).
const STAGE_UNIT: i32 = 1 << 16;

/// The step of the child's setup that failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stage {
    /// `setsid`: a session and process group of its own.
    Session,
    /// `TIOCSCTTY`: the terminal as controlling terminal.
    Terminal,
    /// `setgroups`, `setgid`, `setuid`: becoming the desktop user.
    Credentials,
    /// `chdir` into the working directory, as the desktop user.
    Cwd,
    /// `execve` itself (std reports it without a stage).
    Exec,
}

impl Stage {
    const ALL: [Stage; 4] = [
        Stage::Session,
        Stage::Terminal,
        Stage::Credentials,
        Stage::Cwd,
    ];

    fn code(self) -> i32 {
        match self {
            Stage::Exec => 0,
            Stage::Session => 1,
            Stage::Terminal => 2,
            Stage::Credentials => 3,
            Stage::Cwd => 4,
        }
    }

    /// Name for messages.
    pub fn as_str(self) -> &'static str {
        match self {
            Stage::Session => "setsid",
            Stage::Terminal => "controlling terminal",
            Stage::Credentials => "credentials",
            Stage::Cwd => "chdir",
            Stage::Exec => "exec",
        }
    }
}

/// Splits an error of `spawn` into the stage that failed and the plain
/// system error.
pub(crate) fn classify(e: std::io::Error) -> (Stage, std::io::Error) {
    let Some(raw) = e.raw_os_error() else {
        return (Stage::Exec, e);
    };
    for stage in Stage::ALL {
        let base = stage.code() * STAGE_UNIT;
        if (base..base + STAGE_UNIT).contains(&raw) {
            return (stage, std::io::Error::from_raw_os_error(raw - base));
        }
    }
    (Stage::Exec, e)
}

/// Everything the child needs, decided before the fork.
#[derive(Debug, Clone)]
pub(crate) struct Launch {
    /// Program and arguments (non-empty, no NUL: validated by the protocol).
    pub(crate) argv: Vec<String>,
    /// The complete environment.
    pub(crate) env: Vec<(String, String)>,
    /// Working directory.
    pub(crate) cwd: PathBuf,
    /// The desktop user.
    pub(crate) uid: u32,
    /// The desktop user's group.
    pub(crate) gid: u32,
    /// The exec's tag: its only supplementary group.
    pub(crate) tag_gid: u32,
    /// Whether stdin is a terminal to make the session's controlling one.
    pub(crate) controlling_tty: bool,
}

/// The working directory of a request: the workspace when none is given, a
/// relative one under the workspace, an absolute one as it stands.
pub(crate) fn resolve_cwd(workspace: &Path, cwd: Option<&str>) -> PathBuf {
    match cwd {
        None => workspace.to_owned(),
        Some(cwd) => workspace.join(cwd),
    }
}

/// A `Command` for `launch`; stdio is the caller's to set.
pub(crate) fn command(launch: &Launch) -> std::io::Result<Command> {
    let (program, args) = launch
        .argv
        .split_first()
        .ok_or_else(|| std::io::Error::from_raw_os_error(libc::ENOENT))?;
    let cwd = CString::new(launch.cwd.as_os_str().as_bytes())
        .map_err(|_| std::io::Error::from_raw_os_error(libc::EINVAL))?;
    let uid: libc::uid_t = launch.uid;
    let gid: libc::gid_t = launch.gid;
    let groups: [libc::gid_t; 1] = [launch.tag_gid];
    let controlling_tty = launch.controlling_tty;

    let mut cmd = Command::new(program);
    cmd.args(args).env_clear().envs(launch.env.iter().cloned());
    let setup = move || -> std::io::Result<()> {
        let fail = |stage: Stage| {
            let errno = std::io::Error::last_os_error()
                .raw_os_error()
                .unwrap_or(libc::EINVAL);
            Err(std::io::Error::from_raw_os_error(
                stage.code() * STAGE_UNIT + errno,
            ))
        };
        // Its own session (and process group): signals to the supervisor's
        // group never reach it, and a kill of its group reaches all of it.
        // SAFETY: this and the calls below are plain system calls on integers
        // and on the `groups` array and `cwd` string that live in this
        // closure; all are async-signal-safe, as required between fork and
        // exec.
        if unsafe { libc::setsid() } < 0 {
            return fail(Stage::Session);
        }
        if controlling_tty {
            // SAFETY: see above; stdin is the terminal's slave side.
            if unsafe { libc::ioctl(libc::STDIN_FILENO, libc::TIOCSCTTY, 0) } < 0 {
                return fail(Stage::Terminal);
            }
        }
        // Groups before the gid before the uid: each needs root's
        // capabilities, which setuid drops.
        // SAFETY: see above.
        if unsafe { libc::setgroups(groups.len(), groups.as_ptr()) } < 0 {
            return fail(Stage::Credentials);
        }
        // SAFETY: see above.
        if unsafe { libc::setgid(gid) } < 0 {
            return fail(Stage::Credentials);
        }
        // SAFETY: see above.
        if unsafe { libc::setuid(uid) } < 0 {
            return fail(Stage::Credentials);
        }
        // SAFETY: see above; `cwd` is a NUL-terminated string owned by the
        // closure.
        if unsafe { libc::chdir(cwd.as_ptr()) } < 0 {
            return fail(Stage::Cwd);
        }
        Ok(())
    };
    // SAFETY: the closure runs in the forked child before exec; it only
    // makes async-signal-safe system calls on data captured before the
    // fork, and allocates nothing.
    unsafe { cmd.pre_exec(setup) };
    Ok(cmd)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stages_survive_the_error_pipe() {
        let wrapped = std::io::Error::from_raw_os_error(Stage::Cwd.code() * STAGE_UNIT + 13);
        let (stage, e) = classify(wrapped);
        assert_eq!(stage, Stage::Cwd);
        assert_eq!(e.raw_os_error(), Some(13));
        let (stage, e) = classify(std::io::Error::from_raw_os_error(libc::ENOENT));
        assert_eq!(stage, Stage::Exec);
        assert_eq!(e.raw_os_error(), Some(libc::ENOENT));
        let (stage, _) = classify(std::io::Error::other("no errno"));
        assert_eq!(stage, Stage::Exec);
    }

    #[test]
    fn working_directories() {
        let ws = Path::new("/home/desk/workspace");
        assert_eq!(resolve_cwd(ws, None), ws);
        assert_eq!(resolve_cwd(ws, Some("src")), ws.join("src"));
        assert_eq!(resolve_cwd(ws, Some("/tmp")), Path::new("/tmp"));
    }
}
