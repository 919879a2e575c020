//! Test helpers shared by the testkit's integration tests: a hand-written HTTP/1.1 upstream
//! that answers a fixed response and records what it was sent. Knows nothing of the testkit.

// Each test binary compiles this module and uses only part of it.
#![allow(dead_code)]

use std::error::Error as _;
use std::io;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

/// The fixed response of [`Upstream`]: 200, body `hello`, a marker header.
pub(crate) const RESPONSE: &[u8] =
    b"HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\nx-upstream: yes\r\ncontent-length: 5\r\n\r\nhello";

/// A loopback HTTP/1.1 server answering [`RESPONSE`] to every request, one per connection.
#[derive(Debug)]
pub(crate) struct Upstream {
    addr: SocketAddr,
    seen: Arc<Mutex<Vec<String>>>,
    task: JoinHandle<()>,
}

impl Upstream {
    pub(crate) async fn start() -> Upstream {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let record = Arc::clone(&seen);
        let task = tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let record = Arc::clone(&record);
                tokio::spawn(async move {
                    if let Ok(request) = serve_one(stream).await {
                        record.lock().unwrap().push(request);
                    }
                });
            }
        });
        Upstream { addr, seen, task }
    }

    pub(crate) fn addr(&self) -> SocketAddr {
        self.addr
    }

    pub(crate) fn url(&self) -> String {
        format!("http://{}/", self.addr)
    }

    /// Requests answered so far.
    pub(crate) fn served(&self) -> usize {
        self.seen.lock().unwrap().len()
    }

    /// The raw text of every request answered so far.
    pub(crate) fn requests(&self) -> Vec<String> {
        self.seen.lock().unwrap().clone()
    }
}

impl Drop for Upstream {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Reads one request (head and `Content-Length` body), answers [`RESPONSE`], closes.
async fn serve_one(mut stream: TcpStream) -> io::Result<String> {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    let request = loop {
        let read = stream.read(&mut chunk).await?;
        if read == 0 {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
        buf.extend_from_slice(&chunk[..read]);
        let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") else {
            continue;
        };
        let head = String::from_utf8_lossy(&buf[..end]).to_lowercase();
        let length: usize = head
            .lines()
            .find_map(|line| line.strip_prefix("content-length:"))
            .map_or(0, |v| v.trim().parse().unwrap());
        if buf.len() >= end + 4 + length {
            break String::from_utf8_lossy(&buf).into_owned();
        }
    };
    stream.write_all(RESPONSE).await?;
    stream.shutdown().await?;
    Ok(request)
}

/// A reqwest client with a short overall timeout, so a test that goes wrong fails fast.
pub(crate) fn http_client() -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(Duration::from_secs(5))
        .build()
        .unwrap()
}

/// The `io::ErrorKind` at the bottom of an error's source chain, if there is one.
pub(crate) fn io_kind(error: &reqwest::Error) -> Option<io::ErrorKind> {
    let mut source = error.source();
    while let Some(current) = source {
        if let Some(io) = current.downcast_ref::<io::Error>() {
            return Some(io.kind());
        }
        source = current.source();
    }
    None
}
