//! The PostgreSQL engine: client statements on a pool of tokio-postgres connections
//! (deadpool-postgres) logged in as the client role (`sqlhttp_client` by default), every
//! request in a transaction of the server's own. Each connection's session state (settings,
//! temporary tables, advisory locks) is reset before it serves another request.
//!
//! - [`PostgresEngine`] implements the engine contract (`engine::Engine`): statements stream
//!   once their body outgrows a chunk (`stream`), as on SQLite; a read-only one runs in `BEGIN
//!   READ ONLY`; keyed ones run exactly once (`keyed`); batches run in one transaction
//!   (`batch`; a read-only batch is `READ ONLY, REPEATABLE READ`, so its statements see one
//!   snapshot).
//! - Each transaction sets `statement_timeout` to `--statement-timeout`; a request whose
//!   requester goes away has its statement cancelled and its connection discarded.
//! - The transaction that commits is checked to be the one the server opened
//!   (`transaction_timestamp()` taken at BEGIN and checked again in COMMIT's own message),
//!   whatever the text checks saw; the guard savepoint carries a random name per request (ADR
//!   0027). Statements are prepared once per connection and cached (`exec::prepare`). A write
//!   takes two round trips: BEGIN with the statement, then its end with the session's reset
//!   (ADR 0034). A read takes one: BEGIN, the statement, and its ROLLBACK with what is left of
//!   the reset after a rollback, written together (ADR 0037).
//! - With `--read-replica`, verified reads (a read-only statement, a read-only batch) run on a
//!   streaming replica's pool of its own when one is fit and has replayed as far as the read's
//!   bookmark asks (`replicas` chooses, ADR 0039), else on the primary, which also serves every
//!   read a replica fails before its answer started. Every answer learns the log position it
//!   stands at (`transaction`), for its `Sqlhttp-Bookmark`. A request whose bookmark is past
//!   everything the primary has written is refused before anything runs (`ahead`).
//! - The pool's connections run over `wire`'s stream, which fails a connection as soon as
//!   PostgreSQL declares a row or cell past the server's limits (ADR 0028), before it arrives.
//! - `lease` hands out the pool's connections, `transaction` opens and ends the server's
//!   transaction, `exec` runs a statement into the shared result writer, `placeholders` rewrites
//!   `?` into `$n`, `errors` maps PostgreSQL's errors onto the protocol's table, `types` maps
//!   values both ways, `sandbox` adds PostgreSQL's text rules to the common ones, `setup`
//!   prepares the database at start, `session` resets a connection between requests.
//!
//! Knows nothing about HTTP. See `docs/adr/0018-postgresql-engine.md`.
//!
//! Past 600 lines on purpose for now: `engine/postgres/` is rebuilt on `sqlhttp-pgwire` by issue 38
//! (ADR 0059), which splits it by concern; issue 39 left this folder as it is.

mod aging;
mod ahead;
mod batch;
mod catalog;
mod describe;
mod errors;
mod exec;
mod flights;
mod in_transaction;
pub(crate) mod interactive;
mod keyed;
mod lease;
mod placeholders;
mod read_flight;
mod replicas;
mod sandbox;
mod session;
mod setup;
mod statement_flight;
mod stream;
mod tag;
mod texts;
mod tls;
mod transaction;
mod types;
mod wire;
mod write_flight;

use std::collections::HashMap;
use std::future::Future;
use std::pin::pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use deadpool_postgres::{Hook, HookError, Manager, ManagerConfig, Pool, RecyclingMethod, Runtime};
use tokio::sync::Semaphore;
use tokio_postgres::CancelToken;
use tracing::Instrument as _;

use crate::budget::{Budget, Held};
use crate::config::{Limits, PostgresUrl, ReadReplicas};
use crate::engine::interactive::{Isolation, TxOptions};
use crate::engine::job::{Cancel, CancelOnDrop};
use crate::engine::keyed::{PurgeClock, Stored};
use crate::engine::run_to_end::{Panicked, RunToEnd};
use crate::engine::{
    Access, Buffering, Catalog, Engine, GivenUp, Keyed, Outcome, ReplicaReport, Reply,
    shutting_down,
};
use crate::error::ServerError;
use crate::protocol::batch::BatchRequest;
use crate::protocol::bookmark::{Bookmark, Position, ReadAt, ServedBy};
use crate::protocol::error::{ApiError, ErrorCode};
use crate::protocol::request::SqlRequest;
use crate::timing::Timing;

use ahead::PrimaryLog;
use keyed::Work;
use lease::{Backends, Lease};
use replicas::{Choice, Node, Reason, Replica, Replicas, Route};

/// How long opening a new connection may take.
const CONNECT_WITHIN: Duration = Duration::from_secs(5);

/// How long cancelled work may take to stop before it is abandoned (its connection is then
/// rolled back by its owner, or discarded).
const STOP_WITHIN: Duration = Duration::from_secs(1);

/// Handle to the PostgreSQL engine. Each request's transaction runs to its end, on the
/// requester's task while it waits and as a task of its own after (`RunToEnd`, ADR 0070), so a
/// requester that goes away interrupts the running statement (PostgreSQL cancels it) but never
/// leaves a transaction half-done: what committed stays, what did not is rolled back.
#[derive(Debug)]
pub(crate) struct PostgresEngine {
    inner: Arc<Inner>,
    buffering: Buffering,
    /// Connections interactive transactions may hold at once: all of the pool's but one, so
    /// idle transactions can never take every connection from plain requests.
    transaction_slots: Arc<Semaphore>,
    /// The read replicas, when there are any.
    replicas: Option<Arc<Replicas>>,
    /// How far the primary's log is known to reach: bookmarks past it are refused.
    log: Arc<PrimaryLog>,
}

/// What the tasks share.
struct Inner {
    pool: Pool,
    /// One permit per pooled connection plus `--queue-depth`: past it requests answer 503.
    admission: Arc<Semaphore>,
    limits: Limits,
    closing: Arc<AtomicBool>,
    /// Wakes every guarded job when the engine closes.
    shutdown: tokio::sync::Notify,
    /// The server is shutting down: interactive transactions' statements stop now (see
    /// [`PostgresEngine::stop_transactions`]).
    stopping_transactions: AtomicBool,
    /// Wakes the interactive transactions' running statements when that starts.
    stop_transactions: tokio::sync::Notify,
    in_flight: Arc<Mutex<HashMap<u64, CancelToken>>>,
    next_lease: AtomicU64,
    /// When expired idempotency keys were last purged.
    purges: PurgeClock,
    /// What the store's functions ask for (see `keyed`).
    store_key: String,
    /// How to log in beside the pool (see `lease::terminate`).
    reaper: Arc<wire::Target>,
    /// The owner's side of the client role: puts its password and defaults back.
    keeper: Arc<setup::RoleKeeper>,
    /// What the pool's connections were cut for (see `wire`).
    cuts: Arc<wire::Cuts>,
    /// Which backend process each pooled connection is (see `lease`).
    backends: Arc<Backends>,
    /// The primary, or a replica (see `replicas`).
    node: Node,
    /// On the primary: where the positions its requests read go (see `ahead`).
    log: Option<Arc<PrimaryLog>>,
    /// The client texts that passed the text checks lately (see `texts`).
    texts: texts::CheckedTexts,
}

impl std::fmt::Debug for Inner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PostgresEngine")
            .field("connections", &self.pool.status().size)
            .finish_non_exhaustive()
    }
}

impl PostgresEngine {
    /// Prepares the database (the client role, its schema rights, the server's store) and
    /// builds the pool of client-role connections; they open on first use.
    pub(crate) fn start(
        url: &PostgresUrl,
        read_replicas: &ReadReplicas,
        idempotency_ttl: Option<Duration>,
        limits: Limits,
        budget: Budget,
    ) -> Result<PostgresEngine, ServerError> {
        let prepared = setup::prepare(url)?;
        let closing = Arc::new(AtomicBool::new(false));
        let log = Arc::new(PrimaryLog::new(prepared.keeper.owner_target()));
        let primary = Inner::open(
            url,
            wire::Target {
                config: prepared.client.clone(),
                tls: Arc::clone(&prepared.tls),
            },
            &prepared,
            limits,
            Arc::clone(&closing),
            Node::Primary,
            Some(Arc::clone(&log)),
        )?;
        if idempotency_ttl.is_none() {
            primary.purges.purged_now();
        }
        let replicas = (!read_replicas.urls.is_empty())
            .then(|| Self::replicas(&prepared, read_replicas, limits, &closing, &log))
            .transpose()?
            .map(Arc::new);
        if let Some(replicas) = &replicas {
            replicas.watch();
        }
        let connections = limits.pool_size.max(1);
        Ok(PostgresEngine {
            inner: Arc::new(primary),
            buffering: Buffering::new(budget, &limits),
            transaction_slots: Arc::new(Semaphore::new(connections.saturating_sub(1).max(1))),
            replicas,
            log,
        })
    }

    /// The read replicas' pools: each logs in as the client role (its password and rights
    /// replicate from the primary) at its URL's host, port and database, with its URL's TLS.
    fn replicas(
        prepared: &setup::Prepared,
        read_replicas: &ReadReplicas,
        limits: Limits,
        closing: &Arc<AtomicBool>,
        log: &Arc<PrimaryLog>,
    ) -> Result<Replicas, ServerError> {
        let mut nodes = Vec::new();
        for url in &read_replicas.urls {
            let failed = |reason: String| ServerError::Postgres {
                database: url.to_string(),
                reason,
            };
            let mut monitor: tokio_postgres::Config = url
                .secret()
                .parse()
                .map_err(|e: tokio_postgres::Error| failed(e.to_string()))?;
            // TLS is `tls`'s, on the socket, before the driver sees it.
            monitor.ssl_mode(tokio_postgres::config::SslMode::Disable);
            let tls = Arc::new(tls::PgTls::new(url.ssl()).map_err(failed)?);
            let mut client = monitor.clone();
            client.user(url.client_role());
            if let Some(password) = prepared.client.get_password() {
                client.password(password);
            }
            let watch = Arc::new(replicas::Watch::default());
            let inner = Inner::open(
                url,
                wire::Target {
                    config: client,
                    tls: Arc::clone(&tls),
                },
                prepared,
                limits,
                Arc::clone(closing),
                Node::Replica(Arc::clone(&watch)),
                None,
            )?;
            // Its store is the primary's, read-only here: nothing is purged on a replica.
            inner.purges.purged_now();
            nodes.push((
                url.to_string(),
                Replica::new(
                    Arc::new(inner),
                    watch,
                    wire::Target {
                        config: monitor,
                        tls,
                    },
                ),
            ));
        }
        let monitors: Vec<(String, &wire::Target)> = nodes
            .iter()
            .map(|(url, replica)| (url.clone(), replica.monitor()))
            .collect();
        replicas::check_at_start(&prepared.keeper.owner_target(), &monitors)?;
        let nodes = nodes.into_iter().map(|(_, replica)| replica).collect();
        Ok(Replicas::new(
            nodes,
            prepared.keeper.owner_target(),
            Arc::clone(log),
            read_replicas.max_lag,
            read_replicas.wait,
        ))
    }
}

impl Inner {
    /// A pool of client-role connections to `target` (the primary, or a replica of it, as
    /// `node` says); they open on first use. The positions the primary's requests read are
    /// kept in `log`.
    fn open(
        url: &PostgresUrl,
        target: wire::Target,
        prepared: &setup::Prepared,
        limits: Limits,
        closing: Arc<AtomicBool>,
        node: Node,
        log: Option<Arc<PrimaryLog>>,
    ) -> Result<Inner, ServerError> {
        let failed = |reason: String| ServerError::Postgres {
            database: url.to_string(),
            reason,
        };
        let reaper = Arc::new(wire::Target {
            config: target.config.clone(),
            tls: Arc::clone(&target.tls),
        });
        let keeper = Arc::clone(&prepared.keeper);
        let cuts = Arc::new(wire::Cuts::default());
        let backends = Arc::new(Backends::default());
        let learning = Arc::clone(&backends);
        let wires = Arc::clone(&cuts);
        // Flights serve verified reads on the primary only, for now (ADR 0061).
        let flights = (!node.is_replica()).then_some(limits);
        let manager = Manager::from_connect(
            target.config,
            wire::BoundedConnect {
                bounds: wire::Bounds::new(limits.max_value_bytes, limits.max_result_bytes),
                cuts: Arc::clone(&cuts),
                tls: target.tls,
            },
            ManagerConfig {
                // A client's function may change its session (settings, temporary tables that
                // would shadow the next client's): reset it before the next request.
                recycling_method: RecyclingMethod::Fast,
            },
        );
        let connections = limits.pool_size.max(1);
        let pool = Pool::builder(manager)
            .max_size(connections)
            .runtime(Runtime::Tokio1)
            .wait_timeout(Some(limits.statement_timeout))
            .create_timeout(Some(CONNECT_WITHIN))
            .recycle_timeout(Some(CONNECT_WITHIN))
            .post_create(Hook::async_fn(move |client, _| {
                let keeper = Arc::clone(&keeper);
                let backends = Arc::clone(&learning);
                let wires = Arc::clone(&wires);
                Box::pin(async move {
                    session::check_new(client, &keeper)
                        .await
                        .map_err(|why| HookError::Message(why.into()))?;
                    backends
                        .learn(client, &wires, flights.as_ref())
                        .await
                        .map_err(|why| HookError::Message(why.into()))
                })
            }))
            .build()
            .map_err(|e| failed(e.to_string()))?;
        Ok(Inner {
            pool,
            admission: Arc::new(Semaphore::new(connections + limits.queue_depth)),
            limits,
            closing,
            shutdown: tokio::sync::Notify::new(),
            stopping_transactions: AtomicBool::new(false),
            stop_transactions: tokio::sync::Notify::new(),
            in_flight: Arc::default(),
            next_lease: AtomicU64::new(0),
            // The first keyed request purges.
            purges: PurgeClock::default(),
            store_key: prepared.store_key.clone(),
            reaper,
            keeper: Arc::clone(&prepared.keeper),
            cuts,
            backends,
            node,
            log,
            texts: texts::CheckedTexts::default(),
        })
    }
}

impl PostgresEngine {
    /// Runs `work` to its end and waits for it: on the requester's task while it waits, as a
    /// task of its own once it stopped waiting ([`RunToEnd`]). Dropping the returned future
    /// (the requester went away) cancels the statement the work is running; the work then
    /// rolls back, unless its statement had already finished, in which case it commits.
    async fn spawn<T, F, Fut>(&self, work: F) -> Result<T, ApiError>
    where
        T: Send + 'static,
        F: FnOnce(Arc<Inner>, Arc<Job>) -> Fut,
        Fut: std::future::Future<Output = Result<T, ApiError>> + Send + 'static,
    {
        self.spawn_on(&self.inner, Arc::new(Job::default()), work)
            .await
    }

    /// [`PostgresEngine::spawn`] on `node`'s pool, for `job`.
    async fn spawn_on<T, F, Fut>(
        &self,
        node: &Arc<Inner>,
        job: Arc<Job>,
        work: F,
    ) -> Result<T, ApiError>
    where
        T: Send + 'static,
        F: FnOnce(Arc<Inner>, Arc<Job>) -> Fut,
        Fut: std::future::Future<Output = Result<T, ApiError>> + Send + 'static,
    {
        // The work serves the request: its timing and span go with it. Boxed as it is made:
        // the wrappers then move a pointer, not the work's kilobytes (ADR 0073).
        let work =
            Box::pin(work(Arc::clone(node), Arc::clone(&job))).instrument(tracing::Span::current());
        let mut work = RunToEnd::new(Timing::carry(work));
        // Declared after the work: dropped first, so the work goes on cancelled.
        let cancel = CancelOnDrop::new(job);
        let result = (&mut work).await;
        cancel.disarm();
        result.unwrap_or_else(panicked)
    }
    /// [`PostgresEngine::spawn`] for work that builds a whole outcome: it takes a little of the
    /// server's budget when it gets its connection and grows it as its result grows (see
    /// [`Buffering`]), then keeps what the outcome needs, to hold until the answer is sent.
    /// The outcome comes with the position its job learned, served by the primary.
    async fn spawn_buffered<F, Fut>(&self, work: F) -> Result<(Outcome, Held), ApiError>
    where
        F: FnOnce(Arc<Inner>, Arc<Job>) -> Fut,
        Fut: Future<Output = Result<Outcome, ApiError>> + Send + 'static,
    {
        self.spawn_buffered_on(Route::Primary(Arc::clone(&self.inner)), work)
            .await
    }

    /// [`PostgresEngine::spawn_buffered`] where `route` says.
    async fn spawn_buffered_on<F, Fut>(
        &self,
        route: Route,
        work: F,
    ) -> Result<(Outcome, Held), ApiError>
    where
        F: FnOnce(Arc<Inner>, Arc<Job>) -> Fut,
        Fut: Future<Output = Result<Outcome, ApiError>> + Send + 'static,
    {
        let buffering = self.buffering.clone();
        let job = Arc::new(Job::requiring(route.min()));
        let (outcome, held) = self
            .spawn_on(route.node(), Arc::clone(&job), |inner, job| {
                let work = work(inner, job);
                async move {
                    let share = buffering.start();
                    let outcome = Buffering::scope(Arc::clone(&share), work).await?;
                    Buffering::kept(share, outcome)
                }
            })
            .await?;
        Ok((outcome.at(job.position_as(route.served_by())), held))
    }

    /// Runs a read where the replicas choose (see `replicas`), consistent with at least `at`:
    /// on a replica when one is fit and far enough, and on the primary when none is or when
    /// the replica could not serve it before any of its answer was sent (it is down, behind
    /// after all, busy, in a recovery conflict, or refuses what only a primary runs: the
    /// failures the replica's own pool marks [`ApiError::elsewhere`]). Any other failure is
    /// the read's answer: the server's own refusals (its buffer budget, its transaction slots,
    /// its shutdown) would be the same on the primary. `run` is called with the [`Route`].
    async fn read<T, F, Fut>(&self, at: ReadAt, run: F) -> Result<T, ApiError>
    where
        F: Fn(Route) -> Fut,
        Fut: Future<Output = Result<T, ApiError>>,
    {
        let primary = || Route::Primary(Arc::clone(&self.inner));
        let Some(replicas) = &self.replicas else {
            return run(primary()).await;
        };
        let reason = match replicas.choose(at).await {
            Choice::Replica(replica) => {
                let route = Route::Replica {
                    node: Arc::clone(&replica.inner),
                    min: at.min.map_or(0, |bookmark| bookmark.position()),
                };
                // Until its answer starts, a read is abandoned as soon as the replica's watcher
                // finds it gone, wherever it is: waiting for a connection, its BEGIN, its end.
                let served = tokio::select! {
                    served = run(route) => served,
                    () = replica.inner.node.gone() => Err(replica_gone()),
                };
                match served {
                    Err(err) if err.elsewhere && !self.inner.closing.load(Ordering::Acquire) => {
                        tracing::debug!(error = %err.message, "a replica failed a read; the primary serves it");
                        Reason::Failed
                    }
                    served => {
                        replicas.served(ServedBy::Replica, Reason::Routed);
                        return served;
                    }
                }
            }
            Choice::Primary(reason) => reason,
        };
        replicas.served(ServedBy::Primary, reason);
        run(primary()).await
    }

    /// One of the connections interactive transactions may hold, once one is free (waiting at
    /// most the statement timeout).
    async fn transaction_slot(&self) -> Result<tokio::sync::OwnedSemaphorePermit, ApiError> {
        tokio::time::timeout(
            self.inner.limits.statement_timeout,
            Arc::clone(&self.transaction_slots).acquire_owned(),
        )
        .await
        .map_err(|_| {
            ApiError::unavailable(
                "the database is busy: every connection interactive transactions may hold \
                 (all of --pool-size but one) stayed held for longer than this server's \
                 statement timeout; retry later",
            )
        })?
        .map_err(|_| shutting_down())
    }
}

impl PostgresEngine {
    /// The server is shutting down and about to roll its open transactions back: a statement
    /// one of them runs now is cancelled at once (a cancel request, then its session ended,
    /// as a plain request's is when its requester goes away), so the rollback never waits
    /// for it to end on its own. The transaction is rolled back with its session and its
    /// requester is answered `503` (shutting down). Statements sent after this are refused
    /// the same way, before they run. A COMMIT already under way is left to finish: cutting it
    /// would leave its outcome unknown.
    pub(crate) fn stop_transactions(&self) {
        let nodes = std::iter::once(&self.inner)
            .chain(self.replicas.iter().flat_map(|replicas| replicas.pools()));
        for node in nodes {
            node.stopping_transactions.store(true, Ordering::Release);
            node.stop_transactions.notify_waiters();
        }
    }
}

impl Engine for PostgresEngine {
    fn catalog(&self) -> Catalog {
        catalog::CATALOG
    }

    /// Runs one request without an Idempotency-Key, streaming a success body larger than one
    /// chunk while the rows arrive (see `stream`): in a read-write transaction, or for
    /// [`Access::ReadOnly`] in a `READ ONLY` one, where a statement that writes is refused by
    /// PostgreSQL (`403 READ_ONLY`; nothing was written).
    async fn execute(
        &self,
        request: SqlRequest,
        access: Access,
        at: ReadAt,
    ) -> Result<Reply, ApiError> {
        self.check_bookmark(at).await?;
        if access == Access::ReadWrite {
            let primary = Route::Primary(Arc::clone(&self.inner));
            return self.streamed(primary, request, access).await;
        }
        if !self.inner.texts.passed_for_read(&request.sql) {
            sandbox::check_read_only_text(&request.sql)?;
        }
        self.read(at, |route| self.streamed(route, request.clone(), access))
            .await
    }

    /// Runs one keyed request exactly once (see `keyed`); the key's claim is held until the
    /// engine is done with it, whether or not the requester still waits.
    async fn execute_keyed(
        &self,
        keyed: Keyed,
        request: SqlRequest,
    ) -> Result<(Outcome, Held), ApiError> {
        self.spawn_buffered(|inner, job| async move {
            // Boxed: the keyed transaction's future is large.
            Box::pin(keyed::with_key(
                &inner,
                &job,
                &keyed,
                Work::Statement(&request),
            ))
            .await
        })
        .await
    }

    /// Runs a batch in one transaction (`READ ONLY, REPEATABLE READ` for a read-only one, whose
    /// statements are read by PostgreSQL's own text rules first; see `batch`).
    async fn batch(&self, batch: BatchRequest, at: ReadAt) -> Result<(Outcome, Held), ApiError> {
        self.check_bookmark(at).await?;
        batch::only_enforced(&batch)?;
        if batch.read_only {
            for (index, statement) in batch.statements.iter().enumerate() {
                sandbox::check_read_only_text(&statement.sql).map_err(|e| e.at_statement(index))?;
            }
        }
        // `SERIALIZABLE` cannot run on a hot standby (`0A000`): the primary serves such a
        // read, as it serves such an interactive transaction.
        if !batch.read_only || batch.isolation == Some(Isolation::Serializable) {
            return self
                .spawn_buffered(|inner, job| async move {
                    batch::batch(&inner, &job, &batch).await.map(Outcome::fresh)
                })
                .await;
        }
        let batch = Arc::new(batch);
        self.read(at, |route| {
            let batch = Arc::clone(&batch);
            self.spawn_buffered_on(route, |inner, job| async move {
                batch::batch(&inner, &job, &batch).await.map(Outcome::fresh)
            })
        })
        .await
    }

    /// Runs a keyed write batch exactly once in a transaction of its own (see `keyed`).
    async fn batch_keyed(
        &self,
        keyed: Keyed,
        batch: BatchRequest,
    ) -> Result<(Outcome, Held), ApiError> {
        batch::only_enforced(&batch)?;
        self.spawn_buffered(|inner, job| async move {
            Box::pin(keyed::with_key(&inner, &job, &keyed, Work::Batch(&batch))).await
        })
        .await
    }

    /// `409 BOOKMARK_AHEAD` for a bookmark past everything the primary has written (see
    /// `ahead`): cheap unless the bookmark is past every position this process has seen.
    async fn check_bookmark(&self, at: ReadAt) -> Result<(), ApiError> {
        self.log.check(at).await
    }

    /// Whether a connection answers a trivial statement.
    async fn ready(&self) -> Result<(), ApiError> {
        self.spawn(|inner, job| async move { inner.ready(&job).await })
            .await
    }

    /// Requests waiting for a connection now.
    fn queue_depths(&self) -> Vec<(&'static str, usize)> {
        vec![("postgres", self.inner.pool.status().waiting)]
    }

    /// None: PostgreSQL stops its statements itself (a cancel, or the session's end).
    fn given_up(&self) -> GivenUp {
        GivenUp::default()
    }

    fn replicas(&self) -> ReplicaReport {
        self.replicas
            .as_ref()
            .map(|replicas| replicas.report())
            .unwrap_or_default()
    }

    /// Leases a connection and opens an interactive transaction on it (see `interactive`), once
    /// one of the connections transactions may hold is free (waiting at most the statement
    /// timeout).
    ///
    /// A read-only `REPEATABLE READ` transaction (one snapshot for all its statements, taken at
    /// its open) is a verified read: a replica may serve it, as far as `at` asks, and its open
    /// answers the snapshot's position. Others run on the primary (`SERIALIZABLE` cannot run
    /// on a hot standby, and a `READ COMMITTED` one's statements each see a newer snapshot than
    /// any position its open could name).
    type Session = interactive::Session;

    async fn begin(
        &self,
        options: TxOptions,
        at: ReadAt,
    ) -> Result<interactive::Session, ApiError> {
        self.check_bookmark(at).await?;
        let on_replica = options.read_only && options.isolation == Isolation::RepeatableRead;
        if !on_replica {
            let slot = self.transaction_slot().await?;
            let primary = Route::Primary(Arc::clone(&self.inner));
            return interactive::Session::open(primary, options, slot).await;
        }
        self.read(at, |route| async move {
            let slot = self.transaction_slot().await?;
            interactive::Session::open(route, options, slot).await
        })
        .await
    }

    /// Describes the statement on the primary (see `describe`), which has every schema change.
    async fn describe_statement(
        &self,
        sql: String,
        access: Access,
    ) -> Result<crate::engine::describe::Described, ApiError> {
        self.spawn(|inner, job| async move { describe::describe(&inner, &job, &sql, access).await })
            .await
    }

    /// The outcome stored under `key`, read in a transaction of its own.
    async fn recorded(&self, key: String) -> Result<Option<Stored>, ApiError> {
        self.spawn(|inner, job| async move { interactive::recorded(&inner, &job, &key).await })
            .await
    }

    /// Claims a record in a transaction of its own.
    async fn claim_record(
        &self,
        key: String,
        request_hash: [u8; 32],
        status: u16,
        body: Vec<u8>,
    ) -> Result<Stored, ApiError> {
        self.spawn(|inner, job| async move {
            interactive::claim_record(&inner, &job, &key, &request_hash, status, &body).await
        })
        .await
    }

    /// Stores a record in a transaction of its own.
    async fn store_record(
        &self,
        key: String,
        request_hash: [u8; 32],
        body: Vec<u8>,
    ) -> Result<(), ApiError> {
        self.spawn(|inner, job| async move {
            interactive::store_record(&inner, &job, &key, &request_hash, &body).await
        })
        .await
    }

    /// Closes the pool: statements still running are cancelled (their requests answer 503),
    /// and this returns once every request has let go of its connection. Later requests
    /// answer 503.
    async fn close(&self) {
        match &self.replicas {
            Some(replicas) => {
                let pools = replicas.pools().map(|pool| pool.close());
                let closed = std::iter::once(self.inner.close()).chain(pools);
                for closing in closed {
                    closing.await;
                }
            }
            None => self.inner.close().await,
        }
    }
}

/// The answer for a read whose replica its watcher found gone: served elsewhere (see
/// `PostgresEngine::read`).
fn replica_gone() -> ApiError {
    ApiError::outage("the read replica stopped answering; its read was abandoned").elsewhere()
}

/// Whether a replica refused `err`'s statement because it is a replica: `55000` (a function
/// that needs a primary, `pg_current_wal_lsn()`: "recovery is in progress"), `25006` (one
/// that would assign a transaction id, `txid_current()`: "cannot execute ... during
/// recovery"), and `0A000` or `XX000` said of recovery (an `UNLOGGED` or temporary table:
/// "cannot access temporary or unlogged relations during recovery"; a function that needs a
/// new OID or a WAL entry). On the primary the same statement gets its own answer, a write's
/// `403` included (it runs there in a read-only transaction too), so nothing is lost by asking
/// it there.
fn replica_refuses(err: &tokio_postgres::Error) -> bool {
    let Some(code) = err.code() else {
        return false;
    };
    match code.code() {
        "55000" | "25006" => true,
        "0A000" | "XX000" => err
            .as_db_error()
            .is_some_and(|db| db.message().contains("recovery")),
        _ => false,
    }
}

/// One request's job: whether its requester went away. The task that holds the connection
/// cancels its own statement (see [`Inner::guarded`]), so a cancel request can never reach a
/// connection that already serves another request.
#[derive(Default)]
struct Job {
    cancelled: AtomicBool,
    notify: tokio::sync::Notify,
    /// How far the request has seen the log: its read's snapshot, or its commit (0 until it
    /// learned it).
    position: Arc<AtomicU64>,
    /// The least position its read must see (a replica checks before its snapshot; 0 for
    /// none).
    min: AtomicU64,
}

impl Job {
    fn is_cancelled(&self) -> bool {
        self.cancelled.load(Ordering::Acquire)
    }

    /// A job whose read must see at least `min`.
    fn requiring(min: u64) -> Job {
        Job {
            min: AtomicU64::new(min),
            ..Job::default()
        }
    }

    /// Where the job's answer stands, served by `served_by`, once it learned a position.
    fn position_as(&self, served_by: ServedBy) -> Option<Position> {
        match self.position.load(Ordering::Acquire) {
            0 => None,
            at => Some(Position {
                bookmark: Bookmark::from_position(at),
                served_by,
            }),
        }
    }
}

/// A job whose work panicked (see [`RunToEnd`]): logged, and answered `500`.
fn panicked<T>(_: Panicked) -> Result<T, ApiError> {
    tracing::error!("a PostgreSQL job panicked");
    Err(ApiError::internal())
}

impl Cancel for Job {
    fn cancel(&self) {
        self.cancelled.store(true, Ordering::Release);
        self.notify.notify_one();
    }
}

/// The longest a plain request's statement waits for a lock (`lock_timeout`) before it gives
/// its connection back, answered `503` with `Retry-After` (ADR 0043). A row lock held by an
/// idle interactive transaction would otherwise keep every write that needs the row waiting for
/// the whole statement timeout, each on a pooled connection, until no read found one.
const LOCK_WAIT: Duration = Duration::from_secs(1);

impl Inner {
    fn timeout_ms(&self) -> u128 {
        self.limits.statement_timeout.as_millis()
    }

    /// `lock_timeout` for the server's own transactions: [`LOCK_WAIT`], or the statement
    /// timeout when that is shorter (never 0, which PostgreSQL reads as no limit).
    fn lock_wait_ms(&self) -> u128 {
        LOCK_WAIT
            .min(self.limits.statement_timeout)
            .as_millis()
            .max(1)
    }

    /// The protocol error for a PostgreSQL failure; once closing, a cancelled or lost
    /// statement is the shutdown's 503.
    fn map(&self, err: &tokio_postgres::Error) -> ApiError {
        if self.node.is_replica() && replica_refuses(err) {
            // The primary runs it (see `PostgresEngine::read`), and answers for itself.
            return ApiError::unavailable(
                "the statement cannot run on a read replica (it is in recovery); retry on the \
                 primary",
            )
            .elsewhere();
        }
        let mapped = errors::map_error(err, self.timeout_ms());
        if self.closing.load(Ordering::Acquire)
            && matches!(
                mapped.code,
                ErrorCode::StatementTimeout | ErrorCode::Unavailable
            )
        {
            return shutting_down();
        }
        if mapped.code == ErrorCode::Unavailable {
            // The database is unreachable, lost, out of resources or in a recovery conflict.
            return self.failed_here(mapped);
        }
        mapped
    }

    /// `err`, a failure of this node's own (its pool, its connection, its database), marked
    /// as one the primary does not share when this node is a replica: the read goes there
    /// (see `PostgresEngine::read`). The server's own refusals (its buffer budget, its
    /// shutdown, a requester that left) are never marked: they would be the same there.
    fn failed_here(&self, err: ApiError) -> ApiError {
        if self.node.is_replica() {
            err.elsewhere()
        } else {
            err
        }
    }

    /// Runs `work` on `lease`; should the requester go away meanwhile, cancels the statement
    /// running on the lease's connection (PostgreSQL answers it with `57014`) and lets `work`
    /// finish with that error, so the transaction is still ended by its owner.
    ///
    /// The same happens when the engine closes; work that is not in a statement then (a
    /// streamed body waiting for its client to read) gets [`STOP_WITHIN`] and is abandoned.
    ///
    /// And when `work` (of `statements` statements) outlives `--statement-timeout` per
    /// statement and a grace of [`STOP_WITHIN`]: PostgreSQL's own `statement_timeout` normally
    /// fires first, but a client's function can lower its guard (`set_config` through dynamic
    /// SQL), and the pool must not be held past the limit anyway.
    async fn guarded<T>(
        &self,
        job: &Job,
        lease: &Lease,
        statements: usize,
        work: impl Future<Output = Result<T, ApiError>>,
    ) -> Result<T, ApiError> {
        let mut work = pin!(Timing::engine("postgresql", work));
        let shutdown = self.shutdown.notified();
        let mut shutdown = pin!(shutdown);
        shutdown.as_mut().enable();
        let per_statement = self.limits.statement_timeout;
        let backstop = per_statement
            .saturating_mul(u32::try_from(statements.max(1)).unwrap_or(u32::MAX))
            .saturating_add(STOP_WITHIN);
        let mut overran = false;
        let mut gone = false;
        if !self.closing.load(Ordering::Acquire) {
            tokio::select! {
                out = &mut work => return out,
                () = job.notify.notified() => {}
                () = &mut shutdown => {}
                () = tokio::time::sleep(backstop) => overran = true,
                () = self.node.gone() => gone = true,
            }
        }
        // A replica the watcher found gone: the read is served elsewhere (see `read`) at once;
        // its session is not waited for (it is discarded with the lease, never pooled).
        if gone {
            lease.retire();
            return Err(replica_gone());
        }
        lease.cancel_statement().await;
        let overran_error = || {
            ApiError::new(
                ErrorCode::StatementTimeout,
                format!(
                    "the request ran longer than this server's limit of {} ms per statement \
                     (--statement-timeout) and was cancelled; nothing it did was kept",
                    per_statement.as_millis()
                ),
            )
        };
        match tokio::time::timeout(STOP_WITHIN, work).await {
            Ok(Err(_)) if overran => Err(overran_error()),
            Ok(out) => out,
            Err(_) if self.closing.load(Ordering::Acquire) => Err(shutting_down()),
            Err(_) if overran => Err(overran_error()),
            Err(_) => Err(ApiError::interrupted()),
        }
    }

    /// Whether a connection answers a trivial statement.
    async fn ready(&self, job: &Job) -> Result<(), ApiError> {
        let mut lease = self.lease(job).await?;
        lease
            .client()
            .query_one("SELECT 1", &[])
            .await
            .map_err(|e| self.map(&e))?;
        lease.clean = true;
        Ok(())
    }

    async fn close(&self) {
        self.closing.store(true, Ordering::Release);
        self.shutdown.notify_waiters();
        self.pool.close();
        loop {
            let tokens: Vec<CancelToken> = self
                .in_flight
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .values()
                .cloned()
                .collect();
            if tokens.is_empty() {
                break;
            }
            for token in tokens {
                wire::cancel(&token, &self.reaper).await;
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
    }
}
