//! [`Value`]: one dynamically typed cell of a [`Table`](crate::Table), one variant per SQLite
//! storage class plus one for PostgreSQL's JSON-shaped cells (arrays, `json`, `jsonb`), read from
//! the wire and read back as any `T: Deserialize` by [`Row::get`](crate::Row::get).
//!
//! Plain data, its serde impls and accessors; knows the protocol's cell forms (a blob is
//! `{"base64": ...}`), nothing of rows or HTTP.

use std::fmt;

use serde::de::{self, Deserializer, MapAccess, SeqAccess, Visitor};

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;

use crate::wire::blob::BLOB_KEY;

/// A dynamically typed cell: one variant per SQLite storage class, and [`Value::Json`] for the
/// arrays and objects only PostgreSQL answers.
///
/// ```
/// use sqlhttp::Value;
///
/// let cells = [Value::Integer(7), Value::Text("seven".into()), Value::Blob(vec![7]), Value::Null];
/// assert_eq!(cells[0].as_i64(), Some(7));
/// assert_eq!(cells[1].as_str(), Some("seven"));
/// assert_eq!(cells[2].as_blob(), Some(&[7u8][..]));
/// assert!(cells[3].is_null());
/// ```
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum Value {
    /// `NULL`.
    Null,
    /// An INTEGER (64-bit, exact).
    Integer(i64),
    /// A REAL.
    Real(f64),
    /// TEXT.
    Text(String),
    /// A BLOB (PostgreSQL's `bytea`).
    Blob(Vec<u8>),
    /// A cell that is a JSON array or an object other than a blob: a PostgreSQL array, or a `json`
    /// or `jsonb` value that is an array or an object (a `jsonb` scalar arrives as the scalar, and
    /// reads as [`Integer`](Value::Integer), [`Real`](Value::Real), [`Text`](Value::Text) or
    /// [`Null`](Value::Null)). SQLite never answers one.
    Json(serde_json::Value),
}

impl Value {
    /// Whether the cell is `NULL`.
    pub fn is_null(&self) -> bool {
        matches!(self, Value::Null)
    }

    /// The integer, if the cell is one.
    pub fn as_i64(&self) -> Option<i64> {
        match self {
            Value::Integer(i) => Some(*i),
            _ => None,
        }
    }

    /// The number as a float, if the cell is a REAL or an INTEGER.
    pub fn as_f64(&self) -> Option<f64> {
        match self {
            Value::Real(f) => Some(*f),
            Value::Integer(i) => Some(*i as f64),
            _ => None,
        }
    }

    /// The text, if the cell is TEXT.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            Value::Text(s) => Some(s),
            _ => None,
        }
    }

    /// The bytes, if the cell is a BLOB.
    pub fn as_blob(&self) -> Option<&[u8]> {
        match self {
            Value::Blob(b) => Some(b),
            _ => None,
        }
    }

    /// The array or object, if the cell is one (see [`Value::Json`]).
    pub fn as_json(&self) -> Option<&serde_json::Value> {
        match self {
            Value::Json(v) => Some(v),
            _ => None,
        }
    }
}

/// The wire form: `null`, a number, a string, `{"base64": "..."}` for a BLOB, the array or object
/// of a [`Value::Json`]. A REAL that is not finite is handed to the serializer as it is: bound as a
/// parameter it is refused before sending ([`ErrorKind::InvalidParameter`](crate::ErrorKind)), and
/// `serde_json` writes it `null`.
impl serde::Serialize for Value {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap as _;
        match self {
            Value::Integer(i) => serializer.serialize_i64(*i),
            Value::Real(f) => serializer.serialize_f64(*f),
            Value::Null => serializer.serialize_unit(),
            Value::Text(s) => serializer.serialize_str(s),
            Value::Json(v) => v.serialize(serializer),
            Value::Blob(bytes) => {
                let mut map = serializer.serialize_map(Some(1))?;
                map.serialize_entry(BLOB_KEY, &STANDARD.encode(bytes))?;
                map.end()
            }
        }
    }
}

impl<'de> serde::Deserialize<'de> for Value {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(ValueVisitor)
    }
}

struct ValueVisitor;

impl<'de> Visitor<'de> for ValueVisitor {
    type Value = Value;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a cell: null, a number, a string, a blob, an array or an object")
    }

    fn visit_unit<E: de::Error>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_none<E: de::Error>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_bool<E: de::Error>(self, v: bool) -> Result<Value, E> {
        Ok(Value::Integer(i64::from(v)))
    }

    fn visit_i64<E: de::Error>(self, v: i64) -> Result<Value, E> {
        Ok(Value::Integer(v))
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> Result<Value, E> {
        Ok(i64::try_from(v).map_or(Value::Real(v as f64), Value::Integer))
    }

    fn visit_f64<E: de::Error>(self, v: f64) -> Result<Value, E> {
        Ok(Value::Real(v))
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<Value, E> {
        Ok(Value::Text(v.to_owned()))
    }

    fn visit_string<E: de::Error>(self, v: String) -> Result<Value, E> {
        Ok(Value::Text(v))
    }

    fn visit_bytes<E: de::Error>(self, v: &[u8]) -> Result<Value, E> {
        Ok(Value::Blob(v.to_vec()))
    }

    fn visit_byte_buf<E: de::Error>(self, v: Vec<u8>) -> Result<Value, E> {
        Ok(Value::Blob(v))
    }

    /// `{"base64": "..."}` alone is a blob (as the protocol writes one); any other object is a
    /// PostgreSQL `json`/`jsonb` value.
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        use serde_json::Value as Json;
        let Some(first) = map.next_key::<String>()? else {
            return Ok(Value::Json(Json::Object(serde_json::Map::new())));
        };
        let value = map.next_value::<Json>()?;
        let mut object = serde_json::Map::new();
        if first == BLOB_KEY
            && let Json::String(encoded) = &value
        {
            match map.next_key::<String>()? {
                None => {
                    return STANDARD
                        .decode(encoded.as_bytes())
                        .map(Value::Blob)
                        .map_err(|e| de::Error::custom(format_args!("a blob's base64: {e}")));
                }
                Some(key) => {
                    object.insert(first, value);
                    let value = map.next_value::<Json>()?;
                    object.insert(key, value);
                }
            }
        } else {
            object.insert(first, value);
        }
        while let Some((key, value)) = map.next_entry::<String, Json>()? {
            object.insert(key, value);
        }
        Ok(Value::Json(Json::Object(object)))
    }

    /// A PostgreSQL array, or a `json`/`jsonb` array. (Protocol drafts once sent a blob as an array
    /// of bytes; that form is gone, and reading an `integer[]` as bytes would be a wrong answer.)
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let mut items = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(4096));
        while let Some(item) = seq.next_element::<serde_json::Value>()? {
            items.push(item);
        }
        Ok(Value::Json(serde_json::Value::Array(items)))
    }
}

/// Reads a cell as any `T: Deserialize`: numbers, strings, bytes, `Option`s.
impl<'de> Deserializer<'de> for &'de Value {
    /// The JSON parser's error type, so a failed read keeps the same source as a decode's.
    type Error = serde_json::Error;

    fn deserialize_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Self::Error> {
        match self {
            Value::Null => visitor.visit_unit(),
            Value::Integer(i) => visitor.visit_i64(*i),
            Value::Real(f) => visitor.visit_f64(*f),
            Value::Text(s) => visitor.visit_borrowed_str(s),
            Value::Blob(b) => visitor.visit_borrowed_bytes(b),
            Value::Json(v) => v.deserialize_any(visitor),
        }
    }

    /// SQLite's booleans, `0` and `1`, read as `bool`s, as a decoded row's cells do.
    fn deserialize_bool<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Self::Error> {
        match self {
            Value::Integer(i @ (0 | 1)) => visitor.visit_bool(*i == 1),
            _ => self.deserialize_any(visitor),
        }
    }

    fn deserialize_option<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Self::Error> {
        match self {
            Value::Null => visitor.visit_none(),
            _ => visitor.visit_some(self),
        }
    }

    /// A blob as a sequence of bytes, for `Vec<u8>`.
    fn deserialize_seq<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Self::Error> {
        match self {
            Value::Blob(b) => visitor.visit_seq(de::value::SeqDeserializer::new(b.iter().copied())),
            Value::Json(v) => v.deserialize_seq(visitor),
            _ => self.deserialize_any(visitor),
        }
    }

    fn deserialize_newtype_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        visitor: V,
    ) -> Result<V::Value, Self::Error> {
        visitor.visit_newtype_struct(self)
    }

    serde::forward_to_deserialize_any! {
        i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string
        bytes byte_buf unit unit_struct tuple tuple_struct map struct enum identifier ignored_any
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::Deserialize;

    #[test]
    fn cells_read_back_as_typed_values() {
        let blob = Value::Blob(vec![0, 255]);
        assert_eq!(Vec::<u8>::deserialize(&blob).unwrap(), [0, 255]);
        assert_eq!(crate::Blob::deserialize(&blob).unwrap().0, [0, 255]);
        assert_eq!(i64::deserialize(&Value::Integer(-3)).unwrap(), -3);
        assert_eq!(f64::deserialize(&Value::Integer(2)).unwrap(), 2.0);
        assert_eq!(
            Option::<String>::deserialize(&Value::Null).unwrap(),
            None::<String>
        );
        assert!(String::deserialize(&Value::Integer(1)).is_err());
    }

    #[test]
    fn cells_decode_from_the_wire() {
        let cells: Vec<Value> = serde_json::from_str(
            r#"[null, 1, -0.5, "t", {"base64": "AP8="}, 18446744073709551615]"#,
        )
        .unwrap();
        assert_eq!(
            cells,
            [
                Value::Null,
                Value::Integer(1),
                Value::Real(-0.5),
                Value::Text("t".into()),
                Value::Blob(vec![0, 255]),
                Value::Real(u64::MAX as f64),
            ]
        );
    }
}
