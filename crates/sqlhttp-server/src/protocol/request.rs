//! Decoding a `POST /api/v1/sql` body into a [`SqlRequest`]. How the SQL text is read (its
//! statements and their keywords) is `sql_text`'s.
//!
//! Pure functions over bytes and strings: no HTTP types, no engine. The SQL text is never
//! rewritten and parameters are never spliced into it.

use serde_json::value::RawValue;

use crate::protocol::error::ApiError;

/// One positional parameter, already checked against the protocol's accepted kinds.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Param {
    Null,
    Integer(i64),
    Real(f64),
    Text(String),
    Blob(Vec<u8>),
}

/// A decoded request body.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct SqlRequest {
    pub(crate) sql: String,
    pub(crate) params: Vec<Param>,
    /// `"read_only": true`: the statement must not write, and is refused (`403 READ_ONLY`,
    /// nothing written) if it may, whatever the credential may do.
    pub(crate) read_only: bool,
}

/// The body as the protocol crate types it, read in place: `sql` kept as any JSON value (so a
/// `null` or a number is refused by name below), each parameter kept raw until it is checked.
type Wire<'a> = sqlhttp_protocol::body::SqlRequest<serde_json::Value, Vec<&'a RawValue>>;

impl SqlRequest {
    /// Decodes and validates a request body; every failure is a `400 BAD_REQUEST`.
    pub(crate) fn parse(body: &[u8]) -> Result<SqlRequest, ApiError> {
        let wire: Wire<'_> = serde_json::from_slice(body).map_err(|e| {
            if e.to_string().starts_with("missing field `sql`") {
                return ApiError::bad_request("`sql` is missing");
            }
            ApiError::bad_request(format!(
                "the body must be a JSON object {{\"sql\": string, \"params\": array}}: {e}"
            ))
        })?;
        object(
            body,
            "the body must be a JSON object {\"sql\": string, \"params\": array}",
        )?;
        let serde_json::Value::String(sql) = wire.sql else {
            return Err(ApiError::bad_request("`sql` must be a string"));
        };
        let params = wire
            .params
            .unwrap_or_default()
            .into_iter()
            .enumerate()
            .map(|(index, raw)| parse_param(index, raw))
            .collect::<Result<_, _>>()?;
        Ok(SqlRequest {
            sql,
            params,
            read_only: wire.read_only,
        })
    }
}

/// `400 BAD_REQUEST` saying `shape` unless `body` is a JSON object: serde also reads a struct
/// from a JSON array (`["SELECT 1", []]`), and every body of the protocol is an object. The one
/// check of it, for every route's body.
pub(crate) fn object(body: &[u8], shape: &str) -> Result<(), ApiError> {
    if body.iter().find(|b| !b.is_ascii_whitespace()) != Some(&b'{') {
        return Err(ApiError::bad_request(shape.to_owned()));
    }
    Ok(())
}

/// The non-negative integer a JSON number literal names, exactly, however it is spelled: `3`,
/// `3.0`, `30e-1` and `0.3E+1` are all 3, as JSON Schema's `integer` reads them. Worked out on
/// the decimal digits, never through a float (a float holds `4465287181458842.0` only
/// approximately once it is divided by ten). `None` for anything else: a fraction, a negative
/// number, one beyond `u64`, or text that is not a number.
pub(crate) fn exact_unsigned(literal: &str) -> Option<u64> {
    let literal = literal.trim();
    let (mantissa, exponent) = match literal.find(['e', 'E']) {
        Some(at) => (&literal[..at], literal[at + 1..].parse::<i64>().ok()?),
        None => (literal, 0),
    };
    let (negative, mantissa) = match mantissa.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, mantissa),
    };
    let (whole, fraction) = mantissa.split_once('.').unwrap_or((mantissa, ""));
    if whole.is_empty()
        || !whole
            .bytes()
            .chain(fraction.bytes())
            .all(|b| b.is_ascii_digit())
    {
        return None;
    }
    let digits = format!("{whole}{fraction}");
    let significant = digits.trim_start_matches('0');
    let trimmed = significant.trim_end_matches('0');
    if trimmed.is_empty() {
        return Some(0);
    }
    if negative {
        return None;
    }
    let fraction_len = i64::try_from(fraction.len()).ok()?;
    let zeros = i64::try_from(significant.len() - trimmed.len()).ok()?;
    let scale = exponent.checked_sub(fraction_len)?.checked_add(zeros)?;
    if !(0..=20).contains(&scale) {
        return None;
    }
    let mut value: u64 = trimmed.parse().ok()?;
    for _ in 0..scale {
        value = value.checked_mul(10)?;
    }
    Some(value)
}

fn parse_param(index: usize, raw: &RawValue) -> Result<Param, ApiError> {
    let position = index + 1;
    let value: serde_json::Value = serde_json::from_str(raw.get())
        .map_err(|e| ApiError::bad_request(format!("parameter {position}: {e}")))?;
    match value {
        serde_json::Value::Null => Ok(Param::Null),
        serde_json::Value::Bool(b) => Ok(Param::Integer(i64::from(b))),
        serde_json::Value::String(s) => Ok(Param::Text(s)),
        serde_json::Value::Number(n) => {
            if let Some(i) = n.as_i64() {
                return Ok(Param::Integer(i));
            }
            // An integer literal outside i64 (serde_json reads those beyond u64 as floats),
            // or `-0`, which serde_json reads as the float -0.0.
            let literal = raw.get();
            let is_integer_literal = !literal.contains(['.', 'e', 'E']);
            if is_integer_literal && n.as_f64() == Some(0.0) {
                return Ok(Param::Integer(0));
            }
            if n.is_u64() || is_integer_literal {
                return Err(ApiError::bad_request(format!(
                    "parameter {position}: integer {literal} is outside the signed 64-bit range"
                )));
            }
            match n.as_f64() {
                Some(f) if f.is_finite() => Ok(Param::Real(f)),
                _ => Err(ApiError::bad_request(format!(
                    "parameter {position}: number {literal} is not a finite double"
                ))),
            }
        }
        serde_json::Value::Object(object) => parse_blob(position, &object),
        serde_json::Value::Array(_) => Err(ApiError::bad_request(format!(
            "parameter {position}: arrays are not accepted; use null, a boolean, a number, a string \
             or a blob ({{\"base64\": \"...\"}})"
        ))),
    }
}

/// A blob parameter: an object whose only member is `base64`, a string in standard base64
/// (padded).
fn parse_blob(
    position: usize,
    object: &serde_json::Map<String, serde_json::Value>,
) -> Result<Param, ApiError> {
    use base64::Engine as _;
    let refused = |why: &str| {
        ApiError::bad_request(format!(
            "parameter {position}: an object parameter is a blob, {{\"base64\": \"...\"}}; {why}"
        ))
    };
    let encoded = match object.get(sqlhttp_protocol::body::member::BASE64) {
        Some(serde_json::Value::String(encoded)) if object.len() == 1 => encoded,
        Some(_) if object.len() == 1 => return Err(refused("`base64` must be a string")),
        _ => return Err(refused("it must have the one member `base64`")),
    };
    base64::engine::general_purpose::STANDARD
        .decode(encoded)
        .map(Param::Blob)
        .map_err(|e| refused(&format!("`base64` is not standard padded base64: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::error::ErrorCode;

    fn bad(body: &str) -> String {
        let err = SqlRequest::parse(body.as_bytes()).unwrap_err();
        assert_eq!(err.code, ErrorCode::BadRequest, "{body}");
        err.message
    }

    #[test]
    fn an_integer_is_one_however_it_is_spelled_and_exactly() {
        for (literal, value) in [
            ("3", 3),
            ("3.0", 3),
            ("30e-1", 3),
            ("0.3E+1", 3),
            ("1e2", 100),
            ("-0", 0),
            ("0.000e5", 0),
            // Through a float (`as_f64`) this is 4465287181458841.5 or so, never an integer.
            ("4465287181458842.0", 4_465_287_181_458_842),
            ("9007199254740991.000", 9_007_199_254_740_991),
            ("18446744073709551615", u64::MAX),
            ("1844674407370955161.5e1", u64::MAX),
        ] {
            assert_eq!(exact_unsigned(literal), Some(value), "{literal}");
        }
        for literal in [
            "1.5",
            "-1",
            "-1.0",
            "0.1",
            "18446744073709551616",
            "1e20",
            "1e99999999999999999999",
            "\"3\"",
            "null",
            "true",
            "",
        ] {
            assert_eq!(exact_unsigned(literal), None, "{literal}");
        }
    }

    #[test]
    fn decodes_sql_and_params() {
        let request = SqlRequest::parse(
            br#"{"sql":"SELECT ?","params":[null,true,false,-7,9223372036854775807,1.5,"x",2e3]}"#,
        )
        .unwrap();
        assert_eq!(request.sql, "SELECT ?");
        assert_eq!(
            request.params,
            vec![
                Param::Null,
                Param::Integer(1),
                Param::Integer(0),
                Param::Integer(-7),
                Param::Integer(i64::MAX),
                Param::Real(1.5),
                Param::Text("x".into()),
                Param::Real(2000.0),
            ]
        );
    }

    #[test]
    fn blobs_are_base64_objects() {
        let request = SqlRequest::parse(
            br#"{"sql":"SELECT ?, ?","params":[{"base64":"AP8Q"},{"base64":""}]}"#,
        )
        .unwrap();
        assert_eq!(
            request.params,
            vec![Param::Blob(vec![0, 255, 16]), Param::Blob(vec![])]
        );
    }

    #[test]
    fn negative_zero_is_the_integer_zero() {
        let request = SqlRequest::parse(br#"{"sql":"SELECT ?, ?","params":[-0, -0.0]}"#).unwrap();
        assert_eq!(request.params, vec![Param::Integer(0), Param::Real(-0.0)]);
    }

    #[test]
    fn params_are_optional() {
        for body in [
            r#"{"sql":"SELECT 1"}"#,
            r#"{"sql":"SELECT 1","params":null}"#,
        ] {
            assert!(
                SqlRequest::parse(body.as_bytes())
                    .unwrap()
                    .params
                    .is_empty()
            );
        }
    }

    #[test]
    fn rejects_malformed_bodies() {
        bad("not json");
        bad("");
        bad("[1,2]");
        assert!(bad(r#"{"params":[]}"#).contains("missing"));
        assert!(bad(r#"{"sql":42}"#).contains("must be a string"));
        assert!(bad(r#"{"sql":null}"#).contains("must be a string"));
        bad(r#"{"sql":"SELECT 1","params":{"a":1}}"#);
        assert!(bad(r#" ["SELECT 1", []]"#).contains("JSON object"));
        bad(r#"["SELECT 1"]"#);
    }

    #[test]
    fn rejects_unsupported_params() {
        assert!(bad(r#"{"sql":"SELECT ?","params":[[1]]}"#).contains("parameter 1"));
        assert!(bad(r#"{"sql":"SELECT ?","params":[1,{"a":1}]}"#).contains("parameter 2"));
        assert!(bad(r#"{"sql":"SELECT ?","params":[{"base64":"AP8"}]}"#).contains("base64"));
        assert!(bad(r#"{"sql":"SELECT ?","params":[{"base64":7}]}"#).contains("string"));
        bad(r#"{"sql":"SELECT ?","params":[{"base64":"","x":1}]}"#);
        bad(r#"{"sql":"SELECT ?","params":[9223372036854775808]}"#);
        bad(r#"{"sql":"SELECT ?","params":[-9223372036854775809]}"#);
        bad(r#"{"sql":"SELECT ?","params":[100000000000000000000000]}"#);
    }

    proptest::proptest! {
        /// The decoder answers every body, however malformed, deep or large, without panicking.
        #[test]
        fn any_body_decodes_or_is_refused(body in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..512)) {
            let _ = SqlRequest::parse(&body);
        }

        #[test]
        fn deep_json_is_refused(depth in 1usize..100_000) {
            let body = format!(
                "{{\"sql\":\"SELECT ?\",\"params\":[{}1{}]}}",
                "[".repeat(depth),
                "]".repeat(depth)
            );
            proptest::prop_assert!(SqlRequest::parse(body.as_bytes()).is_err());
        }
    }
}
