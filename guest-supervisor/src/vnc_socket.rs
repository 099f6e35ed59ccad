//! The desktop's VNC socket, `/run/dormouse/vnc.sock`: the only way the host
//! reaches the guest's VNC server.
//!
//! Debian's x11vnc cannot serve a unix socket itself (`-unixsock` needs a
//! patched libvncserver; stock 0.9.14 resets every connection on it), so
//! x11vnc listens on the guest's loopback (`127.0.0.1:<vnc_port>`, which
//! nothing outside a network-less guest can reach) and this module owns the
//! socket: bound beside `supervisor.sock` with the same rules
//! ([`socket::bind_named`]: beneath the held run directory, whatever sat at
//! the name removed without being followed, root-owned 0600), and only once
//! the VNC service first passed its readiness check, so a connection that
//! succeeds reaches a VNC server that answered. Each accepted connection is
//! spliced to the loopback port with bounded buffers; connections are capped.
//!
//! It never parses or changes the bytes (the broker's gateway enforces what
//! a viewer may send) and never touches the services or the status.

use std::sync::Arc;
use std::time::Duration;

use dormouse_protocol::screen::VNC_SOCKET_FILE_NAME;
use dormouse_protocol::ServiceRunState;
use tokio::net::{TcpStream, UnixListener, UnixStream};

use crate::config::Config;
use crate::socket::{self, SocketError};
use crate::status::StatusCell;

/// Most VNC connections spliced at once: the bound the broker's admission
/// holds to as well (one constant, in the protocol crate); here it bounds
/// what the guest spends whatever the host does.
pub const MAX_VNC_CONNECTIONS: usize = dormouse_protocol::screen::MAX_SCREEN_CONNECTIONS;

/// Buffer of each direction of a splice.
const SPLICE_BUFFER: usize = 64 * 1024;

/// How long a connection to the loopback VNC server may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);

/// Name of the VNC service in the status.
const VNC_SERVICE: &str = "vnc";

/// Waits until the VNC service is first ready, binds the socket and serves
/// it until the returned future is dropped (which ends every splice and
/// removes the socket file).
pub async fn serve(config: Arc<Config>, cell: StatusCell) -> Result<(), SocketError> {
    let mut status = cell.subscribe();
    loop {
        let ready = status.borrow_and_update().services.iter().any(|s| {
            s.name == VNC_SERVICE && s.state == ServiceRunState::Running && s.ready_since.is_some()
        });
        if ready {
            break;
        }
        if status.changed().await.is_err() {
            return Ok(());
        }
    }
    let bound = socket::bind_named(&config, VNC_SOCKET_FILE_NAME)?;
    tracing::info!(path = %bound.path().display(), port = config.vnc_port, "vnc socket listening");
    accept_loop(&bound.listener, config.vnc_port).await;
    Ok(())
}

/// Accepts until dropped, splicing each connection (at most
/// [`MAX_VNC_CONNECTIONS`]); one over the limit is closed at once, and the
/// broker sees the close and answers its viewer.
async fn accept_loop(listener: &UnixListener, port: u16) {
    socket::accept_capped(
        listener,
        MAX_VNC_CONNECTIONS,
        "vnc socket",
        move |stream, slot| async move {
            splice(stream, port).await;
            drop(slot);
        },
        |_| {},
    )
    .await;
}

/// Carries one connection to the loopback VNC server and back.
async fn splice(mut client: UnixStream, port: u16) {
    let addr = std::net::SocketAddr::from((std::net::Ipv4Addr::LOCALHOST, port));
    let mut server = match tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(addr)).await {
        Ok(Ok(server)) => server,
        Ok(Err(e)) => {
            tracing::warn!(error = %e, "cannot reach the vnc server");
            return;
        }
        Err(_) => {
            tracing::warn!("the vnc server did not accept in time");
            return;
        }
    };
    let _ = server.set_nodelay(true);
    match tokio::io::copy_bidirectional_with_sizes(
        &mut client,
        &mut server,
        SPLICE_BUFFER,
        SPLICE_BUFFER,
    )
    .await
    {
        Ok((up, down)) => tracing::debug!(up, down, "vnc connection closed"),
        Err(e) => tracing::debug!(error = %e, "vnc connection ended"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

    #[tokio::test]
    async fn a_connection_is_spliced_to_the_loopback_port() {
        let tcp = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = tcp.local_addr().unwrap().port();
        tokio::spawn(async move {
            let (mut s, _) = tcp.accept().await.unwrap();
            s.write_all(b"RFB 003.008\n").await.unwrap();
            let mut buf = [0u8; 4];
            s.read_exact(&mut buf).await.unwrap();
            s.write_all(&buf).await.unwrap();
        });
        let dir = std::env::temp_dir().join(format!("dm-vnc-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("v.sock");
        let _ = std::fs::remove_file(&path);
        let listener = UnixListener::bind(&path).unwrap();
        let serve = tokio::spawn(async move { accept_loop(&listener, port).await });
        let mut c = UnixStream::connect(&path).await.unwrap();
        let mut banner = [0u8; 12];
        c.read_exact(&mut banner).await.unwrap();
        assert_eq!(&banner, b"RFB 003.008\n");
        c.write_all(b"ping").await.unwrap();
        let mut echo = [0u8; 4];
        c.read_exact(&mut echo).await.unwrap();
        assert_eq!(&echo, b"ping");
        serve.abort();
        let _ = std::fs::remove_dir_all(&dir);
    }
}
