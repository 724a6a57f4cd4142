//! A guest's stdout and stderr: bounded buffers behind WASI's output
//! streams, drained into the log after each call
//! ([`crate::state::HostState::flush_output`]).

use std::{
    pin::Pin,
    sync::{Arc, Mutex},
    task::{Context, Poll},
};

use bytes::Bytes;
use wasmtime_wasi::{
    cli::{IsTerminal, StdoutStream},
    p2::{OutputStream, Pollable, StreamResult},
};

/// A bounded buffer behind a guest's stdout or stderr. Writes past the bound
/// are counted and dropped, never refused: a chatty guest must not trap.
#[derive(Clone, Debug)]
pub(crate) struct Capture {
    inner: Arc<Mutex<CaptureBuf>>,
}

#[derive(Debug)]
struct CaptureBuf {
    bytes: Vec<u8>,
    cap: usize,
    dropped: usize,
}

impl Capture {
    pub(crate) fn new(cap: usize) -> Self {
        Capture {
            inner: Arc::new(Mutex::new(CaptureBuf {
                bytes: Vec::new(),
                cap,
                dropped: 0,
            })),
        }
    }

    pub(crate) fn stream(&self) -> CaptureStream {
        CaptureStream(self.clone())
    }

    fn write(&self, data: &[u8]) {
        let mut buf = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        let room = buf.cap.saturating_sub(buf.bytes.len());
        let keep = room.min(data.len());
        buf.bytes.extend_from_slice(&data[..keep]);
        buf.dropped += data.len() - keep;
    }

    /// Takes what was written since the last call, and how much was dropped.
    pub(crate) fn take(&self) -> (Vec<u8>, usize) {
        let mut buf = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        let dropped = std::mem::take(&mut buf.dropped);
        (std::mem::take(&mut buf.bytes), dropped)
    }
}

pub(crate) struct CaptureStream(Capture);

impl IsTerminal for CaptureStream {
    fn is_terminal(&self) -> bool {
        false
    }
}

impl StdoutStream for CaptureStream {
    fn async_stream(&self) -> Box<dyn tokio::io::AsyncWrite + Send + Sync> {
        Box::new(CaptureWriter(self.0.clone()))
    }

    fn p2_stream(&self) -> Box<dyn OutputStream> {
        Box::new(CaptureWriter(self.0.clone()))
    }
}

struct CaptureWriter(Capture);

#[wasmtime_wasi::async_trait]
impl Pollable for CaptureWriter {
    async fn ready(&mut self) {}
}

impl OutputStream for CaptureWriter {
    fn write(&mut self, bytes: Bytes) -> StreamResult<()> {
        self.0.write(&bytes);
        Ok(())
    }

    fn flush(&mut self) -> StreamResult<()> {
        Ok(())
    }

    fn check_write(&mut self) -> StreamResult<usize> {
        Ok(64 * 1024)
    }
}

impl tokio::io::AsyncWrite for CaptureWriter {
    fn poll_write(
        self: Pin<&mut Self>,
        _: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        self.0.write(buf);
        Poll::Ready(Ok(buf.len()))
    }

    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn capture_is_bounded_and_counts_what_it_drops() {
        let c = Capture::new(4);
        c.write(b"abc");
        c.write(b"def");
        assert_eq!(c.take(), (b"abcd".to_vec(), 2));
        assert_eq!(c.take(), (Vec::new(), 0));
    }
}
