//! What the server's schema holds, the same on every engine: [`Client::tables`] and
//! [`Client::describe`] over the protocol's `POST /api/v1/describe`, and
//! [`Client::describe_statement`] over `POST /api/v1/describe/statement` (what one statement
//! takes and gives, nothing run: what the `query!` macros check against).
//!
//! Knows the describe calls' bodies and what they answer; the transport sends each as a read
//! (retried), and the server runs each engine's own catalog query or prepares the statement.

use bytes::Bytes;
use serde::Deserialize;

use crate::client::Client;
use crate::cursor::Collect;
use crate::error::Result;
use crate::options::CallOptions;
use crate::retry::classify::OpClass;
use crate::transport::{Call, Endpoint};

/// A table or a view the server lets this client see, from [`Client::tables`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct TableInfo {
    /// Its name.
    pub name: String,
    /// Whether it is a view (else a table).
    pub is_view: bool,
}

/// One column of a table, from [`Client::describe`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ColumnInfo {
    /// Its name.
    pub name: String,
    /// Its type as the engine names it: as declared on SQLite (`INTEGER`, `VARCHAR(20)`, or empty),
    /// PostgreSQL's own name on PostgreSQL (`integer`, `character varying(20)`).
    pub declared_type: String,
    /// Whether it may hold NULL (a primary-key column may not).
    pub nullable: bool,
    /// Its default as SQL text (`2000`, `'x'::text`, `nextval(...)`), when it has one.
    pub default: Option<String>,
    /// Whether it is part of the primary key.
    pub primary_key: bool,
}

/// What one statement takes and gives, from [`Client::describe_statement`]: found by preparing
/// it on the server, nothing run.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct StatementInfo {
    /// Its parameters, in order (`?1` first).
    pub params: Vec<ParamInfo>,
    /// Its result columns, in order (none for a statement without rows).
    pub columns: Vec<StatementColumn>,
    /// Whether it may write (a read-only credential may not run it).
    pub may_write: bool,
    /// The engine that described it, as its answer's `Sqlhttp-Engine` header names it
    /// (`sqlite`, `postgresql`), when it did: type names are the engine's own.
    pub engine: Option<String>,
}

/// One parameter of a described statement.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct ParamInfo {
    /// Its type as the engine inferred it (PostgreSQL's name: `int4`, `text`); `None` where the
    /// engine does not know (always on SQLite).
    pub type_name: Option<String>,
}

/// One result column of a described statement.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct StatementColumn {
    /// Its name.
    pub name: String,
    /// Its type: PostgreSQL's name (`int8`); on SQLite the declared type of the table column it
    /// comes from, `None` for an expression.
    pub type_name: Option<String>,
    /// `Some(false)` when the server knows it is never NULL (read straight from a `NOT NULL`
    /// table column, outside outer joins and compound selects); `None` when not known.
    pub nullable: Option<bool>,
}

impl From<sqlhttp_protocol::body::StatementDescription> for StatementInfo {
    fn from(body: sqlhttp_protocol::body::StatementDescription) -> Self {
        StatementInfo {
            params: body
                .params
                .into_iter()
                .map(|param| ParamInfo {
                    type_name: param.type_name,
                })
                .collect(),
            columns: body
                .columns
                .into_iter()
                .map(|column| StatementColumn {
                    name: column.name,
                    type_name: column.type_name,
                    nullable: column.nullable,
                })
                .collect(),
            may_write: body.may_write,
            engine: None,
        }
    }
}

impl Client {
    /// What `sql` takes and gives: its parameters (with their types where the engine infers
    /// them), its result columns (name, type, whether known never NULL) and whether it may
    /// write. The server prepares the statement and runs nothing; it refuses a describe as it
    /// would refuse running the statement (the sandbox, a read-only credential and a statement
    /// that may write, on PostgreSQL the tables the credential's role may not read). A read:
    /// retried on transient failures.
    ///
    /// ```no_run
    /// # async fn run(client: sqlhttp::Client) -> sqlhttp::Result<()> {
    /// let info = client.describe_statement("SELECT id, title FROM books WHERE id = ?").await?;
    /// assert_eq!(info.params.len(), 1);
    /// for column in &info.columns {
    ///     println!("{} {:?} {:?}", column.name, column.type_name, column.nullable);
    /// }
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    ///
    /// The statement's own error (`SqlError` for text the engine cannot prepare, a refusal for
    /// one it may not run), or any failure of the call, after retries.
    pub async fn describe_statement(&self, sql: &str) -> Result<StatementInfo> {
        let body = serde_json::to_vec(&sqlhttp_protocol::body::DescribeStatementRequest { sql })
            .map_err(crate::Error::decode)?;
        let mut whole = crate::cursor::Whole::default();
        let options = CallOptions::default();
        let call = Call {
            class: OpClass::Read,
            endpoint: Endpoint::DescribeStatement,
            body: Bytes::from(body),
            sql,
            options: &options,
            idempotency_key: None,
            started: None,
        };
        let delivered = self.send(call, &mut whole).await?;
        let described: sqlhttp_protocol::body::StatementDescription =
            serde_json::from_slice(&whole.0).map_err(crate::Error::decode)?;
        let mut info = StatementInfo::from(described);
        info.engine = delivered.body.engine().map(str::to_owned);
        Ok(info)
    }

    /// The tables and views this client can see, by name (the server's own are left out). A
    /// read: retried on transient failures, and a read token may call it.
    ///
    /// ```no_run
    /// # async fn run(client: sqlhttp::Client) -> sqlhttp::Result<()> {
    /// for table in client.tables().await? {
    ///     println!("{}{}", table.name, if table.is_view { " (view)" } else { "" });
    /// }
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    ///
    /// Any failure of the call, after retries.
    pub async fn tables(&self) -> Result<Vec<TableInfo>> {
        let rows: Vec<(String, String)> = self.describe_call(Bytes::from_static(b"{}")).await?;
        Ok(rows
            .into_iter()
            .map(|(name, kind)| TableInfo {
                is_view: kind == "view",
                name,
            })
            .collect())
    }

    /// The columns of `table` in order, or `None` when the client can see no table or view of
    /// that name. A read: retried on transient failures, and a read token may call it.
    ///
    /// ```no_run
    /// # async fn run(client: sqlhttp::Client) -> sqlhttp::Result<()> {
    /// if let Some(columns) = client.describe("books").await? {
    ///     for column in columns {
    ///         println!("{} {}", column.name, column.declared_type);
    ///     }
    /// }
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    ///
    /// Any failure of the call, after retries.
    pub async fn describe(&self, table: &str) -> Result<Option<Vec<ColumnInfo>>> {
        let body = serde_json::to_vec(&serde_json::json!({ "table": table }))
            .map_err(crate::Error::decode)?;
        let rows: Vec<ColumnRow> = self.describe_call(Bytes::from(body)).await?;
        if rows.is_empty() {
            return Ok(None);
        }
        Ok(Some(
            rows.into_iter()
                .map(|row| ColumnInfo {
                    name: row.name,
                    declared_type: row.r#type,
                    nullable: row.nullable != 0,
                    default: row.default,
                    primary_key: row.primary_key != 0,
                })
                .collect(),
        ))
    }

    async fn describe_call<T: serde::de::DeserializeOwned + Send>(
        &self,
        body: Bytes,
    ) -> Result<Vec<T>> {
        let mut rows = Collect::new();
        let options = CallOptions::default();
        let call = Call {
            class: OpClass::Read,
            endpoint: Endpoint::Describe,
            body,
            sql: "describe",
            options: &options,
            idempotency_key: None,
            started: None,
        };
        self.send(call, &mut rows).await?;
        Ok(rows.rows)
    }
}

/// A row of a table's description, as the protocol writes it.
#[derive(Deserialize)]
struct ColumnRow {
    name: String,
    r#type: String,
    nullable: i64,
    default: Option<String>,
    primary_key: i64,
}
