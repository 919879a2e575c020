//! [`ChaosProxy`]: an HTTP/1.1 proxy on loopback that injects one planned [`Fault`] per request
//! between a client and an upstream server (or several, in round robin).
//!
//! This module owns the proxy's lifetime, its fault plan and its counters. It must not know
//! about the sqlhttp SDK, the server crate or the wire protocol beyond canned error bodies.

mod exchange;
mod fault;
mod http1;
mod upstream;

use std::collections::VecDeque;
use std::fmt;
use std::io;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::task::{AbortHandle, JoinSet};

use upstream::Upstreams;

pub use fault::Fault;

/// The bound on every wait of one exchange except [`Fault::Stall`] and [`Fault::Delay`]:
/// reading the client's request, connecting to and hearing back from the upstream, writing the
/// response.
const IO_TIMEOUT: Duration = Duration::from_secs(30);

#[derive(Debug)]
struct Shared {
    upstreams: Upstreams,
    plan: Mutex<VecDeque<Fault>>,
    connections: AtomicUsize,
    requests: AtomicUsize,
    forwarded: AtomicUsize,
}

impl Shared {
    fn plan(&self) -> MutexGuard<'_, VecDeque<Fault>> {
        // A panic while holding the lock cannot leave the queue half-updated: recover it.
        self.plan
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn next_fault(&self) -> Fault {
        self.plan().pop_front().unwrap_or(Fault::Pass)
    }

    fn count_request(&self) {
        self.requests.fetch_add(1, Ordering::SeqCst);
    }

    fn count_forwarded(&self, upstream: usize) {
        self.upstreams.count_forwarded(upstream);
        self.forwarded.fetch_add(1, Ordering::SeqCst);
    }
}

/// A fault-injecting HTTP/1.1 proxy listening on `127.0.0.1`, in front of one upstream
/// ([`start`](Self::start)) or several ([`start_balanced`](Self::start_balanced)).
///
/// Each request takes the next [`Fault`] from a FIFO plan (an empty plan means
/// [`Fault::Pass`]). Every exchange is single-use: the proxy reads one request (head and
/// `Content-Length` body) from a client connection, forwards it over a fresh upstream connection
/// with `Connection: close`, reads the complete response, answers the client with
/// `Connection: close`, and closes both. Clients therefore never reuse a connection through the
/// proxy, which keeps "one request, one fault" exact.
///
/// Limits: chunked request bodies (`Transfer-Encoding`) are refused with `400 Bad Request`,
/// request heads over 64 KiB with `431`, bodies over 64 MiB with `413`; these refusals consume
/// no fault and are not counted as requests. Every wait is bounded by a 30 s I/O timeout,
/// except [`Fault::Delay`] (its own duration) and [`Fault::Stall`] (until the client goes away).
///
/// Dropping the proxy stops accepting and aborts every connection task it started.
///
/// # Several upstreams
///
/// A balanced proxy stands for a load balancer in front of replicas. Each forwarded request
/// goes to the next upstream in round robin (in the order given), over its own connection; a
/// request the proxy answers or drops without forwarding takes no turn. When that upstream
/// cannot be connected to (it is down), the proxy tries the following ones in order, once
/// around, and answers `502 Bad Gateway` only when no upstream took the connection. That
/// failover is always safe: an upstream that never took the connection saw nothing of the
/// request. A failure after the request was sent (the upstream dies mid-request, closes without
/// a complete response, or does not answer in time) is never sent elsewhere: the upstream may
/// have done the work, so the client gets the `502`/`504` and decides. Faults apply per request
/// as with one upstream; [`forwarded_to`](Self::forwarded_to) and
/// [`failed_connects_to`](Self::failed_connects_to) tell where requests went.
///
/// ```
/// use sqlhttp_testkit::{ChaosProxy, Fault};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> std::io::Result<()> {
/// # let upstream = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
/// # let upstream_addr = upstream.local_addr()?;
/// let proxy = ChaosProxy::start(upstream_addr).await?;
/// proxy.push(Fault::DropAfterForward);
/// proxy.push(Fault::rate_limited(2));
/// // Point the client under test at proxy.url() instead of the server ...
/// assert!(proxy.url().starts_with("http://127.0.0.1:"));
/// assert_eq!(proxy.pending(), 2);
/// assert_eq!(proxy.requests(), 0);
/// # Ok(())
/// # }
/// ```
pub struct ChaosProxy {
    addr: SocketAddr,
    shared: Arc<Shared>,
    accept_loop: AbortHandle,
}

impl fmt::Debug for ChaosProxy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ChaosProxy")
            .field("addr", &self.addr)
            .field("upstreams", &self.upstreams())
            .field("plan", &*self.shared.plan())
            .field("connections", &self.connections())
            .field("requests", &self.requests())
            .field("forwarded", &self.forwarded())
            .finish()
    }
}

impl ChaosProxy {
    /// Starts a proxy on `127.0.0.1` (an ephemeral port) in front of `upstream`, with an empty
    /// plan. Must be called within a tokio runtime.
    ///
    /// # Errors
    /// When the proxy cannot listen.
    pub async fn start(upstream: SocketAddr) -> io::Result<ChaosProxy> {
        ChaosProxy::start_balanced([upstream]).await
    }

    /// Starts a proxy on `127.0.0.1` (an ephemeral port) that balances requests over
    /// `upstreams` in round robin, failing over past upstreams that refuse the connection (see
    /// [Several upstreams](Self#several-upstreams)), with an empty plan. Must be called within a
    /// tokio runtime.
    ///
    /// ```
    /// use sqlhttp_testkit::ChaosProxy;
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> std::io::Result<()> {
    /// # let a = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    /// # let b = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    /// # let (replica_a, replica_b) = (a.local_addr()?, b.local_addr()?);
    /// // Two replicas of one service: requests alternate between them, starting with replica_a.
    /// let proxy = ChaosProxy::start_balanced([replica_a, replica_b]).await?;
    /// assert_eq!(proxy.upstreams(), [replica_a, replica_b]);
    /// assert_eq!(proxy.forwarded_to(replica_b), 0);
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    /// `InvalidInput` when `upstreams` is empty; otherwise when the proxy cannot listen.
    pub async fn start_balanced(
        upstreams: impl IntoIterator<Item = SocketAddr>,
    ) -> io::Result<ChaosProxy> {
        let upstreams = Upstreams::new(upstreams.into_iter().collect())?;
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).await?;
        let addr = listener.local_addr()?;
        let shared = Arc::new(Shared {
            upstreams,
            plan: Mutex::default(),
            connections: AtomicUsize::new(0),
            requests: AtomicUsize::new(0),
            forwarded: AtomicUsize::new(0),
        });
        let accept_loop = tokio::spawn(accept_loop(listener, Arc::clone(&shared))).abort_handle();
        Ok(ChaosProxy {
            addr,
            shared,
            accept_loop,
        })
    }

    /// The address the proxy listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The proxy's base URL, `http://127.0.0.1:PORT` (no trailing slash).
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The upstream every forwarded request goes to; for a balanced proxy, the first of its
    /// upstreams.
    pub fn upstream(&self) -> SocketAddr {
        self.upstreams()[0]
    }

    /// Every upstream, in round-robin order (one for a proxy made by [`start`](Self::start)).
    pub fn upstreams(&self) -> &[SocketAddr] {
        self.shared.upstreams.addrs()
    }

    /// Appends one fault to the plan.
    pub fn push(&self, fault: Fault) {
        self.shared.plan().push_back(fault);
    }

    /// Appends several faults to the plan, in order.
    pub fn push_all(&self, faults: impl IntoIterator<Item = Fault>) {
        self.shared.plan().extend(faults);
    }

    /// Empties the plan: later requests pass. Counters are kept.
    pub fn clear(&self) {
        self.shared.plan().clear();
    }

    /// Faults still waiting in the plan.
    pub fn pending(&self) -> usize {
        self.shared.plan().len()
    }

    /// Client connections accepted so far.
    pub fn connections(&self) -> usize {
        self.shared.connections.load(Ordering::SeqCst)
    }

    /// Complete requests received from clients so far (each consumed one fault).
    pub fn requests(&self) -> usize {
        self.shared.requests.load(Ordering::SeqCst)
    }

    /// Requests written in full to the upstream so far (the upstream saw them, whatever
    /// happened to the response).
    pub fn forwarded(&self) -> usize {
        self.shared.forwarded.load(Ordering::SeqCst)
    }

    /// Requests written in full to `upstream` so far; 0 when it is not one of the upstreams.
    /// Over all upstreams these add up to [`forwarded`](Self::forwarded).
    pub fn forwarded_to(&self, upstream: SocketAddr) -> usize {
        self.shared.upstreams.forwarded_to(upstream)
    }

    /// Connection attempts to `upstream` that failed so far (refused, say, because it is down);
    /// 0 when it is not one of the upstreams. Each of them was failed over to the next upstream
    /// or, when none was left, answered with `502`.
    pub fn failed_connects_to(&self, upstream: SocketAddr) -> usize {
        self.shared.upstreams.failed_connects_to(upstream)
    }
}

impl Drop for ChaosProxy {
    fn drop(&mut self) {
        // Aborting the accept loop drops its listener and its JoinSet, which aborts every
        // connection task.
        self.accept_loop.abort();
    }
}

async fn accept_loop(listener: TcpListener, shared: Arc<Shared>) {
    let mut connections = JoinSet::new();
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((client, _)) => {
                    shared.connections.fetch_add(1, Ordering::SeqCst);
                    let shared = Arc::clone(&shared);
                    connections.spawn(async move {
                        exchange::serve(client, &shared).await;
                    });
                }
                Err(error) => {
                    // Out of descriptors and the like: back off briefly instead of spinning.
                    tracing::debug!(%error, "chaos proxy: accept failed");
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
            },
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
        }
    }
}
