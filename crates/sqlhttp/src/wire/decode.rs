//! Decoding a success response straight from its bytes: typed rows, the dynamic table, or the effect of
//! a statement.
//!
//! Rows are deserialized into the caller's `T` as the parser meets them, without a `serde_json::Value`
//! per cell: a row (a JSON array) is presented to `T` as a map from column names to cells when `T` is a
//! struct or a map, as a sequence when `T` is a tuple or a `Vec` (whatever the row's width), and as
//! its single cell otherwise, when the result has one column: a scalar, an `Option`, `Blob`,
//! `Value`, `serde_json::Value` (ADR 0050). Positions are tracked so that a failure names its row
//! and column.
//!
//! The functions are public for callers that hold a response body already (a recorded response, a
//! cache); `Client` calls them after each successful exchange. This module knows the response envelope
//! of protocol v1 and nothing of HTTP or retries.
//!
//! ```
//! let body = br#"{"columns":[{"name":"id","type":"INTEGER"}],"rows":[[1],[2]],"rows_affected":0,"last_insert_id":null}"#;
//! let ids: Vec<i64> = sqlhttp::decode::rows(body)?;
//! assert_eq!(ids, [1, 2]);
//! # Ok::<(), sqlhttp::Error>(())
//! ```

use std::cell::Cell;
use std::fmt;
use std::marker::PhantomData;

use serde::de::{
    self, DeserializeOwned, DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess,
    Visitor,
};

use super::blob::CellSeed;
use super::envelope::{Decoder, Step};
use crate::error::{Error, ErrorKind};
use crate::stats::Stats;
use crate::table::{Column, ExecResult, Table};
use crate::value::Value;

/// Where the decoder is, for error messages.
#[derive(Default)]
pub(crate) struct Position {
    pub(crate) in_rows: Cell<bool>,
    pub(crate) row: Cell<usize>,
    pub(crate) column: Cell<Option<usize>>,
}

/// Decodes the rows of a response body into `T`s: structs by column name, tuples by position, a scalar
/// from a one-column result.
///
/// # Errors
///
/// [`ErrorKind::Decode`] naming the row and column when a cell is not what `T` expects, or when the
/// body is not a protocol v1 response; the server's error when a streamed body ends with one (see
/// the protocol's streamed results).
pub fn rows<T: DeserializeOwned>(body: &[u8]) -> Result<Vec<T>, Error> {
    let mut decoder = Decoder::<T>::whole(body);
    let mut rows = Vec::new();
    match decoder.drain_into(&mut rows)? {
        Step::End => Ok(rows),
        Step::Row(()) | Step::NeedMore => unreachable!("the whole body was given"),
    }
}

/// Decodes a response body into a [`Table`] of dynamically typed cells.
///
/// # Errors
///
/// [`ErrorKind::Decode`] when the body is not a protocol v1 response; the server's error when a
/// streamed body ends with one.
pub fn table(body: &[u8]) -> Result<Table, Error> {
    let mut decoder = Decoder::<Vec<Value>>::whole(body);
    let mut rows = Vec::new();
    loop {
        match decoder.next()? {
            Step::Row(row) => rows.push(row),
            Step::End => break,
            Step::NeedMore => unreachable!("the whole body was given"),
        }
    }
    let columns = decoder.columns().unwrap_or_default().to_vec();
    let effect = decoder.effect();
    Ok(Table::new(
        columns,
        rows,
        effect.rows_affected.unwrap_or(0),
        effect.last_insert_id,
        Stats::from_wire(decoder.stats().as_ref(), 0),
    ))
}

/// Decodes only a statement's effect from a response body, skipping any rows without building
/// them; its stats carry `attempts`.
///
/// # Errors
///
/// [`ErrorKind::Decode`] when the body is not a protocol v1 response; the server's error when a
/// streamed body ends with one.
pub fn exec_result(body: &[u8]) -> Result<ExecResult, Error> {
    let mut decoder = Decoder::<IgnoredAny>::whole(body);
    loop {
        match decoder.next()? {
            Step::Row(_) => {}
            Step::End => return effect_of(&decoder, 0),
            Step::NeedMore => unreachable!("the whole body was given"),
        }
    }
}

/// The effect a decoder read, which a protocol v1 success body must state.
pub(crate) fn effect_of<T>(decoder: &Decoder<'_, T>, attempts: u32) -> Result<ExecResult, Error> {
    let effect = decoder.effect();
    // Required: a `{}` from something that is not a protocol v1 server must not read as success.
    let rows_affected = effect.rows_affected.ok_or_else(|| {
        Error::new(ErrorKind::Decode {
            row: None,
            column: None,
            message: "missing field `rows_affected`".to_owned(),
        })
    })?;
    Ok(ExecResult {
        rows_affected,
        last_insert_id: effect.last_insert_id,
        stats: Stats::from_wire(decoder.stats().as_ref(), attempts),
    })
}

/// A row's decode failure as the caller needs it: the row, the column that failed (none for a
/// field the result lacks: the column the parser was on is not the culprit), what was expected,
/// and the Rust type decoded into. No source is kept: the JSON parser's error quotes the cell, and
/// a caller who logs the whole `source()` chain must not log user data.
pub(crate) fn positioned<T>(
    err: &serde_json::Error,
    position: &Position,
    columns: &[Column],
) -> Error {
    let message = redact(&without_position(err));
    let missing = message.starts_with("missing field `");
    let (row, column) = if position.in_rows.get() {
        let column = position.column.get().filter(|_| !missing).map(|i| {
            columns
                .get(i)
                .map_or_else(|| format!("#{i}"), |c| c.name.clone())
        });
        (Some(position.row.get()), column)
    } else {
        (None, None)
    };
    let mut message = format!("{message} (decoding into `{}`)", std::any::type_name::<T>());
    if columns.len() == 1
        && std::any::type_name::<T>().starts_with("alloc::vec::Vec<")
        && (message.starts_with("invalid type: map,")
            || message.starts_with("invalid type: sequence,"))
    {
        // A `Vec` target reads the row's cells, whatever its width (`Vec<Value>` reads any row).
        message.push_str(
            "; a `Vec` target is a row of cells: read a one-column BLOB into `sqlhttp::Blob`, \
             `bytes::Bytes` or `serde_bytes::ByteBuf`, and a one-column array into `(Vec<_>,)`",
        );
    }
    if missing {
        let names: Vec<&str> = columns.iter().map(|c| c.name.as_str()).collect();
        message.push_str(&format!(
            "; the result has no column of that name (its columns: {})",
            names.join(", ")
        ));
    }
    Error::new(ErrorKind::Decode {
        row,
        column,
        message,
    })
}

/// The parser's message without its ` at line L column C`: a position in the response's JSON
/// says nothing to a caller, who has the row and the column instead.
pub(crate) fn without_position(err: &serde_json::Error) -> String {
    let text = err.to_string();
    let suffix = format!(" at line {} column {}", err.line(), err.column());
    match text.strip_suffix(&suffix) {
        Some(message) => message.to_owned(),
        None => text,
    }
}

/// A decode error's message without the value it quotes: serde's `invalid type: string "alice",
/// expected i64` becomes `invalid type: string, expected i64`, and `unknown variant `x`, expected ...`
/// loses the `x`. Cells can hold personal data, and messages end up in logs.
pub(crate) fn redact(message: &str) -> String {
    for prefix in ["invalid type: ", "invalid value: "] {
        if let Some(rest) = message.strip_prefix(prefix)
            && let Some(split) = rest.rfind(", expected ")
        {
            let unexpected = &rest[..split];
            // serde's `Unexpected` prints a kind of one or more words (`floating point`), then
            // the value in backticks or quotes: keep what comes before the value.
            let kind = unexpected
                .find(['`', '"'])
                .map_or(unexpected, |i| unexpected[..i].trim_end());
            return format!("{prefix}{kind}{}", &rest[split..]);
        }
    }
    if let Some(rest) = message.strip_prefix("unknown variant `")
        && let Some(split) = rest.find("`, expected ")
    {
        return format!("unknown variant{}", &rest[split + 1..]);
    }
    message.to_owned()
}

/// Rows kept raw because they came before the columns, decoded once the names are known.
pub(crate) struct RowsSeed<'a, T> {
    position: &'a Position,
    columns: &'a [Column],
    marker: PhantomData<T>,
}

impl<'a, T> RowsSeed<'a, T> {
    pub(crate) fn new(position: &'a Position, columns: &'a [Column]) -> Self {
        Self {
            position,
            columns,
            marker: PhantomData,
        }
    }
}

impl<'de, T: DeserializeOwned> DeserializeSeed<'de> for RowsSeed<'_, T> {
    type Value = Vec<T>;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Vec<T>, D::Error> {
        deserializer.deserialize_seq(self)
    }
}

impl<'de, T: DeserializeOwned> Visitor<'de> for RowsSeed<'_, T> {
    type Value = Vec<T>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("an array of rows")
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Vec<T>, A::Error> {
        self.position.in_rows.set(true);
        let mut rows = Vec::with_capacity(seq.size_hint().unwrap_or(0));
        loop {
            self.position.row.set(rows.len());
            self.position.column.set(None);
            let row = seq.next_element_seed(RowSeed::<T> {
                position: self.position,
                columns: self.columns,
                marker: PhantomData,
            })?;
            match row {
                Some(row) => rows.push(row),
                None => break,
            }
        }
        self.position.in_rows.set(false);
        Ok(rows)
    }
}

/// One row (a JSON array) presented to `T`.
pub(crate) struct RowSeed<'a, T> {
    position: &'a Position,
    columns: &'a [Column],
    marker: PhantomData<T>,
}

impl<'a, T> RowSeed<'a, T> {
    pub(crate) fn new(position: &'a Position, columns: &'a [Column]) -> Self {
        Self {
            position,
            columns,
            marker: PhantomData,
        }
    }
}

impl<'de, T: DeserializeOwned> DeserializeSeed<'de> for RowSeed<'_, T> {
    type Value = T;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<T, D::Error> {
        deserializer.deserialize_seq(self)
    }
}

impl<'de, T: DeserializeOwned> Visitor<'de> for RowSeed<'_, T> {
    type Value = T;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a row (an array of cells)")
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<T, A::Error> {
        let value = T::deserialize(RowDeserializer {
            seq: &mut seq,
            columns: self.columns,
            position: self.position,
        })?;
        if seq.next_element::<IgnoredAny>()?.is_some() {
            self.position.column.set(None);
            return Err(de::Error::custom(format_args!(
                "the row has more cells than the target type reads ({} columns)",
                self.columns.len()
            )));
        }
        Ok(value)
    }
}

/// Presents one row to `T`.
struct RowDeserializer<'a, A> {
    seq: &'a mut A,
    columns: &'a [Column],
    position: &'a Position,
}

impl<'de, A: SeqAccess<'de>> RowDeserializer<'_, A> {
    /// Hands the row's only cell to `seed`.
    fn single<S: DeserializeSeed<'de>>(self, seed: S) -> Result<S::Value, A::Error> {
        if self.columns.len() != 1 {
            return Err(de::Error::custom(format_args!(
                "a scalar target reads one column, but the result has {}",
                self.columns.len()
            )));
        }
        self.position.column.set(Some(0));
        self.seq
            .next_element_seed(CellSeed(seed))?
            .ok_or_else(|| de::Error::invalid_length(0, &"a row with one cell"))
    }

    fn by_name<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, A::Error> {
        visitor.visit_map(ColumnsByName {
            seq: self.seq,
            columns: self.columns,
            position: self.position,
            next: 0,
        })
    }
}

macro_rules! forward_to_single_cell {
    ($($method:ident $(, $arg:ident: $ty:ty)*;)*) => {$(
        fn $method<V: Visitor<'de>>(self, $($arg: $ty,)* visitor: V) -> Result<V::Value, A::Error> {
            struct Seed<V> {
                visitor: V,
                $($arg: $ty,)*
            }
            impl<'de, V: Visitor<'de>> DeserializeSeed<'de> for Seed<V> {
                type Value = V::Value;
                fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<V::Value, D::Error> {
                    d.$method($(self.$arg,)* self.visitor)
                }
            }
            self.single(Seed { visitor, $($arg,)* })
        }
    )*};
}

impl<'de, A: SeqAccess<'de>> Deserializer<'de> for RowDeserializer<'_, A> {
    type Error = A::Error;

    /// Self-describing targets (`sqlhttp::Value`, `serde_json::Value`, `Blob`, untagged enums)
    /// read a one-column result's cell, as every scalar does (and as `Option<T>` of them always
    /// did), and see a wider row as an object by column name.
    fn deserialize_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, A::Error> {
        if self.columns.len() == 1 {
            struct Seed<V>(V);
            impl<'de, V: Visitor<'de>> DeserializeSeed<'de> for Seed<V> {
                type Value = V::Value;
                fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<V::Value, D::Error> {
                    d.deserialize_any(self.0)
                }
            }
            self.single(Seed(visitor))
        } else {
            self.by_name(visitor)
        }
    }

    fn deserialize_map<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, A::Error> {
        self.by_name(visitor)
    }

    fn deserialize_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        _fields: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, A::Error> {
        self.by_name(visitor)
    }

    fn deserialize_seq<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, A::Error> {
        visitor.visit_seq(CellsInOrder {
            seq: self.seq,
            position: self.position,
            next: 0,
        })
    }

    fn deserialize_tuple<V: Visitor<'de>>(
        self,
        _len: usize,
        visitor: V,
    ) -> Result<V::Value, A::Error> {
        self.deserialize_seq(visitor)
    }

    fn deserialize_tuple_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        _len: usize,
        visitor: V,
    ) -> Result<V::Value, A::Error> {
        self.deserialize_seq(visitor)
    }

    fn deserialize_newtype_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        visitor: V,
    ) -> Result<V::Value, A::Error> {
        visitor.visit_newtype_struct(self)
    }

    /// A row always exists; `Option<T>` of a one-column result reads the cell's nullness.
    fn deserialize_option<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, A::Error> {
        if self.columns.len() == 1 {
            struct Seed<V>(V);
            impl<'de, V: Visitor<'de>> DeserializeSeed<'de> for Seed<V> {
                type Value = V::Value;
                fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<V::Value, D::Error> {
                    d.deserialize_option(self.0)
                }
            }
            self.single(Seed(visitor))
        } else {
            visitor.visit_some(self)
        }
    }

    fn deserialize_ignored_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, A::Error> {
        while self.seq.next_element::<IgnoredAny>()?.is_some() {}
        visitor.visit_unit()
    }

    forward_to_single_cell! {
        deserialize_bool; deserialize_i8; deserialize_i16; deserialize_i32; deserialize_i64;
        deserialize_i128; deserialize_u8; deserialize_u16; deserialize_u32; deserialize_u64;
        deserialize_u128; deserialize_f32; deserialize_f64; deserialize_char; deserialize_str;
        deserialize_string; deserialize_bytes; deserialize_byte_buf; deserialize_unit;
        deserialize_identifier;
        deserialize_unit_struct, name: &'static str;
        deserialize_enum, name: &'static str, variants: &'static [&'static str];
    }
}

/// A row as `column name -> cell`, in column order.
struct ColumnsByName<'a, A> {
    seq: &'a mut A,
    columns: &'a [Column],
    position: &'a Position,
    next: usize,
}

impl<'de, A: SeqAccess<'de>> MapAccess<'de> for ColumnsByName<'_, A> {
    type Error = A::Error;

    fn next_key_seed<K: DeserializeSeed<'de>>(
        &mut self,
        seed: K,
    ) -> Result<Option<K::Value>, A::Error> {
        let Some(column) = self.columns.get(self.next) else {
            return Ok(None);
        };
        seed.deserialize(de::value::StrDeserializer::<A::Error>::new(&column.name))
            .map(Some)
    }

    fn next_value_seed<S: DeserializeSeed<'de>>(&mut self, seed: S) -> Result<S::Value, A::Error> {
        let index = self.next;
        self.next += 1;
        self.position.column.set(Some(index));
        self.seq.next_element_seed(CellSeed(seed))?.ok_or_else(|| {
            de::Error::custom(format_args!(
                "the row has {index} cells but the result has {} columns",
                self.columns.len()
            ))
        })
    }

    fn size_hint(&self) -> Option<usize> {
        Some(self.columns.len() - self.next)
    }
}

/// A row as a sequence of cells, tracking the column for error messages.
struct CellsInOrder<'a, A> {
    seq: &'a mut A,
    position: &'a Position,
    next: usize,
}

impl<'de, A: SeqAccess<'de>> SeqAccess<'de> for CellsInOrder<'_, A> {
    type Error = A::Error;

    fn next_element_seed<S: DeserializeSeed<'de>>(
        &mut self,
        seed: S,
    ) -> Result<Option<S::Value>, A::Error> {
        self.position.column.set(Some(self.next));
        self.next += 1;
        self.seq.next_element_seed(CellSeed(seed))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::Deserialize;
    use std::collections::BTreeMap;

    const BODY: &str = r#"{"columns":[{"name":"id","type":"INTEGER"},{"name":"name","type":"TEXT"},{"name":"score","type":"REAL"},{"name":"note","type":""}],
        "rows":[[9223372036854775807,"ada",1.5,null],[2,"bob",-0.25,"hi"]],"rows_affected":0,"last_insert_id":null}"#;

    #[derive(Debug, Deserialize, PartialEq)]
    struct Person {
        id: i64,
        name: String,
        score: f64,
        note: Option<String>,
    }

    #[test]
    fn structs_by_column_name() {
        let rows: Vec<Person> = rows(BODY.as_bytes()).unwrap();
        assert_eq!(
            rows,
            vec![
                Person {
                    id: i64::MAX,
                    name: "ada".into(),
                    score: 1.5,
                    note: None
                },
                Person {
                    id: 2,
                    name: "bob".into(),
                    score: -0.25,
                    note: Some("hi".into())
                },
            ]
        );
    }

    #[test]
    fn struct_fields_in_any_order_and_extra_columns_ignored() {
        #[derive(Debug, Deserialize, PartialEq)]
        struct Partial {
            name: String,
            id: i64,
        }
        let rows: Vec<Partial> = rows(BODY.as_bytes()).unwrap();
        assert_eq!(
            rows[1],
            Partial {
                name: "bob".into(),
                id: 2
            }
        );
    }

    #[test]
    fn tuples_by_position() {
        let rows: Vec<(i64, String, f64, Option<String>)> = rows(BODY.as_bytes()).unwrap();
        assert_eq!(rows[0], (i64::MAX, "ada".to_owned(), 1.5, None));
    }

    #[test]
    fn maps_and_values() {
        let maps: Vec<BTreeMap<String, serde_json::Value>> = rows(BODY.as_bytes()).unwrap();
        assert_eq!(maps[1]["name"], "bob");
        let values: Vec<serde_json::Value> = rows(BODY.as_bytes()).unwrap();
        assert_eq!(values[0]["id"], i64::MAX);
    }

    #[test]
    fn scalars_from_a_single_column() {
        let body = br#"{"columns":[{"name":"n","type":""}],"rows":[[3],[null]]}"#;
        let rows: Vec<Option<u8>> = rows(body).unwrap();
        assert_eq!(rows, vec![Some(3), None]);
        let err = super::rows::<i64>(body).unwrap_err();
        assert!(
            matches!(err.kind(), ErrorKind::Decode { row: Some(1), .. }),
            "{err:?}"
        );
    }

    #[test]
    fn a_scalar_target_on_many_columns_is_an_error() {
        let err = rows::<i64>(BODY.as_bytes()).unwrap_err();
        assert!(err.to_string().contains("one column"), "{err}");
    }

    #[test]
    fn blob_cells_decode_into_bytes_blobs_and_byte_buffers() {
        let body = br#"{"columns":[{"name":"b","type":"BLOB"},{"name":"n","type":"BLOB"}],"rows":[[{"base64":"AP8Q"},null],[{"base64":""},{"base64":"AQ=="}]]}"#;
        let rows: Vec<(Vec<u8>, Option<Vec<u8>>)> = rows(body).unwrap();
        assert_eq!(rows[0], (vec![0, 255, 16], None));
        assert_eq!(rows[1], (vec![], Some(vec![1])));
        let blobs: Vec<(crate::Blob, Option<crate::Blob>)> = super::rows(body).unwrap();
        assert_eq!(blobs[0].0.0, [0, 255, 16]);
        #[derive(Debug, Deserialize)]
        struct File {
            b: bytes::Bytes,
            n: Option<crate::Blob>,
        }
        let files: Vec<File> = super::rows(body).unwrap();
        assert_eq!(&files[0].b[..], [0, 255, 16]);
        assert_eq!(files[1].n.as_ref().unwrap().0, [1]);
        let err = super::rows::<(i64, i64)>(body).unwrap_err();
        assert!(matches!(err.kind(), ErrorKind::Decode { column: Some(c), .. } if c == "b"));
    }

    #[test]
    fn a_one_column_result_reads_as_its_cell_in_every_scalar_shape() {
        let body =
            br#"{"columns":[{"name":"data","type":"BLOB"}],"rows":[[{"base64":"AP8Q"}],[null]]}"#;
        let blobs: Vec<Option<crate::Blob>> = rows(body).unwrap();
        assert_eq!(blobs, [Some(crate::Blob(vec![0, 255, 16])), None]);
        let one = br#"{"columns":[{"name":"data","type":"BLOB"}],"rows":[[{"base64":"AP8Q"}]]}"#;
        assert_eq!(rows::<crate::Blob>(one).unwrap()[0].0, [0, 255, 16]);
        assert_eq!(&rows::<bytes::Bytes>(one).unwrap()[0][..], [0, 255, 16]);
        assert_eq!(rows::<(Vec<u8>,)>(one).unwrap()[0].0, [0, 255, 16]);
        assert_eq!(rows::<Value>(one).unwrap(), [Value::Blob(vec![0, 255, 16])]);
        assert_eq!(
            rows::<serde_json::Value>(one).unwrap(),
            [serde_json::json!({"base64": "AP8Q"})]
        );
        assert_eq!(
            rows::<Option<Value>>(body).unwrap(),
            [Some(Value::Blob(vec![0, 255, 16])), None]
        );
        assert_eq!(
            rows::<Option<serde_json::Value>>(body).unwrap(),
            [Some(serde_json::json!({"base64": "AP8Q"})), None]
        );
        // `Vec<T>` is a row's cells, whatever its width: `Vec<Value>` keeps reading any result.
        assert_eq!(
            rows::<Vec<Value>>(one).unwrap(),
            [vec![Value::Blob(vec![0, 255, 16])]]
        );
        let err = rows::<Vec<u8>>(one).unwrap_err();
        assert!(err.to_string().contains("serde_bytes::ByteBuf"), "{err}");

        let body = br#"{"columns":[{"name":"n","type":""}],"rows":[[7],[1.5],["x"],[null]]}"#;
        assert_eq!(
            rows::<Value>(body).unwrap(),
            [
                Value::Integer(7),
                Value::Real(1.5),
                Value::Text("x".into()),
                Value::Null
            ]
        );
        assert_eq!(
            rows::<serde_json::Value>(body).unwrap(),
            [
                serde_json::json!(7),
                serde_json::json!(1.5),
                serde_json::json!("x"),
                serde_json::Value::Null
            ]
        );
        assert_eq!(
            rows::<Option<serde_json::Value>>(body).unwrap()[3],
            None::<serde_json::Value>
        );
        // Structs and maps still read a one-column row by name.
        #[derive(Debug, Deserialize, PartialEq)]
        struct N {
            n: Option<Value>,
        }
        assert_eq!(
            rows::<N>(body).unwrap()[0],
            N {
                n: Some(Value::Integer(7))
            }
        );
        let maps: Vec<BTreeMap<String, Value>> = rows(body).unwrap();
        assert_eq!(maps[2]["n"], Value::Text("x".into()));
    }

    #[test]
    fn booleans_read_from_sqlite_integers_0_and_1_only() {
        let body = br#"{"columns":[{"name":"b","type":""}],"rows":[[1],[0],[true],[null]]}"#;
        assert_eq!(
            rows::<Option<bool>>(body).unwrap(),
            [Some(true), Some(false), Some(true), None]
        );
        let table = table(body).unwrap();
        assert!(table.row(0).unwrap().get::<bool>("b").unwrap());
        assert!(!table.row(1).unwrap().get::<bool>("b").unwrap());
        let body = br#"{"columns":[{"name":"b","type":""}],"rows":[[2]]}"#;
        let err = rows::<bool>(body).unwrap_err();
        assert!(err.to_string().contains("expected a boolean"), "{err}");
        assert!(table.row(3).unwrap().get::<bool>("b").is_err());
    }

    #[test]
    fn a_one_column_array_reads_into_a_one_tuple_and_a_vec_says_so() {
        let body = br#"{"columns":[{"name":"a","type":"_int8"}],"rows":[[[1,2]]]}"#;
        assert_eq!(rows::<(Vec<i64>,)>(body).unwrap(), [(vec![1, 2],)]);
        let err = rows::<Vec<i64>>(body).unwrap_err();
        assert!(err.to_string().contains("`(Vec<_>,)`"), "{err}");
    }

    #[test]
    fn postgresql_arrays_and_json_cells_are_json_values_not_blobs() {
        let body = br#"{"columns":[{"name":"a","type":"_int4"},{"name":"j","type":"jsonb"}],"rows":[[[1,2,3],{"k":[1,{"base64":"AA=="}]}],[[],{"base64":"AA==","x":1}]]}"#;
        let table = table(body).unwrap();
        assert_eq!(
            table.row(0).unwrap().values(),
            [
                Value::Json(serde_json::json!([1, 2, 3])),
                Value::Json(serde_json::json!({"k": [1, {"base64": "AA=="}]}))
            ]
        );
        assert_eq!(
            table.row(1).unwrap().values()[1],
            Value::Json(serde_json::json!({"base64": "AA==", "x": 1}))
        );
        assert_eq!(
            table.row(0).unwrap().get::<Vec<i64>>("a").unwrap(),
            [1, 2, 3]
        );
        #[derive(Debug, Deserialize, PartialEq)]
        struct Row {
            a: Vec<i64>,
            j: serde_json::Value,
        }
        let typed: Vec<Row> = rows(body).unwrap();
        assert_eq!(typed[1].a, Vec::<i64>::new());
        assert_eq!(table.rows_as::<Row>().unwrap(), typed);
    }

    #[test]
    fn blobs_decode_into_bytes() {
        let body = br#"{"columns":[{"name":"b","type":"BLOB"}],"rows":[[[0,1,255]]]}"#;
        let rows: Vec<(Vec<u8>,)> = rows(body).unwrap();
        assert_eq!(rows[0].0, vec![0, 1, 255]);
    }

    #[test]
    fn decode_errors_name_row_and_column() {
        #[derive(Debug, Deserialize)]
        #[allow(dead_code)]
        struct Wrong {
            id: i64,
            name: i64,
        }
        let err = rows::<Wrong>(BODY.as_bytes()).unwrap_err();
        match err.kind() {
            ErrorKind::Decode {
                row,
                column,
                message,
            } => {
                assert_eq!(*row, Some(0));
                assert_eq!(column.as_deref(), Some("name"));
                assert!(message.contains("expected i64"), "{message}");
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn decode_errors_keep_no_cell_anywhere_in_their_chain() {
        #[derive(Debug, Deserialize)]
        #[allow(dead_code)]
        struct Book {
            id: i64,
            year: i64,
        }
        let body = br#"{"columns":[{"name":"id","type":""},{"name":"year","type":""}],"rows":[[1,"Dune, the novel"]]}"#;
        let err = rows::<Book>(body).unwrap_err();
        let mut chain = format!("{err} {err:?}");
        let mut source = std::error::Error::source(&err);
        while let Some(cause) = source {
            chain.push_str(&format!(" {cause} {cause:?}"));
            source = cause.source();
        }
        assert!(!chain.contains("Dune"), "{chain}");
        assert!(!chain.contains("at line"), "no JSON positions: {chain}");
        assert!(chain.contains("Book"), "the Rust type is named: {chain}");
        assert!(
            matches!(err.kind(), ErrorKind::Decode { row: Some(0), column: Some(c), .. } if c == "year"),
            "{err:?}"
        );
    }

    #[test]
    fn redaction_keeps_kinds_of_several_words_and_drops_their_values() {
        for (message, kept) in [
            (
                "invalid type: floating point `98765.4321`, expected i64",
                "invalid type: floating point, expected i64",
            ),
            (
                "invalid type: string \"Dune, the novel\", expected i64",
                "invalid type: string, expected i64",
            ),
            (
                "invalid value: character `c`, expected a digit",
                "invalid value: character, expected a digit",
            ),
            (
                "invalid type: integer `-7`, expected u8",
                "invalid type: integer, expected u8",
            ),
            (
                "invalid type: null, expected i64",
                "invalid type: null, expected i64",
            ),
        ] {
            assert_eq!(redact(message), kept);
        }
    }

    #[test]
    fn a_missing_field_names_itself_not_the_column_the_parser_was_on() {
        #[derive(Debug, Deserialize)]
        #[allow(dead_code)]
        struct Book {
            id: i64,
            author: String,
        }
        let err = rows::<Book>(BODY.as_bytes()).unwrap_err();
        match err.kind() {
            ErrorKind::Decode {
                row,
                column,
                message,
            } => {
                assert_eq!((*row, column.as_deref()), (Some(0), None));
                assert!(message.contains("missing field `author`"), "{message}");
                assert!(
                    message.contains("its columns: id, name, score, note"),
                    "{message}"
                );
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_tuple_too_short_for_the_row_is_an_error() {
        let err = rows::<(i64, String)>(BODY.as_bytes()).unwrap_err();
        assert!(err.to_string().contains("more cells"), "{err}");
        let err = rows::<(i64, String, f64, Option<String>, i64)>(BODY.as_bytes()).unwrap_err();
        assert!(
            matches!(err.kind(), ErrorKind::Decode { row: Some(0), .. }),
            "{err:?}"
        );
    }

    #[test]
    fn missing_struct_field_is_an_error() {
        #[derive(Debug, Deserialize)]
        #[allow(dead_code)]
        struct Extra {
            id: i64,
            missing: i64,
        }
        let err = rows::<Extra>(BODY.as_bytes()).unwrap_err();
        assert!(err.to_string().contains("missing"), "{err}");
    }

    #[test]
    fn rows_before_columns_still_decode_by_name() {
        let body =
            br#"{"rows":[[1,"x"]],"columns":[{"name":"id","type":""},{"name":"name","type":""}]}"#;
        #[derive(Debug, Deserialize, PartialEq)]
        struct Row {
            name: String,
            id: i64,
        }
        assert_eq!(
            rows::<Row>(body).unwrap(),
            vec![Row {
                name: "x".into(),
                id: 1
            }]
        );
    }

    #[test]
    fn malformed_envelopes_are_decode_errors() {
        for body in [
            &b""[..],
            b"[]",
            b"{\"rows\":[]}",
            b"{\"columns\":[]}",
            b"{\"columns\":[],\"rows\":[]} x",
            b"{\"columns\":[],\"rows\":[[1]",
        ] {
            let err = rows::<(i64,)>(body).unwrap_err();
            assert!(
                matches!(err.kind(), ErrorKind::Decode { .. }),
                "{body:?}: {err:?}"
            );
        }
    }

    #[test]
    fn exec_result_skips_rows() {
        let effect =
            exec_result(br#"{"columns":[],"rows":[],"rows_affected":3,"last_insert_id":41}"#)
                .unwrap();
        assert_eq!(
            effect,
            ExecResult {
                rows_affected: 3,
                last_insert_id: Some(41),
                stats: Stats::default(),
            }
        );
        let effect = exec_result(
            br#"{"columns":[],"rows":[],"rows_affected":3,"last_insert_id":41,"stats":{"duration_ms":2.5,"rows_written":3,"served_by":"primary"}}"#,
        )
        .unwrap();
        assert_eq!(effect.rows_affected, 3);
        assert_eq!(
            effect.stats.duration,
            Some(std::time::Duration::from_micros(2_500))
        );
        assert_eq!(effect.stats.rows_written, Some(3));
        assert_eq!(effect.stats.served_by, Some(crate::ServedBy::Primary));
    }

    #[test]
    fn table_keeps_columns_and_cells() {
        let table = table(BODY.as_bytes()).unwrap();
        assert_eq!(table.columns()[0].name(), "id");
        assert_eq!(table.columns()[0].type_name(), "INTEGER");
        assert_eq!(table.len(), 2);
        assert_eq!(table.row(1).unwrap().get::<String>("name").unwrap(), "bob");
    }
}
