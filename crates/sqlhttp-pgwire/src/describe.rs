//! [`Connection::describe`]: a statement prepared and described in one flight (`Parse`,
//! `Describe` of the statement, `Sync`), answered by its parameters' types and its result's
//! columns, as a statement cache needs them once per connection and statement (ADR 0059).
//!
//! Knows the answers such a flight gets; nothing about which statements are cached or why.

use tokio::io::{AsyncRead, AsyncWrite};

use crate::connection::Connection;
use crate::error::Error;
use crate::flight::{Answer, Column};

/// What a prepared statement takes and returns ([`Connection::describe`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Described {
    /// Its parameters' type OIDs, in order (those the `Parse` gave, the rest as PostgreSQL
    /// inferred them).
    pub params: Vec<u32>,
    /// Its result's columns, in order; empty for a statement that returns no rows (`NoData`).
    /// Their [`Column::format`] is [`crate::Format::Text`]: a statement's format is chosen only
    /// when it is bound.
    pub columns: Vec<Column>,
}

impl<C: AsyncRead + AsyncWrite + Unpin> Connection<C> {
    /// Prepares `sql` as the statement `name` (`""`: the unnamed one) with the given parameter
    /// type OIDs (see [`crate::Flight::parse`]) and describes it, in one flight with one `Sync`.
    ///
    /// PostgreSQL's refusal (a syntax error, an unknown table, a name already taken) is
    /// [`Error::Db`] with the flight read to its `ReadyForQuery`: the connection is not in doubt,
    /// and clean unless a transaction is open (which the refusal failed). [`Error::Invalid`]
    /// (`sql` or `name` cannot be sent) sent nothing and leaves the connection as it was. Any
    /// other `Err` leaves it in doubt ([`Error::Fatal`]: PostgreSQL ended the session).
    pub async fn describe(
        &mut self,
        name: &str,
        sql: &str,
        types: &[u32],
    ) -> Result<Described, Error> {
        let mut flight = self.flight()?;
        flight
            .parse(name, sql, types)?
            .describe_statement(name)?
            .sync();
        let mut answers = flight.send().await?;
        let mut params = None;
        let mut columns = None;
        let mut refused = None;
        while let Some(answer) = answers.next().await? {
            match answer {
                Answer::ParseComplete | Answer::ReadyForQuery(_) => {}
                Answer::ParameterDescription(types) => params = Some(types),
                Answer::RowDescription(described) => columns = Some(described.to_vec()?),
                Answer::NoData => columns = Some(Vec::new()),
                Answer::Error(e) => refused = Some(e),
                other => {
                    self.in_doubt = true;
                    return Err(Error::Protocol(format!(
                        "an unexpected answer to a statement's Describe: {other:?}"
                    )));
                }
            }
        }
        if let Some(e) = refused {
            return Err(Error::Db(e));
        }
        match (params, columns) {
            (Some(params), Some(columns)) => Ok(Described { params, columns }),
            _ => {
                self.in_doubt = true;
                Err(Error::Protocol(
                    "a statement's Describe was answered without its parameters or columns".into(),
                ))
            }
        }
    }
}
