//! One parked `egress_accept` connection's life: parked until a client is
//! handed to it (or the broker leaves), then `egress_open`, the broker's
//! verdict, the client's answer and the raw relay, or the hand-over of the
//! client's socket to the broker. It never parses a
//! client's request (that is [`super::head`]'s) and never decides a policy.

use std::time::Duration;

use std::sync::atomic::{AtomicU64, Ordering};

use dormouse_protocol::egress::{self, EgressForm, EgressVerdict};
use dormouse_protocol::stream;
use dormouse_protocol::{splice, Response};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::unix::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::TcpStream;

use super::hub::{Handoff, Hub};
use super::reply;

/// How long a client's answer from the proxy itself may take to write.
const ANSWER_TIMEOUT: Duration = Duration::from_secs(5);

/// Serves one `egress_accept` on the broker connection `rd`/`wr`:
/// `release` is called once the connection is parked (it gives back the
/// guest socket's general connection slot: a parked or relaying egress
/// connection is bounded by the hub and by the proxy's client cap).
pub async fn serve(
    hub: &Hub,
    rd: &mut OwnedReadHalf,
    wr: &mut OwnedWriteHalf,
    io: Duration,
    release: impl FnOnce(),
) {
    let parked = match hub.park() {
        Ok(rx) => rx,
        Err(e) => {
            let refusal = Response::error(e.code(), e.to_string());
            let _ = stream::write_frame(wr, &refusal, &[], io).await;
            return;
        }
    };
    release();
    let mut probe = [0u8; 1];
    let handoff = tokio::select! {
        handoff = parked => match handoff {
            Ok(handoff) => handoff,
            Err(_) => return, // the proxy stopped
        },
        // The broker left (or broke the protocol by speaking first).
        _ = rd.read(&mut probe) => return,
    };
    carry(handoff, rd, wr, io).await;
}

/// Sends the client's request to the broker, answers the client by the
/// verdict, and relays.
async fn carry(handoff: Handoff, rd: &mut OwnedReadHalf, wr: &mut OwnedWriteHalf, io: Duration) {
    let Handoff {
        mut client,
        open,
        payload,
        permit,
    } = handoff;
    let id = open.id;
    let authority = open.authority();
    let (host, port) = (open.host.clone(), open.port);
    let html = matches!(open.form, EgressForm::Http { .. });
    let connect = !html;
    let sent = Response::EgressOpen(open);
    if let Err(e) = stream::write_frame(wr, &sent, &payload, io).await {
        tracing::debug!(id, error = %e, "the broker connection failed at egress_open");
        let reason = format!("egress unavailable: the broker connection failed ({e})");
        answer(&mut client, 502, &reason, html).await;
        return;
    }
    drop(payload);
    let verdict = egress::read_verdict(rd).await;
    let verdict = match verdict {
        Ok(v) => v,
        Err(e) => {
            tracing::debug!(id, error = %e, "no verdict from the broker");
            let reason = format!("egress failed: no answer from the broker for {authority} ({e})");
            answer(&mut client, 502, &reason, html).await;
            return;
        }
    };
    match verdict {
        EgressVerdict::Refused { reason } => {
            tracing::debug!(id, %authority, %reason, "egress refused");
            let hint = reply::policy_hint(&reason, &reply::this_desktop(), &host, port);
            let bytes = reply::answer_with_hint(403, &reason, hint.as_deref(), html);
            write_answer(&mut client, &bytes).await;
        }
        EgressVerdict::Failed { reason } => {
            tracing::debug!(id, %authority, %reason, "egress failed");
            answer(&mut client, 502, &reason, html).await;
        }
        EgressVerdict::HandOver => {
            if connect && !established(&mut client).await {
                return;
            }
            let _ = client.set_nodelay(true);
            if let Err(e) = hand_over(&client, wr).await {
                tracing::debug!(id, %authority, error = %e, "egress hand-over failed");
                return;
            }
            drop(client);
            // The broker relays the program's socket now and closes the
            // session once it holds it; the proxy's client permit goes
            // back then.
            let mut rest = [0u8; 64];
            while matches!(rd.read(&mut rest).await, Ok(n) if n > 0) {}
            tracing::debug!(id, %authority, "egress handed over, closed");
        }
        EgressVerdict::Connected => {
            if connect && !established(&mut client).await {
                return;
            }
            let _ = client.set_nodelay(true);
            let (up, down) = (AtomicU64::new(0), AtomicU64::new(0));
            let relayed = splice::relay(&client, rd.as_ref(), &up, &down).await;
            let (up, down) = (up.load(Ordering::Relaxed), down.load(Ordering::Relaxed));
            match relayed {
                Ok(()) => tracing::debug!(id, %authority, up, down, "egress closed"),
                Err(e) => tracing::debug!(id, %authority, up, down, error = %e, "egress ended"),
            }
        }
    }
    drop(permit);
}

/// Answers a `CONNECT` client `200 Connection established`; false when it
/// could not be told.
async fn established(client: &mut TcpStream) -> bool {
    let wrote =
        tokio::time::timeout(ANSWER_TIMEOUT, client.write_all(reply::CONNECT_ESTABLISHED)).await;
    matches!(wrote, Ok(Ok(())))
}

/// Sends the program's socket to the broker: one byte with `SCM_RIGHTS`
/// on the session, within [`ANSWER_TIMEOUT`].
async fn hand_over(client: &TcpStream, wr: &OwnedWriteHalf) -> std::io::Result<()> {
    use nix::sys::socket::{sendmsg, ControlMessage, MsgFlags};
    use std::os::fd::AsRawFd as _;
    let session = wr.as_ref();
    let fds = [client.as_raw_fd()];
    let send = async {
        loop {
            session.writable().await?;
            let sent = session.try_io(tokio::io::Interest::WRITABLE, || {
                let byte = [0u8; 1];
                let iov = [std::io::IoSlice::new(&byte)];
                let cmsg = [ControlMessage::ScmRights(&fds)];
                sendmsg::<()>(
                    session.as_raw_fd(),
                    &iov,
                    &cmsg,
                    MsgFlags::MSG_NOSIGNAL,
                    None,
                )
                .map_err(std::io::Error::from)
            });
            match sent {
                Ok(1) => return Ok(()),
                Ok(_) => return Err(std::io::Error::other("the hand-over byte was not sent")),
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
                Err(e) => return Err(e),
            }
        }
    };
    tokio::time::timeout(ANSWER_TIMEOUT, send)
        .await
        .map_err(|_| std::io::Error::other("the hand-over timed out"))?
}

/// Writes the proxy's own answer and closes the client's connection.
pub async fn answer(client: &mut TcpStream, status: u16, reason: &str, html: bool) {
    write_answer(client, &reply::answer(status, reason, html)).await;
}

/// Writes the proxy's own answer `bytes` and closes, within
/// [`ANSWER_TIMEOUT`].
async fn write_answer(client: &mut TcpStream, bytes: &[u8]) {
    let _ = tokio::time::timeout(ANSWER_TIMEOUT, async {
        client.write_all(bytes).await?;
        client.shutdown().await
    })
    .await;
}
