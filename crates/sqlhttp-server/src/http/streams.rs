//! HTTP/2 stream permits (ADR 0044): what lets an HTTP/2 request run beside others on its
//! connection, and hold its response until its client takes it.
//!
//! Every HTTP/2 connection has one permit of its own, paid for by its slot under
//! `--max-connections` (an HTTP/1.1 connection's one response at a time): its first stream in
//! flight always runs, whatever other clients hold. A stream beyond it takes one of the
//! server's shared permits (`--max-connections` of them), and only while whoever asks holds
//! fewer than an eighth of them: a credential (its identity) once authenticated, the client's
//! address otherwise (anonymous requests, probes, metrics, the OpenAPI document). A request
//! `authenticate` refuses never reaches [`admit_stream`], so it holds no permit: its `401`
//! is a small fixed answer, like the `503` given to a stream that gets no permit.
//!
//! A shared permit is taken after authentication (the `gate` layer asks [`admit_stream`] once
//! `credentials::authenticate` found the caller) and kept until the stream's response body is
//! dropped (the server releases it with [`StreamSlot::release`]). When the shared permits run
//! out the server is [pressed](StreamPermits::pressed_within), and connections whose
//! shared-permit responses wait on their client are cut after [`PRESSED_STALL`] rather than
//! the send timeout.
//!
//! Knows requests' credentials and addresses; nothing about SQL.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use axum::extract::{ConnectInfo, Request};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::http::credentials::{Credential, Identity, Label};
use crate::protocol::error::ApiError;

/// Each holder may have at most this fraction (one in `SHARE`) of the shared permits.
const SHARE: usize = 8;

/// How long a response holding a shared permit may wait on its client while the shared permits
/// are short (a stream was refused for lack of one within the send timeout); past it its
/// connection is cut (at most the send timeout).
pub(crate) const PRESSED_STALL: Duration = Duration::from_secs(1);

/// Who a shared permit is counted against.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Holder {
    /// An authenticated credential, by its identity.
    Credential(Identity),
    /// Anyone else (anonymous requests, probes, a token-less server's clients), by address.
    Address(Option<IpAddr>),
}

/// The server's shared HTTP/2 stream permits (one set per serving server).
#[derive(Debug)]
pub(crate) struct StreamPermits {
    shared: Arc<Semaphore>,
    /// The most shared permits one holder may have at once.
    per_holder: usize,
    held: Mutex<HashMap<Holder, usize>>,
    /// When a stream was last refused because the shared permits had run out.
    pressed: Mutex<Option<tokio::time::Instant>>,
}

impl StreamPermits {
    /// `shared` permits for streams beyond each connection's first.
    pub(crate) fn new(shared: usize) -> Arc<StreamPermits> {
        let shared = shared.max(1);
        Arc::new(StreamPermits {
            shared: Arc::new(Semaphore::new(shared)),
            per_holder: (shared / SHARE).max(1),
            held: Mutex::new(HashMap::new()),
            pressed: Mutex::new(None),
        })
    }

    /// A new HTTP/2 connection's permits: its own one, and the server's shared ones.
    pub(crate) fn connection(self: &Arc<StreamPermits>) -> Arc<ConnectionPermits> {
        Arc::new(ConnectionPermits {
            own: Arc::new(Semaphore::new(1)),
            server: Arc::clone(self),
        })
    }

    /// Whether a stream was refused for lack of a shared permit within `within`.
    pub(crate) fn pressed_within(&self, within: Duration) -> bool {
        lock(&self.pressed).is_some_and(|at| at.elapsed() < within)
    }

    fn holders(&self) -> MutexGuard<'_, HashMap<Holder, usize>> {
        lock(&self.held)
    }

    /// One shared permit for `holder`, unless it has its share or none is left.
    fn share(self: &Arc<StreamPermits>, holder: Holder) -> Result<StreamPermit, &'static str> {
        let mut held = self.holders();
        let count = held.entry(holder).or_insert(0);
        if *count >= self.per_holder {
            if *count == 0 {
                held.remove(&holder);
            }
            return Err(
                "this client has as many HTTP/2 streams in flight as one client may hold; \
                 retry later",
            );
        }
        let Ok(permit) = Arc::clone(&self.shared).try_acquire_owned() else {
            if *count == 0 {
                held.remove(&holder);
            }
            drop(held);
            *lock(&self.pressed) = Some(tokio::time::Instant::now());
            return Err(
                "the server is serving as many HTTP/2 streams beyond each connection's first as \
                 it takes connections (--max-connections); retry later",
            );
        };
        *count += 1;
        Ok(StreamPermit::Shared {
            _permit: permit,
            holder,
            server: Arc::clone(self),
        })
    }
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// One HTTP/2 connection's permits.
#[derive(Debug)]
pub(crate) struct ConnectionPermits {
    /// The connection's own permit: one stream in flight at a time, whoever else holds what.
    own: Arc<Semaphore>,
    server: Arc<StreamPermits>,
}

/// A stream's permit, released when dropped.
#[derive(Debug)]
enum StreamPermit {
    /// The connection's own.
    Own(#[allow(dead_code, reason = "held for its drop")] OwnedSemaphorePermit),
    /// One of the server's shared permits, counted against `holder`.
    Shared {
        _permit: OwnedSemaphorePermit,
        holder: Holder,
        server: Arc<StreamPermits>,
    },
}

impl Drop for StreamPermit {
    fn drop(&mut self) {
        if let StreamPermit::Shared { holder, server, .. } = self {
            let mut held = server.holders();
            if let Some(count) = held.get_mut(holder) {
                *count -= 1;
                if *count == 0 {
                    held.remove(holder);
                }
            }
        }
    }
}

/// Where one HTTP/2 stream's permit is kept: the server puts it in the request's extensions,
/// [`admit_stream`] fills it, and the server releases it when the response body is dropped.
#[derive(Debug, Clone)]
pub(crate) struct StreamSlot {
    connection: Arc<ConnectionPermits>,
    permit: Arc<Mutex<Option<StreamPermit>>>,
}

impl StreamSlot {
    pub(crate) fn new(connection: &Arc<ConnectionPermits>) -> StreamSlot {
        StreamSlot {
            connection: Arc::clone(connection),
            permit: Arc::new(Mutex::new(None)),
        }
    }

    /// Takes the connection's own permit, else a shared one for `holder`.
    fn take(&self, holder: Holder) -> Result<(), &'static str> {
        let permit = match Arc::clone(&self.connection.own).try_acquire_owned() {
            Ok(own) => StreamPermit::Own(own),
            Err(_) => self.connection.server.share(holder)?,
        };
        *lock(&self.permit) = Some(permit);
        Ok(())
    }

    /// Whether the stream holds one of the server's shared permits.
    pub(crate) fn is_shared(&self) -> bool {
        matches!(*lock(&self.permit), Some(StreamPermit::Shared { .. }))
    }

    /// Gives the permit back (the stream's response is gone).
    pub(crate) fn release(&self) {
        let permit = lock(&self.permit).take();
        drop(permit);
    }
}

/// Gives an HTTP/2 request its stream permit before it runs (see the module), or refuses it
/// `503 UNAVAILABLE` with `Retry-After`, nothing run. HTTP/1.1 requests (no [`StreamSlot`])
/// pass: their connection is their permit.
pub(crate) fn admit_stream(request: &Request) -> Result<(), ApiError> {
    let Some(slot) = request.extensions().get::<StreamSlot>() else {
        return Ok(());
    };
    let holder = match request.extensions().get::<Credential>() {
        Some(credential) if credential.label != Label::Anonymous => {
            Holder::Credential(credential.identity)
        }
        _ => Holder::Address(
            request
                .extensions()
                .get::<ConnectInfo<SocketAddr>>()
                .map(|info| info.0.ip()),
        ),
    };
    slot.take(holder).map_err(|refusal| {
        // `debug`, not `warn`: each refusal is a stream an anonymous client can open at will
        // (the attack soak logged 1,776 a minute at `warn`); the answer says what happened.
        tracing::debug!(?holder, "no HTTP/2 stream permit; refusing a stream");
        ApiError::unavailable(refusal)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn address(last: u8) -> Holder {
        Holder::Address(Some(IpAddr::from([10, 0, 0, last])))
    }

    #[test]
    fn a_connection_runs_its_first_stream_whatever_the_shared_permits() {
        let server = StreamPermits::new(8);
        // One holder takes its share (8 / 8 = 1) on a connection.
        let busy = server.connection();
        let first = StreamSlot::new(&busy);
        first.take(address(1)).unwrap();
        assert!(!first.is_shared());
        let second = StreamSlot::new(&busy);
        second.take(address(1)).unwrap();
        assert!(second.is_shared());
        assert!(StreamSlot::new(&busy).take(address(1)).is_err());
        // Seven others take the rest.
        let others: Vec<_> = (2..9)
            .map(|n| {
                let slot = StreamSlot::new(&busy);
                slot.take(address(n)).unwrap();
                slot
            })
            .collect();
        assert!(!server.pressed_within(Duration::from_secs(60)));
        assert!(StreamSlot::new(&busy).take(address(9)).is_err());
        assert!(server.pressed_within(Duration::from_secs(60)));
        // A new connection still runs a stream, for anyone.
        let fresh = server.connection();
        let own = StreamSlot::new(&fresh);
        own.take(address(1)).unwrap();
        assert!(!own.is_shared());
        // Permits come back when released.
        second.release();
        let again = StreamSlot::new(&fresh);
        again.take(address(1)).unwrap();
        assert!(again.is_shared());
        drop(others);
    }

    #[test]
    fn shares_are_counted_per_holder_and_given_back() {
        let server = StreamPermits::new(16);
        let connection = server.connection();
        let own = StreamSlot::new(&connection);
        own.take(address(1)).unwrap();
        let identity = Identity::of_token_digest(&[1; 32]);
        let token = Holder::Credential(identity);
        let taken: Vec<_> = (0..2)
            .map(|_| {
                let slot = StreamSlot::new(&connection);
                slot.take(token).unwrap();
                slot
            })
            .collect();
        assert!(StreamSlot::new(&connection).take(token).is_err());
        // Another holder has its own share.
        StreamSlot::new(&connection).take(address(1)).unwrap();
        for slot in &taken {
            slot.release();
        }
        assert!(server.holders().get(&token).is_none());
        StreamSlot::new(&connection).take(token).unwrap();
    }
}
