//! Admission of execs and terminal sessions: the owner's only part in them.
//!
//! It decides, under the same checks as every mutating call (the computer
//! exists, the lease fence passes, it is not being removed or taken over),
//! whether the desktop may run a command now (running and ready), renews
//! the idle timer (a command is use), and hands back the guest socket. It
//! never runs the command: the caller's own task does, so a long command
//! never blocks this task and the caller's lifetime is the command's.

use tokio::time::Instant;
use uuid::Uuid;

use super::commands::Answer;
use super::Owner;
use crate::command::{Fence, Reply};
use crate::error::BrokerError;
use crate::guest::GuestSocket;

impl Owner {
    pub(super) fn admit_exec(
        &mut self,
        (id, fence): (Uuid, Fence),
        reply: Reply<GuestSocket>,
    ) -> Answer<GuestSocket> {
        let result = self.try_admit_exec(id, fence);
        Answer::Now(reply, result)
    }

    fn try_admit_exec(&mut self, id: Uuid, fence: Fence) -> Result<GuestSocket, BrokerError> {
        let c = self.admit(id, fence)?;
        if !c.is_ready() {
            return Err(BrokerError::WrongState(
                "the desktop is not running and ready".into(),
            ));
        }
        c.idle.renew(Instant::now());
        self.dirty.insert(id);
        Ok(self.ctx.socket(id))
    }
}
