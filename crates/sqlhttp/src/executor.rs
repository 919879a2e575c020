//! [`Executor`]: what runs statements, the client or a transaction, so that code written once
//! runs on both (sqlx's `Executor`, tokio-postgres's `GenericClient`).
//!
//! Sealed: implemented for `&Client`, `&Transaction` and `&mut Transaction` only, so methods can
//! be added without breaking anyone. Each method hands out the builder the client or the
//! transaction hands out; this module knows nothing of how they are sent.

use serde::Serialize;

use crate::client::Client;
use crate::insert::Insert;
use crate::statement::{Execute, Query, TableQuery};
use crate::transaction::Transaction;

mod sealed {
    pub trait Sealed {}
    impl Sealed for &crate::Client {}
    impl Sealed for &crate::Transaction {}
    impl Sealed for &mut crate::Transaction {}
    impl<E: Sealed> Sealed for &E {}
}

/// Something statements run on: a [`Client`] (each statement on its own) or a [`Transaction`]
/// (each statement the transaction's next), borrowed for `'c`. Write a repository function once
/// against it and call it with either; the builders it hands out are the same ([`Query`],
/// [`TableQuery`], [`Execute`], [`Insert`]), and awaiting one means the same on both.
///
/// ```no_run
/// use serde::Deserialize;
///
/// #[derive(Deserialize)]
/// struct Book { id: i64, title: String }
///
/// async fn load(db: impl sqlhttp::Executor<'_>, id: i64) -> sqlhttp::Result<Book> {
///     db.query("SELECT id, title FROM books WHERE id = ?").bind(id).fetch_one().await
/// }
///
/// async fn rename(db: impl sqlhttp::Executor<'_>, id: i64, title: &str) -> sqlhttp::Result<Book> {
///     db.execute("UPDATE books SET title = ? WHERE id = ?").bind(title).bind(id).await?;
///     load(&db, id).await
/// }
///
/// # async fn run(client: sqlhttp::Client) -> sqlhttp::Result<()> {
/// let book = load(&client, 1).await?;
///
/// let tx = client.transaction().await?;
/// let renamed = rename(&tx, book.id, "Dune Messiah").await?;
/// tx.commit().await?;
/// # Ok(())
/// # }
/// ```
///
/// A function may take `&impl Executor` as well (`load(&db, ..)` above): a reference to an
/// executor is one. Sealed: only this crate implements it.
pub trait Executor<'c>: Send + Sync + sealed::Sealed {
    /// A read whose rows are decoded into a type of yours: [`Client::query`] or
    /// [`Transaction::query`].
    fn query(&self, sql: impl Into<String>) -> Query;

    /// A read returning a [`Table`](crate::Table): [`Client::query_table`] or
    /// [`Transaction::query_table`].
    fn query_table(&self, sql: impl Into<String>) -> TableQuery;

    /// A statement run for its effect: [`Client::execute`] (never retried) or
    /// [`Transaction::execute`] (retried, as every step of a transaction is).
    fn execute(&self, sql: impl Into<String>) -> Execute;

    /// A typed bulk insert: [`Client::insert`] or [`Transaction::insert`].
    fn insert<'r, T: Serialize + Sync>(&self, table: &str, rows: &'r [T]) -> Insert<'r, T>;
}

/// Forwards every method to the one of `$on` (a type path), through `self`'s derefs.
macro_rules! forward {
    ($($on:tt)*) => {
        fn query(&self, sql: impl Into<String>) -> Query {
            $($on)*::query(self, sql)
        }
        fn query_table(&self, sql: impl Into<String>) -> TableQuery {
            $($on)*::query_table(self, sql)
        }
        fn execute(&self, sql: impl Into<String>) -> Execute {
            $($on)*::execute(self, sql)
        }
        fn insert<'r, T: Serialize + Sync>(&self, table: &str, rows: &'r [T]) -> Insert<'r, T> {
            $($on)*::insert(self, table, rows)
        }
    };
}

impl<'c> Executor<'c> for &'c Client {
    forward!(Client);
}

impl<'c> Executor<'c> for &'c Transaction {
    forward!(Transaction);
}

/// For code that holds the transaction mutably (as sqlx's `&mut *tx`): the same statements.
impl<'c> Executor<'c> for &'c mut Transaction {
    forward!(Transaction);
}

/// A reference to an executor is one, so a function can hand its `db` on (`load(&db, ..)`)
/// and still use it.
impl<'c, E: Executor<'c>> Executor<'c> for &E {
    forward!(<E as Executor<'c>>);
}
