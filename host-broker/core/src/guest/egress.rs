//! The broker's end of an egress session (`egress_accept`): park a
//! connection, read the guest's `egress_open` when a guest program asks,
//! answer one verdict, then hand over the raw stream, or take the guest
//! program's own socket when the guest hands it over
//! ([`dormouse_protocol::egress`] has the frame flow).

use std::io;
use std::mem::MaybeUninit;
use std::os::fd::OwnedFd;
use std::time::Duration;

use rustix::net::{
    AddressFamily, RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, ReturnFlags, SocketType,
};

use dormouse_protocol::call;
use dormouse_protocol::declare::Call;
use dormouse_protocol::egress::{self, EgressOpen, EgressVerdict};
use dormouse_protocol::stream;
use tokio::io::Interest;
use tokio::net::{TcpStream, UnixStream};

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
    pub async fn take_client(&self, within: Duration) -> io::Result<TcpStream> {
        let fd = tokio::time::timeout(within, self.receive_fd())
            .await
            .map_err(|_| io::Error::other("the guest did not hand its socket over in time"))??;
        let stream = std::net::TcpStream::from(checked_tcp(fd)?);
        stream.set_nonblocking(true)?;
        TcpStream::from_std(stream)
    }

    async fn receive_fd(&self) -> io::Result<OwnedFd> {
        loop {
            self.stream.readable().await?;
            match self
                .stream
                .try_io(Interest::READABLE, || receive_one(&self.stream))
            {
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                other => return other,
            }
        }
    }
}

/// One byte and exactly one descriptor from `socket`.
fn receive_one(socket: &UnixStream) -> io::Result<OwnedFd> {
    let mut byte = [0u8; 1];
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(1))];
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
    if got.bytes == 0 {
        return Err(io::Error::other(
            "the guest closed instead of handing its socket over",
        ));
    }
    if got.flags.contains(ReturnFlags::CTRUNC) || fds.len() != 1 {
        return Err(io::Error::other(format!(
            "the guest sent {} descriptors (truncated: {}), not one",
            fds.len(),
            got.flags.contains(ReturnFlags::CTRUNC)
        )));
    }
    fds.pop()
        .ok_or_else(|| io::Error::other("no descriptor from the guest"))
}

/// `fd` if it is a connected TCP socket over IPv4 or IPv6.
fn checked_tcp(fd: OwnedFd) -> io::Result<OwnedFd> {
    let refuse = |what: &str| {
        io::Error::other(format!(
            "the guest handed over {what}, not a TCP connection"
        ))
    };
    if rustix::net::sockopt::socket_type(&fd)
        .map_err(|_| refuse("something that is not a socket"))?
        != SocketType::STREAM
    {
        return Err(refuse("a socket that is not a stream"));
    }
    if rustix::net::sockopt::socket_protocol(&fd)? != Some(rustix::net::ipproto::TCP) {
        return Err(refuse("a stream socket that is not TCP"));
    }
    let family = rustix::net::getsockname(&fd)?.address_family();
    if family != AddressFamily::INET && family != AddressFamily::INET6 {
        return Err(refuse("a socket that is not IPv4 or IPv6"));
    }
    rustix::net::getpeername(&fd)
        .ok()
        .flatten()
        .ok_or_else(|| refuse("a socket that is not connected"))?;
    Ok(fd)
}

#[cfg(test)]
#[path = "egress_tests.rs"]
mod tests;
