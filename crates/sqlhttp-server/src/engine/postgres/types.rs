//! The type mapping between PostgreSQL and the protocol's JSON: result cells written from the
//! binary values tokio-postgres receives, and request parameters bound for the types PostgreSQL
//! infers for each `$n`.
//!
//! Cells (see `docs/protocol.md`, "PostgreSQL"):
//!
//! | PostgreSQL | JSON cell |
//! |---|---|
//! | `bool` | `true` / `false` |
//! | `int2`, `int4`, `int8`, `oid` | number |
//! | `float4`, `float8` | number, the shortest decimal that reads back as the same `float4` or `float8` (`0.1::float4` is `0.1`); `NaN` and infinities as `null` (as on SQLite) |
//! | `numeric` | string with every digit (`"12.50"`, `"NaN"`, `"Infinity"`) |
//! | `text`, `varchar`, `bpchar`, `name`, `"char"`, enums | string |
//! | `date`, `time`, `timetz`, `timestamp`, `timestamptz` | ISO-8601 string; `timestamptz` in UTC with `Z`; years past 9999 with ISO 8601's `+` (`+10000-01-01`), years before 1 in its astronomical numbering (`1 BC` is `0000`, `2 BC` is `-0001`) |
//! | `interval` | ISO-8601 duration string (`P1Y2M3DT4H5M6.5S`) |
//! | `uuid` | string, hyphenated lower case |
//! | `json`, `jsonb` | the JSON value itself; a value a JSON reader such as the SDK's cannot take back (a number beyond `f64`, `1e400`, or more than [`MAX_JSON_DEPTH`] levels of nesting) as a string holding its JSON text |
//! | `bytea` | blob, `{"base64": "..."}` |
//! | `inet`, `cidr` | string (`10.0.0.1`, `10.0.0.0/8`) |
//! | arrays of any of these | JSON arrays (nested for several dimensions) |
//! | domains | as their base type |
//! | `void` (`SELECT pg_sleep(1)`) | `null` |
//!
//! Any other type is refused with `400 SQL_ERROR` naming the column: cast it (`x::text`).
//!
//! Parameters: `null` binds NULL to any type. Numbers and strings are sent in PostgreSQL's text
//! format, so PostgreSQL parses them with the inferred type's own input rules (`"2024-06-01"`
//! for a `date`, `"12.50"` for a `numeric`, `1` or `true` for a `bool`, `"{1,2}"` for an array);
//! a value the type cannot take is the statement's `SQL_ERROR`. A blob binds to `bytea` only.
//!
//! Knows PostgreSQL's binary formats and the protocol's JSON; nothing about connections, SQL text
//! or HTTP.
//!
//! Past 600 lines on purpose for now: `engine/postgres/` is rebuilt on `sqlhttp-pgwire` by issue 38
//! (ADR 0059), which splits it by concern; issue 39 left this folder as it is.

use std::error::Error;
use std::fmt::Write as _;

use base64::Engine as _;
use tokio_postgres::types::{Format, FromSql, IsNull, Kind, ToSql, Type, to_sql_checked};

use crate::protocol::error::ApiError;
use crate::protocol::request::Param;

type BoxError = Box<dyn Error + Sync + Send>;

/// A column's value as PostgreSQL sent it (binary format), or NULL.
#[derive(Debug)]
pub(crate) struct Raw<'a>(pub(crate) Option<&'a [u8]>);

impl Raw<'_> {
    /// The value's size as PostgreSQL sent it (0 for NULL).
    pub(crate) fn len(&self) -> usize {
        self.0.map_or(0, <[u8]>::len)
    }
}

impl<'a> FromSql<'a> for Raw<'a> {
    fn from_sql(_: &Type, raw: &'a [u8]) -> Result<Self, BoxError> {
        Ok(Raw(Some(raw)))
    }

    fn from_sql_null(_: &Type) -> Result<Self, BoxError> {
        Ok(Raw(None))
    }

    fn accepts(_: &Type) -> bool {
        true
    }
}

/// Whether cells of `ty` can be written (so a statement is refused before any row is sent).
pub(crate) fn is_supported(ty: &Type) -> bool {
    match ty.kind() {
        Kind::Array(element) => is_supported(element),
        Kind::Domain(base) => is_supported(base),
        Kind::Enum(_) => true,
        _ => matches!(
            *ty,
            Type::BOOL
                | Type::INT2
                | Type::INT4
                | Type::INT8
                | Type::OID
                | Type::FLOAT4
                | Type::FLOAT8
                | Type::NUMERIC
                | Type::TEXT
                | Type::VARCHAR
                | Type::BPCHAR
                | Type::NAME
                | Type::CHAR
                | Type::UNKNOWN
                | Type::DATE
                | Type::TIME
                | Type::TIMETZ
                | Type::TIMESTAMP
                | Type::TIMESTAMPTZ
                | Type::INTERVAL
                | Type::UUID
                | Type::JSON
                | Type::JSONB
                | Type::BYTEA
                | Type::INET
                | Type::CIDR
                | Type::VOID
        ),
    }
}

/// The refusal for a column whose type has no JSON form here.
pub(crate) fn unsupported(column: &str, ty: &Type) -> ApiError {
    ApiError::sql(format!(
        "column `{column}` has type {}, which this server does not send as JSON; cast it, \
         for example `{column}::text`",
        ty.name()
    ))
}

fn malformed(ty: &Type) -> BoxError {
    format!("malformed {} value", ty.name()).into()
}

fn be<const N: usize>(raw: &[u8], ty: &Type) -> Result<[u8; N], BoxError> {
    raw.get(..N)
        .and_then(|b| b.try_into().ok())
        .ok_or_else(|| malformed(ty))
}

/// Writes one cell of type `ty` as JSON.
pub(crate) fn write_cell(out: &mut Vec<u8>, ty: &Type, raw: Option<&[u8]>) -> Result<(), BoxError> {
    let Some(raw) = raw else {
        out.extend_from_slice(b"null");
        return Ok(());
    };
    match ty.kind() {
        Kind::Array(element) => return write_array(out, element, raw),
        Kind::Domain(base) => return write_cell(out, base, Some(raw)),
        Kind::Enum(_) => return write_text(out, raw),
        _ => {}
    }
    match *ty {
        Type::BOOL => out.extend_from_slice(if raw.first() == Some(&1) {
            b"true"
        } else {
            b"false"
        }),
        Type::INT2 => write_display(out, i16::from_be_bytes(be(raw, ty)?)),
        Type::INT4 => write_display(out, i32::from_be_bytes(be(raw, ty)?)),
        Type::INT8 => write_display(out, i64::from_be_bytes(be(raw, ty)?)),
        Type::OID => write_display(out, u32::from_be_bytes(be(raw, ty)?)),
        // Widening to f64 first would write `0.1::float4` as `0.10000000149011612`.
        Type::FLOAT4 => write_float32(out, f32::from_be_bytes(be(raw, ty)?)),
        Type::FLOAT8 => write_float(out, f64::from_be_bytes(be(raw, ty)?)),
        Type::NUMERIC => write_string(out, &numeric(raw).ok_or_else(|| malformed(ty))?),
        Type::TEXT | Type::VARCHAR | Type::BPCHAR | Type::NAME | Type::UNKNOWN => {
            write_text(out, raw)?
        }
        // `"char"` is one raw byte: a byte past ASCII is written as PostgreSQL's text output
        // writes it, `\ooo`.
        Type::CHAR => match raw {
            [byte] if !byte.is_ascii() => write_string(out, &format!("\\{byte:03o}")),
            _ => write_text(out, raw)?,
        },
        Type::DATE => write_string(out, &date(i32::from_be_bytes(be(raw, ty)?))),
        Type::TIME => write_string(out, &time_of_day(i64::from_be_bytes(be(raw, ty)?))),
        Type::TIMETZ => {
            let micros = i64::from_be_bytes(be(raw, ty)?);
            let west = i32::from_be_bytes(be(raw.get(8..).unwrap_or_default(), ty)?);
            let mut text = time_of_day(micros);
            text.push_str(&offset(-west));
            write_string(out, &text);
        }
        Type::TIMESTAMP => write_string(out, &timestamp(i64::from_be_bytes(be(raw, ty)?), "")),
        Type::TIMESTAMPTZ => write_string(out, &timestamp(i64::from_be_bytes(be(raw, ty)?), "Z")),
        Type::INTERVAL => {
            let micros = i64::from_be_bytes(be(raw, ty)?);
            let days = i32::from_be_bytes(be(raw.get(8..).unwrap_or_default(), ty)?);
            let months = i32::from_be_bytes(be(raw.get(12..).unwrap_or_default(), ty)?);
            write_string(out, &interval(months, days, micros));
        }
        Type::UUID => write_string(out, &uuid(&be::<16>(raw, ty)?)),
        // PostgreSQL checked the JSON text; an empty one would break the body.
        Type::JSON if !raw.is_empty() => write_json(out, raw)?,
        // jsonb's binary form is a version byte (1) and the JSON text.
        Type::JSONB => match raw.split_first() {
            Some((1, json)) if !json.is_empty() => write_json(out, json)?,
            _ => return Err(malformed(ty)),
        },
        Type::BYTEA => write_blob(out, raw),
        Type::INET | Type::CIDR => write_string(out, &inet(raw).ok_or_else(|| malformed(ty))?),
        Type::VOID => out.extend_from_slice(b"null"),
        _ => return Err(format!("type {} has no JSON form", ty.name()).into()),
    }
    Ok(())
}

fn write_display(out: &mut Vec<u8>, value: impl std::fmt::Display) {
    let _ = std::io::Write::write_fmt(out, format_args!("{value}"));
}

fn write_float(out: &mut Vec<u8>, value: f64) {
    if value.is_finite() {
        let _ = serde_json::to_writer(&mut *out, &value);
    } else {
        out.extend_from_slice(b"null");
    }
}

fn write_float32(out: &mut Vec<u8>, value: f32) {
    if value.is_finite() {
        let _ = serde_json::to_writer(&mut *out, &value);
    } else {
        out.extend_from_slice(b"null");
    }
}

/// Deepest nesting of a `json` or `jsonb` cell sent as the value itself: serde_json (the
/// SDK's reader) refuses a document nested 128 levels deep, and a cell sits inside the body's
/// object, its `rows` array and its row.
pub(crate) const MAX_JSON_DEPTH: usize = 120;

/// A `json`/`jsonb` cell: PostgreSQL's JSON text as it is when a JSON reader can take it back,
/// else as a string holding that text (see the module documentation).
fn write_json(out: &mut Vec<u8>, text: &[u8]) -> Result<(), BoxError> {
    if json_depth(text) <= MAX_JSON_DEPTH && serde_json::from_slice::<Readable>(text).is_ok() {
        out.extend_from_slice(text);
        Ok(())
    } else {
        write_text(out, text)
    }
}

/// A JSON value read as a reader reads it (numbers converted, strings unescaped) and kept
/// nowhere: `IgnoredAny` skips numbers unread, so `1e400` would pass it.
struct Readable;

impl<'de> serde::Deserialize<'de> for Readable {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(Readable)
    }
}

impl<'de> serde::de::Visitor<'de> for Readable {
    type Value = Readable;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_bool<E>(self, _: bool) -> Result<Readable, E> {
        Ok(Readable)
    }

    fn visit_i64<E>(self, _: i64) -> Result<Readable, E> {
        Ok(Readable)
    }

    fn visit_u64<E>(self, _: u64) -> Result<Readable, E> {
        Ok(Readable)
    }

    fn visit_f64<E>(self, _: f64) -> Result<Readable, E> {
        Ok(Readable)
    }

    fn visit_str<E>(self, _: &str) -> Result<Readable, E> {
        Ok(Readable)
    }

    fn visit_unit<E>(self) -> Result<Readable, E> {
        Ok(Readable)
    }

    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<Readable, A::Error> {
        while seq.next_element::<Readable>()?.is_some() {}
        Ok(Readable)
    }

    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<Readable, A::Error> {
        while map
            .next_entry::<serde::de::IgnoredAny, Readable>()?
            .is_some()
        {}
        Ok(Readable)
    }
}

/// The deepest nesting of arrays and objects in JSON `text` (strings skipped).
fn json_depth(text: &[u8]) -> usize {
    let (mut depth, mut deepest, mut in_string, mut escaped) = (0_usize, 0, false, false);
    for &byte in text {
        if in_string {
            match byte {
                _ if escaped => escaped = false,
                b'\\' => escaped = true,
                b'"' => in_string = false,
                _ => {}
            }
            continue;
        }
        match byte {
            b'"' => in_string = true,
            b'[' | b'{' => {
                depth += 1;
                deepest = deepest.max(depth);
            }
            b']' | b'}' => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    deepest
}

fn write_string(out: &mut Vec<u8>, value: &str) {
    let _ = serde_json::to_writer(&mut *out, value);
}

fn write_text(out: &mut Vec<u8>, raw: &[u8]) -> Result<(), BoxError> {
    write_string(out, std::str::from_utf8(raw)?);
    Ok(())
}

/// The protocol's blob cell: `{"base64": "..."}`, standard padded base64.
pub(crate) fn write_blob(out: &mut Vec<u8>, bytes: &[u8]) {
    out.extend_from_slice(b"{\"base64\":\"");
    out.extend_from_slice(
        base64::engine::general_purpose::STANDARD
            .encode(bytes)
            .as_bytes(),
    );
    out.extend_from_slice(b"\"}");
}

/// An array (any number of dimensions) as nested JSON arrays; an empty array is `[]`.
fn write_array(out: &mut Vec<u8>, element: &Type, raw: &[u8]) -> Result<(), BoxError> {
    let header = |at: usize| -> Result<i32, BoxError> {
        Ok(i32::from_be_bytes(be(
            raw.get(at..).unwrap_or_default(),
            &Type::INT4,
        )?))
    };
    let dimensions = usize::try_from(header(0)?).map_err(|_| malformed(element))?;
    let lens = (0..dimensions)
        .map(|d| {
            header(12 + 8 * d).and_then(|len| usize::try_from(len).map_err(|_| malformed(element)))
        })
        .collect::<Result<Vec<_>, _>>()?;
    let mut values = raw
        .get(12 + 8 * dimensions..)
        .ok_or_else(|| malformed(element))?;
    if dimensions == 0 {
        out.extend_from_slice(b"[]");
        return Ok(());
    }
    write_dimension(out, element, &lens, &mut values)
}

fn write_dimension(
    out: &mut Vec<u8>,
    element: &Type,
    lens: &[usize],
    values: &mut &[u8],
) -> Result<(), BoxError> {
    let (len, inner) = lens.split_first().ok_or_else(|| malformed(element))?;
    out.push(b'[');
    for index in 0..*len {
        if index > 0 {
            out.push(b',');
        }
        if inner.is_empty() {
            let size = i32::from_be_bytes(be(values, element)?);
            *values = &values[4..];
            if size < 0 {
                write_cell(out, element, None)?;
            } else {
                let size = size as usize;
                let value = values.get(..size).ok_or_else(|| malformed(element))?;
                *values = &values[size..];
                write_cell(out, element, Some(value))?;
            }
        } else {
            write_dimension(out, element, inner, values)?;
        }
    }
    out.push(b']');
    Ok(())
}

/// `numeric`'s binary form as decimal text with every digit of its scale.
fn numeric(raw: &[u8]) -> Option<String> {
    let word = |at: usize| {
        raw.get(at..at + 2)
            .map(|b| u16::from_be_bytes([b[0], b[1]]))
    };
    let ndigits = usize::from(word(0)?);
    let weight = word(2)? as i16;
    let sign = word(4)?;
    let dscale = usize::from(word(6)?);
    match sign {
        0xC000 => return Some("NaN".into()),
        0xD000 => return Some("Infinity".into()),
        0xF000 => return Some("-Infinity".into()),
        0x0000 | 0x4000 => {}
        _ => return None,
    }
    let digits = (0..ndigits)
        .map(|i| word(8 + 2 * i))
        .collect::<Option<Vec<u16>>>()?;
    let digit = |d: i32| {
        usize::try_from(d)
            .ok()
            .and_then(|d| digits.get(d))
            .copied()
            .unwrap_or(0)
    };
    let weight = i32::from(weight);
    let mut text = String::new();
    if sign == 0x4000 {
        text.push('-');
    }
    if weight < 0 {
        text.push('0');
    } else {
        for d in 0..=weight {
            if d == 0 {
                let _ = write!(text, "{}", digit(d));
            } else {
                let _ = write!(text, "{:04}", digit(d));
            }
        }
    }
    if dscale > 0 {
        let mut fraction = String::new();
        let mut d = weight + 1;
        while fraction.len() < dscale {
            let _ = write!(fraction, "{:04}", digit(d));
            d += 1;
        }
        fraction.truncate(dscale);
        text.push('.');
        text.push_str(&fraction);
    }
    Some(text)
}

/// Days since 1970-01-01 to (year, month, day), proleptic Gregorian (Howard Hinnant's method).
fn civil(days_since_unix: i64) -> (i64, u32, u32) {
    let z = days_since_unix + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

/// PostgreSQL's dates and timestamps count from 2000-01-01.
const PG_EPOCH_DAYS: i64 = 10_957;
const MICROS_PER_DAY: i64 = 86_400_000_000;

fn format_date(days_since_pg_epoch: i64) -> String {
    let (year, month, day) = civil(days_since_pg_epoch + PG_EPOCH_DAYS);
    // ISO 8601 numbers years astronomically (1 BC is 0000) and writes one outside 0000..=9999
    // with its sign (an expanded year).
    if year < 0 {
        format!("-{:04}-{month:02}-{day:02}", -year)
    } else if year > 9999 {
        format!("+{year}-{month:02}-{day:02}")
    } else {
        format!("{year:04}-{month:02}-{day:02}")
    }
}

fn date(days: i32) -> String {
    match days {
        i32::MAX => "infinity".into(),
        i32::MIN => "-infinity".into(),
        days => format_date(i64::from(days)),
    }
}

fn time_of_day(micros: i64) -> String {
    let seconds = micros / 1_000_000;
    let fraction = micros % 1_000_000;
    let mut text = format!(
        "{:02}:{:02}:{:02}",
        seconds / 3600,
        seconds / 60 % 60,
        seconds % 60
    );
    if fraction != 0 {
        let digits = format!("{fraction:06}");
        text.push('.');
        text.push_str(digits.trim_end_matches('0'));
    }
    text
}

fn timestamp(micros: i64, zone: &str) -> String {
    match micros {
        i64::MAX => "infinity".into(),
        i64::MIN => "-infinity".into(),
        micros => format!(
            "{}T{}{zone}",
            format_date(micros.div_euclid(MICROS_PER_DAY)),
            time_of_day(micros.rem_euclid(MICROS_PER_DAY))
        ),
    }
}

/// A UTC offset in seconds east as `+HH:MM` (`+HH:MM:SS` when it has seconds).
fn offset(east: i32) -> String {
    let sign = if east < 0 { '-' } else { '+' };
    let east = east.unsigned_abs();
    let mut text = format!("{sign}{:02}:{:02}", east / 3600, east / 60 % 60);
    if !east.is_multiple_of(60) {
        let _ = write!(text, ":{:02}", east % 60);
    }
    text
}

/// An interval as an ISO-8601 duration; each part keeps its own sign, as PostgreSQL's
/// `iso_8601` interval style writes them.
fn interval(months: i32, days: i32, micros: i64) -> String {
    let mut text = String::from("P");
    let (years, months) = (months / 12, months % 12);
    for (value, unit) in [
        (i64::from(years), 'Y'),
        (i64::from(months), 'M'),
        (i64::from(days), 'D'),
    ] {
        if value != 0 {
            let _ = write!(text, "{value}{unit}");
        }
    }
    if micros != 0 {
        text.push('T');
        let (hours, rest) = (micros / 3_600_000_000, micros % 3_600_000_000);
        let (minutes, rest) = (rest / 60_000_000, rest % 60_000_000);
        if hours != 0 {
            let _ = write!(text, "{hours}H");
        }
        if minutes != 0 {
            let _ = write!(text, "{minutes}M");
        }
        if rest != 0 {
            let sign = if rest < 0 { "-" } else { "" };
            let rest = rest.unsigned_abs();
            let _ = write!(text, "{sign}{}", rest / 1_000_000);
            if rest % 1_000_000 != 0 {
                let digits = format!("{:06}", rest % 1_000_000);
                let _ = write!(text, ".{}", digits.trim_end_matches('0'));
            }
            text.push('S');
        }
    }
    if text.len() == 1 {
        text.push_str("T0S");
    }
    text
}

fn uuid(bytes: &[u8; 16]) -> String {
    let mut text = String::with_capacity(36);
    for (index, byte) in bytes.iter().enumerate() {
        if matches!(index, 4 | 6 | 8 | 10) {
            text.push('-');
        }
        let _ = write!(text, "{byte:02x}");
    }
    text
}

/// `inet`/`cidr`: family, prefix bits, is-cidr flag, address length, address.
fn inet(raw: &[u8]) -> Option<String> {
    let (&family, rest) = raw.split_first()?;
    let (&bits, rest) = rest.split_first()?;
    let (&is_cidr, rest) = rest.split_first()?;
    let (&len, address) = rest.split_first()?;
    let address = address.get(..usize::from(len))?;
    let (text, full) = match family {
        2 => (
            std::net::Ipv4Addr::from(<[u8; 4]>::try_from(address).ok()?).to_string(),
            32,
        ),
        3 => (
            std::net::Ipv6Addr::from(<[u8; 16]>::try_from(address).ok()?).to_string(),
            128,
        ),
        _ => return None,
    };
    Some(if is_cidr == 1 || bits != full {
        format!("{text}/{bits}")
    } else {
        text
    })
}

/// One parameter as PostgreSQL receives it.
#[derive(Debug)]
pub(crate) enum Bound<'a> {
    /// SQL NULL.
    Null,
    /// Text for the parameter type's input function.
    Text(String),
    /// A `bytea`'s bytes (binary format).
    Bytes(&'a [u8]),
}

impl ToSql for Bound<'_> {
    fn to_sql(&self, _: &Type, out: &mut bytes::BytesMut) -> Result<IsNull, BoxError> {
        match self {
            Bound::Null => return Ok(IsNull::Yes),
            Bound::Text(text) => out.extend_from_slice(text.as_bytes()),
            Bound::Bytes(bytes) => out.extend_from_slice(bytes),
        }
        Ok(IsNull::No)
    }

    fn accepts(_: &Type) -> bool {
        true
    }

    fn encode_format(&self, _: &Type) -> Format {
        match self {
            Bound::Bytes(_) => Format::Binary,
            Bound::Null | Bound::Text(_) => Format::Text,
        }
    }

    to_sql_checked!();
}

/// Binds the request's parameters for a statement whose `$n` have the `types` PostgreSQL
/// inferred; the caller has checked that there are as many of each.
pub(crate) fn bind<'a>(params: &'a [Param], types: &[Type]) -> Result<Vec<Bound<'a>>, ApiError> {
    params
        .iter()
        .zip(types)
        .enumerate()
        .map(|(index, (param, ty))| {
            bind_one(param, ty)
                .map_err(|why| ApiError::sql(format!("parameter {}: {why}", index + 1)))
        })
        .collect()
}

fn bind_one<'a>(param: &'a Param, ty: &Type) -> Result<Bound<'a>, String> {
    Ok(match param {
        Param::Null => Bound::Null,
        Param::Integer(i) => Bound::Text(i.to_string()),
        Param::Real(f) => Bound::Text(serde_json::to_string(f).map_err(|e| e.to_string())?),
        Param::Text(s) => Bound::Text(s.clone()),
        Param::Blob(bytes) if *ty == Type::BYTEA => Bound::Bytes(bytes),
        Param::Blob(_) => {
            return Err(format!(
                "a blob binds to a bytea parameter only, and PostgreSQL expects {} here",
                ty.name()
            ));
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cell(ty: &Type, raw: &[u8]) -> String {
        let mut out = Vec::new();
        write_cell(&mut out, ty, Some(raw)).unwrap();
        String::from_utf8(out).unwrap()
    }

    fn numeric_raw(weight: i16, sign: u16, dscale: u16, digits: &[u16]) -> Vec<u8> {
        let mut raw = Vec::new();
        raw.extend_from_slice(&(digits.len() as u16).to_be_bytes());
        raw.extend_from_slice(&weight.to_be_bytes());
        raw.extend_from_slice(&sign.to_be_bytes());
        raw.extend_from_slice(&dscale.to_be_bytes());
        for d in digits {
            raw.extend_from_slice(&d.to_be_bytes());
        }
        raw
    }

    #[test]
    fn scalars() {
        assert_eq!(cell(&Type::BOOL, &[1]), "true");
        assert_eq!(cell(&Type::BOOL, &[0]), "false");
        assert_eq!(cell(&Type::INT2, &(-7i16).to_be_bytes()), "-7");
        assert_eq!(cell(&Type::INT4, &i32::MIN.to_be_bytes()), "-2147483648");
        assert_eq!(
            cell(&Type::INT8, &i64::MAX.to_be_bytes()),
            "9223372036854775807"
        );
        assert_eq!(cell(&Type::FLOAT8, &0.25f64.to_be_bytes()), "0.25");
        assert_eq!(cell(&Type::FLOAT4, &1.5f32.to_be_bytes()), "1.5");
        assert_eq!(cell(&Type::FLOAT4, &0.1f32.to_be_bytes()), "0.1");
        assert_eq!(cell(&Type::FLOAT4, &f32::NAN.to_be_bytes()), "null");
        assert_eq!(cell(&Type::FLOAT8, &f64::NAN.to_be_bytes()), "null");
        assert_eq!(cell(&Type::FLOAT8, &f64::INFINITY.to_be_bytes()), "null");
        assert_eq!(cell(&Type::TEXT, "a\"é".as_bytes()), r#""a\"é""#);
        assert_eq!(cell(&Type::BYTEA, &[0, 255, 16]), r#"{"base64":"AP8Q"}"#);
        assert_eq!(cell(&Type::JSON, br#"{"a": [1]}"#), r#"{"a": [1]}"#);
        assert_eq!(cell(&Type::JSONB, b"\x01[1,2]"), "[1,2]");
        let uuid = [
            0x12, 0x3e, 0x45, 0x67, 0xe8, 0x9b, 0x12, 0xd3, 0xa4, 0x56, 0x42, 0x66, 0x14, 0x17,
            0x40, 0x00,
        ];
        assert_eq!(
            cell(&Type::UUID, &uuid),
            r#""123e4567-e89b-12d3-a456-426614174000""#
        );
        assert_eq!(
            cell(&Type::INET, &[2, 32, 0, 4, 10, 0, 0, 1]),
            r#""10.0.0.1""#
        );
        assert_eq!(
            cell(&Type::CIDR, &[2, 8, 1, 4, 10, 0, 0, 0]),
            r#""10.0.0.0/8""#
        );
        let mut null = Vec::new();
        write_cell(&mut null, &Type::INT4, None).unwrap();
        assert_eq!(null, b"null");
    }

    #[test]
    fn numerics_keep_every_digit() {
        assert_eq!(
            cell(&Type::NUMERIC, &numeric_raw(0, 0, 2, &[12, 5000])),
            r#""12.50""#
        );
        assert_eq!(
            cell(&Type::NUMERIC, &numeric_raw(0, 0x4000, 0, &[7])),
            r#""-7""#
        );
        assert_eq!(cell(&Type::NUMERIC, &numeric_raw(0, 0, 0, &[])), r#""0""#);
        assert_eq!(
            cell(&Type::NUMERIC, &numeric_raw(0, 0, 3, &[])),
            r#""0.000""#
        );
        // 12345678.9 = [1234, 5678, 9000] with weight 1
        assert_eq!(
            cell(&Type::NUMERIC, &numeric_raw(1, 0, 1, &[1234, 5678, 9000])),
            r#""12345678.9""#
        );
        // 0.00012 = [1, 2000] with weight -1
        assert_eq!(
            cell(&Type::NUMERIC, &numeric_raw(-1, 0, 5, &[1, 2000])),
            r#""0.00012""#
        );
        // 10000 = [1] with weight 1 (trailing zero groups are left out)
        assert_eq!(
            cell(&Type::NUMERIC, &numeric_raw(1, 0, 0, &[1])),
            r#""10000""#
        );
        // 123456789012345678901234567890
        assert_eq!(
            cell(
                &Type::NUMERIC,
                &numeric_raw(7, 0, 0, &[12, 3456, 7890, 1234, 5678, 9012, 3456, 7890])
            ),
            r#""123456789012345678901234567890""#
        );
        assert_eq!(
            cell(&Type::NUMERIC, &numeric_raw(0, 0xC000, 0, &[])),
            r#""NaN""#
        );
        assert_eq!(
            cell(&Type::NUMERIC, &numeric_raw(0, 0xF000, 0, &[])),
            r#""-Infinity""#
        );
    }

    #[test]
    fn dates_and_times_are_iso_8601() {
        assert_eq!(cell(&Type::DATE, &0i32.to_be_bytes()), r#""2000-01-01""#);
        assert_eq!(
            cell(&Type::DATE, &(-10_957i32).to_be_bytes()),
            r#""1970-01-01""#
        );
        assert_eq!(
            cell(&Type::DATE, &8_919i32.to_be_bytes()),
            r#""2024-06-02""#
        );
        assert_eq!(cell(&Type::DATE, &60i32.to_be_bytes()), r#""2000-03-01""#);
        assert_eq!(cell(&Type::DATE, &i32::MAX.to_be_bytes()), r#""infinity""#);
        // 10000-01-01 is 2,921,940 days after 2000-01-01; 0001-01-01 BC is year 0000.
        assert_eq!(
            cell(&Type::DATE, &2_921_940i32.to_be_bytes()),
            r#""+10000-01-01""#
        );
        assert_eq!(
            cell(&Type::DATE, &(-730_485i32).to_be_bytes()),
            r#""0000-01-01""#
        );
        assert_eq!(
            cell(&Type::DATE, &(-730_850i32).to_be_bytes()),
            r#""-0001-01-01""#
        );
        let noon = 12 * 3_600_000_000i64 + 500_000;
        assert_eq!(cell(&Type::TIME, &noon.to_be_bytes()), r#""12:00:00.5""#);
        assert_eq!(
            cell(&Type::TIMESTAMP, &noon.to_be_bytes()),
            r#""2000-01-01T12:00:00.5""#
        );
        assert_eq!(
            cell(&Type::TIMESTAMPTZ, &(-1i64).to_be_bytes()),
            r#""1999-12-31T23:59:59.999999Z""#
        );
        assert_eq!(
            cell(&Type::TIMESTAMPTZ, &i64::MIN.to_be_bytes()),
            r#""-infinity""#
        );
        let mut timetz = 3_600_000_000i64.to_be_bytes().to_vec();
        timetz.extend_from_slice(&(-19_800i32).to_be_bytes()); // 5:30 east, as seconds west
        assert_eq!(cell(&Type::TIMETZ, &timetz), r#""01:00:00+05:30""#);
    }

    #[test]
    fn intervals_are_iso_8601_durations() {
        let raw = |micros: i64, days: i32, months: i32| {
            let mut raw = micros.to_be_bytes().to_vec();
            raw.extend_from_slice(&days.to_be_bytes());
            raw.extend_from_slice(&months.to_be_bytes());
            raw
        };
        let hms = 4 * 3_600_000_000 + 5 * 60_000_000 + 6_500_000;
        assert_eq!(
            cell(&Type::INTERVAL, &raw(hms, 3, 14)),
            r#""P1Y2M3DT4H5M6.5S""#
        );
        assert_eq!(cell(&Type::INTERVAL, &raw(0, 0, 0)), r#""PT0S""#);
        assert_eq!(
            cell(&Type::INTERVAL, &raw(-1_000_000, -1, 0)),
            r#""P-1DT-1S""#
        );
    }

    #[test]
    fn arrays_nest_by_dimension() {
        let array = |dims: &[i32], elements: &[Option<i32>]| {
            let mut raw = Vec::new();
            raw.extend_from_slice(&(dims.len() as i32).to_be_bytes());
            raw.extend_from_slice(&1i32.to_be_bytes());
            raw.extend_from_slice(&Type::INT4.oid().to_be_bytes());
            for d in dims {
                raw.extend_from_slice(&d.to_be_bytes());
                raw.extend_from_slice(&1i32.to_be_bytes());
            }
            for e in elements {
                match e {
                    Some(v) => {
                        raw.extend_from_slice(&4i32.to_be_bytes());
                        raw.extend_from_slice(&v.to_be_bytes());
                    }
                    None => raw.extend_from_slice(&(-1i32).to_be_bytes()),
                }
            }
            raw
        };
        assert_eq!(cell(&Type::INT4_ARRAY, &array(&[], &[])), "[]");
        assert_eq!(
            cell(&Type::INT4_ARRAY, &array(&[3], &[Some(1), None, Some(3)])),
            "[1,null,3]"
        );
        assert_eq!(
            cell(
                &Type::INT4_ARRAY,
                &array(&[2, 2], &[Some(1), Some(2), Some(3), Some(4)])
            ),
            "[[1,2],[3,4]]"
        );
        let mut truncated = Vec::new();
        assert!(
            write_cell(
                &mut truncated,
                &Type::INT4_ARRAY,
                Some(&array(&[3], &[Some(1)]))
            )
            .is_err()
        );
    }

    #[test]
    fn malformed_values_are_errors_not_panics() {
        for ty in [
            Type::INT4,
            Type::INT8,
            Type::UUID,
            Type::NUMERIC,
            Type::JSONB,
            Type::INTERVAL,
            Type::INET,
            Type::TIMETZ,
        ] {
            let mut out = Vec::new();
            assert!(write_cell(&mut out, &ty, Some(&[1])).is_err(), "{ty}");
        }
        assert!(write_cell(&mut Vec::new(), &Type::JSON, Some(&[])).is_err());
    }

    #[test]
    fn json_a_reader_cannot_take_back_is_sent_as_its_text() {
        assert_eq!(cell(&Type::JSON, b"1e400"), r#""1e400""#);
        assert_eq!(cell(&Type::JSONB, b"\x011e400"), r#""1e400""#);
        assert_eq!(cell(&Type::JSON, b"1e300"), "1e300");
        let nested = |levels: usize| format!("{}{}", "[".repeat(levels), "]".repeat(levels));
        let deepest = nested(MAX_JSON_DEPTH);
        assert_eq!(cell(&Type::JSON, deepest.as_bytes()), deepest);
        let deeper = nested(MAX_JSON_DEPTH + 1);
        assert_eq!(
            cell(&Type::JSON, deeper.as_bytes()),
            serde_json::to_string(&deeper).unwrap()
        );
        // Brackets inside strings are not nesting.
        let text = format!(r#"["{}\"]"]"#, "[".repeat(500));
        assert_eq!(cell(&Type::JSON, text.as_bytes()), text);
        // Whatever is sent, the body's reader takes it back inside a row.
        let row = format!("[{}]", cell(&Type::JSON, nested(5000).as_bytes()));
        assert!(serde_json::from_str::<serde_json::Value>(&row).is_ok());
    }

    #[test]
    fn supported_types() {
        assert!(is_supported(&Type::INT4_ARRAY));
        assert!(is_supported(&Type::JSONB));
        assert!(!is_supported(&Type::POINT));
        assert!(!is_supported(&Type::MONEY));
        assert!(unsupported("p", &Type::POINT).message.contains("p::text"));
    }

    #[test]
    fn parameters_bind_as_text_and_blobs_as_bytea() {
        let params = vec![
            Param::Null,
            Param::Integer(-3),
            Param::Real(0.1),
            Param::Text("2024-06-01".into()),
            Param::Blob(vec![1, 2]),
        ];
        let types = [
            Type::INT4,
            Type::INT8,
            Type::FLOAT8,
            Type::DATE,
            Type::BYTEA,
        ];
        let bound = bind(&params, &types).unwrap();
        assert!(matches!(bound[0], Bound::Null));
        assert!(matches!(&bound[1], Bound::Text(t) if t == "-3"));
        assert!(matches!(&bound[2], Bound::Text(t) if t == "0.1"));
        assert!(matches!(&bound[3], Bound::Text(t) if t == "2024-06-01"));
        assert!(matches!(bound[4], Bound::Bytes(&[1, 2])));
        assert!(matches!(bound[1].encode_format(&Type::INT8), Format::Text));
        assert!(matches!(
            bound[4].encode_format(&Type::BYTEA),
            Format::Binary
        ));
        let err = bind(&[Param::Blob(vec![])], &[Type::TEXT]).unwrap_err();
        assert!(err.message.contains("parameter 1"), "{}", err.message);
    }
}
