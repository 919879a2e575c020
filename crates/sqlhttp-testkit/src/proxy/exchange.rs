//! One client connection through the proxy: read a request, take the next fault, carry it out.
//!
//! This module knows the fault semantics and the sockets of one exchange. It must not know
//! about the accept loop, the proxy's lifetime, how an upstream is chosen or the sqlhttp wire
//! protocol.

use std::time::Duration;

use http::StatusCode;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::timeout;

use super::fault::Fault;
use super::http1::{self, ProxiedRequest, RequestError};
use super::{IO_TIMEOUT, Shared};

/// How long to wait for the client to close after the answer before closing ourselves.
const LINGER_AFTER_ANSWER: Duration = Duration::from_secs(1);

/// Serves one client connection to its end.
pub(super) async fn serve(mut client: TcpStream, shared: &Shared) {
    let request = match timeout(IO_TIMEOUT, http1::read_request(&mut client)).await {
        Ok(Ok(request)) => request,
        Ok(Err(RequestError::Reject(status, why))) => {
            tracing::debug!(%status, why, "chaos proxy: request refused");
            answer(client, &http1::text_response(status, why)).await;
            return;
        }
        Ok(Err(RequestError::Gone)) | Err(_) => return,
    };
    shared.count_request();
    let fault = shared.next_fault();
    tracing::debug!(?fault, "chaos proxy: request");
    match fault {
        Fault::CloseBeforeForward => drop(client),
        Fault::ResetBeforeForward => reset(client),
        Fault::Stall => wait_until_gone(client).await,
        Fault::Respond {
            status,
            headers,
            body,
        } => answer(client, &http1::encode_response(status, &headers, &body)).await,
        Fault::Pass => {
            let response = forward(&request, shared).await;
            answer(client, &response).await;
        }
        Fault::DropAfterForward => {
            let _response = forward(&request, shared).await;
            drop(client);
        }
        Fault::Delay(delay) => {
            let response = forward(&request, shared).await;
            tokio::time::sleep(delay).await;
            answer(client, &response).await;
        }
        Fault::Truncate(keep) => {
            let response = forward(&request, shared).await;
            answer(client, &response[..keep.min(response.len())]).await;
        }
    }
}

/// Sends `request` over a fresh connection to the upstream whose turn it is (or the next one
/// that accepts the connection) and returns the complete response framed for the client, or
/// the proxy's own 502/504 when that fails.
async fn forward(request: &ProxiedRequest, shared: &Shared) -> Vec<u8> {
    let exchange = async {
        let (upstream, mut connection) = shared.upstreams.connect().await?;
        connection.write_all(&request.bytes).await?;
        shared.count_forwarded(upstream);
        http1::read_response(&mut connection, request.is_head).await
    };
    match timeout(IO_TIMEOUT, exchange).await {
        Ok(Ok(response)) => response,
        Ok(Err(error)) => {
            tracing::debug!(%error, "chaos proxy: upstream failed");
            let text = format!("sqlhttp-testkit proxy: upstream failed: {error}");
            http1::text_response(StatusCode::BAD_GATEWAY, &text)
        }
        Err(_) => http1::text_response(
            StatusCode::GATEWAY_TIMEOUT,
            "sqlhttp-testkit proxy: upstream timed out",
        ),
    }
}

/// Writes `bytes`, closes the sending side, and gives the client a moment to close first (so
/// the close never discards data the client has not read yet).
async fn answer(mut client: TcpStream, bytes: &[u8]) {
    let written = timeout(IO_TIMEOUT, async {
        client.write_all(bytes).await?;
        client.shutdown().await
    })
    .await;
    if matches!(written, Ok(Ok(()))) {
        let _ = timeout(LINGER_AFTER_ANSWER, wait_until_gone(client)).await;
    }
}

/// Closes abortively: the client sees a connection reset.
fn reset(client: TcpStream) {
    // A zero linger makes the close send RST; unlike a non-zero linger it never blocks the thread.
    #[allow(deprecated)]
    if let Err(error) = client.set_linger(Some(Duration::ZERO)) {
        tracing::debug!(%error, "chaos proxy: could not arm the reset");
    }
    drop(client);
}

/// Reads and discards until the client closes its side or the connection fails.
async fn wait_until_gone(mut client: TcpStream) {
    let mut scratch = [0u8; 1024];
    while let Ok(read) = client.read(&mut scratch).await {
        if read == 0 {
            break;
        }
    }
}
