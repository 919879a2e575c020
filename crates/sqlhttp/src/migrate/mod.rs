//! Schema migrations: a [`Migrator`] over numbered SQL files applies the ones a database lacks,
//! each **as one atomic batch together with its record** in a history table of the
//! application's own. So a crash mid-migration leaves nothing half-applied; and two deploys that
//! run at once apply each migration exactly once: both number the record one above the last
//! event they read, the table holds each number once, and the run whose record comes second is
//! rolled back whole and reads the history again. Each batch carries an idempotency key of its
//! own, so a lost answer is retried without running the migration twice (ADR 0031).
//!
//! ```no_run
//! # async fn run(client: sqlhttp::Client) -> Result<(), sqlhttp::migrate::MigrateError> {
//! use sqlhttp::migrate::Migrator;
//!
//! // migrations/0001_create_books.sql, migrations/0002_add_isbn.sql, ...
//! let report = Migrator::from_dir("migrations")?.run(&client).await?;
//! for applied in &report.applied {
//!     println!("applied {} {} in {:?}", applied.version, applied.name, applied.elapsed);
//! }
//! # Ok(())
//! # }
//! ```
//!
//! Files are `NNNN_name.sql` (NNNN the version: digits, applied in numeric order), with an
//! optional `NNNN_name.down.sql` that [`Migrator::revert`] runs. A file holds statements ended by
//! `;` ([`script::split`] cuts them; trigger and function bodies stay
//! whole). [`migrations!`](crate::migrations) embeds the files in the binary instead.
//!
//! This module knows the migration rules and the batch each step is sent as; the files'
//! reading is `source`'s, the history table's SQL is `history`'s, and retrying is the
//! transport's.

mod history;
mod source;

use std::path::Path;
use std::time::Duration;

use tokio::time::Instant;

pub use source::Migration;

use self::history::{Direction, Event, History, State};
use crate::error::ErrorKind;
use crate::script::{self, ScriptStatement};
use crate::{Client, Error};

/// The history table's name unless [`Migrator::table`] says otherwise.
pub const DEFAULT_TABLE: &str = "sqlhttp_migrations";

/// How long a run waits for another run that holds a migration's key, by default.
const DEFAULT_LOCK_TIMEOUT: Duration = Duration::from_secs(300);

/// The pause between two looks at a key another run holds, when the server named none.
const KEY_IN_USE_PAUSE: Duration = Duration::from_secs(1);

/// Why migrating failed. Nothing of the migration named is applied (each is one atomic batch);
/// the migrations before it in the same run are.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum MigrateError {
    /// A migration file cannot be used: its name, its text, or a statement a migration cannot
    /// hold (the message says which and why).
    #[error("{file}: {message}")]
    Source {
        /// The file (or directory) concerned.
        file: String,
        /// What is wrong with it.
        message: String,
    },
    /// An applied migration's file changed since: the database holds what the old text did.
    #[error(
        "{file} (version {version}) changed after it was applied: its checksum was {applied} \
         when it was applied and is {local} now; put the file back as it was and make the \
         change in a new migration"
    )]
    ChecksumMismatch {
        /// The migration's version.
        version: u64,
        /// Its file.
        file: String,
        /// The checksum the history recorded when it was applied.
        applied: String,
        /// The file's checksum now.
        local: String,
    },
    /// The database has a migration applied that is not among the migrations given (a file
    /// removed, or a database ahead of this build). [`Migrator::ignore_missing`] lets a run
    /// go on.
    #[error(
        "version {version} ({name}) is applied to the database but there is no migration file \
         for it; restore the file, or run a build that has it (Migrator::ignore_missing lets a \
         run go on without it)"
    )]
    Missing {
        /// The applied version.
        version: u64,
        /// Its name as recorded.
        name: String,
    },
    /// A pending migration's version is below one already applied (say, written on a branch
    /// merged later). [`Migrator::allow_out_of_order`] applies it anyway.
    #[error(
        "{file} (version {version}) is pending but version {applied} is already applied; give \
         it a version above {applied}, or allow out-of-order migrations \
         (Migrator::allow_out_of_order)"
    )]
    OutOfOrder {
        /// The pending version.
        version: u64,
        /// Its file.
        file: String,
        /// The highest applied version.
        applied: u64,
    },
    /// A statement of a migration failed; the migration's batch was rolled back whole.
    #[error("{file}: statement at line {line}: {source}")]
    Statement {
        /// The file the statement is in.
        file: String,
        /// The line it starts on.
        line: usize,
        /// The server's answer.
        #[source]
        source: Error,
    },
    /// [`Migrator::revert`] was asked to revert a migration that has no down file.
    #[error("{file} (version {version}) cannot be reverted: there is no {down}")]
    NoDown {
        /// The migration's version.
        version: u64,
        /// Its file.
        file: String,
        /// The down file it would need.
        down: String,
    },
    /// The migration's batch was still running, or waiting for another run's, after
    /// [`Migrator::lock_timeout`].
    #[error(
        "{file} (version {version}) is still being applied or reverted after {waited:?} (this \
         run's batch, or another run's); look with `info` before running again"
    )]
    Busy {
        /// The migration's version.
        version: u64,
        /// Its file.
        file: String,
        /// How long this run waited.
        waited: Duration,
    },
    /// The history changed under this run in a way it cannot settle (another run applied or
    /// reverted something else at the same time): nothing of this step was applied; run again.
    #[error("{file} (version {version}): {message}; nothing of it was applied by this run")]
    Conflict {
        /// The migration's version.
        version: u64,
        /// Its file.
        file: String,
        /// What was found.
        message: String,
    },
    /// A setting of the migrator cannot work (the history table's name).
    #[error("invalid migrator setting: {0}")]
    Config(String),
    /// A call to the server failed outside a migration's statements (reading or creating the
    /// history table, ...).
    #[error("{context}: {source}")]
    Client {
        /// What the migrator was doing.
        context: String,
        /// The call's failure.
        #[source]
        source: Error,
    },
}

impl MigrateError {
    /// The SDK error behind this one, when a call to the server failed.
    pub fn client_error(&self) -> Option<&Error> {
        match self {
            MigrateError::Statement { source, .. } | MigrateError::Client { source, .. } => {
                Some(source)
            }
            _ => None,
        }
    }

    fn client(context: impl Into<String>) -> impl FnOnce(Error) -> MigrateError {
        let context = context.into();
        move |source| MigrateError::Client { context, source }
    }
}

/// What [`Migrator::run`] did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct MigrateReport {
    /// The migrations applied, in order.
    pub applied: Vec<Applied>,
    /// The database's version afterwards: the highest applied, `None` when none is.
    pub version: Option<u64>,
}

/// One migration [`Migrator::run`] applied.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Applied {
    /// Its version.
    pub version: u64,
    /// Its name.
    pub name: String,
    /// How long its batch took, as this client saw it (waits for another run included).
    pub elapsed: Duration,
    /// Whether another run applied it: this run's record collided with the other's, and the
    /// history then showed it applied (nothing of this run's batch was).
    pub by_another_run: bool,
}

/// The migration [`Migrator::revert`] reverted.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Reverted {
    /// Its version.
    pub version: u64,
    /// Its name.
    pub name: String,
    /// Whether another run reverted it (as for [`Applied::by_another_run`]).
    pub by_another_run: bool,
}

/// One line of [`Migrator::info`]: a migration known locally, in the database, or both.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct MigrationInfo {
    /// Its version.
    pub version: u64,
    /// Its name (the file's, or the history's when there is no file).
    pub name: String,
    /// Where it stands.
    pub status: MigrationStatus,
    /// When it was applied (the server's `CURRENT_TIMESTAMP`, as the engine writes it).
    pub applied_at: Option<String>,
    /// How long its batch took on the server side of the client, when recorded.
    pub duration: Option<Duration>,
    /// Its checksum: the file's, or the history's when there is no file.
    pub checksum: String,
}

/// Where one migration stands, in [`MigrationInfo`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum MigrationStatus {
    /// Applied, with the file's checksum.
    Applied,
    /// Not applied (never, or reverted since).
    Pending,
    /// Applied, but the file changed since: the history has this checksum.
    Changed {
        /// The checksum recorded when it was applied.
        applied: String,
    },
    /// Applied, but there is no file for it.
    Missing,
}

/// Applies, reverts and reports numbered SQL migrations; see the [module docs](self).
///
/// The history table (`sqlhttp_migrations` unless [`table`](Self::table) names another) is
/// created on the first [`run`](Self::run); it has one row per event (`version`, `seq`,
/// `direction` `up` or `down`, `name`, `checksum`, `applied_at`, `duration_ms`), so it also
/// keeps what was reverted and when.
#[derive(Debug, Clone)]
pub struct Migrator {
    migrations: Vec<Migration>,
    table: String,
    allow_out_of_order: bool,
    ignore_missing: bool,
    lock_timeout: Duration,
}

impl Migrator {
    /// A migrator over `migrations` (in any order: they are applied by version).
    ///
    /// # Errors
    /// [`MigrateError::Source`] when two have the same version, or a version is over
    /// `i64::MAX`.
    pub fn new(migrations: impl IntoIterator<Item = Migration>) -> Result<Migrator, MigrateError> {
        let mut migrations: Vec<Migration> = migrations.into_iter().collect();
        migrations.sort_by_key(Migration::version);
        for pair in migrations.windows(2) {
            if pair[0].version() == pair[1].version() {
                return Err(MigrateError::Source {
                    file: pair[1].source().to_owned(),
                    message: format!(
                        "version {} is also {}: each version is one migration",
                        pair[1].version(),
                        pair[0].source()
                    ),
                });
            }
        }
        if let Some(too_big) = migrations
            .iter()
            .find(|m| i64::try_from(m.version()).is_err())
        {
            return Err(MigrateError::Source {
                file: too_big.source().to_owned(),
                message: format!(
                    "version {} is over the largest, {}",
                    too_big.version(),
                    i64::MAX
                ),
            });
        }
        Ok(Migrator {
            migrations,
            table: DEFAULT_TABLE.to_owned(),
            allow_out_of_order: false,
            ignore_missing: false,
            lock_timeout: DEFAULT_LOCK_TIMEOUT,
        })
    }

    /// A migrator over the `.sql` files of `dir` (not its subdirectories; other files are
    /// ignored): `NNNN_name.sql` applies version NNNN, `NNNN_name.down.sql` reverts it
    /// (`NNNN_name.up.sql` is read as `NNNN_name.sql`).
    ///
    /// # Errors
    /// [`MigrateError::Source`] when the directory or a file cannot be read, a `.sql` file is
    /// not named as above, two files have one version, or a down file has no migration.
    pub fn from_dir(dir: impl AsRef<Path>) -> Result<Migrator, MigrateError> {
        Migrator::from_files(source::read_dir(dir.as_ref())?)
    }

    /// A migrator over files given as `(file name, text)` pairs, named as for
    /// [`from_dir`](Self::from_dir) (a path's last component is its name); the form
    /// [`migrations!`](crate::migrations) builds from files embedded at compile time.
    ///
    /// ```
    /// let migrator = sqlhttp::migrate::Migrator::from_files([
    ///     ("0001_create_books.sql", "CREATE TABLE books (id INTEGER PRIMARY KEY, title TEXT);"),
    ///     ("0002_add_isbn.sql", "ALTER TABLE books ADD COLUMN isbn TEXT;"),
    ///     ("0002_add_isbn.down.sql", "ALTER TABLE books DROP COLUMN isbn;"),
    /// ])?;
    /// assert_eq!(migrator.migrations().len(), 2);
    /// # Ok::<(), sqlhttp::migrate::MigrateError>(())
    /// ```
    ///
    /// # Errors
    /// As [`from_dir`](Self::from_dir), for names.
    pub fn from_files<N, T>(
        files: impl IntoIterator<Item = (N, T)>,
    ) -> Result<Migrator, MigrateError>
    where
        N: AsRef<str>,
        T: Into<String>,
    {
        Migrator::new(source::assemble(files)?)
    }

    /// Names the history table (`sqlhttp_migrations` by default): an unquoted identifier of
    /// letters, digits and `_`, at most 63 bytes. Checked when the migrator is used.
    #[must_use]
    pub fn table(mut self, name: impl Into<String>) -> Migrator {
        self.table = name.into();
        self
    }

    /// Whether a pending migration below the highest applied version is applied (`true`) or
    /// refused with [`MigrateError::OutOfOrder`] (`false`, the default).
    #[must_use]
    pub fn allow_out_of_order(mut self, allow: bool) -> Migrator {
        self.allow_out_of_order = allow;
        self
    }

    /// Whether an applied version with no migration here is ignored (`true`) or refused with
    /// [`MigrateError::Missing`] (`false`, the default).
    #[must_use]
    pub fn ignore_missing(mut self, ignore: bool) -> Migrator {
        self.ignore_missing = ignore;
        self
    }

    /// How long a step waits for a batch of its own that is still running on the server (its
    /// answer was lost and the retry finds it at work), or, on PostgreSQL, for another run's
    /// record that holds the same event number (5 minutes by default); past it,
    /// [`MigrateError::Busy`].
    #[must_use]
    pub fn lock_timeout(mut self, timeout: Duration) -> Migrator {
        self.lock_timeout = timeout;
        self
    }

    /// The migrations, by version.
    pub fn migrations(&self) -> &[Migration] {
        &self.migrations
    }

    fn history(&self) -> Result<History, MigrateError> {
        if history::is_table_name(&self.table) {
            Ok(History::new(self.table.clone()))
        } else {
            Err(MigrateError::Config(format!(
                "the history table's name {:?} cannot be used: letters, digits and _, not \
                 starting with a digit, at most 63 bytes",
                self.table
            )))
        }
    }

    /// Applies every pending migration, in version order, each as one atomic batch with its
    /// record, and returns what it applied. A run with nothing pending is a no-op.
    ///
    /// Before anything is applied, the run checks the history against the migrations: an
    /// applied migration whose file changed ([`MigrateError::ChecksumMismatch`]), an applied
    /// version without a file ([`MigrateError::Missing`]), a pending version below an applied
    /// one ([`MigrateError::OutOfOrder`]), and every pending file's statements (a statement a
    /// batch cannot hold: [`MigrateError::Source`]) each stop it.
    ///
    /// # Errors
    /// The above; [`MigrateError::Statement`] when a statement fails on the server (that
    /// migration is rolled back, the ones before it stay applied); [`MigrateError::Busy`],
    /// [`MigrateError::Conflict`] and [`MigrateError::Client`] as they say.
    pub async fn run(&self, client: &Client) -> Result<MigrateReport, MigrateError> {
        let history = self.history()?;
        history
            .ensure(client)
            .await
            .map_err(MigrateError::client(format!(
                "cannot create the migration history table {}",
                history.table()
            )))?;
        let mut state = self.read(&history, client).await?;
        let limit = client.batch_limits().max_statements;
        self.plan(&state, limit)?;
        let keys_at_commit = on_sqlite(client).await?;
        let mut report = MigrateReport {
            applied: Vec::new(),
            version: state.applied().map(|event| event.version).max(),
        };
        let mut collisions = 0;
        // Planned anew after every step: another run may have moved the history on.
        while let Some(migration) = self
            .migrations
            .iter()
            .find(|m| state.applied_event(m.version()).is_none())
        {
            let step = Step {
                migration,
                file: migration.source().to_owned(),
                direction: Direction::Up,
                seq: state.next_seq(migration.version()),
                event: state.next_event(),
                statements: statements_of(migration.source(), migration.up_sql(), limit)?,
                keys_at_commit,
            };
            let started = Instant::now();
            match self.send(client, &history, &step).await? {
                Sent::Committed => {
                    let elapsed = started.elapsed();
                    let millis = u64::try_from(elapsed.as_millis()).unwrap_or(u64::MAX);
                    if let Err(error) = history
                        .set_duration(client, migration.version(), step.seq, millis)
                        .await
                    {
                        tracing::warn!(
                            version = migration.version(),
                            %error,
                            "the migration is applied; its duration was not recorded"
                        );
                    }
                    state.record(step.event_row());
                    report.applied.push(Applied {
                        version: migration.version(),
                        name: migration.name().to_owned(),
                        elapsed,
                        by_another_run: false,
                    });
                }
                Sent::Collided => {
                    collisions += 1;
                    if collisions > MAX_COLLISIONS {
                        return Err(MigrateError::Conflict {
                            version: migration.version(),
                            file: step.file,
                            message: format!(
                                "the history kept changing under this run ({MAX_COLLISIONS} \
                                 times)"
                            ),
                        });
                    }
                    state = self.read(&history, client).await?;
                    self.plan(&state, limit)?;
                    if state.applied_event(migration.version()).is_some() {
                        report.applied.push(Applied {
                            version: migration.version(),
                            name: migration.name().to_owned(),
                            elapsed: started.elapsed(),
                            by_another_run: true,
                        });
                    }
                }
            }
            report.version = state.applied().map(|event| event.version).max();
        }
        Ok(report)
    }

    /// Reverts the latest applied migration with its down file, as one atomic batch with its
    /// record; `None` when nothing is applied.
    ///
    /// # Errors
    /// [`MigrateError::NoDown`] when it has no down file; [`MigrateError::ChecksumMismatch`]
    /// or [`MigrateError::Missing`] when its file changed or is gone (the down file of another
    /// text would not undo what was applied); otherwise as [`run`](Self::run).
    pub async fn revert(&self, client: &Client) -> Result<Option<Reverted>, MigrateError> {
        let history = self.history()?;
        let state = self.read(&history, client).await?;
        let Some(latest) = state.applied().max_by_key(|event| event.version) else {
            return Ok(None);
        };
        let Some(migration) = self
            .migrations
            .iter()
            .find(|m| m.version() == latest.version)
        else {
            return Err(MigrateError::Missing {
                version: latest.version,
                name: latest.name.clone(),
            });
        };
        check_checksum(migration, latest)?;
        let Some(down) = migration.down_sql() else {
            return Err(MigrateError::NoDown {
                version: migration.version(),
                file: migration.source().to_owned(),
                down: migration.down_source(),
            });
        };
        let file = migration.down_source();
        let step = Step {
            migration,
            statements: statements_of(&file, down, client.batch_limits().max_statements)?,
            file,
            direction: Direction::Down,
            seq: state.next_seq(migration.version()),
            event: state.next_event(),
            keys_at_commit: on_sqlite(client).await?,
        };
        match self.send(client, &history, &step).await? {
            Sent::Committed => Ok(Some(Reverted {
                version: migration.version(),
                name: migration.name().to_owned(),
                by_another_run: false,
            })),
            Sent::Collided => {
                // Reverting is not re-planned: the latest migration may be another one now.
                let now = self.read(&history, client).await?;
                if now.applied_event(migration.version()).is_none()
                    && now.next_seq(migration.version()) > step.seq
                {
                    return Ok(Some(Reverted {
                        version: migration.version(),
                        name: migration.name().to_owned(),
                        by_another_run: true,
                    }));
                }
                Err(MigrateError::Conflict {
                    version: migration.version(),
                    file: step.file,
                    message: "another run changed the history while this one reverted; see \
                              `info`, then revert again if it is still wanted"
                        .to_owned(),
                })
            }
        }
    }

    /// Every migration known here or in the database, by version, with where it stands. Reads
    /// only: the history table is not created.
    ///
    /// # Errors
    /// [`MigrateError::Client`] when the history cannot be read.
    pub async fn info(&self, client: &Client) -> Result<Vec<MigrationInfo>, MigrateError> {
        let history = self.history()?;
        let state = self.read(&history, client).await?;
        let mut lines: Vec<MigrationInfo> = self
            .migrations
            .iter()
            .map(|migration| {
                let applied = state.applied_event(migration.version());
                let status = match applied {
                    None => MigrationStatus::Pending,
                    Some(event) if event.checksum == migration.checksum() => {
                        MigrationStatus::Applied
                    }
                    Some(event) => MigrationStatus::Changed {
                        applied: event.checksum.clone(),
                    },
                };
                MigrationInfo {
                    version: migration.version(),
                    name: migration.name().to_owned(),
                    status,
                    applied_at: applied.map(|event| event.applied_at.clone()),
                    duration: applied.and_then(duration_of),
                    checksum: migration.checksum().to_owned(),
                }
            })
            .collect();
        for event in state.applied() {
            if !self.migrations.iter().any(|m| m.version() == event.version) {
                lines.push(MigrationInfo {
                    version: event.version,
                    name: event.name.clone(),
                    status: MigrationStatus::Missing,
                    applied_at: Some(event.applied_at.clone()),
                    duration: duration_of(event),
                    checksum: event.checksum.clone(),
                });
            }
        }
        lines.sort_by_key(|line| line.version);
        Ok(lines)
    }

    async fn read(&self, history: &History, client: &Client) -> Result<State, MigrateError> {
        history
            .read(client)
            .await
            .map_err(MigrateError::client(format!(
                "cannot read the migration history table {}",
                history.table()
            )))
    }

    /// Refuses a history that does not match the migrations (a changed file, a missing one,
    /// a pending version below an applied one), and pending files a batch cannot hold, before
    /// anything is applied.
    fn plan(&self, state: &State, limit: usize) -> Result<(), MigrateError> {
        for event in state.applied() {
            match self
                .migrations
                .iter()
                .find(|m| m.version() == event.version)
            {
                Some(migration) => check_checksum(migration, event)?,
                None if self.ignore_missing => {}
                None => {
                    return Err(MigrateError::Missing {
                        version: event.version,
                        name: event.name.clone(),
                    });
                }
            }
        }
        let highest_applied = state.applied().map(|event| event.version).max();
        let mut pending = self
            .migrations
            .iter()
            .filter(|m| state.applied_event(m.version()).is_none());
        if !self.allow_out_of_order
            && let Some(applied) = highest_applied
            && let Some(early) = pending.clone().find(|m| m.version() < applied)
        {
            return Err(MigrateError::OutOfOrder {
                version: early.version(),
                file: early.source().to_owned(),
                applied,
            });
        }
        pending.try_for_each(|m| statements_of(m.source(), m.up_sql(), limit).map(|_| ()))
    }

    /// Sends one step's batch (its record first, then its statements) under a key of its own,
    /// retried under that key while the outcome is unknown; [`Sent::Collided`] when another
    /// step was recorded first (nothing of this one was applied).
    async fn send(
        &self,
        client: &Client,
        history: &History,
        step: &Step<'_>,
    ) -> Result<Sent, MigrateError> {
        let migration = step.migration;
        // A key for this call only: its retries are answered from the server's store, while
        // another run (or a later run of this one, after a failure was fixed) is a new
        // request that the history's unique event number settles.
        let key = format!(
            "sqlhttp-migrate/{}/{}/{}/{:032x}",
            history.table(),
            migration.version(),
            step.direction.as_str(),
            rand::random::<u128>()
        );
        let started = Instant::now();
        loop {
            let mut batch = client
                .batch()
                .statement(history.record_sql())
                .bind(step.event)
                .bind(migration.version())
                .bind(step.seq)
                .bind(step.direction.as_str())
                .bind(migration.name())
                .bind(migration.checksum());
            for statement in &step.statements {
                batch = batch.statement(statement.sql.clone());
            }
            batch = batch.foreign_keys_checked_at_commit(step.keys_at_commit);
            let Err(error) = batch.idempotency_key(key.clone()).retry_writes(true).await else {
                return Ok(Sent::Committed);
            };
            let waited = started.elapsed();
            let busy = || MigrateError::Busy {
                version: migration.version(),
                file: step.file.clone(),
                waited,
            };
            match (error.kind(), error.statement_index()) {
                // This call's own earlier attempt is still running on the server.
                (ErrorKind::IdempotencyKeyInUse { retry_after, .. }, _) => {
                    if waited >= self.lock_timeout {
                        return Err(busy());
                    }
                    tokio::time::sleep(retry_after.unwrap_or(KEY_IN_USE_PAUSE)).await;
                }
                (ErrorKind::ConstraintViolation { .. }, Some(0)) => return Ok(Sent::Collided),
                // On PostgreSQL the record waits for a concurrent run's to commit or roll back:
                // past the statement timeout, look again.
                (ErrorKind::StatementTimeout { .. }, Some(0)) => {
                    if waited >= self.lock_timeout {
                        return Err(busy());
                    }
                    return Ok(Sent::Collided);
                }
                (_, Some(index)) if index > 0 => {
                    let line = step.statements.get(index - 1).map_or(0, |s| s.line);
                    return Err(MigrateError::Statement {
                        file: step.file.clone(),
                        line,
                        source: error,
                    });
                }
                _ => {
                    return Err(MigrateError::Client {
                        context: format!(
                            "while {} {} (version {})",
                            match step.direction {
                                Direction::Up => "applying",
                                Direction::Down => "reverting",
                            },
                            step.file,
                            migration.version()
                        ),
                        source: error,
                    });
                }
            }
        }
    }
}

/// How a step's batch ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Sent {
    /// It committed, with its record.
    Committed,
    /// Another step took its event number first: nothing of it was applied.
    Collided,
}

/// Steps re-planned in one run, at most, before it gives up (each follows another run's step).
const MAX_COLLISIONS: usize = 1000;

/// One migration's batch: what it applies or reverts, and the event it records.
#[derive(Debug)]
struct Step<'a> {
    migration: &'a Migration,
    /// The file the statements come from (the down file for a revert).
    file: String,
    direction: Direction,
    seq: u64,
    event: u64,
    statements: Vec<ScriptStatement>,
    /// The engine is SQLite: foreign keys are checked at commit (see [`on_sqlite`]).
    keys_at_commit: bool,
}

impl Step<'_> {
    /// The history's row for this step, once it committed (its time is the server's; only the
    /// migrator's own bookkeeping reads this one).
    fn event_row(&self) -> Event {
        Event {
            event: self.event,
            version: self.migration.version(),
            seq: self.seq,
            direction: self.direction.as_str().to_owned(),
            name: self.migration.name().to_owned(),
            checksum: self.migration.checksum().to_owned(),
            applied_at: String::new(),
            duration_ms: None,
        }
    }
}

/// Whether the server's engine is SQLite (it knows `sqlite_version()`), where migrations run
/// with foreign keys checked at commit: a table rebuild (create, copy, drop, rename) must not
/// fire the `ON DELETE` actions of the tables that refer to the dropped one, and SQLite ignores
/// `PRAGMA foreign_keys` inside the migration's transaction (ADR 0031).
async fn on_sqlite(client: &Client) -> Result<bool, MigrateError> {
    match client
        .query("SELECT sqlite_version()")
        .fetch_one::<String>()
        .await
    {
        Ok(_) => Ok(true),
        Err(error) if matches!(error.kind(), ErrorKind::Sql { .. }) => Ok(false),
        Err(error) => Err(MigrateError::Client {
            context: "cannot tell the server's engine".to_owned(),
            source: error,
        }),
    }
}

fn check_checksum(migration: &Migration, applied: &Event) -> Result<(), MigrateError> {
    if applied.checksum == migration.checksum() {
        Ok(())
    } else {
        Err(MigrateError::ChecksumMismatch {
            version: migration.version(),
            file: migration.source().to_owned(),
            applied: applied.checksum.clone(),
            local: migration.checksum().to_owned(),
        })
    }
}

fn duration_of(event: &Event) -> Option<Duration> {
    event
        .duration_ms
        .and_then(|millis| u64::try_from(millis).ok())
        .map(Duration::from_millis)
}

/// The statements of a migration file, each checked for what a batch can hold, within the
/// batch limit (`limit` statements, one of them the record).
fn statements_of(
    file: &str,
    text: &str,
    limit: usize,
) -> Result<Vec<ScriptStatement>, MigrateError> {
    let split = script::split(text);
    let last = split
        .last_statement()
        .transpose()
        .map_err(|line| MigrateError::Source {
            file: file.to_owned(),
            message: format!(
                "the statement at line {line} does not end: a quote, comment or body in it is not \
             closed"
            ),
        })?;
    let mut statements = split.statements;
    // The last statement may omit its `;`.
    statements.extend(last);
    for statement in &statements {
        if let Some(reason) = not_in_a_batch(&statement.sql) {
            return Err(MigrateError::Source {
                file: file.to_owned(),
                message: format!("the statement at line {}: {reason}", statement.line),
            });
        }
    }
    if statements.len() >= limit {
        return Err(MigrateError::Source {
            file: file.to_owned(),
            message: format!(
                "{} statements: a migration is one batch with its record, at most {} statements \
                 (ClientBuilder::batch_max_statements, the server's --max-batch-statements); \
                 split it into several migrations",
                statements.len(),
                limit.saturating_sub(1)
            ),
        });
    }
    Ok(statements)
}

/// Why a statement cannot be one of a migration's batch, when it cannot: it ends or opens a
/// transaction, or its engine refuses to run it inside one. Not a complete list of the
/// latter: the server refuses the rest, and the error names the file and line the same way.
fn not_in_a_batch(sql: &str) -> Option<&'static str> {
    let words: Vec<String> = script::leading_words(sql, 16)
        .map(str::to_ascii_uppercase)
        .collect();
    let word = |i: usize| words.get(i).map_or("", String::as_str);
    // REINDEX (VERBOSE, ...) TABLE ...: the options do not count as words.
    let after_options: Vec<&str> = match words.iter().position(|w| w == ")") {
        Some(close) if word(1) == "(" => std::iter::once(word(0))
            .chain(words[close + 1..].iter().map(String::as_str))
            .collect(),
        _ => words.iter().map(String::as_str).collect(),
    };
    let concurrently = "CONCURRENTLY cannot run inside a transaction, and a migration is one; \
                        do it without CONCURRENTLY, or outside the migrations";
    match (word(0), word(1), word(2)) {
        (
            "BEGIN" | "START" | "COMMIT" | "END" | "ROLLBACK" | "SAVEPOINT" | "RELEASE" | "ABORT",
            ..,
        ) => Some(
            "transaction control cannot be in a migration: each migration already runs as \
                 one transaction, applied whole or not at all",
        ),
        ("VACUUM", ..) => Some("VACUUM cannot run inside a transaction, and a migration is one"),
        ("DISCARD", "ALL", _) => Some("DISCARD ALL cannot run inside a transaction"),
        ("CREATE", "INDEX", "CONCURRENTLY") | ("CREATE", "UNIQUE", "INDEX")
            if word(2) == "CONCURRENTLY" || word(3) == "CONCURRENTLY" =>
        {
            Some(concurrently)
        }
        ("DROP", "INDEX", "CONCURRENTLY") => Some(concurrently),
        ("REINDEX", ..) if after_options.get(2) == Some(&"CONCURRENTLY") => Some(concurrently),
        ("REINDEX", ..) if matches!(after_options.get(1), Some(&"DATABASE" | &"SYSTEM")) => {
            Some("REINDEX DATABASE and REINDEX SYSTEM cannot run inside a transaction")
        }
        ("ALTER", "TABLE", _)
            if words
                .windows(2)
                .any(|w| w[0] == "DETACH" && w[1] == "PARTITION")
                && words.iter().any(|w| w == "CONCURRENTLY" || w == "FINALIZE") =>
        {
            Some(concurrently)
        }
        ("CLUSTER", "", _) | ("CLUSTER", "VERBOSE", "") => {
            Some("CLUSTER of every table cannot run inside a transaction; name the table")
        }
        ("CREATE" | "DROP", "DATABASE" | "TABLESPACE", _) => {
            Some("databases and tablespaces cannot be created or dropped inside a transaction")
        }
        ("ALTER", "SYSTEM", _) => {
            Some("ALTER SYSTEM cannot run inside a transaction, and a migration is one")
        }
        _ => None,
    }
}

/// A [`Migrator`] over migration files embedded in the binary at compile time, so that nothing
/// needs to be on disk where it runs. Paths are relative to the calling crate's
/// `CARGO_MANIFEST_DIR`; files are named as for [`Migrator::from_dir`] (down files listed too).
/// Evaluates to `Result<Migrator, MigrateError>` (an error only for names).
///
/// ```ignore
/// let migrator = sqlhttp::migrations![
///     "migrations/0001_create_books.sql",
///     "migrations/0002_add_isbn.sql",
///     "migrations/0002_add_isbn.down.sql",
/// ]?;
/// migrator.run(&client).await?;
/// ```
#[macro_export]
#[cfg_attr(docsrs, doc(cfg(feature = "migrate")))]
macro_rules! migrations {
    ($($file:literal),+ $(,)?) => {
        $crate::migrate::Migrator::from_files([
            $(($file, include_str!(concat!(env!("CARGO_MANIFEST_DIR"), "/", $file))),)+
        ])
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statements_a_batch_cannot_hold_name_their_line() {
        for (text, needle) in [
            (
                "CREATE TABLE a (x INT);\nBEGIN;\n",
                "line 2: transaction control",
            ),
            ("-- tidy\nVACUUM;", "line 2: VACUUM"),
            (
                "CREATE UNIQUE INDEX CONCURRENTLY i ON t (x);",
                "line 1: CONCURRENTLY",
            ),
            ("create database x;", "databases"),
            ("REINDEX (VERBOSE) TABLE CONCURRENTLY t;", "CONCURRENTLY"),
            ("REINDEX DATABASE app;", "REINDEX DATABASE"),
            (
                "ALTER TABLE m DETACH PARTITION m1 CONCURRENTLY;",
                "CONCURRENTLY",
            ),
            ("CLUSTER;", "CLUSTER"),
            ("SELECT 1;\nSELECT 'open", "line 2 does not end"),
        ] {
            let error = statements_of("0003_x.sql", text, 100).unwrap_err();
            let message = error.to_string();
            assert!(message.starts_with("0003_x.sql: "), "{message}");
            assert!(message.contains(needle), "{text:?}: {message}");
        }
        // Not refused: a table named `concurrently`, an index built in the transaction.
        for fine in [
            "CREATE TABLE concurrently (x INT);",
            "CREATE INDEX i ON t (x);",
            "REINDEX TABLE t;",
            "CLUSTER t USING i;",
        ] {
            assert!(statements_of("x.sql", fine, 100).is_ok(), "{fine}");
        }
        let trigger = "CREATE TRIGGER t AFTER INSERT ON a BEGIN INSERT INTO b VALUES (1); END;";
        assert_eq!(statements_of("x.sql", trigger, 100).unwrap().len(), 1);
        assert!(
            statements_of("x.sql", "-- nothing yet\n", 100)
                .unwrap()
                .is_empty()
        );
        let last = statements_of("x.sql", "SELECT 1;\nSELECT 2\n", 100).unwrap();
        assert_eq!((last[1].sql.as_str(), last[1].line), ("SELECT 2", 2));
    }

    #[test]
    fn a_migration_fits_one_batch_with_its_record() {
        let text = "SELECT 1;".repeat(99);
        assert_eq!(statements_of("x.sql", &text, 100).unwrap().len(), 99);
        let error = statements_of("x.sql", &"SELECT 1;".repeat(100), 100).unwrap_err();
        assert!(
            error.to_string().contains("at most 99 statements"),
            "{error}"
        );
    }

    #[test]
    fn versions_are_unique_and_sorted() {
        let migrator =
            Migrator::new([Migration::new(2, "b", ""), Migration::new(1, "a", "")]).unwrap();
        assert_eq!(
            migrator
                .migrations()
                .iter()
                .map(Migration::version)
                .collect::<Vec<_>>(),
            [1, 2]
        );
        let error =
            Migrator::new([Migration::new(1, "a", ""), Migration::new(1, "b", "")]).unwrap_err();
        assert!(error.to_string().contains("also 0001_a.sql"), "{error}");
        assert!(Migrator::new([Migration::new(u64::MAX, "a", "")]).is_err());
    }

    #[test]
    fn history_table_names_are_identifiers() {
        let bad = Migrator::new([])
            .unwrap()
            .table("a; DROP TABLE b")
            .history();
        assert!(matches!(bad, Err(MigrateError::Config(_))));
        assert!(
            Migrator::new([])
                .unwrap()
                .table("app_migrations")
                .history()
                .is_ok()
        );
    }
}
