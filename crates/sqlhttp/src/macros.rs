//! What the checked-query macros (`query!`, `query_as!`, `query_scalar!`, `execute!`, feature
//! `macros`) expand to: [`Checked`], a statement whose SQL, parameters and row type were checked
//! at compile time against the statement's description (ADR 0055), finished on any
//! [`Executor`] with the SDK's own builders, so retries, timeouts, streaming and transactions
//! apply as to any statement; [`CheckedExecute`], its counterpart for statements run for their
//! effect. The traits below carry the compile-time checks' error messages; the macros alone
//! use them.
//!
//! Knows the SDK's builders; nothing about where a description came from (the macros' cache).

use std::marker::PhantomData;

use serde::de::DeserializeOwned;

use crate::error::Result;
use crate::{Execute, Executor, Query, RowStream};

#[doc(hidden)]
pub use serde;
#[doc(hidden)]
pub use serde_json;

/// A read checked at compile time: its rows are decoded as `D` (the struct `query!` generated,
/// or `query_scalar!`'s column type) and handed over as `R` (`D` itself, or the `query_as!`
/// struct, filled field by field). Finish it on a client or a transaction with
/// [`fetch_all`](Self::fetch_all), [`fetch_one`](Self::fetch_one) or
/// [`fetch_optional`](Self::fetch_optional) ([`fetch`](Self::fetch), a stream, for `query!` and
/// `query_scalar!`), or take the SDK's [`Query`] builder with [`on`](Self::on) for per-call
/// settings.
#[must_use = "a query does nothing until it is fetched"]
pub struct Checked<D, R, F> {
    sql: &'static str,
    bind: F,
    map: fn(D) -> R,
    row: PhantomData<fn() -> (D, R)>,
}

impl<D, R, F> std::fmt::Debug for Checked<D, R, F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Checked")
            .field("sql", &self.sql)
            .finish_non_exhaustive()
    }
}

impl<D, R, F> Checked<D, R, F>
where
    D: DeserializeOwned + Send + 'static,
    F: FnOnce(Query) -> Query,
{
    #[doc(hidden)]
    pub fn new(sql: &'static str, bind: F, map: fn(D) -> R) -> Self {
        Checked {
            sql,
            bind,
            map,
            row: PhantomData,
        }
    }

    /// The SDK's builder for this statement on `db`, its parameters bound: set per-call
    /// options on it, then finish it with `fetch_all()` and the others, naming the row type
    /// yourself (the finishing calls here name it for you).
    pub fn on<'c>(self, db: impl Executor<'c>) -> Query {
        (self.bind)(db.query(self.sql))
    }

    /// Every row. See [`Query::fetch_all`].
    ///
    /// # Errors
    ///
    /// As [`Query::fetch_all`].
    pub async fn fetch_all<'c>(self, db: impl Executor<'c>) -> Result<Vec<R>> {
        let map = self.map;
        let rows: Vec<D> = self.on(db).fetch_all().await?;
        Ok(rows.into_iter().map(map).collect())
    }

    /// The first row. See [`Query::fetch_one`].
    ///
    /// # Errors
    ///
    /// As [`Query::fetch_one`].
    pub async fn fetch_one<'c>(self, db: impl Executor<'c>) -> Result<R> {
        let map = self.map;
        self.on(db).fetch_one().await.map(map)
    }

    /// The first row, or `None`. See [`Query::fetch_optional`].
    ///
    /// # Errors
    ///
    /// As [`Query::fetch_optional`].
    pub async fn fetch_optional<'c>(self, db: impl Executor<'c>) -> Result<Option<R>> {
        let map = self.map;
        Ok(self.on(db).fetch_optional().await?.map(map))
    }
}

impl<D, F> Checked<D, D, F>
where
    D: DeserializeOwned + Send + 'static,
    F: FnOnce(Query) -> Query,
{
    /// The rows as a stream, decoded one at a time. See [`Query::fetch`].
    pub fn fetch<'c>(self, db: impl Executor<'c>) -> RowStream<D> {
        self.on(db).fetch()
    }
}

/// A statement run for its effect, checked at compile time (`execute!`): [`on`](Self::on) gives
/// the SDK's [`Execute`] builder, which `.await`s to its
/// [`ExecResult`](crate::ExecResult) (never retried on the client; retried in a transaction).
#[must_use = "a statement does nothing until it is run"]
pub struct CheckedExecute<F> {
    sql: &'static str,
    bind: F,
}

impl<F> std::fmt::Debug for CheckedExecute<F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CheckedExecute")
            .field("sql", &self.sql)
            .finish_non_exhaustive()
    }
}

impl<F: FnOnce(Execute) -> Execute> CheckedExecute<F> {
    #[doc(hidden)]
    pub fn new(sql: &'static str, bind: F) -> Self {
        CheckedExecute { sql, bind }
    }

    /// The SDK's builder for this statement on `db`, its parameters bound.
    pub fn on<'c>(self, db: impl Executor<'c>) -> Execute {
        (self.bind)(db.execute(self.sql))
    }
}

/// A Rust value that may be bound to a parameter whose type the engine inferred as `M` (a
/// marker of [`pg`]).
#[doc(hidden)]
#[diagnostic::on_unimplemented(
    message = "a `{Self}` cannot be bound to a parameter of PostgreSQL type `{M}`",
    label = "this argument's type does not fit the parameter's",
    note = "the statement's description (its .sqlhttp/ cache entry) says the parameter is `{M}`"
)]
pub trait Encode<M> {}

impl<M, T: ?Sized + Encode<M>> Encode<M> for &T {}
impl<M, T: Encode<M>> Encode<M> for Option<T> {}

/// Checks, at compile time only, that `value` fits a parameter of type `M`.
#[doc(hidden)]
pub fn param<M, T: ?Sized + Encode<M>>(_value: &T) {}

/// Markers of PostgreSQL's parameter types, by PostgreSQL's names.
#[doc(hidden)]
#[allow(non_camel_case_types, missing_debug_implementations)]
pub mod pg {
    macro_rules! markers {
        ($($name:ident: $($rust:ty),+;)+) => {
            $(
                #[doc = concat!("PostgreSQL's `", stringify!($name), "`.")]
                pub struct $name;
                $(impl super::Encode<$name> for $rust {})+
            )+
        };
    }

    markers! {
        bool: bool;
        int2: i16, i8, u8;
        int4: i32, i16, i8, u8, u16;
        int8: i64, i32, i16, i8, u8, u16, u32;
        oid: u32, u16, u8;
        float4: f32, i16, i8, u8;
        float8: f64, f32, i32, i16, i8, u8, u16, u32;
        numeric: str, String, i64, i32, i16, i8, u8, u16, u32, f64, f32;
        text: str, String, char;
        varchar: str, String, char;
        bpchar: str, String, char;
        name: str, String;
        bytea: crate::Blob, [u8], Vec<u8>;
        json: serde_json::Value, crate::Value, str, String;
        jsonb: serde_json::Value, crate::Value, str, String;
        date: str, String;
        time: str, String;
        timetz: str, String;
        timestamp: str, String;
        timestamptz: str, String;
        interval: str, String;
        uuid: str, String;
        inet: str, String;
        cidr: str, String;
    }
}

/// A field of type `Self` can hold the query's column `C` (a marker the macro generated, named
/// after the column).
#[doc(hidden)]
#[diagnostic::on_unimplemented(
    message = "column `{C}` of the query does not fit a field of type `{Self}`",
    label = "the field's type is not the column's",
    note = "the column's Rust type is the one `mismatched types` names; if the field's is meant, say so in the SQL: `AS \"{C}: Type\"` (or `\"{C}!\"`, `\"{C}?\"` for its nullability)"
)]
pub trait FromColumn<C> {}

/// Checks, at compile time only, that a field may hold column `C`; never called.
#[doc(hidden)]
pub fn column<C, F: FromColumn<C>>() -> F {
    unreachable!("a compile-time check, never run")
}
