//! The history table: one row per migration applied or reverted, in the application's own
//! database (`sqlhttp_migrations` unless the migrator names another), and what it says about the
//! database's version.
//!
//! The table is an event log: `event` numbers every event of the table (unique), `(version,
//! seq)` is its primary key, `seq` counting the events of one version (0 when first applied, 1
//! when reverted, 2 when applied again, ...), and a version is applied when its last event is
//! `up`. Each event is inserted as the first statement of the batch that applies or reverts the
//! migration, numbered one above the highest event its run read: two steps decided on the same
//! reading (two runs applying the same migration, a run and a revert at once) collide on the
//! number, and only one commits, whatever the idempotency keys.
//!
//! Knows the table's SQL (the same text on SQLite and PostgreSQL) and how to fold its rows; not
//! which migrations exist locally.

use std::collections::BTreeMap;

use serde::Deserialize;

use crate::Client;
use crate::error::Result;

/// Whether an event applied or reverted its migration.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Direction {
    Up,
    Down,
}

impl Direction {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Direction::Up => "up",
            Direction::Down => "down",
        }
    }
}

/// One row of the history table.
#[derive(Debug, Clone, Deserialize)]
pub(crate) struct Event {
    pub(crate) event: u64,
    pub(crate) version: u64,
    pub(crate) seq: u64,
    pub(crate) direction: String,
    pub(crate) name: String,
    pub(crate) checksum: String,
    pub(crate) applied_at: String,
    pub(crate) duration_ms: Option<i64>,
}

/// The history table of one name.
#[derive(Debug, Clone)]
pub(crate) struct History {
    table: String,
}

/// What the history says: per version, its latest event; and the highest event number.
#[derive(Debug, Default)]
pub(crate) struct State {
    latest: BTreeMap<u64, Event>,
    last_event: Option<u64>,
}

impl State {
    /// The applied versions' latest events (their `up`), in version order.
    pub(crate) fn applied(&self) -> impl Iterator<Item = &Event> {
        self.latest
            .values()
            .filter(|event| event.direction == Direction::Up.as_str())
    }

    /// The applied event of `version`, if it is applied.
    pub(crate) fn applied_event(&self, version: u64) -> Option<&Event> {
        self.latest
            .get(&version)
            .filter(|event| event.direction == Direction::Up.as_str())
    }

    /// The `seq` of the next event of `version`.
    pub(crate) fn next_seq(&self, version: u64) -> u64 {
        self.latest.get(&version).map_or(0, |event| event.seq + 1)
    }

    /// The number of the next event of the table.
    pub(crate) fn next_event(&self) -> u64 {
        self.last_event.map_or(1, |last| last + 1)
    }

    /// Takes in an event this run recorded (its batch committed).
    pub(crate) fn record(&mut self, event: Event) {
        self.last_event = self.last_event.max(Some(event.event));
        self.latest.insert(event.version, event);
    }
}

impl History {
    pub(crate) fn new(table: String) -> History {
        History { table }
    }

    pub(crate) fn table(&self) -> &str {
        &self.table
    }

    /// The table's name as SQL: quoted, so that a reserved word (`order`) names it too and
    /// PostgreSQL keeps its case as SQLite does.
    fn quoted(&self) -> String {
        format!("\"{}\"", self.table)
    }

    /// Whether the table exists (a describe: a read, retried).
    pub(crate) async fn exists(&self, client: &Client) -> Result<bool> {
        Ok(client.describe(&self.table).await?.is_some())
    }

    /// Creates the table unless it exists. Two runs may race to create it: a failure is taken
    /// back when the table exists afterwards.
    pub(crate) async fn ensure(&self, client: &Client) -> Result<()> {
        if self.exists(client).await? {
            return Ok(());
        }
        let created = client
            .execute(format!(
                "CREATE TABLE IF NOT EXISTS {} (\
                 event BIGINT NOT NULL UNIQUE, \
                 version BIGINT NOT NULL, \
                 seq BIGINT NOT NULL, \
                 direction TEXT NOT NULL, \
                 name TEXT NOT NULL, \
                 checksum TEXT NOT NULL, \
                 applied_at TEXT NOT NULL, \
                 duration_ms BIGINT, \
                 PRIMARY KEY (version, seq))",
                self.quoted()
            ))
            .await;
        match created {
            Ok(_) => Ok(()),
            Err(error) => match self.exists(client).await {
                Ok(true) => Ok(()),
                _ => Err(error),
            },
        }
    }

    /// Reads the whole history (a read, retried); an absent table is an empty history.
    pub(crate) async fn read(&self, client: &Client) -> Result<State> {
        if !self.exists(client).await? {
            return Ok(State::default());
        }
        let events: Vec<Event> = client
            .query(format!(
                "SELECT event, version, seq, direction, name, checksum, applied_at, duration_ms \
                 FROM {} ORDER BY version, seq",
                self.quoted()
            ))
            .fetch_all()
            .await?;
        let mut state = State::default();
        // In (version, seq) order: the last one of each version stays.
        for event in events {
            state.record(event);
        }
        Ok(state)
    }

    /// The statement that records an event, first in its migration's batch, with its
    /// parameters bound by the caller in this order: event, version, seq, direction, name,
    /// checksum. The time is the server's.
    pub(crate) fn record_sql(&self) -> String {
        format!(
            "INSERT INTO {} (event, version, seq, direction, name, checksum, applied_at) \
             VALUES (?, ?, ?, ?, ?, ?, CURRENT_TIMESTAMP)",
            self.quoted()
        )
    }

    /// Records how long an applied event's batch took, after it committed (informational: a
    /// failure here changes nothing of the migration).
    pub(crate) async fn set_duration(
        &self,
        client: &Client,
        version: u64,
        seq: u64,
        millis: u64,
    ) -> Result<()> {
        client
            .execute(format!(
                "UPDATE {} SET duration_ms = ? WHERE version = ? AND seq = ?",
                self.quoted()
            ))
            .bind(i64::try_from(millis).unwrap_or(i64::MAX))
            .bind(version)
            .bind(seq)
            .await
            .map(|_| ())
    }
}

/// Whether `name` can name the history table: letters, digits and `_`, not starting with a
/// digit (it is quoted in SQL, so a reserved word is fine).
pub(crate) fn is_table_name(name: &str) -> bool {
    let mut bytes = name.bytes();
    bytes
        .next()
        .is_some_and(|b| b.is_ascii_alphabetic() || b == b'_')
        && bytes.all(|b| b.is_ascii_alphanumeric() || b == b'_')
        && name.len() <= 63
}
