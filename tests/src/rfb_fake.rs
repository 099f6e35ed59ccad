//! The fake VNC server of [`super`]: a desktop's `vnc.sock` on a unix
//! socket that does the server side of the handshake and records what
//! reaches it.

use super::*;

/// What one connection to the fake server delivered.
#[derive(Debug, Default)]
pub struct FakeConnection {
    /// The 12-byte version the viewer sent.
    pub version: Vec<u8>,
    /// Every byte after the handshake (security type and ClientInit too).
    pub received: Vec<u8>,
    /// The handshake completed.
    pub handshaken: bool,
    /// The connection ended (EOF or error on read).
    pub closed: bool,
}

/// A fake VNC server on a unix socket.
#[derive(Debug)]
pub struct FakeVncServer {
    path: PathBuf,
    /// One entry per accepted connection, in order.
    pub connections: Arc<Mutex<Vec<Arc<Mutex<FakeConnection>>>>>,
    task: JoinHandle<()>,
}

/// Framebuffer size of the fake server.
pub const FAKE_WIDTH: u16 = 64;
/// Framebuffer height of the fake server.
pub const FAKE_HEIGHT: u16 = 48;

impl FakeVncServer {
    /// Listens at `path`. With `stream_every`, each connection also gets a
    /// Raw FramebufferUpdate of the whole 64x48 screen (12 KiB) that often,
    /// whether it asked or not (as continuous updates would).
    pub fn start(path: &Path, stream_every: Option<Duration>) -> Result<Self> {
        Self::start_saying(path, stream_every, Vec::new())
    }

    /// [`Self::start`], each connection also sent `said` once right after
    /// its ServerInit (server messages the test wants a viewer to meet).
    pub fn start_saying(
        path: &Path,
        stream_every: Option<Duration>,
        said: Vec<u8>,
    ) -> Result<Self> {
        let said = Arc::new(said);
        let listener = UnixListener::bind(path)?;
        let connections: Arc<Mutex<Vec<Arc<Mutex<FakeConnection>>>>> = Arc::default();
        let all = connections.clone();
        let task = tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let conn = Arc::new(Mutex::new(FakeConnection::default()));
                all.lock().unwrap().push(conn.clone());
                tokio::spawn(serve(stream, conn, stream_every, said.clone()));
            }
        });
        Ok(Self {
            path: path.to_owned(),
            connections,
            task,
        })
    }

    /// The socket path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Connection `i`'s record.
    pub fn connection(&self, i: usize) -> Option<Arc<Mutex<FakeConnection>>> {
        self.connections.lock().unwrap().get(i).cloned()
    }

    /// How many connections were accepted.
    pub fn accepted(&self) -> usize {
        self.connections.lock().unwrap().len()
    }

    /// Waits until connection `i` has received `pred`, at most `within`.
    pub async fn wait_for(
        &self,
        i: usize,
        within: Duration,
        pred: impl Fn(&FakeConnection) -> bool,
    ) -> Result<()> {
        let deadline = tokio::time::Instant::now() + within;
        loop {
            if let Some(c) = self.connection(i) {
                if pred(&c.lock().unwrap()) {
                    return Ok(());
                }
            }
            if tokio::time::Instant::now() >= deadline {
                bail!("fake VNC connection {i}: condition not met within {within:?}");
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}

impl Drop for FakeVncServer {
    fn drop(&mut self) {
        self.task.abort();
        let _ = std::fs::remove_file(&self.path);
    }
}

/// One Raw FramebufferUpdate of the whole fake screen: a gradient (blue
/// across, green down) whose red is `shade`, so each update differs.
pub fn fake_update(shade: u8) -> Vec<u8> {
    let mut v = vec![0, 0, 0, 1, 0, 0, 0, 0];
    v.extend_from_slice(&FAKE_WIDTH.to_be_bytes());
    v.extend_from_slice(&FAKE_HEIGHT.to_be_bytes());
    v.extend_from_slice(&0i32.to_be_bytes());
    for y in 0..FAKE_HEIGHT {
        for x in 0..FAKE_WIDTH {
            let blue = u8::try_from(u32::from(x) * 255 / u32::from(FAKE_WIDTH)).unwrap_or(255);
            let green = u8::try_from(u32::from(y) * 255 / u32::from(FAKE_HEIGHT)).unwrap_or(255);
            v.extend_from_slice(&[blue, green, shade, 0]);
        }
    }
    v
}

async fn serve(
    stream: UnixStream,
    conn: Arc<Mutex<FakeConnection>>,
    every: Option<Duration>,
    said: Arc<Vec<u8>>,
) {
    let (mut rd, mut wr) = stream.into_split();
    let handshake = async {
        wr.write_all(b"RFB 003.008\n").await?;
        let mut version = [0u8; 12];
        rd.read_exact(&mut version).await?;
        conn.lock().unwrap().version = version.to_vec();
        wr.write_all(&[1, 1]).await?;
        let mut security = [0u8; 1];
        rd.read_exact(&mut security).await?;
        conn.lock().unwrap().received.push(security[0]);
        wr.write_all(&[0, 0, 0, 0]).await?;
        let mut shared = [0u8; 1];
        rd.read_exact(&mut shared).await?;
        conn.lock().unwrap().received.push(shared[0]);
        let mut init = Vec::new();
        init.extend_from_slice(&FAKE_WIDTH.to_be_bytes());
        init.extend_from_slice(&FAKE_HEIGHT.to_be_bytes());
        init.extend_from_slice(&[32, 24, 0, 1, 0, 255, 0, 255, 0, 255, 16, 8, 0, 0, 0, 0]);
        init.extend_from_slice(&4u32.to_be_bytes());
        init.extend_from_slice(b"fake");
        wr.write_all(&init).await?;
        wr.write_all(&said).await?;
        conn.lock().unwrap().handshaken = true;
        std::io::Result::Ok(())
    };
    if handshake.await.is_err() {
        conn.lock().unwrap().closed = true;
        return;
    }
    // Without streaming the write half stays here: dropping it would shut
    // the connection's write side down, which reads as the desktop leaving.
    let (writer, _idle_writer) = match every {
        Some(every) => (
            Some(tokio::spawn(async move {
                let mut shade = 0u8;
                loop {
                    tokio::time::sleep(every).await;
                    shade = shade.wrapping_add(1);
                    if wr.write_all(&fake_update(shade)).await.is_err() {
                        return;
                    }
                }
            })),
            None,
        ),
        None => (None, Some(wr)),
    };
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        match rd.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => conn.lock().unwrap().received.extend_from_slice(&buf[..n]),
        }
    }
    conn.lock().unwrap().closed = true;
    if let Some(w) = writer {
        w.abort();
    }
}
