//! How many rows a success body holds, for the request log: counted from the body the engine
//! wrote (`{"columns": [...], "rows": [[...], ...], ...}`) without building its values, and put
//! in the response's extensions as [`Rows`].
//!
//! Knows the success body's shape only. A body that is not held whole (a streamed one) is not
//! counted: the log line then has no `rows`.

use serde::Deserialize;
use serde::de::{IgnoredAny, SeqAccess, Visitor};

/// The number of rows of a success response.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Rows(pub(crate) u64);

/// Counts the `rows` of a success body; `None` when it is not one.
pub(crate) fn count(body: &[u8]) -> Option<u64> {
    #[derive(Deserialize)]
    struct Body {
        rows: Count,
    }
    serde_json::from_slice::<Body>(body)
        .ok()
        .map(|body| body.rows.0)
}

/// The length of a JSON array, its elements skipped.
struct Count(u64);

impl<'de> Deserialize<'de> for Count {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Count, D::Error> {
        struct Counter;
        impl<'de> Visitor<'de> for Counter {
            type Value = Count;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("an array of rows")
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Count, A::Error> {
                let mut n = 0;
                while seq.next_element::<IgnoredAny>()?.is_some() {
                    n += 1;
                }
                Ok(Count(n))
            }
        }
        deserializer.deserialize_seq(Counter)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_are_counted() {
        let body = br#"{"columns":[{"name":"a","type":""}],"rows":[[1],["x,]"],[[1,2]]],"rows_affected":0,"last_insert_id":null}"#;
        assert_eq!(count(body), Some(3));
        assert_eq!(
            count(br#"{"columns":[],"rows":[],"rows_affected":2,"last_insert_id":7}"#),
            Some(0)
        );
        assert_eq!(count(br#"{"error":{"code":"X","message":"m"}}"#), None);
        assert_eq!(count(b"not json"), None);
    }
}
