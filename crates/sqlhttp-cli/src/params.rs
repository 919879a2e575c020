//! Turning `-p VALUE` arguments into bound parameters: a JSON literal when the text is one
//! (`42`, `-1.5`, `true`, `null`, `"42"`), else the text itself.
//!
//! Pure conversion; knows nothing about statements or servers.

use serde_json::Value;

/// The parameter a `-p` argument stands for.
pub(crate) fn parse(text: &str) -> Value {
    match serde_json::from_str::<Value>(text) {
        Ok(value @ (Value::Null | Value::Bool(_) | Value::Number(_) | Value::String(_))) => value,
        _ => Value::String(text.to_owned()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn literals_and_text() {
        assert_eq!(parse("42"), json!(42));
        assert_eq!(parse("-7"), json!(-7));
        assert_eq!(parse("1.5"), json!(1.5));
        assert_eq!(parse("true"), json!(true));
        assert_eq!(parse("null"), Value::Null);
        assert_eq!(parse("\"42\""), json!("42"));
        assert_eq!(parse("hello world"), json!("hello world"));
        assert_eq!(
            parse("[1]"),
            json!("[1]"),
            "arrays are not parameters: sent as text"
        );
        assert_eq!(parse("caf\u{e9}"), json!("caf\u{e9}"));
        assert_eq!(parse(""), json!(""));
    }
}
