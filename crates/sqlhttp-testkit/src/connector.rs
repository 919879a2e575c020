//! [`FaultConnector`]: a tower [`Layer`] for reqwest's connector that makes connection attempts
//! fail, stall or hang on a plan, then delegates to the real connector.
//!
//! This module knows only the tower `Layer`/`Service` contract and `std::io` errors. It must not
//! know about HTTP, the sqlhttp wire protocol, the SDK or the server: reqwest's connector request
//! and connection types are unnameable, so everything here is generic over them.

use std::collections::VecDeque;
use std::fmt;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll};
use std::time::Duration;

use tower::{Layer, Service};

/// What one connection attempt does instead of (or before) connecting.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConnectFault {
    /// Fail at once with [`io::ErrorKind::ConnectionRefused`], like a port nobody listens on.
    Refused,
    /// Fail at once with [`io::ErrorKind::ConnectionReset`], like a connection dropped mid-handshake.
    Reset,
    /// Wait this long, then connect for real.
    Delay(Duration),
    /// Never complete: the attempt stays pending until the caller gives up (a connect timeout or a
    /// request timeout drops it).
    Hang,
}

/// The error an injected connection failure reports.
fn injected(kind: io::ErrorKind) -> io::Error {
    io::Error::new(kind, format!("sqlhttp-testkit: injected {kind}"))
}

#[derive(Debug, Default)]
struct Shared {
    plan: Mutex<VecDeque<ConnectFault>>,
    each_delay: Mutex<Option<Duration>>,
    attempts: AtomicUsize,
    faults: AtomicUsize,
}

impl Shared {
    fn plan(&self) -> MutexGuard<'_, VecDeque<ConnectFault>> {
        // A panic while holding the lock cannot leave the queue half-updated: recover it.
        self.plan
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn each_delay(&self) -> MutexGuard<'_, Option<Duration>> {
        self.each_delay
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// A reqwest connector layer that injects connection faults from a FIFO plan.
///
/// Each connection attempt takes the next [`ConnectFault`] from the plan; once the plan is empty,
/// attempts go straight to the real connector. Install it with
/// `reqwest::ClientBuilder::connector_layer`. Clones share the plan and the counters, so keep one
/// clone in the test to push faults and read [`attempts`](Self::attempts) afterwards.
///
/// Injected failures surface from reqwest as connect errors (`reqwest::Error::is_connect`), the
/// same as a real refused or reset connection. A [`ConnectFault::Hang`] surfaces as whatever
/// gives up first: `connect_timeout` (a connect error that is also a timeout) or the request
/// timeout.
///
/// ```
/// use sqlhttp_testkit::{ConnectFault, FaultConnector};
///
/// # fn main() -> Result<(), reqwest::Error> {
/// let faults = FaultConnector::new().fail_first(2, ConnectFault::Refused);
/// let http = reqwest::Client::builder()
///     .connector_layer(faults.clone())
///     .retry(reqwest::retry::never()) // so every attempt is the caller's own
///     .build()?;
/// // ... hand `http` to the client under test, make one call, then:
/// assert_eq!(faults.attempts(), 0); // nothing has connected yet in this example
/// assert_eq!(faults.pending(), 2);
/// # drop(http);
/// # Ok(())
/// # }
/// ```
#[derive(Clone, Default)]
pub struct FaultConnector {
    shared: Arc<Shared>,
}

impl fmt::Debug for FaultConnector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FaultConnector")
            .field("plan", &*self.shared.plan())
            .field("each_delay", &*self.shared.each_delay())
            .field("attempts", &self.attempts())
            .field("faults_injected", &self.faults_injected())
            .finish()
    }
}

impl FaultConnector {
    /// A connector layer with an empty plan: every attempt passes through.
    pub fn new() -> Self {
        Self::default()
    }

    /// Appends `n` copies of `fault` to the plan (builder style).
    #[must_use]
    pub fn fail_first(self, n: usize, fault: ConnectFault) -> Self {
        self.push_all(std::iter::repeat_n(fault, n));
        self
    }

    /// Appends one fault to the plan (builder style).
    #[must_use]
    pub fn then(self, fault: ConnectFault) -> Self {
        self.push(fault);
        self
    }

    /// Delays every connection attempt by `delay` before its planned fault (if any) applies
    /// (builder style). The delay is not counted as an injected fault.
    #[must_use]
    pub fn delay_each(self, delay: Duration) -> Self {
        *self.shared.each_delay() = Some(delay);
        self
    }

    /// Appends one fault to the plan; visible to every clone at once.
    pub fn push(&self, fault: ConnectFault) {
        self.shared.plan().push_back(fault);
    }

    /// Appends several faults to the plan, in order.
    pub fn push_all(&self, faults: impl IntoIterator<Item = ConnectFault>) {
        self.shared.plan().extend(faults);
    }

    /// Empties the plan and removes the per-attempt delay; counters are kept.
    pub fn clear(&self) {
        self.shared.plan().clear();
        *self.shared.each_delay() = None;
    }

    /// Faults still waiting in the plan.
    pub fn pending(&self) -> usize {
        self.shared.plan().len()
    }

    /// Connection attempts seen so far (faulted or not), across every clone and every client
    /// built with this layer.
    pub fn attempts(&self) -> usize {
        self.shared.attempts.load(Ordering::SeqCst)
    }

    /// Plan entries consumed so far (each `Refused`, `Reset`, `Delay` or `Hang` taken from the
    /// plan counts once, when the attempt takes it).
    pub fn faults_injected(&self) -> usize {
        self.shared.faults.load(Ordering::SeqCst)
    }

    /// Records one attempt and takes what it should do.
    fn next(&self) -> (Option<Duration>, Option<ConnectFault>) {
        self.shared.attempts.fetch_add(1, Ordering::SeqCst);
        let fault = self.shared.plan().pop_front();
        if fault.is_some() {
            self.shared.faults.fetch_add(1, Ordering::SeqCst);
        }
        (*self.shared.each_delay(), fault)
    }
}

impl<S> Layer<S> for FaultConnector {
    type Service = FaultConnectorService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        FaultConnectorService {
            inner,
            plan: self.clone(),
        }
    }
}

/// The service [`FaultConnector`] wraps around reqwest's connector; see there.
#[derive(Clone)]
pub struct FaultConnectorService<S> {
    inner: S,
    plan: FaultConnector,
}

impl<S> fmt::Debug for FaultConnectorService<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FaultConnectorService")
            .field("plan", &self.plan)
            .finish_non_exhaustive()
    }
}

/// The future of one connection attempt through [`FaultConnectorService`].
pub type FaultConnecting<T, E> = Pin<Box<dyn Future<Output = Result<T, E>> + Send>>;

impl<S, R> Service<R> for FaultConnectorService<S>
where
    S: Service<R> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: From<io::Error>,
    R: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = FaultConnecting<S::Response, S::Error>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: R) -> Self::Future {
        let (delay, fault) = self.plan.next();
        // The instance that was polled ready goes with this call; keep a fresh clone for the next.
        let fresh = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, fresh);
        Box::pin(async move {
            if let Some(delay) = delay {
                tokio::time::sleep(delay).await;
            }
            match fault {
                Some(ConnectFault::Hang) => std::future::pending::<()>().await,
                Some(ConnectFault::Delay(delay)) => tokio::time::sleep(delay).await,
                Some(ConnectFault::Refused) => {
                    return Err(injected(io::ErrorKind::ConnectionRefused).into());
                }
                Some(ConnectFault::Reset) => {
                    return Err(injected(io::ErrorKind::ConnectionReset).into());
                }
                None => {}
            }
            inner.call(request).await
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plan_is_fifo_and_shared_between_clones() {
        let faults = FaultConnector::new()
            .fail_first(2, ConnectFault::Refused)
            .then(ConnectFault::Reset);
        let other = faults.clone();
        assert_eq!(other.next(), (None, Some(ConnectFault::Refused)));
        assert_eq!(faults.next(), (None, Some(ConnectFault::Refused)));
        assert_eq!(other.next(), (None, Some(ConnectFault::Reset)));
        assert_eq!(faults.next(), (None, None));
        assert_eq!(faults.attempts(), 4);
        assert_eq!(other.faults_injected(), 3);
    }

    #[test]
    fn clear_empties_plan_and_delay_but_keeps_counters() {
        let faults = FaultConnector::new()
            .delay_each(Duration::from_millis(5))
            .then(ConnectFault::Hang);
        assert_eq!(faults.pending(), 1);
        faults.next();
        faults.push(ConnectFault::Refused);
        faults.clear();
        assert_eq!(faults.pending(), 0);
        assert_eq!(faults.next(), (None, None));
        assert_eq!(faults.attempts(), 2);
        assert_eq!(faults.faults_injected(), 1);
    }
}
