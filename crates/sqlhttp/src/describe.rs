//! What the server's schema holds, the same on every engine: [`Client::tables`] and
//! [`Client::describe`] over the protocol's `POST /api/v1/describe`.
//!
//! Knows the describe call's body and the rows it answers with; the transport sends it as a
//! read (retried), and the server runs each engine's own catalog query.

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

impl Client {
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
