//! A cancel request: a message of its own on a new stream to the same server, naming the
//! session's [`BackendKey`]. PostgreSQL answers nothing and closes the stream; whether a
//! statement was running to be cancelled is for the session's own answers to say.
//!
//! Knows the cancel message; how to reach the server (TCP, Unix socket, TLS) is the caller's.

use bytes::BytesMut;
use postgres_protocol::message::frontend;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use crate::connection::BackendKey;
use crate::error::Error;

/// Sends a cancel request for `key` over `stream` (freshly opened to the session's server) and
/// waits until the server closed it; the caller bounds how long (the server may never answer).
pub async fn cancel<S: AsyncRead + AsyncWrite + Unpin>(
    mut stream: S,
    key: BackendKey,
) -> Result<(), Error> {
    let mut buf = BytesMut::with_capacity(16);
    frontend::cancel_request(key.process_id, key.secret_key, &mut buf);
    stream.write_all(&buf).await?;
    stream.flush().await?;
    let mut rest = [0u8; 1];
    // The server closes without a word; anything else is not ours to read.
    let _ = stream.read(&mut rest).await?;
    Ok(())
}
