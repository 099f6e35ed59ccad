//! The broker's end of an egress session (`egress_accept`): park a
//! connection, read the guest's `egress_open` when a guest program asks,
//! answer one verdict, then hand over the raw stream
//! ([`dormouse_protocol::egress`] has the frame flow).

use std::io;

use dormouse_protocol::call;
use dormouse_protocol::declare::Call;
use dormouse_protocol::egress::{self, EgressOpen, EgressVerdict};
use dormouse_protocol::stream;
use tokio::net::UnixStream;

use super::{typed, GuestConnection, GuestError, FRAME_BODY_TIMEOUT, REQUEST_TIMEOUT};

/// A parked egress connection the guest has asked on.
#[derive(Debug)]
pub struct EgressSession {
    stream: UnixStream,
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
        Ok((
            open,
            frame.payload,
            EgressSession {
                stream: self.stream,
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
}
