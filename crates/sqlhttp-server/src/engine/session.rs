//! [`Session`]: the open interactive transaction of whichever engine serves the database,
//! SQLite's or PostgreSQL's. Each engine's session implements [`Interactive`]; this enum only
//! dispatches, every call through the one `dispatch!` below, as [`Backend`](crate::engine::Backend)
//! does for the [`Engine`](crate::engine::Engine) calls.
//!
//! It names both engines' sessions, and no engine imports it: an engine's `begin` answers its
//! own session, and `Backend::begin` wraps it here. Knows nothing about HTTP, tokens or the
//! registry of transactions (`crate::transactions`).

use crate::engine::interactive::{CommitError, Interactive, Record, StepError};
#[cfg(feature = "postgres")]
use crate::engine::postgres::interactive as postgres;
use crate::engine::sqlite::interactive as sqlite;
use crate::protocol::bookmark::{Bookmark, Position};
use crate::protocol::request::SqlRequest;

/// An engine's open transaction: one connection held across requests.
#[derive(Debug)]
pub(crate) enum Session {
    /// A SQLite connection of its own, on a thread of its own.
    Sqlite(sqlite::Session),
    /// A pooled PostgreSQL connection, held (boxed: it is far larger than SQLite's handle).
    #[cfg(feature = "postgres")]
    Postgres(Box<postgres::Session>),
}

impl From<sqlite::Session> for Session {
    fn from(session: sqlite::Session) -> Session {
        Session::Sqlite(session)
    }
}

#[cfg(feature = "postgres")]
impl From<postgres::Session> for Session {
    fn from(session: postgres::Session) -> Session {
        Session::Postgres(Box::new(session))
    }
}

/// Runs `$call` on whichever engine's session `$session` holds, bound as `$inner`. (The same
/// shape as `engine::backend`'s: one match per enum, written once.)
macro_rules! dispatch {
    ($session:expr, $inner:ident => $call:expr) => {
        match $session {
            Session::Sqlite($inner) => $call,
            #[cfg(feature = "postgres")]
            Session::Postgres($inner) => $call,
        }
    };
}

impl Interactive for Session {
    fn position(&self) -> Option<Position> {
        dispatch!(self, session => session.position())
    }

    fn must_end(&self) -> bool {
        dispatch!(self, session => session.must_end())
    }

    async fn step(&mut self, request: SqlRequest) -> Result<Vec<u8>, StepError> {
        dispatch!(self, session => session.step(request).await)
    }

    async fn commit(self, record: Option<Record>) -> Result<Option<Bookmark>, CommitError> {
        dispatch!(self, session => Interactive::commit(session, record).await)
    }

    async fn rollback(self) {
        dispatch!(self, session => Interactive::rollback(session).await)
    }
}
