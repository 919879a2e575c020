//! [`TestServer`]: the reference server `sqlhttpd` run in-process on loopback for a test, with
//! stop/restart on the same port and database, and SDK clients pointed at it or at a
//! [`ChaosProxy`] in front of it; [`TestServerBuilder`] says how it starts (the application
//! harness's migrations, fixtures and PostgreSQL are `harness`'s).
//!
//! This module knows the server crate's embedding API and the SDK's client builder. It must not
//! know how either works inside, nor anything about fault plans beyond starting a proxy.

use std::fmt;
use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use sqlhttp_server::{Config, Database, Server, ServerError, ServerHandle};

use crate::proxy::ChaosProxy;

/// How many times [`TestServer::restart`] tries to bind the old port again.
const REBIND_ATTEMPTS: u32 = 100;
/// The pause between two of those tries.
const REBIND_PAUSE: Duration = Duration::from_millis(20);

/// `sqlhttpd` running inside the test process on `127.0.0.1` (an ephemeral port).
///
/// The server runs on the test's tokio runtime. [`stop`](Self::stop) shuts it down gracefully;
/// [`restart`](Self::restart) brings it back on the same port with the same configuration (and
/// so the same database file, for a file-backed server), which is how a test makes a server
/// "crash" between two attempts of one call. A file-backed server's database lives in a fresh
/// directory under the system's temp dir, removed when the `TestServer` is dropped.
///
/// Dropping a running `TestServer` drops its server handle without waiting for a graceful
/// shutdown; call [`stop`](Self::stop) first when the test needs the database closed.
///
/// The methods panic when the server cannot start: this is a test harness, and a server that
/// does not start is a failed test.
///
/// ```
/// use sqlhttp_testkit::TestServer;
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// let mut server = TestServer::file_backed().await;
/// let client = server.client_builder().build().unwrap();
/// client.execute("CREATE TABLE t (x INTEGER)").await.unwrap();
///
/// client.execute("INSERT INTO t VALUES (42)").await.unwrap();
///
/// server.restart().await; // same URL, same database file
/// let x: i64 = client.query("SELECT x FROM t").fetch_one().await.unwrap();
/// assert_eq!(x, 42);
/// server.stop().await;
/// # }
/// ```
pub struct TestServer {
    config: Config,
    addr: SocketAddr,
    handle: Option<ServerHandle>,
    // Held for their Drop, which removes the directory and drops the PostgreSQL database;
    // declared last so that happens only after the handle above is dropped.
    _temp_dir: Option<TempDir>,
    #[cfg(feature = "harness")]
    _database: Option<crate::harness::TestDatabase>,
}

impl fmt::Debug for TestServer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TestServer")
            .field("addr", &self.addr)
            .field("running", &self.is_running())
            .field("database", &self.config.database)
            .finish_non_exhaustive()
    }
}

impl TestServer {
    /// Starts a server with the default configuration and a private in-memory database, when
    /// awaited; before that, the returned [`TestServerBuilder`] can say more (with the `harness`
    /// feature: migrations to apply, fixtures to load, PostgreSQL instead of SQLite).
    ///
    /// ```
    /// use sqlhttp_testkit::TestServer;
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// let server = TestServer::start().await;
    /// let answer: i64 = server.client().query("SELECT 6 * 7").fetch_one().await.unwrap();
    /// assert_eq!(answer, 42);
    /// # }
    /// ```
    ///
    /// # Panics
    /// When awaited, if the server cannot start (or, with the `harness` feature, a migration or
    /// fixture fails).
    pub fn start() -> TestServerBuilder {
        TestServerBuilder::new()
    }

    /// Starts a server with `config`; its `listen` address is replaced with `127.0.0.1:0`.
    ///
    /// # Panics
    /// If the server cannot start.
    pub async fn with_config(config: Config) -> TestServer {
        TestServer::launch(config, None).await
    }

    /// Starts a server with the default configuration and a database file in a fresh temporary
    /// directory.
    ///
    /// # Panics
    /// If the directory cannot be created or the server cannot start.
    pub async fn file_backed() -> TestServer {
        TestServer::file_backed_with_config(Config::default()).await
    }

    /// Starts a server with `config`, its `database` replaced with a file in a fresh temporary
    /// directory and its `listen` address with `127.0.0.1:0`.
    ///
    /// # Panics
    /// If the directory cannot be created or the server cannot start.
    pub async fn file_backed_with_config(mut config: Config) -> TestServer {
        let temp_dir = TempDir::new().unwrap_or_else(|error| {
            panic!("sqlhttp-testkit: cannot create a temporary directory: {error}")
        });
        config.database = Database::File(temp_dir.path().join("sqlhttp.db"));
        TestServer::launch(config, Some(temp_dir)).await
    }

    async fn launch(mut config: Config, temp_dir: Option<TempDir>) -> TestServer {
        config.listen = SocketAddr::from((Ipv4Addr::LOCALHOST, 0));
        let (addr, handle) = match bind(&config).await {
            Ok(server) => server,
            Err(error) => panic!("sqlhttp-testkit: sqlhttpd did not start: {error}"),
        };
        // A restart must come back on the same port.
        config.listen = addr;
        TestServer {
            config,
            addr,
            handle: Some(handle),
            _temp_dir: temp_dir,
            #[cfg(feature = "harness")]
            _database: None,
        }
    }

    /// The server's address (the same across restarts).
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The server's base URL, `http://127.0.0.1:PORT` (the same across restarts).
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The configuration the server runs with (`listen` is its actual address).
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// The database file of a file-backed server, `None` for an in-memory one.
    pub fn database_path(&self) -> Option<&Path> {
        match &self.config.database {
            Database::File(path) => Some(path),
            _ => None,
        }
    }

    /// Whether the server is running (started and not stopped).
    pub fn is_running(&self) -> bool {
        self.handle.is_some()
    }

    /// An SDK client builder pointed straight at the server, with the first configured token (if
    /// any) as its bearer token.
    pub fn client_builder(&self) -> sqlhttp::ClientBuilder {
        self.builder_for(self.url())
    }

    /// An SDK client pointed straight at the server, as [`client_builder`](Self::client_builder)
    /// builds it.
    ///
    /// # Panics
    /// If the client cannot be built (it always can for this URL).
    pub fn client(&self) -> sqlhttp::Client {
        self.client_builder()
            .build()
            .unwrap_or_else(|error| panic!("sqlhttp-testkit: cannot build a client: {error}"))
    }

    /// An SDK client pointed at `proxy` (see [`proxy`](Self::proxy)), as
    /// [`proxied_client_builder`](Self::proxied_client_builder) builds it.
    ///
    /// # Panics
    /// If the client cannot be built.
    pub fn proxied_client(&self, proxy: &ChaosProxy) -> sqlhttp::Client {
        self.proxied_client_builder(proxy)
            .build()
            .unwrap_or_else(|error| panic!("sqlhttp-testkit: cannot build a client: {error}"))
    }

    /// Starts a [`ChaosProxy`] in front of the server (it keeps working across restarts).
    ///
    /// # Panics
    /// If the proxy cannot bind a loopback port.
    pub async fn proxy(&self) -> ChaosProxy {
        ChaosProxy::start(self.addr)
            .await
            .unwrap_or_else(|error| panic!("sqlhttp-testkit: the proxy did not start: {error}"))
    }

    /// An SDK client builder pointed at `proxy`, with the first configured token (if any) as its
    /// bearer token.
    pub fn proxied_client_builder(&self, proxy: &ChaosProxy) -> sqlhttp::ClientBuilder {
        self.builder_for(proxy.url())
    }

    fn builder_for(&self, url: String) -> sqlhttp::ClientBuilder {
        let builder = sqlhttp::Client::builder(url);
        match self.config.tokens.first() {
            Some(token) => builder.bearer_token(token.clone()),
            None => builder,
        }
    }

    /// Shuts the server down gracefully; the database is closed when this returns. Does nothing
    /// when the server is not running.
    pub async fn stop(&mut self) {
        if let Some(handle) = self.handle.take() {
            handle.shutdown().await;
        }
    }

    /// Stops the server (if running) and starts it again on the same port with the same
    /// configuration. The old port is retried for up to two seconds while the OS releases it.
    ///
    /// # Panics
    /// If the server cannot start again.
    pub async fn restart(&mut self) {
        self.stop().await;
        let mut attempt = 1;
        let handle = loop {
            match bind(&self.config).await {
                Ok((_, handle)) => break handle,
                Err(error) if attempt >= REBIND_ATTEMPTS => {
                    panic!(
                        "sqlhttp-testkit: sqlhttpd did not restart on {}: {error}",
                        self.addr
                    )
                }
                Err(_) => {
                    attempt += 1;
                    tokio::time::sleep(REBIND_PAUSE).await;
                }
            }
        };
        self.handle = Some(handle);
    }
}

/// How a [`TestServer`] starts, from [`TestServer::start`]; `.await` it to start the server.
///
// The harness's methods exist only with the feature: link to them only then.
#[cfg_attr(
    feature = "harness",
    doc = "With the `harness` feature (the test harness for applications), it also applies \
           [`migrations`](Self::migrations), loads [`fixture`](Self::fixture)s, and runs on a \
           fresh PostgreSQL database instead of SQLite ([`postgres`](Self::postgres)):"
)]
#[cfg_attr(
    not(feature = "harness"),
    doc = "With the `harness` feature (the test harness for applications), it also applies \
           `migrations`, loads `fixture`s, and runs on a fresh PostgreSQL database instead of \
           SQLite (`postgres`):"
)]
///
/// ```no_run
/// # #[cfg(feature = "harness")]
/// # async fn run() {
/// use sqlhttp_testkit::TestServer;
///
/// let server = TestServer::start()
///     .migrations("migrations")
///     .fixture("INSERT INTO books (id, title) VALUES (1, 'Dune');")
///     .postgres_from_env() // SQLHTTPD_TEST_POSTGRES_URL when set, else SQLite
///     .await;
/// let titles: Vec<String> = server.client().query("SELECT title FROM books").fetch_all().await.unwrap();
/// # }
/// ```
#[must_use = "a builder does nothing until it is awaited"]
pub struct TestServerBuilder {
    config: Config,
    file_backed: bool,
    #[cfg(feature = "harness")]
    setup: crate::harness::Setup,
}

impl fmt::Debug for TestServerBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TestServerBuilder")
            .field("file_backed", &self.file_backed)
            .finish_non_exhaustive()
    }
}

impl TestServerBuilder {
    fn new() -> TestServerBuilder {
        TestServerBuilder {
            config: Config::default(),
            file_backed: false,
            #[cfg(feature = "harness")]
            setup: crate::harness::Setup::default(),
        }
    }

    /// Runs the server with `config` (its `listen` address is replaced with `127.0.0.1:0`, and
    /// its database with the one this builder chooses when it chooses one).
    pub fn config(mut self, config: Config) -> TestServerBuilder {
        self.config = config;
        self
    }

    /// With `true`, keeps the SQLite database in a file in a fresh temporary directory (removed
    /// on drop), so that [`TestServer::restart`] keeps the data. Default: `false` (in memory).
    pub fn file_backed(mut self, file_backed: bool) -> TestServerBuilder {
        self.file_backed = file_backed;
        self
    }

    async fn launch(self) -> TestServer {
        #[cfg(feature = "harness")]
        {
            let TestServerBuilder {
                mut config,
                file_backed,
                setup,
            } = self;
            let database = setup.database(&mut config).await;
            let mut server = if file_backed && database.is_none() {
                TestServer::file_backed_with_config(config).await
            } else {
                TestServer::with_config(config).await
            };
            server._database = database;
            setup.apply(&server).await;
            server
        }
        #[cfg(not(feature = "harness"))]
        {
            if self.file_backed {
                TestServer::file_backed_with_config(self.config).await
            } else {
                TestServer::with_config(self.config).await
            }
        }
    }
}

#[cfg(feature = "harness")]
#[cfg_attr(docsrs, doc(cfg(feature = "harness")))]
impl TestServerBuilder {
    /// Applies the migrations of `dir` (as [`sqlhttp::migrate::Migrator::from_dir`] reads them)
    /// once the server is up, before the test gets it.
    pub fn migrations(mut self, dir: impl AsRef<Path>) -> TestServerBuilder {
        self.setup.migrations(dir.as_ref());
        self
    }

    /// Applies `migrator`'s migrations (embedded ones, say) once the server is up.
    pub fn migrator(mut self, migrator: sqlhttp::migrate::Migrator) -> TestServerBuilder {
        self.setup.migrator(migrator);
        self
    }

    /// Runs the statements of `sql` (a script: statements ended by `;`) after the migrations,
    /// in batches of at most 100 statements (the reference server's limit), each atomic;
    /// fixtures run in the order given.
    pub fn fixture(mut self, sql: impl Into<String>) -> TestServerBuilder {
        self.setup.fixture(sql.into());
        self
    }

    /// Runs the server on a fresh database of the PostgreSQL cluster at `url` (a role that may
    /// create databases and roles), with a client role of its own; both are dropped when the
    /// `TestServer` is dropped.
    pub fn postgres(mut self, url: impl Into<String>) -> TestServerBuilder {
        self.setup.postgres(Some(url.into()));
        self
    }

    /// [`postgres`](Self::postgres) with the URL in the environment variable
    /// `SQLHTTPD_TEST_POSTGRES_URL` when it is set and not empty; SQLite otherwise. One test
    /// then runs on either engine.
    pub fn postgres_from_env(mut self) -> TestServerBuilder {
        let url = std::env::var(crate::harness::POSTGRES_URL_VAR)
            .ok()
            .filter(|url| !url.trim().is_empty());
        self.setup.postgres(url);
        self
    }
}

impl std::future::IntoFuture for TestServerBuilder {
    type Output = TestServer;
    type IntoFuture = std::pin::Pin<Box<dyn std::future::Future<Output = TestServer> + Send>>;

    fn into_future(self) -> Self::IntoFuture {
        Box::pin(self.launch())
    }
}

/// Binds and spawns a server for `config`.
async fn bind(config: &Config) -> Result<(SocketAddr, ServerHandle), ServerError> {
    let server = Server::bind(config.clone()).await?;
    let addr = server.local_addr();
    Ok((addr, server.spawn()))
}

/// A directory under the system temp dir, removed (with its contents) on drop.
#[derive(Debug)]
struct TempDir {
    path: PathBuf,
}

impl TempDir {
    fn new() -> std::io::Result<TempDir> {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |elapsed| elapsed.as_nanos());
        // The counter makes names unique within this process, the pid and clock across
        // processes; a few tries cover a leftover directory from an earlier run.
        let mut last_error = None;
        for _ in 0..16 {
            let name = format!(
                "sqlhttp-testkit-{}-{nanos}-{}",
                std::process::id(),
                NEXT.fetch_add(1, Ordering::Relaxed)
            );
            let path = std::env::temp_dir().join(name);
            match std::fs::create_dir(&path) {
                Ok(()) => return Ok(TempDir { path }),
                Err(error) if error.kind() == std::io::ErrorKind::AlreadyExists => {
                    last_error = Some(error);
                }
                Err(error) => return Err(error),
            }
        }
        Err(last_error.unwrap_or_else(|| std::io::ErrorKind::AlreadyExists.into()))
    }

    fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        if let Err(error) = std::fs::remove_dir_all(&self.path) {
            tracing::debug!(%error, path = %self.path.display(), "cannot remove the temp dir");
        }
    }
}
