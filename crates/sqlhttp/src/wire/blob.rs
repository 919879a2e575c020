//! Binary values: [`Blob`], and the two places where serde's bytes hook meets the protocol's typed
//! blob value `{"base64": "..."}` — [`to_param`] (binding: anything serialized with
//! `serialize_bytes`, such as `Blob`, `serde_bytes::ByteBuf` or `bytes::Bytes`, binds as a BLOB) and
//! [`Cell`] (decoding: a blob cell is handed to a type that asks for bytes, or for a sequence of
//! `u8`, as its bytes; and, the one other rule a cell adds to JSON's, a `bool` takes SQLite's
//! booleans, the integers 0 and 1).
//!
//! [`to_param`] is also where a number that has no faithful JSON form is refused (NaN, the
//! infinities, integers outside `i64`), at any depth: every path that binds (statements, batches,
//! transactions, `insert` rows) serializes through it, so that check is made once, here.
//!
//! Knows serde and the blob's JSON form; nothing of rows, HTTP or retries.

use std::fmt;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use serde::de::{self, DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};
use serde::ser::{self, Serialize, SerializeMap, SerializeStruct, Serializer};
use serde_json::{Map, Value as Json};

/// The member name of the protocol's blob value (the protocol crate's).
pub(crate) const BLOB_KEY: &str = sqlhttp_protocol::body::member::BASE64;

/// A BLOB: binds as one and decodes from one (`{"base64": "..."}` on the wire; 1 MB of bytes is
/// about 1.33 MB of JSON).
///
/// Any value serde serializes as bytes binds as a BLOB too (`serde_bytes::ByteBuf`, `bytes::Bytes`),
/// and a BLOB cell decodes into any type that deserializes from bytes, or into a `Vec<u8>` field.
/// A one-column result reads straight into a `Blob`, as below (a whole-row `Vec<u8>` target is the
/// row's cells, as any `Vec<T>` is).
///
/// ```no_run
/// # async fn run(client: sqlhttp::Client) -> sqlhttp::Result<()> {
/// use sqlhttp::Blob;
///
/// client.execute("INSERT INTO files (name, data) VALUES (?, ?)")
///     .bind("logo.png")
///     .bind(Blob(vec![0x89, b'P', b'N', b'G']))
///     .await?;
/// let data: Blob = client.query("SELECT data FROM files WHERE name = ?").bind("logo.png").fetch_one().await?;
/// assert_eq!(data.0[1..4], *b"PNG");
/// # Ok(())
/// # }
/// ```
#[derive(Clone, PartialEq, Eq, Hash, Default)]
pub struct Blob(pub Vec<u8>);

/// Shows the length, never the bytes (a cell may be personal data).
impl fmt::Debug for Blob {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Blob(<{} bytes>)", self.0.len())
    }
}

impl From<Vec<u8>> for Blob {
    fn from(bytes: Vec<u8>) -> Self {
        Blob(bytes)
    }
}

impl From<Blob> for Vec<u8> {
    fn from(blob: Blob) -> Self {
        blob.0
    }
}

impl AsRef<[u8]> for Blob {
    fn as_ref(&self) -> &[u8] {
        &self.0
    }
}

impl Serialize for Blob {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_bytes(&self.0)
    }
}

impl<'de> serde::Deserialize<'de> for Blob {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        // Self-describing: the blob value is an object, which a JSON parser gives only to a visitor
        // that takes anything.
        deserializer.deserialize_any(BytesVisitor).map(Blob)
    }
}

/// Reads bytes from the blob value, from bytes, or from an array of byte values.
struct BytesVisitor;

impl<'de> Visitor<'de> for BytesVisitor {
    type Value = Vec<u8>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a blob ({\"base64\": \"...\"})")
    }

    fn visit_bytes<E: de::Error>(self, v: &[u8]) -> Result<Vec<u8>, E> {
        Ok(v.to_vec())
    }

    fn visit_byte_buf<E: de::Error>(self, v: Vec<u8>) -> Result<Vec<u8>, E> {
        Ok(v)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Vec<u8>, A::Error> {
        let mut bytes = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(1 << 20));
        while let Some(byte) = seq.next_element::<u8>()? {
            bytes.push(byte);
        }
        Ok(bytes)
    }

    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Vec<u8>, A::Error> {
        read_blob(map)
    }
}

/// Reads the blob value's one member, `base64`, and decodes it.
pub(crate) fn read_blob<'de, A: MapAccess<'de>>(mut map: A) -> Result<Vec<u8>, A::Error> {
    let mut bytes = None;
    while let Some(key) = map.next_key::<std::borrow::Cow<'de, str>>()? {
        if key == BLOB_KEY && bytes.is_none() {
            let encoded = map.next_value::<std::borrow::Cow<'de, str>>()?;
            bytes = Some(
                STANDARD
                    .decode(encoded.as_bytes())
                    .map_err(|e| de::Error::custom(format_args!("a blob's base64: {e}")))?,
            );
        } else {
            return Err(de::Error::custom(
                "an object cell is a blob, {\"base64\": \"...\"}, with no other member",
            ));
        }
    }
    bytes.ok_or_else(|| de::Error::missing_field(BLOB_KEY))
}

/// The protocol's blob value for `bytes`.
pub(crate) fn blob_json(bytes: &[u8]) -> Json {
    let mut map = Map::with_capacity(1);
    map.insert(BLOB_KEY.to_owned(), Json::String(STANDARD.encode(bytes)));
    Json::Object(map)
}

/// Whether `map` is the protocol's blob value.
pub(crate) fn is_blob(map: &Map<String, Json>) -> bool {
    map.len() == 1 && matches!(map.get(BLOB_KEY), Some(Json::String(_)))
}

/// Serializes a parameter (or an insert row) to JSON as `serde_json::to_value` does, except that
/// bytes become the protocol's blob value. Structs and maps keep that rule for their fields.
pub(crate) fn to_param<T: Serialize + ?Sized>(value: &T) -> Result<Json, serde_json::Error> {
    value.serialize(ParamSerializer)
}

/// See [`to_param`].
struct ParamSerializer;

/// An integer parameter: SQLite's and PostgreSQL's integers are signed 64-bit, and a larger one
/// would reach the engine as a float (or be refused there), so it is refused here, before sending.
/// The value is not quoted: parameters can be personal data, and errors end up in logs.
fn integer(v: Option<i64>) -> Result<Json, serde_json::Error> {
    v.map(Json::from).ok_or_else(|| {
        ser::Error::custom("an integer outside i64's range (SQL integers are signed 64-bit)")
    })
}

/// A float parameter: NaN and the infinities have no JSON form (serde_json would write `null`, binding
/// NULL silently), so they are refused here, before sending.
fn real(v: f64, ty: &str) -> Result<Json, serde_json::Error> {
    if v.is_nan() {
        return Err(ser::Error::custom(format_args!(
            "a NaN {ty} cannot be bound (JSON has no NaN; bind None for NULL)"
        )));
    }
    if v.is_infinite() {
        let sign = if v > 0.0 { "+" } else { "-" };
        return Err(ser::Error::custom(format_args!(
            "{sign}infinity ({ty}) cannot be bound (JSON has no infinities)"
        )));
    }
    Ok(Json::from(v))
}

use serde_json::value::Serializer as Plain;

macro_rules! plain {
    ($($method:ident($($arg:ident: $ty:ty),*);)*) => {$(
        fn $method(self, $($arg: $ty),*) -> Result<Json, serde_json::Error> {
            Plain.$method($($arg),*)
        }
    )*};
}

impl Serializer for ParamSerializer {
    type Ok = Json;
    type Error = serde_json::Error;
    type SerializeSeq = <Plain as Serializer>::SerializeSeq;
    type SerializeTuple = <Plain as Serializer>::SerializeTuple;
    type SerializeTupleStruct = <Plain as Serializer>::SerializeTupleStruct;
    type SerializeTupleVariant = <Plain as Serializer>::SerializeTupleVariant;
    type SerializeMap = Object;
    type SerializeStruct = Object;
    type SerializeStructVariant = <Plain as Serializer>::SerializeStructVariant;

    plain! {
        serialize_bool(v: bool); serialize_i8(v: i8); serialize_i16(v: i16); serialize_i32(v: i32);
        serialize_i64(v: i64); serialize_u8(v: u8); serialize_u16(v: u16); serialize_u32(v: u32);
        serialize_char(v: char); serialize_str(v: &str); serialize_none(); serialize_unit();
        serialize_unit_struct(name: &'static str);
        serialize_unit_variant(name: &'static str, index: u32, variant: &'static str);
    }

    fn serialize_i128(self, v: i128) -> Result<Json, serde_json::Error> {
        integer(i64::try_from(v).ok())
    }

    fn serialize_u64(self, v: u64) -> Result<Json, serde_json::Error> {
        integer(i64::try_from(v).ok())
    }

    fn serialize_u128(self, v: u128) -> Result<Json, serde_json::Error> {
        integer(i64::try_from(v).ok())
    }

    fn serialize_f32(self, v: f32) -> Result<Json, serde_json::Error> {
        // Widened exactly: `0.1f32` binds as the double nearest to the `f32`, as serde_json does.
        real(f64::from(v), "f32")
    }

    fn serialize_f64(self, v: f64) -> Result<Json, serde_json::Error> {
        real(v, "f64")
    }

    fn serialize_bytes(self, v: &[u8]) -> Result<Json, serde_json::Error> {
        Ok(blob_json(v))
    }

    fn serialize_some<T: Serialize + ?Sized>(self, value: &T) -> Result<Json, serde_json::Error> {
        value.serialize(self)
    }

    fn serialize_newtype_struct<T: Serialize + ?Sized>(
        self,
        _name: &'static str,
        value: &T,
    ) -> Result<Json, serde_json::Error> {
        value.serialize(self)
    }

    fn serialize_newtype_variant<T: Serialize + ?Sized>(
        self,
        name: &'static str,
        index: u32,
        variant: &'static str,
        value: &T,
    ) -> Result<Json, serde_json::Error> {
        Plain.serialize_newtype_variant(name, index, variant, value)
    }

    fn serialize_seq(self, len: Option<usize>) -> Result<Self::SerializeSeq, serde_json::Error> {
        Plain.serialize_seq(len)
    }

    fn serialize_tuple(self, len: usize) -> Result<Self::SerializeTuple, serde_json::Error> {
        Plain.serialize_tuple(len)
    }

    fn serialize_tuple_struct(
        self,
        name: &'static str,
        len: usize,
    ) -> Result<Self::SerializeTupleStruct, serde_json::Error> {
        Plain.serialize_tuple_struct(name, len)
    }

    fn serialize_tuple_variant(
        self,
        name: &'static str,
        index: u32,
        variant: &'static str,
        len: usize,
    ) -> Result<Self::SerializeTupleVariant, serde_json::Error> {
        Plain.serialize_tuple_variant(name, index, variant, len)
    }

    fn serialize_map(self, len: Option<usize>) -> Result<Object, serde_json::Error> {
        Ok(Object {
            map: Map::with_capacity(len.unwrap_or(0)),
            key: None,
        })
    }

    fn serialize_struct(
        self,
        _name: &'static str,
        len: usize,
    ) -> Result<Object, serde_json::Error> {
        self.serialize_map(Some(len))
    }

    fn serialize_struct_variant(
        self,
        name: &'static str,
        index: u32,
        variant: &'static str,
        len: usize,
    ) -> Result<Self::SerializeStructVariant, serde_json::Error> {
        Plain.serialize_struct_variant(name, index, variant, len)
    }
}

/// A struct or map whose values keep the blob rule.
pub(crate) struct Object {
    map: Map<String, Json>,
    key: Option<String>,
}

impl SerializeMap for Object {
    type Ok = Json;
    type Error = serde_json::Error;

    fn serialize_key<T: Serialize + ?Sized>(&mut self, key: &T) -> Result<(), serde_json::Error> {
        match key.serialize(Plain)? {
            Json::String(key) => {
                self.key = Some(key);
                Ok(())
            }
            _ => Err(ser::Error::custom("a map key must be a string")),
        }
    }

    fn serialize_value<T: Serialize + ?Sized>(
        &mut self,
        value: &T,
    ) -> Result<(), serde_json::Error> {
        let key = self
            .key
            .take()
            .ok_or_else(|| ser::Error::custom("a map value came before its key"))?;
        let value = to_param(value)
            .map_err(|err| ser::Error::custom(format_args!("field `{key}`: {err}")))?;
        self.map.insert(key, value);
        Ok(())
    }

    fn end(self) -> Result<Json, serde_json::Error> {
        Ok(Json::Object(self.map))
    }
}

impl SerializeStruct for Object {
    type Ok = Json;
    type Error = serde_json::Error;

    fn serialize_field<T: Serialize + ?Sized>(
        &mut self,
        key: &'static str,
        value: &T,
    ) -> Result<(), serde_json::Error> {
        let value = to_param(value)
            .map_err(|err| ser::Error::custom(format_args!("field `{key}`: {err}")))?;
        self.map.insert(key.to_owned(), value);
        Ok(())
    }

    fn end(self) -> Result<Json, serde_json::Error> {
        Ok(Json::Object(self.map))
    }
}

/// One cell presented to the caller's type: as the JSON parser presents it, except that a type
/// asking for bytes (or for a sequence, as `Vec<u8>` does) gets a blob cell's bytes.
pub(crate) struct Cell<D>(pub(crate) D);

/// Wraps a seed so that the cell it reads is a [`Cell`].
pub(crate) struct CellSeed<S>(pub(crate) S);

impl<'de, S: DeserializeSeed<'de>> DeserializeSeed<'de> for CellSeed<S> {
    type Value = S::Value;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<S::Value, D::Error> {
        self.0.deserialize(Cell(deserializer))
    }
}

macro_rules! forward {
    ($($method:ident $(, $arg:ident: $ty:ty)*;)*) => {$(
        fn $method<V: Visitor<'de>>(self, $($arg: $ty,)* visitor: V) -> Result<V::Value, D::Error> {
            self.0.$method($($arg,)* visitor)
        }
    )*};
}

impl<'de, D: Deserializer<'de>> Deserializer<'de> for Cell<D> {
    type Error = D::Error;

    forward! {
        deserialize_any; deserialize_i8; deserialize_i16; deserialize_i32;
        deserialize_i64; deserialize_i128; deserialize_u8; deserialize_u16; deserialize_u32;
        deserialize_u64; deserialize_u128; deserialize_f32; deserialize_f64; deserialize_char;
        deserialize_str; deserialize_string; deserialize_unit; deserialize_map;
        deserialize_identifier; deserialize_ignored_any;
        deserialize_unit_struct, name: &'static str;
        deserialize_tuple, len: usize;
        deserialize_tuple_struct, name: &'static str, len: usize;
        deserialize_struct, name: &'static str, fields: &'static [&'static str];
        deserialize_enum, name: &'static str, variants: &'static [&'static str];
    }

    fn deserialize_bytes<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, D::Error> {
        self.0.deserialize_any(BytesOf(visitor))
    }

    fn deserialize_bool<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, D::Error> {
        self.0.deserialize_any(BoolOf(visitor))
    }

    fn deserialize_byte_buf<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, D::Error> {
        self.0.deserialize_any(BytesOf(visitor))
    }

    fn deserialize_seq<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, D::Error> {
        self.0.deserialize_any(SeqOf(visitor))
    }

    fn deserialize_option<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, D::Error> {
        self.0.deserialize_option(SomeCell(visitor))
    }

    fn deserialize_newtype_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        visitor: V,
    ) -> Result<V::Value, D::Error> {
        visitor.visit_newtype_struct(self)
    }
}

/// Passes every value on to the inner visitor, for the visitors below.
macro_rules! pass_scalars {
    () => {
        fn visit_bool<E: de::Error>(self, v: bool) -> Result<V::Value, E> {
            self.0.visit_bool(v)
        }
        fn visit_i64<E: de::Error>(self, v: i64) -> Result<V::Value, E> {
            self.0.visit_i64(v)
        }
        fn visit_u64<E: de::Error>(self, v: u64) -> Result<V::Value, E> {
            self.0.visit_u64(v)
        }
        fn visit_f64<E: de::Error>(self, v: f64) -> Result<V::Value, E> {
            self.0.visit_f64(v)
        }
        fn visit_str<E: de::Error>(self, v: &str) -> Result<V::Value, E> {
            self.0.visit_str(v)
        }
        fn visit_borrowed_str<E: de::Error>(self, v: &'de str) -> Result<V::Value, E> {
            self.0.visit_borrowed_str(v)
        }
        fn visit_string<E: de::Error>(self, v: String) -> Result<V::Value, E> {
            self.0.visit_string(v)
        }
        fn visit_unit<E: de::Error>(self) -> Result<V::Value, E> {
            self.0.visit_unit()
        }
        fn visit_none<E: de::Error>(self) -> Result<V::Value, E> {
            self.0.visit_none()
        }
    };
}

/// A type asking for bytes: a blob cell's bytes; a string's bytes and an array of bytes as the
/// JSON parser would give them.
struct BytesOf<V>(V);

impl<'de, V: Visitor<'de>> Visitor<'de> for BytesOf<V> {
    type Value = V::Value;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.expecting(f)
    }

    pass_scalars!();

    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<V::Value, A::Error> {
        self.0.visit_seq(seq)
    }

    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<V::Value, A::Error> {
        let bytes = read_blob(map)?;
        self.0.visit_byte_buf(bytes)
    }
}

/// A `bool`: `true` and `false` (PostgreSQL's `boolean`), and SQLite's booleans, `1` and `0` (what
/// `x > 1` or a column of `BOOLEAN` affinity answers there). Any other integer stays an error.
struct BoolOf<V>(V);

impl<'de, V: Visitor<'de>> Visitor<'de> for BoolOf<V> {
    type Value = V::Value;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.expecting(f)
    }

    fn visit_bool<E: de::Error>(self, v: bool) -> Result<V::Value, E> {
        self.0.visit_bool(v)
    }

    fn visit_i64<E: de::Error>(self, v: i64) -> Result<V::Value, E> {
        match v {
            0 | 1 => self.0.visit_bool(v == 1),
            _ => self.0.visit_i64(v),
        }
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> Result<V::Value, E> {
        match v {
            0 | 1 => self.0.visit_bool(v == 1),
            _ => self.0.visit_u64(v),
        }
    }

    fn visit_f64<E: de::Error>(self, v: f64) -> Result<V::Value, E> {
        self.0.visit_f64(v)
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<V::Value, E> {
        self.0.visit_str(v)
    }

    fn visit_unit<E: de::Error>(self) -> Result<V::Value, E> {
        self.0.visit_unit()
    }

    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<V::Value, A::Error> {
        self.0.visit_seq(seq)
    }

    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<V::Value, A::Error> {
        self.0.visit_map(map)
    }
}

/// A type asking for a sequence: an array as it is, a blob cell as its bytes (`Vec<u8>`).
struct SeqOf<V>(V);

impl<'de, V: Visitor<'de>> Visitor<'de> for SeqOf<V> {
    type Value = V::Value;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.expecting(f)
    }

    pass_scalars!();

    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<V::Value, A::Error> {
        self.0.visit_seq(seq)
    }

    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<V::Value, A::Error> {
        let bytes = read_blob(map)?;
        self.0
            .visit_seq(de::value::SeqDeserializer::<_, A::Error>::new(
                bytes.into_iter(),
            ))
    }
}

/// `Option<T>`: the value inside stays a [`Cell`].
struct SomeCell<V>(V);

impl<'de, V: Visitor<'de>> Visitor<'de> for SomeCell<V> {
    type Value = V::Value;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.expecting(f)
    }

    fn visit_none<E: de::Error>(self) -> Result<V::Value, E> {
        self.0.visit_none()
    }

    fn visit_unit<E: de::Error>(self) -> Result<V::Value, E> {
        self.0.visit_unit()
    }

    fn visit_some<D: Deserializer<'de>>(self, deserializer: D) -> Result<V::Value, D::Error> {
        self.0.visit_some(Cell(deserializer))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_bind_as_blobs_and_structs_keep_the_rule() {
        assert_eq!(
            to_param(&Blob(vec![0, 255, 16])).unwrap(),
            serde_json::json!({"base64": "AP8Q"})
        );
        assert_eq!(
            to_param(&bytes::Bytes::from_static(b"")).unwrap(),
            serde_json::json!({"base64": ""})
        );
        #[derive(serde::Serialize)]
        struct File {
            name: &'static str,
            data: Option<Blob>,
        }
        assert_eq!(
            to_param(&File {
                name: "a",
                data: Some(Blob(vec![1]))
            })
            .unwrap(),
            serde_json::json!({"name": "a", "data": {"base64": "AQ=="}})
        );
        assert_eq!(to_param(&vec![1u8]).unwrap(), serde_json::json!([1]));
    }

    #[test]
    fn a_blob_decodes_from_its_value_and_the_old_array() {
        let blob: Blob = serde_json::from_str(r#"{"base64":"AP8Q"}"#).unwrap();
        assert_eq!(blob.0, [0, 255, 16]);
        let blob: Blob = serde_json::from_str("[0,255,16]").unwrap();
        assert_eq!(blob.0, [0, 255, 16]);
        assert!(serde_json::from_str::<Blob>(r#"{"base64":"AP8"}"#).is_err());
        assert!(serde_json::from_str::<Blob>(r#"{"hex":"00"}"#).is_err());
        assert_eq!(format!("{:?}", Blob(vec![1, 2])), "Blob(<2 bytes>)");
    }
}
