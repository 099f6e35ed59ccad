//! The broker's end of an egress session (`egress_accept`): park a
//! connection, read the guest's `egress_open` when a guest program asks,
//! answer one verdict, then hand over the raw stream, or take the guest
//! program's own socket when the guest hands it over
//! ([`dormouse_protocol::egress`] has the frame flow).
//!
//! A handed socket is shared with the guest, which may change its flags at
//! any time: it leaves here only as a
//! [`HandedSocket`](dormouse_protocol::splice::HandedSocket), and nothing
//! the guest sent is ever closed on this thread.

use std::io;
use std::mem::MaybeUninit;
use std::os::fd::OwnedFd;
use std::sync::Arc;
use std::time::Duration;

use rustix::net::{
    AddressFamily, RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, ReturnFlags, SocketType,
};

use dormouse_egress::Closer;
use dormouse_protocol::call;
use dormouse_protocol::declare::Call;
use dormouse_protocol::egress::{self, EgressOpen, EgressVerdict};
use dormouse_protocol::splice::HandedSocket;
use dormouse_protocol::stream;
use tokio::io::Interest;
use tokio::net::UnixStream;

use super::{typed, GuestConnection, GuestError, FRAME_BODY_TIMEOUT, REQUEST_TIMEOUT};

/// A parked egress connection the guest has asked on.
#[derive(Debug)]
pub struct EgressSession {
    stream: UnixStream,
    /// The guest offered its program's socket and the channel can carry it.
    hand_over: bool,
}

impl GuestConnection {
    /// Parks this connection for the guest's proxy and waits, as long as it
    /// takes, for a guest program's connection: what it asked for, the
    /// bytes to write upstream first, and the session to answer on.
    pub async fn egress_accept(
        mut self,
    ) -> Result<(EgressOpen, Vec<u8>, EgressSession), GuestError> {
        stream::write_frame(
            &mut self.stream,
            &dormouse_protocol::Request::from(call::EgressAccept),
            &[],
            REQUEST_TIMEOUT,
        )
        .await
        .map_err(GuestError::from_stream)?;
        let frame = stream::read_frame::<dormouse_protocol::Response, _>(
            &mut self.stream,
            &egress::open_limits(FRAME_BODY_TIMEOUT),
        )
        .await
        .map_err(GuestError::from_stream)?;
        let open: EgressOpen = typed(call::EgressAccept::KIND, frame.message)?;
        open.validate().map_err(|e| GuestError::Unexpected {
            to: call::EgressAccept::KIND,
            got: super::sanitize(&e.to_string()),
        })?;
        let hand_over = open.hand_over && self.direct;
        Ok((
            open,
            frame.payload,
            EgressSession {
                stream: self.stream,
                hand_over,
            },
        ))
    }
}

impl EgressSession {
    /// Sends the one verdict frame.
    pub async fn verdict(&mut self, verdict: &EgressVerdict) -> io::Result<()> {
        egress::write_verdict(&mut self.stream, verdict, REQUEST_TIMEOUT)
            .await
            .map_err(|e| io::Error::other(e.to_string()))
    }

    /// The socket the raw bytes go through after the verdict.
    pub fn socket(&self) -> &UnixStream {
        &self.stream
    }

    /// Whether [`EgressVerdict::HandOver`] may be answered.
    pub fn can_hand_over(&self) -> bool {
        self.hand_over
    }

    /// After [`EgressVerdict::HandOver`]: the guest program's socket, sent
    /// as one byte with `SCM_RIGHTS` within `within`. Anything else is
    /// refused: no byte or no descriptor, more than one, a truncated
    /// message, or a descriptor that is not a connected IPv4/IPv6 TCP
    /// socket (a guest could send any descriptor it has).
    ///
    /// Every descriptor received, taken or refused, is closed by `closer`,
    /// never here: its last close may block (a linger the guest set, a
    /// file whose close waits on a server). The control buffer has room
    /// for the most one message can carry, so the kernel never drops one
    /// of them on this thread either.
    pub async fn take_client(&self, within: Duration, closer: &Closer) -> io::Result<HandedSocket> {
        let received = tokio::time::timeout(within, self.receive_fds())
            .await
            .map_err(|_| io::Error::other("the guest did not hand its socket over in time"))??;
        let fd = match received.one() {
            Ok(fd) => fd,
            Err((e, fds)) => {
                for fd in fds {
                    closer.close(fd);
                }
                return Err(e);
            }
        };
        if let Err(e) = checked_tcp(&fd) {
            closer.close(fd);
            return Err(e);
        }
        HandedSocket::new(fd, Arc::new(closer.clone()))
    }

    /// Closes the session once the socket was handed over, by `closer`:
    /// the guest may have queued more descriptors on it, and the kernel
    /// closes those with the session's last descriptor.
    pub fn close_with(self, closer: &Closer) {
        match self.stream.into_std() {
            Ok(stream) => closer.close(OwnedFd::from(stream)),
            Err(e) => tracing::debug!(error = %e, "an egress session closed in place"),
        }
    }

    async fn receive_fds(&self) -> io::Result<Received> {
        loop {
            self.stream.readable().await?;
            match self
                .stream
                .try_io(Interest::READABLE, || receive(&self.stream))
            {
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                other => return other,
            }
        }
    }
}

/// Most descriptors one `SCM_RIGHTS` message carries (`SCM_MAX_FD`).
const MOST_FDS: usize = 253;

/// What one `recvmsg` of the hand-over brought.
struct Received {
    bytes: usize,
    truncated: bool,
    fds: Vec<OwnedFd>,
}

impl Received {
    /// The one descriptor, or why not with every descriptor received.
    fn one(mut self) -> Result<OwnedFd, (io::Error, Vec<OwnedFd>)> {
        if self.bytes == 0 {
            return Err((
                io::Error::other("the guest closed instead of handing its socket over"),
                self.fds,
            ));
        }
        if self.truncated || self.fds.len() != 1 {
            let e = io::Error::other(format!(
                "the guest sent {} descriptors (truncated: {}), not one",
                self.fds.len(),
                self.truncated
            ));
            return Err((e, self.fds));
        }
        self.fds
            .pop()
            .ok_or_else(|| (io::Error::other("no descriptor from the guest"), Vec::new()))
    }
}

/// One byte and the descriptors with it from `socket`.
fn receive(socket: &UnixStream) -> io::Result<Received> {
    let mut byte = [0u8; 1];
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(MOST_FDS))];
    let mut control = RecvAncillaryBuffer::new(&mut space);
    let got = rustix::net::recvmsg(
        socket,
        &mut [io::IoSliceMut::new(&mut byte)],
        &mut control,
        RecvFlags::CMSG_CLOEXEC | RecvFlags::DONTWAIT,
    )?;
    let mut fds: Vec<OwnedFd> = Vec::new();
    for message in control.drain() {
        if let RecvAncillaryMessage::ScmRights(rights) = message {
            fds.extend(rights);
        }
    }
    Ok(Received {
        bytes: got.bytes,
        truncated: got.flags.contains(ReturnFlags::CTRUNC),
        fds,
    })
}

/// Whether `fd` is a connected TCP socket over IPv4 or IPv6.
fn checked_tcp(fd: &OwnedFd) -> io::Result<()> {
    let refuse = |what: &str| {
        io::Error::other(format!(
            "the guest handed over {what}, not a TCP connection"
        ))
    };
    if rustix::net::sockopt::socket_type(fd)
        .map_err(|_| refuse("something that is not a socket"))?
        != SocketType::STREAM
    {
        return Err(refuse("a socket that is not a stream"));
    }
    if rustix::net::sockopt::socket_protocol(fd)? != Some(rustix::net::ipproto::TCP) {
        return Err(refuse("a stream socket that is not TCP"));
    }
    let family = rustix::net::getsockname(fd)?.address_family();
    if family != AddressFamily::INET && family != AddressFamily::INET6 {
        return Err(refuse("a socket that is not IPv4 or IPv6"));
    }
    rustix::net::getpeername(fd)
        .ok()
        .flatten()
        .ok_or_else(|| refuse("a socket that is not connected"))?;
    Ok(())
}

#[cfg(test)]
#[path = "egress_tests.rs"]
mod tests;
