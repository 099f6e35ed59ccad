//! The import and the export in flight at the cut: their outcomes (whole
//! or absent, a whole archive or a clear error) and the sink that holds the
//! export open across the cut.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{ensure, Result};
use dormouse_e2e::broker::BrokerProcess;
use dormouse_e2e::client::ClientError;
use uuid::Uuid;

use super::{EXPORT_BYTES, IMPORT_BYTES};

/// The import is whole (every byte of its file there, the old tree gone)
/// or absent (the old tree as it was, nothing of the new one).
pub(crate) fn import_outcome(
    broker: &BrokerProcess,
    id: Uuid,
    result: Result<dormouse_protocol::workspace::Imported, ClientError>,
) -> Result<String> {
    let ws = broker.workspace(id);
    let big = std::fs::read(ws.join("imported/big.bin")).ok();
    let done = std::fs::read(ws.join("imported/done.txt")).ok();
    let old = std::fs::read(ws.join("old.txt")).ok();
    match result {
        Ok(summary) => {
            ensure!(
                big.as_ref()
                    .is_some_and(|b| b.len() == IMPORT_BYTES && b.iter().all(|x| *x == 7))
                    && done.as_deref() == Some(b"whole".as_slice())
                    && old.is_none(),
                "an import answered {summary:?} is not whole"
            );
            Ok(format!("whole({} bytes)", summary.bytes))
        }
        Err(e) => {
            ensure!(
                big.is_none()
                    && done.is_none()
                    && old.as_deref() == Some(b"before the import".as_slice()),
                "a failed import ({e}) left the workspace changed"
            );
            Ok(format!("absent({})", e.code().unwrap_or("transport")))
        }
    }
}

/// The export is a whole archive holding the file, or a clear error.
pub(crate) fn export_outcome(sink: &HeldSink, result: Result<u64, ClientError>) -> Result<String> {
    match result {
        Ok(n) => {
            let bytes = sink.taken();
            ensure!(
                u64::try_from(bytes.len())? == n && bytes.len() % 512 == 0,
                "an export of {n} bytes is not a whole archive ({} bytes)",
                bytes.len()
            );
            ensure!(
                bytes.len() > EXPORT_BYTES && bytes[bytes.len() - 1024..].iter().all(|b| *b == 0),
                "the archive lacks the file or its end"
            );
            Ok(format!("whole({n} bytes)"))
        }
        Err(e) => Ok(format!("error({})", e.code().unwrap_or("transport"))),
    }
}

/// An export's sink that holds the transfer (blocking its writer) until
/// released, then keeps every byte.
#[derive(Debug, Clone, Default)]
pub(crate) struct HeldSink {
    released: Arc<AtomicBool>,
    written: Arc<AtomicUsize>,
    bytes: Arc<std::sync::Mutex<Vec<u8>>>,
}

impl HeldSink {
    pub(crate) fn release(&self) {
        self.released.store(true, Ordering::SeqCst);
    }

    pub(crate) fn bytes(&self) -> usize {
        self.written.load(Ordering::SeqCst)
    }

    pub(crate) fn taken(&self) -> Vec<u8> {
        std::mem::take(&mut self.bytes.lock().unwrap())
    }
}

/// Releases the sink when dropped (the scenario ended, however).
pub(crate) struct Release(pub(crate) HeldSink);

impl Drop for Release {
    fn drop(&mut self) {
        self.0.release();
    }
}

impl std::io::Write for HeldSink {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.bytes.lock().unwrap().extend_from_slice(buf);
        self.written.fetch_add(buf.len(), Ordering::SeqCst);
        // Bounded: at most 30 s held.
        for _ in 0..1500 {
            if self.released.load(Ordering::SeqCst) {
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}
