//! Results with a shape known only at run time: [`Table`] (columns with their types, rows of dynamically
//! typed cells) and [`ExecResult`] (what a statement changed).
//!
//! Plain data and accessors; decoding from the wire lives in `decode`.

use std::fmt;

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::error::{Error, ErrorKind, Result};
use crate::stats::Stats;

use crate::value::Value;

/// A result column: its name and the engine's declared type.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
pub struct Column {
    pub(crate) name: String,
    #[serde(rename = "type", default)]
    pub(crate) type_name: String,
}

impl Column {
    /// The column's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The engine's declared type (`INTEGER`, `TEXT`, ...), empty when the column has none (an
    /// expression such as `count(*)`).
    pub fn type_name(&self) -> &str {
        &self.type_name
    }
}

/// What a statement run with `execute` changed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct ExecResult {
    /// Rows inserted, updated or deleted by the statement.
    pub rows_affected: u64,
    /// The id (SQLite's rowid) of the last row the statement inserted, if it inserted any.
    pub last_insert_id: Option<i64>,
    /// What the call cost: the server's figures (when it reports them) and the attempts taken.
    pub stats: Stats,
}

/// A query result with its columns, as returned by [`Client::query_table`](crate::Client::query_table),
/// and one per statement of a [`Client::batch`](crate::Client::batch).
///
/// ```
/// # async fn run(client: sqlhttp::Client) -> sqlhttp::Result<()> {
/// let table = client.query_table("SELECT id, name FROM users").await?;
/// for column in table.columns() {
///     print!("{} ({})  ", column.name(), column.type_name());
/// }
/// for row in table.rows() {
///     let id: i64 = row.get("id")?;
///     let name: Option<String> = row.get("name")?;
///     println!("{id} {name:?}");
/// }
/// # Ok(())
/// # }
/// ```
#[derive(Clone, PartialEq)]
pub struct Table {
    columns: Vec<Column>,
    rows: Vec<Vec<Value>>,
    rows_affected: u64,
    last_insert_id: Option<i64>,
    stats: Stats,
}

impl Table {
    pub(crate) fn new(
        columns: Vec<Column>,
        rows: Vec<Vec<Value>>,
        rows_affected: u64,
        last_insert_id: Option<i64>,
        stats: Stats,
    ) -> Self {
        Self {
            columns,
            rows,
            rows_affected,
            last_insert_id,
            stats,
        }
    }

    /// What the call cost: the server's figures for this statement (its time, rows read and
    /// written, which node served it; `None` each when the server does not report it) and the
    /// call's attempts. In a [`batch`](crate::Client::batch), each statement's own figures, and
    /// the batch's attempts.
    pub fn stats(&self) -> &Stats {
        &self.stats
    }

    /// The same table with the call's attempt count.
    pub(crate) fn attempted(mut self, attempts: u32) -> Self {
        self.stats.total_attempts = attempts;
        self
    }

    /// The result's columns, in order.
    pub fn columns(&self) -> &[Column] {
        &self.columns
    }

    /// The position of the column named `name`.
    pub fn column_index(&self, name: &str) -> Option<usize> {
        self.columns.iter().position(|c| c.name == name)
    }

    /// The number of rows.
    pub fn len(&self) -> usize {
        self.rows.len()
    }

    /// Whether there are no rows.
    pub fn is_empty(&self) -> bool {
        self.rows.is_empty()
    }

    /// Rows changed by the statement (non-zero for `INSERT ... RETURNING` and the like).
    pub fn rows_affected(&self) -> u64 {
        self.rows_affected
    }

    /// The id (SQLite's rowid) of the last row the statement inserted, if it inserted any.
    pub fn last_insert_id(&self) -> Option<i64> {
        self.last_insert_id
    }

    /// Every row decoded into a `T`, exactly as [`Query::fetch_all`](crate::Query::fetch_all) decodes
    /// them: a struct by column name, a tuple by position, a map, or a scalar when there is one
    /// column. The typed way to read a [`batch`](crate::Client::batch)'s results:
    ///
    /// ```no_run
    /// # async fn run(client: sqlhttp::Client) -> sqlhttp::Result<()> {
    /// #[derive(serde::Deserialize)]
    /// struct Account { id: i64, balance: i64 }
    ///
    /// let results = client
    ///     .batch()
    ///     .statement("SELECT id, balance FROM accounts WHERE id = ?").bind(1)
    ///     .statement("SELECT count(*) FROM accounts")
    ///     .read_only(true)
    ///     .await?;
    /// let accounts: Vec<Account> = results[0].rows_as()?;
    /// let count: Vec<i64> = results[1].rows_as()?;
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    ///
    /// [`ErrorKind::Decode`] naming the row and column when a cell is not what `T` expects.
    pub fn rows_as<T: DeserializeOwned>(&self) -> Result<Vec<T>> {
        #[derive(Serialize)]
        struct Envelope<'a> {
            columns: &'a [Column],
            rows: &'a [Vec<Value>],
        }
        // One decoder for every path: the table goes back to the wire form `decode::rows` reads.
        let body = serde_json::to_vec(&Envelope {
            columns: &self.columns,
            rows: &self.rows,
        })
        .map_err(Error::decode)?;
        crate::wire::decode::rows(&body)
    }

    /// The row at `index`.
    pub fn row(&self, index: usize) -> Option<Row<'_>> {
        self.rows.get(index).map(|cells| Row {
            table: self,
            index,
            cells,
        })
    }

    /// Every row, in order.
    pub fn rows(&self) -> impl ExactSizeIterator<Item = Row<'_>> + '_ {
        self.rows.iter().enumerate().map(|(index, cells)| Row {
            table: self,
            index,
            cells,
        })
    }

    /// The cells, row by row, without the column metadata.
    pub fn into_rows(self) -> Vec<Vec<Value>> {
        self.rows
    }
}

/// Cells can hold personal data and end up in logs: `Debug` shows the shape, never a cell.
impl fmt::Debug for Table {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Table")
            .field("columns", &self.columns)
            .field("rows", &format_args!("<{} rows>", self.rows.len()))
            .field("rows_affected", &self.rows_affected)
            .field("last_insert_id", &self.last_insert_id)
            .finish()
    }
}

/// One row of a [`Table`]. Its `Debug` shows its position and width, never a cell.
#[derive(Clone, Copy)]
pub struct Row<'a> {
    table: &'a Table,
    index: usize,
    cells: &'a [Value],
}

impl fmt::Debug for Row<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Row")
            .field("index", &self.index)
            .field("cells", &format_args!("<{} cells>", self.cells.len()))
            .finish()
    }
}

impl<'a> Row<'a> {
    /// The cell in the column named `column`.
    pub fn value(&self, column: &str) -> Option<&'a Value> {
        self.table
            .column_index(column)
            .and_then(|i| self.cells.get(i))
    }

    /// The cells, in column order.
    pub fn values(&self) -> &'a [Value] {
        self.cells
    }

    /// The cell in the column named `column`, read as a `T` (`Option<T>` for a nullable column).
    ///
    /// # Errors
    ///
    /// [`ErrorKind::Decode`] when there is no such column or the cell is not a `T`.
    pub fn get<T: DeserializeOwned>(&self, column: &str) -> Result<T> {
        let index = self.table.column_index(column).ok_or_else(|| {
            self.decode_error(
                Some(column.to_owned()),
                format!("no column named `{column}`"),
            )
        })?;
        self.get_index(index)
    }

    /// The cell at position `index`, read as a `T`.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::Decode`] when there is no such column or the cell is not a `T`.
    pub fn get_index<T: DeserializeOwned>(&self, index: usize) -> Result<T> {
        let name = self.table.columns.get(index).map(|c| c.name.clone());
        let cell = self.cells.get(index).ok_or_else(|| {
            self.decode_error(name.clone(), format!("no column at position {index}"))
        })?;
        // The parser's error quotes the cell: only its redacted message is kept, no source.
        T::deserialize(cell).map_err(|err| {
            let message = crate::wire::decode::redact(&crate::wire::decode::without_position(&err));
            let into = std::any::type_name::<T>();
            self.decode_error(name, format!("{message} (decoding into `{into}`)"))
        })
    }

    fn decode_error(&self, column: Option<String>, message: String) -> Error {
        Error::new(ErrorKind::Decode {
            row: Some(self.index),
            column,
            message,
        })
    }
}
