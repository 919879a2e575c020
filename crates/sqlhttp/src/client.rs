//! [`Client`], the entry point, and [`ClientBuilder`], which validates its configuration.
//!
//! A `Client` is an `Arc` around the transport and its settings: cloning it is cheap, and clones share
//! one connection pool, one random source, one retry budget and one bookmark session. The methods here only say what to send
//! and with which operation class; the transport decides how.

use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use http::HeaderValue;
use serde::Serialize;
use tokio_util::sync::CancellationToken;

use crate::batch::{Batch, BatchLimits};
use crate::bookmark::{Bookmark, Session};
use crate::error::{Error, Result};
use crate::insert::{Insert, InsertLimits};
use crate::retry::rate::AdaptiveRate;
use crate::retry::{RetryBudget, RetryPolicy, TokenBucket};
use crate::statement::{Execute, Query, TableQuery, Target};
use crate::transport::hedge::{HedgePolicy, Hedging};
use crate::transport::metrics::Metrics;
use crate::transport::trace::TraceSettings;
use crate::transport::{Call, Delivered, Exchange, HttpExchange, Receive, Transport};

/// The path of the protocol's statement endpoint, relative to the server's base URL.
const ENDPOINT: &str = sqlhttp_protocol::path::SQL.split_at(1).1;
/// The path of the protocol's batch endpoint, relative to the server's base URL.
const BATCH_ENDPOINT: &str = sqlhttp_protocol::path::BATCH.split_at(1).1;
/// The describe endpoint, relative to the base URL.
const DESCRIBE_ENDPOINT: &str = sqlhttp_protocol::path::DESCRIBE.split_at(1).1;

/// A client for a server speaking the sqlhttp protocol.
///
/// Cheap to clone: you do not have to wrap it in an `Rc` or `Arc`. Clones share the connection pool,
/// the retry budget and the bookmark session ([`bookmark`](Self::bookmark)).
///
/// ```no_run
/// # async fn run() -> sqlhttp::Result<()> {
/// use serde::Deserialize;
///
/// #[derive(Deserialize)]
/// struct User { id: i64, name: String }
///
/// let client = sqlhttp::Client::builder("http://127.0.0.1:8080").build()?;
/// let users: Vec<User> = client
///     .query("SELECT id, name FROM users WHERE id > ?")
///     .bind(10)
///     .fetch_all()
///     .await?;
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct Client {
    inner: Arc<Inner>,
}

struct Inner {
    endpoint: reqwest::Url,
    transport: Transport,
    insert_limits: InsertLimits,
    batch_limits: BatchLimits,
}

impl Client {
    /// Starts configuring a client for the server at `base_url` (e.g. `http://127.0.0.1:8080`).
    pub fn builder(base_url: impl Into<String>) -> ClientBuilder {
        ClientBuilder::new(base_url.into())
    }

    /// Checks that the server answers and runs statements (`SELECT 1`). A verified read: retried.
    ///
    /// # Errors
    ///
    /// Any failure of the call, after retries.
    pub async fn ping(&self) -> Result<()> {
        let _: Vec<i64> = self.query("SELECT 1").fetch_all().await?;
        Ok(())
    }

    /// A query whose rows are decoded into a type of yours. A **read**: retried on transient failures.
    ///
    /// A read the server verifies: the request says `"read_only": true`, and `sqlhttpd` refuses a
    /// statement that could write before it runs ([`ErrorKind::ReadOnly`](crate::ErrorKind::ReadOnly),
    /// nothing written), so a retried `query` can never write, let alone twice. Use
    /// [`execute`](Self::execute) or [`insert`](Self::insert) for writes. (A server that ignores the
    /// flag, one that predates it or another implementation, would run a write sent here; see the
    /// README's "What is retried".)
    pub fn query(&self, sql: impl Into<String>) -> Query {
        Query::new(Target::Client(self.clone()), sql.into())
    }

    /// A query whose result comes back as a [`Table`](crate::Table): columns with their types and rows of
    /// dynamically typed cells. A **read**, verified by the server and retried on transient failures,
    /// as [`query`](Self::query) is.
    ///
    /// # Errors
    ///
    /// Any failure of the call after retries; [`ErrorKind::Decode`](crate::ErrorKind::Decode) when the
    /// body is not a protocol v1 result.
    pub fn query_table(&self, sql: impl Into<String>) -> TableQuery {
        TableQuery::new(Target::Client(self.clone()), sql.into())
    }

    /// A statement run for its effect (DDL, `UPDATE`, `DELETE`, an `INSERT` you wrote yourself); `.await`
    /// it for the rows affected and the last insert id.
    ///
    /// **Never retried**, whatever the configuration: the SDK cannot know whether the statement is safe
    /// to run twice (`UPDATE t SET n = n + 1` is not), so a failure comes back after one attempt and the
    /// caller decides. Conversely, an `INSERT` sent through [`query`](Self::query) instead of `execute`
    /// is miscategorised as a read and would be retried.
    ///
    /// A timeout, a lost connection or a cancellation does not tell whether the server committed the
    /// statement: after one, check before running it again.
    ///
    /// # Errors
    ///
    /// Any failure of the one attempt (see [`ErrorKind`](crate::ErrorKind)).
    pub fn execute(&self, sql: impl Into<String>) -> Execute {
        Execute::new(Target::Client(self.clone()), sql.into())
    }

    /// Inserts `rows` (structs or maps, all with the same fields) into `table` with parameterized
    /// multi-row `INSERT` statements; `.await` it for the number of rows inserted.
    ///
    /// A **write**: retried only under [`ClientBuilder::retry_writes`]. Each generated statement carries an
    /// `Idempotency-Key`, the same on every attempt, so a server that honours it applies it once.
    /// Large inputs are split to respect the engine's bound-parameter limit and the body limit (see
    /// [`ClientBuilder::insert_max_params`], [`ClientBuilder::insert_max_bytes`]); every row is checked
    /// before the first statement is sent. `table` is one identifier, quoted as given.
    /// [`RetryPolicy::max_elapsed`] bounds the whole insert, all its statements together.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::InvalidParameter`](crate::ErrorKind::InvalidParameter) or
    /// [`ErrorKind::PayloadTooLarge`](crate::ErrorKind::PayloadTooLarge) before anything is sent, when a
    /// row cannot be inserted; otherwise the failure of a statement, with
    /// [`Error::rows_inserted`](crate::Error::rows_inserted) when earlier statements committed.
    pub fn insert<'r, T: Serialize + Sync>(&self, table: &str, rows: &'r [T]) -> Insert<'r, T> {
        Insert::new(Target::Client(self.clone()), table.to_owned(), rows)
    }

    /// Several statements run in order in **one transaction** on the server, committed only if all
    /// succeed (`POST /api/v1/batch`). Add statements with [`Batch::statement`], bind each one's
    /// parameters with [`Batch::bind`], and `.await` it for one [`Table`](crate::Table) per statement.
    ///
    /// A write batch is a **write**: retried only under `retry_writes`, with one idempotency key on
    /// all attempts, so a server that honours keys applies it exactly once. A
    /// [`read_only`](Batch::read_only) batch is a **read** (one consistent snapshot): retried by
    /// default. See [`Batch`].
    pub fn batch(&self) -> Batch {
        Batch::new(self.clone())
    }

    /// The greatest [`Bookmark`] this client and its clones have seen in an answer (or were given),
    /// `None` before the first (and always against SQLite, which sends none).
    ///
    /// Every request carries it (`Sqlhttp-Bookmark`), so a read served by a replica reflects every
    /// write this client made or saw, and never goes back before an earlier read. Hand it to another
    /// process (a cookie, a job's payload, as its string) to carry the guarantee there:
    ///
    /// ```no_run
    /// # async fn run(client: sqlhttp::Client) -> Result<(), Box<dyn std::error::Error>> {
    /// client.execute("UPDATE users SET name = 'Ada' WHERE id = 1").await?;
    /// let handed_over: Option<String> = client.bookmark().map(|b| b.to_string());
    ///
    /// // In the process that receives it (a web request's cookie, say):
    /// let bookmark: Option<sqlhttp::Bookmark> = handed_over.map(|text| text.parse()).transpose()?;
    /// let other = sqlhttp::Client::builder("http://127.0.0.1:8080").bookmark(bookmark).build()?;
    /// let name: String = other.query("SELECT name FROM users WHERE id = 1").fetch_one().await?;
    /// assert_eq!(name, "Ada");
    /// # Ok(())
    /// # }
    /// ```
    pub fn bookmark(&self) -> Option<Bookmark> {
        self.inner.transport.session.get()
    }

    /// Merges `bookmark` into this client's session (shared with its clones): from now on every
    /// request is at least as fresh as it. One older than the session's changes nothing. For a
    /// long-lived client that receives a bookmark from elsewhere (a job, a message); a single call
    /// can take one with [`Query::bookmark`](crate::Query::bookmark) instead.
    pub fn observe_bookmark(&self, bookmark: Bookmark) {
        self.inner.transport.session.observe(bookmark);
    }

    /// Forgets this client's bookmark, for it and every clone (they share one session): the next
    /// request carries none, and the session starts again from the next answer's.
    ///
    /// Call it when the bookmark may belong to another history: **after a failover** to a new
    /// primary (whose log may be behind the old one's), or when the client is **moved to another
    /// cluster**. Otherwise a bookmark past everything the new primary wrote makes each request
    /// wait for a position that never comes. The SDK also drops it by itself when a server
    /// answers `409 BOOKMARK_AHEAD` ([`ErrorKind::BookmarkAhead`](crate::ErrorKind::BookmarkAhead)).
    /// Reads after a reset may miss writes made before it; see [`Consistency`](crate::Consistency).
    ///
    /// ```no_run
    /// # fn run(client: sqlhttp::Client) {
    /// // The operator failed the database over to its standby:
    /// client.reset_bookmark();
    /// assert_eq!(client.bookmark(), None);
    /// # }
    /// ```
    pub fn reset_bookmark(&self) {
        self.inner.transport.session.reset();
    }

    /// What this client's retry budget and adaptive send rate allow now, shared by every clone: the
    /// tokens left and the bucket's capacity, and the attempts per second the rate allows (see
    /// [`RetryState`](crate::RetryState)). A snapshot: read it again for a later one.
    ///
    /// ```
    /// let client = sqlhttp::Client::builder("http://127.0.0.1:8080").build()?;
    /// let state = client.retry_state();
    /// if let (Some(tokens), Some(capacity)) = (state.tokens(), state.capacity()) {
    ///     println!("retry budget: {tokens} of {capacity} tokens");
    /// }
    /// # Ok::<(), sqlhttp::Error>(())
    /// ```
    pub fn retry_state(&self) -> crate::RetryState {
        self.inner.transport.retry_state()
    }

    pub(crate) fn insert_limits(&self) -> InsertLimits {
        self.inner.insert_limits
    }

    pub(crate) fn batch_limits(&self) -> BatchLimits {
        self.inner.batch_limits
    }

    /// The client's transport: its retry policy, budget and random source (for
    /// [`Client::transact`]'s runs).
    pub(crate) fn transport(&self) -> &crate::transport::Transport {
        &self.inner.transport
    }

    /// Sends a call the request builders made, handing the response body to `receiver` until it is
    /// served; a setting that cannot work fails before anything is sent.
    pub(crate) async fn send(
        &self,
        call: Call<'_>,
        receiver: &mut dyn Receive,
    ) -> Result<Delivered> {
        call.options.validate()?;
        self.inner.transport.send(call, receiver).await
    }
}

impl fmt::Debug for Client {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let t = &self.inner.transport;
        f.debug_struct("Client")
            .field("endpoint", &self.inner.endpoint.as_str())
            .field("timeout", &t.timeout)
            .field("retry", &t.policy)
            .field("retry_writes", &t.retry_writes)
            .field("retry_budget", &t.budget.as_ref().map(|b| b.settings()))
            .field("bookmark", &t.session.get())
            .finish_non_exhaustive()
    }
}

/// The URL with any password replaced, for printing.
fn redacted(url: &str) -> String {
    match reqwest::Url::parse(url) {
        Ok(mut url) => {
            if url.password().is_some() {
                let _ = url.set_password(Some("***"));
            }
            url.to_string()
        }
        Err(_) => "<not a URL>".to_owned(),
    }
}

/// Configures and builds a [`Client`]. Setters never fail; [`build`](Self::build) reports the first
/// problem.
pub struct ClientBuilder {
    base_url: String,
    bearer_token: Option<String>,
    user_agent: String,
    timeout: Option<Duration>,
    http_client: Option<reqwest::Client>,
    #[cfg(feature = "test-util")]
    simulated: Option<crate::simulation::SimulatedServer>,
    policy: RetryPolicy,
    retry_writes: bool,
    budget: Option<RetryBudget>,
    adaptive_rate: bool,
    hedge: Option<HedgePolicy>,
    cancel: Option<CancellationToken>,
    insert_limits: InsertLimits,
    batch_limits: BatchLimits,
    net: NetSettings,
    bookmark: Option<Bookmark>,
    trace_query_text: bool,
}

/// Settings of the HTTP client the SDK builds (none apply to a caller-supplied one).
#[derive(Debug, Clone)]
struct NetSettings {
    connect_timeout: Option<Duration>,
    pool_idle_timeout: Option<Duration>,
    tcp_keepalive: Option<Duration>,
    proxy: Option<reqwest::Proxy>,
    #[cfg(any(feature = "rustls", feature = "native-tls"))]
    root_certificates: Vec<reqwest::Certificate>,
    #[cfg(any(feature = "rustls", feature = "native-tls"))]
    identity: Option<reqwest::Identity>,
    /// Whether any was set: they cannot apply to a caller-supplied client.
    changed: bool,
}

impl Default for NetSettings {
    fn default() -> Self {
        Self {
            connect_timeout: Some(DEFAULT_CONNECT_TIMEOUT),
            pool_idle_timeout: Some(DEFAULT_POOL_IDLE_TIMEOUT),
            tcp_keepalive: Some(DEFAULT_TCP_KEEPALIVE),
            proxy: None,
            #[cfg(any(feature = "rustls", feature = "native-tls"))]
            root_certificates: Vec::new(),
            #[cfg(any(feature = "rustls", feature = "native-tls"))]
            identity: None,
            changed: false,
        }
    }
}

const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// Below the idle timeouts of common load balancers (60 s for AWS ALB/ELB and GCP's, 350 s for AWS NLB),
/// so the client closes an idle connection before a balancer silently drops it.
const DEFAULT_POOL_IDLE_TIMEOUT: Duration = Duration::from_secs(50);
const DEFAULT_TCP_KEEPALIVE: Duration = Duration::from_secs(30);

/// Whether this build of the crate can speak TLS.
const TLS_AVAILABLE: bool = cfg!(any(feature = "rustls", feature = "native-tls"));

/// Parses the base URL, with the fix for the usual slips: no scheme (`127.0.0.1:8080`,
/// `localhost:8080`, which parses with `localhost` as its scheme) and an endpoint's path
/// (`http://host/api/v1/sql`, which the client would double).
fn parse_base_url(input: &str) -> Result<reqwest::Url> {
    let without_scheme = !input.contains("://");
    let suggest_http = || {
        // Shown as a URL would be, never with credentials or a query (a token may be there).
        let shown = match reqwest::Url::parse(&format!("http://{input}")) {
            Ok(mut url) => {
                let _ = url.set_username("");
                let _ = url.set_password(None);
                url.set_query(None);
                url.as_str().trim_end_matches('/').to_owned()
            }
            Err(_) => "http://HOST:PORT".to_owned(),
        };
        Error::config(format!(
            "invalid base URL: it has no scheme; did you mean \"{shown}\"?"
        ))
    };
    let base = match reqwest::Url::parse(input) {
        Ok(url) if without_scheme && !matches!(url.scheme(), "http" | "https") => {
            return Err(suggest_http());
        }
        Ok(url) => url,
        Err(_) if without_scheme => return Err(suggest_http()),
        Err(err) => return Err(Error::config(format!("invalid base URL: {err}"))),
    };
    let path = base.path().trim_end_matches('/');
    for endpoint in [
        sqlhttp_protocol::path::SQL,
        sqlhttp_protocol::path::BATCH,
        sqlhttp_protocol::path::DESCRIBE,
        sqlhttp_protocol::path::API_PREFIX,
    ] {
        if let Some(prefix) = path.strip_suffix(endpoint) {
            let mut fixed = base.clone();
            fixed.set_path(if prefix.is_empty() { "/" } else { prefix });
            return Err(Error::config(format!(
                "the base URL names the API path {endpoint:?}, which the client adds itself; \
                 use \"{}\"",
                redacted(fixed.as_str()).trim_end_matches('/')
            )));
        }
    }
    Ok(base)
}

/// Refuses an `https` URL when the SDK's own client could not speak TLS.
fn check_scheme(scheme: &str, tls_available: bool) -> Result<()> {
    match scheme {
        "http" => Ok(()),
        "https" if tls_available => Ok(()),
        "https" => Err(Error::config(
            "the base URL is https but sqlhttp was built without TLS; enable its `rustls` (default) \
             or `native-tls` feature",
        )),
        other => Err(Error::config(format!(
            "base URL scheme must be http or https, not {other:?}"
        ))),
    }
}

impl ClientBuilder {
    fn new(base_url: String) -> Self {
        Self {
            base_url,
            bearer_token: None,
            user_agent: concat!("sqlhttp-rust/", env!("CARGO_PKG_VERSION")).to_owned(),
            timeout: Some(Duration::from_secs(30)),
            http_client: None,
            #[cfg(feature = "test-util")]
            simulated: None,
            policy: RetryPolicy::new(),
            retry_writes: false,
            budget: Some(RetryBudget::new()),
            adaptive_rate: false,
            hedge: None,
            cancel: None,
            insert_limits: InsertLimits::default(),
            batch_limits: BatchLimits::default(),
            net: NetSettings::default(),
            bookmark: None,
            trace_query_text: false,
        }
    }

    // Connection options

    /// Sends `Authorization: Bearer <token>` on every request. The token never appears in `Debug`,
    /// `Display`, errors or logs. Default: none.
    #[must_use]
    pub fn bearer_token(mut self, token: impl Into<String>) -> Self {
        self.bearer_token = Some(token.into());
        self
    }

    /// The `User-Agent` header. Default: `sqlhttp-rust/<version>`.
    #[must_use]
    pub fn user_agent(mut self, user_agent: impl Into<String>) -> Self {
        self.user_agent = user_agent.into();
        self
    }

    /// Uses this reqwest client (its pool, TLS settings and connector) for every attempt, for instance
    /// one with a connector layer from `sqlhttp-testkit`. Build it with
    /// `.retry(reqwest::retry::never())` and `.redirect(reqwest::redirect::Policy::none())`: reqwest's
    /// own retries would make the attempt counts this SDK reports untrue, and following a redirect
    /// turns a POST into a GET that runs nothing (or re-sends it uncounted). The transport settings
    /// below (connect timeout, pool, keepalive, proxy, certificates) are then yours to set on it:
    /// setting them here too is refused by [`build`](Self::build).
    /// Default: a client built by the SDK with both off.
    #[must_use]
    pub fn http_client(mut self, client: reqwest::Client) -> Self {
        self.http_client = Some(client);
        self
    }

    /// Sends every attempt to `server`, a function of yours, instead of over HTTP (feature
    /// `test-util`): see the [`simulation`](crate::simulation) module. Everything but the network is
    /// the real client. Default: HTTP.
    #[cfg(feature = "test-util")]
    #[cfg_attr(docsrs, doc(cfg(feature = "test-util")))]
    #[must_use]
    pub fn simulated_server<F, Fut>(mut self, server: F) -> Self
    where
        F: Fn(crate::simulation::Request) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = std::io::Result<crate::simulation::Response>> + Send + 'static,
    {
        self.simulated = Some(crate::simulation::SimulatedServer::new(server));
        self
    }

    // Transport options (the SDK's own HTTP client)

    /// How long establishing a connection (TCP and TLS) may take; `None` leaves it to the attempt's
    /// timeout. A failed connect sent nothing, so it is retried like a refused connection and
    /// [`Error::is_sent`](crate::Error::is_sent) is `false`. Default: 10 s.
    #[must_use]
    pub fn connect_timeout(mut self, timeout: impl Into<Option<Duration>>) -> Self {
        self.net.connect_timeout = timeout.into();
        self.net.changed = true;
        self
    }

    /// How long an idle pooled connection is kept; `None` keeps it until the server closes it.
    /// Default: 50 s, below the 60 s idle timeout of common load balancers, so the client does not reuse
    /// a connection a balancer has silently dropped.
    #[must_use]
    pub fn pool_idle_timeout(mut self, timeout: impl Into<Option<Duration>>) -> Self {
        self.net.pool_idle_timeout = timeout.into();
        self.net.changed = true;
        self
    }

    /// TCP keepalive on every connection, probing after this long idle; `None` turns it off.
    /// Default: 30 s.
    #[must_use]
    pub fn tcp_keepalive(mut self, interval: impl Into<Option<Duration>>) -> Self {
        self.net.tcp_keepalive = interval.into();
        self.net.changed = true;
        self
    }

    /// Sends every request through this proxy (see [`reqwest::Proxy`]). Default: none; the
    /// environment's proxy variables are not read.
    #[must_use]
    pub fn proxy(mut self, proxy: reqwest::Proxy) -> Self {
        self.net.proxy = Some(proxy);
        self.net.changed = true;
        self
    }

    /// Trusts this certificate authority too, beside the built-in roots (a private CA, say).
    /// Repeatable. Needs the `rustls` (default) or `native-tls` feature.
    #[cfg(any(feature = "rustls", feature = "native-tls"))]
    #[cfg_attr(docsrs, doc(cfg(any(feature = "rustls", feature = "native-tls"))))]
    #[must_use]
    pub fn add_root_certificate(mut self, certificate: reqwest::Certificate) -> Self {
        self.net.root_certificates.push(certificate);
        self.net.changed = true;
        self
    }

    /// Presents this client certificate to servers that ask for one (mutual TLS). With `rustls`, build
    /// it with [`reqwest::Identity::from_pem`] (certificate chain and private key in one PEM); with
    /// `native-tls`, with `Identity::from_pkcs8_pem` or `from_pkcs12_der`. Default: none.
    #[cfg(any(feature = "rustls", feature = "native-tls"))]
    #[cfg_attr(docsrs, doc(cfg(any(feature = "rustls", feature = "native-tls"))))]
    #[must_use]
    pub fn identity(mut self, identity: reqwest::Identity) -> Self {
        self.net.identity = Some(identity);
        self.net.changed = true;
        self
    }

    // Timeout options

    /// The longest **one attempt** waits for the response head, and then for each further piece of
    /// the body (a stall), so a long download that keeps arriving is never cut. Each attempt gets all
    /// of it. `None` lets an attempt wait as long as the server takes (bounded only by
    /// [`RetryPolicy::max_elapsed`] while the call may still be retried). Default: 30 s.
    #[must_use]
    pub fn timeout(mut self, timeout: impl Into<Option<Duration>>) -> Self {
        self.timeout = timeout.into();
        self
    }

    // Retry options

    /// Attempts, backoff and the elapsed-time ceiling. Default: [`RetryPolicy::new()`].
    #[must_use]
    pub fn retry(mut self, policy: RetryPolicy) -> Self {
        self.policy = policy;
        self
    }

    /// Retries writes (`insert`) too when `true`. Default: `false`.
    ///
    /// Each write call sends one `Idempotency-Key` on all its attempts. The reference server stores the
    /// outcome under that key and replays it, so a retried write is applied exactly once. **Against a
    /// server that ignores the key, a write whose response was lost after the server committed it is
    /// applied twice when retried.** Turn this on only for such servers if duplicates are harmless.
    /// `execute` is never retried, whatever this says.
    #[must_use]
    pub fn retry_writes(mut self, enabled: bool) -> Self {
        self.retry_writes = enabled;
        self
    }

    // Observability options

    /// With `true`, each call's span carries the statement's text as `db.query.text`
    /// (OpenTelemetry's database conventions). Default: `false`, the span carries only
    /// `db.query.summary` (the operation and the table it names, read off the statement's first
    /// words; never a literal).
    ///
    /// The text is the SQL as written: bound values are never in it (they travel apart, and no
    /// span or log carries them), but a literal written into the SQL is. Turn it on when the
    /// statements' text is fit for the tracing backend.
    #[must_use]
    pub fn trace_query_text(mut self, enabled: bool) -> Self {
        self.trace_query_text = enabled;
        self
    }

    /// The client-wide retry budget shared by all clones, or `None` to retry without one.
    /// Default: [`RetryBudget::new()`].
    #[must_use]
    pub fn retry_budget(mut self, budget: impl Into<Option<RetryBudget>>) -> Self {
        self.budget = budget.into();
        self
    }

    /// With `true`, the client (with its clones) paces its own attempts after the server throttles
    /// it (a `429`, a `503` with `Retry-After`): the send rate falls to 0.7 of what it was sending,
    /// then climbs back as a cubic of the time since as answers come without throttles, never above
    /// twice the rate it measures itself sending, never below one attempt every two seconds (the
    /// AWS SDKs' `adaptive` mode, ADR 0054). While it limits, any attempt, a call's first included,
    /// may wait for its turn, except a transaction's steps (the server holds their locks
    /// meanwhile). A cancelled or dropped call stops waiting at once and gives its turn back; one
    /// whose turn is more than its policy's `max_backoff` away, or past its `max_elapsed`, fails
    /// without sending, with [`ErrorKind::ClientRateLimited`](crate::ErrorKind::ClientRateLimited).
    /// [`Client::retry_state`] shows the rate. Default: `false` (nothing is paced).
    #[must_use]
    pub fn adaptive_rate(mut self, enabled: bool) -> Self {
        self.adaptive_rate = enabled;
        self
    }

    /// Hedges verified reads (`query`, `query_table`, a read-only `batch`; never a write, an
    /// `execute` or a transaction's step): a read whose answer has not begun after the policy's
    /// delay (fixed, or a percentile of this client's recent reads) is sent a second time on
    /// another connection, which a load balancer in front of several servers hands to another
    /// one; the first answer wins and the other request is dropped. A hedge budget keeps hedges
    /// to a share of recent reads ([`HedgePolicy::with_max_percent`], 10%), so a partial outage
    /// does not double the load. A call can turn it on or off with `.hedge(bool)`.
    /// `None` turns it off. Default: off.
    #[must_use]
    pub fn hedge_reads(mut self, policy: impl Into<Option<HedgePolicy>>) -> Self {
        self.hedge = policy.into();
        self
    }

    /// Cancels every call of this client (and its clones) when `token` is cancelled, as a call's own
    /// [`cancel_on`](crate::Query::cancel_on) cancels that call (the client keeps a clone of the
    /// token). A cancelled token stays cancelled: from then on every call fails at once with
    /// `Cancelled`, so use a child token (`token.child_token()`) per client you may want to keep.
    /// Default: none.
    #[must_use]
    pub fn cancel_on(mut self, token: &CancellationToken) -> Self {
        self.cancel = Some(token.clone());
        self
    }

    // Insert options

    /// The most bound parameters one generated `INSERT` may carry. Default: 32 766 (SQLite's limit).
    #[must_use]
    pub fn insert_max_params(mut self, max: usize) -> Self {
        self.insert_limits.max_params = max;
        self
    }

    /// The largest request body `insert` generates; match the server's limit. Default: the
    /// reference server's `--max-body-bytes`,
    /// [`MAX_BODY_BYTES`](sqlhttp_protocol::defaults::MAX_BODY_BYTES) (6 MiB).
    #[must_use]
    pub fn insert_max_bytes(mut self, max: usize) -> Self {
        self.insert_limits.max_body_bytes = max;
        self
    }

    // Consistency options

    /// Starts the client's bookmark session at `bookmark` (one handed over from another process: a
    /// cookie, a job's payload), so its first request is already at least as fresh as it; see
    /// [`Client::bookmark`]. `None` starts empty. Default: `None`.
    #[must_use]
    pub fn bookmark(mut self, bookmark: impl Into<Option<Bookmark>>) -> Self {
        self.bookmark = bookmark.into();
        self
    }

    // Batch options

    /// The most statements one [`batch`](Client::batch) (or [`atomic`](crate::Insert::atomic) insert)
    /// may hold; a larger one fails before anything is sent. Match the server's limit. Default: the
    /// reference server's `--max-batch-statements`,
    /// [`MAX_BATCH_STATEMENTS`](sqlhttp_protocol::defaults::MAX_BATCH_STATEMENTS) (100).
    #[must_use]
    pub fn batch_max_statements(mut self, max: usize) -> Self {
        self.batch_limits.max_statements = max;
        self
    }

    /// The largest batch request body the client sends; a larger batch fails before anything is sent.
    /// Match the server's limit. Default: the reference server's `--max-batch-bytes`,
    /// [`MAX_BATCH_BYTES`](sqlhttp_protocol::defaults::MAX_BATCH_BYTES) (8 MiB).
    #[must_use]
    pub fn batch_max_bytes(mut self, max: usize) -> Self {
        self.batch_limits.max_body_bytes = max;
        self
    }

    /// Builds the client.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::Config`](crate::ErrorKind::Config) when:
    /// - the base URL does not parse, or its scheme is not `http` or `https`, or it is `https` and the
    ///   crate was built without a TLS feature (and no [`http_client`](Self::http_client) was given);
    /// - transport settings were given together with an [`http_client`](Self::http_client);
    /// - the bearer token or user agent cannot be sent as a header value;
    /// - the hedge policy cannot work (a percentile outside 1 to 99, `max_percent` outside 1 to 100);
    /// - the retry policy cannot work (zero attempts, `initial_backoff` above `max_backoff`, a zero
    ///   `max_elapsed`), or the timeout is zero;
    /// - an insert or batch limit is zero;
    /// - the HTTP client cannot be built.
    pub fn build(self) -> Result<Client> {
        let mut base = parse_base_url(&self.base_url)?;
        if !base.username().is_empty() || base.password().is_some() {
            // reqwest would send them as Basic credentials beside the bearer token, and they would
            // show wherever the URL is printed.
            return Err(Error::config(
                "the base URL must not carry credentials; use bearer_token",
            ));
        }
        // A caller-supplied client brings its own TLS (or lack of it).
        check_scheme(base.scheme(), TLS_AVAILABLE || self.http_client.is_some())?;
        if !base.path().ends_with('/') {
            let path = format!("{}/", base.path());
            base.set_path(&path);
        }
        let endpoint = base
            .join(ENDPOINT)
            .map_err(|err| Error::config(format!("invalid base URL: {err}")))?;
        let authorization = self
            .bearer_token
            .map(|token| {
                let mut value = HeaderValue::try_from(format!("Bearer {token}")).map_err(|_| {
                    Error::config("the bearer token contains characters not allowed in a header")
                })?;
                value.set_sensitive(true);
                Ok::<_, Error>(value)
            })
            .transpose()?;
        let user_agent = HeaderValue::try_from(self.user_agent).map_err(|_| {
            Error::config("the user agent contains characters not allowed in a header")
        })?;
        self.policy.validate().map_err(Error::config)?;
        if let Some(hedge) = &self.hedge {
            hedge.validate().map_err(Error::config)?;
        }
        if self.timeout == Some(Duration::ZERO) {
            return Err(Error::config("timeout must be larger than zero"));
        }
        if self.insert_limits.max_params == 0 || self.insert_limits.max_body_bytes == 0 {
            return Err(Error::config("insert limits must be larger than zero"));
        }
        if self.batch_limits.max_statements == 0 || self.batch_limits.max_body_bytes == 0 {
            return Err(Error::config("batch limits must be larger than zero"));
        }
        let batch_endpoint = base
            .join(BATCH_ENDPOINT)
            .map_err(|err| Error::config(format!("invalid base URL: {err}")))?;
        let describe_endpoint = base
            .join(DESCRIBE_ENDPOINT)
            .map_err(|err| Error::config(format!("invalid base URL: {err}")))?;
        #[cfg(feature = "test-util")]
        let simulated = self.simulated;
        #[cfg(not(feature = "test-util"))]
        let simulated: Option<std::convert::Infallible> = None;
        let http = match self.http_client {
            _ if simulated.is_some() => None,
            Some(_) if self.net.changed => {
                return Err(Error::config(
                    "transport settings (connect timeout, pool, keepalive, proxy, certificates) \
                     apply to the SDK's own HTTP client; set them on the client given to http_client",
                ));
            }
            Some(http) => Some(http),
            None => Some(self.net.http_client()?),
        };
        let exchange: Box<dyn Exchange> = match (http, simulated) {
            (Some(http), _) => Box::new(HttpExchange {
                http,
                endpoint: endpoint.clone(),
                batch_endpoint,
                describe_endpoint,
                authorization,
                user_agent,
            }),
            #[cfg(feature = "test-util")]
            (None, Some(server)) => Box::new(crate::simulation::SimulatedExchange {
                server,
                endpoint: endpoint.clone(),
                batch_endpoint,
                describe_endpoint,
                authorization,
                user_agent,
            }),
            (None, _) => unreachable!("an HTTP client is built unless a simulated server is set"),
        };
        let trace = TraceSettings::for_url(&endpoint, self.trace_query_text);
        let transport = Transport {
            metrics: Metrics::new(&trace),
            trace,
            exchange,
            timeout: self.timeout,
            policy: self.policy,
            retry_writes: self.retry_writes,
            budget: self.budget.map(TokenBucket::new),
            rate: self.adaptive_rate.then(AdaptiveRate::new),
            hedging: Hedging::new(self.hedge),
            rng: Mutex::new(Transport::new_rng(self.policy.seed)),
            cancel: self.cancel,
            session: Arc::new(Session::new(self.bookmark)),
        };
        Ok(Client {
            inner: Arc::new(Inner {
                endpoint,
                transport,
                insert_limits: self.insert_limits,
                batch_limits: self.batch_limits,
            }),
        })
    }
}

impl NetSettings {
    /// The SDK's own HTTP client: reqwest's retries and redirects off (see `http_client`).
    fn http_client(self) -> Result<reqwest::Client> {
        let mut builder = reqwest::Client::builder()
            .retry(reqwest::retry::never())
            .redirect(reqwest::redirect::Policy::none())
            .pool_idle_timeout(self.pool_idle_timeout)
            .tcp_keepalive(self.tcp_keepalive)
            .no_proxy();
        if let Some(timeout) = self.connect_timeout {
            builder = builder.connect_timeout(timeout);
        }
        if let Some(proxy) = self.proxy {
            builder = builder.proxy(proxy);
        }
        #[cfg(any(feature = "rustls", feature = "native-tls"))]
        {
            for certificate in self.root_certificates {
                builder = builder.add_root_certificate(certificate);
            }
            if let Some(identity) = self.identity {
                builder = builder.identity(identity);
            }
        }
        builder.build().map_err(|err| {
            Error::config(format!("cannot build the HTTP client: {err}")).with_source(err)
        })
    }
}

impl fmt::Debug for ClientBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ClientBuilder")
            .field("base_url", &redacted(&self.base_url))
            .field("authenticated", &self.bearer_token.is_some())
            .field("timeout", &self.timeout)
            .field("retry", &self.policy)
            .field("retry_writes", &self.retry_writes)
            .field("connect_timeout", &self.net.connect_timeout)
            .field("pool_idle_timeout", &self.net.pool_idle_timeout)
            .field("tcp_keepalive", &self.net.tcp_keepalive)
            .field("proxy", &self.net.proxy.is_some())
            .field("custom_http_client", &self.http_client.is_some())
            .field("bookmark", &self.bookmark)
            .field("trace_query_text", &self.trace_query_text)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ErrorKind;

    #[test]
    fn https_is_refused_without_tls_and_the_message_says_which_feature() {
        let err = check_scheme("https", false).unwrap_err();
        assert!(matches!(err.kind(), ErrorKind::Config { .. }), "{err:?}");
        assert!(err.to_string().contains("rustls"), "{err}");
        assert!(check_scheme("https", true).is_ok());
        assert!(check_scheme("http", false).is_ok());
        assert!(check_scheme("ftp", true).is_err());
    }

    #[test]
    fn base_urls_without_a_scheme_or_with_the_api_path_suggest_the_fix() {
        let message = |url: &str| Client::builder(url).build().unwrap_err().to_string();
        for url in ["127.0.0.1:8080", "localhost:8080", "db.internal"] {
            let text = message(url);
            assert!(text.contains(&format!("\"http://{url}\"")), "{text}");
        }
        for (url, fixed) in [
            (
                "http://127.0.0.1:8080/api/v1/sql",
                "\"http://127.0.0.1:8080\"",
            ),
            (
                "http://127.0.0.1:8080/api/v1/sql/",
                "\"http://127.0.0.1:8080\"",
            ),
            (
                "https://db.example/tenant/api/v1/batch",
                "\"https://db.example/tenant\"",
            ),
            ("http://host:1/api/v1", "\"http://host:1\""),
        ] {
            let text = message(url);
            assert!(text.contains(fixed), "{url}: {text}");
        }
        let hidden = message("admin:hunter2@db.internal:8080/?token=SECRET123");
        assert!(
            !hidden.contains("hunter2") && !hidden.contains("SECRET123"),
            "{hidden}"
        );
        assert!(hidden.contains("\"http://db.internal:8080\""), "{hidden}");
        assert!(Client::builder("http://host:1/tenant/").build().is_ok());
        assert!(message("ftp://host").contains("http or https"));
    }

    /// Only in a build without TLS features: `cargo test -p sqlhttp --no-default-features --lib`.
    #[cfg(not(any(feature = "rustls", feature = "native-tls")))]
    #[test]
    fn build_refuses_https_in_a_build_without_tls() {
        let err = Client::builder("https://db.example.com")
            .build()
            .unwrap_err();
        assert!(matches!(err.kind(), ErrorKind::Config { .. }), "{err:?}");
        assert!(Client::builder("http://db.example.com").build().is_ok());
    }
}
