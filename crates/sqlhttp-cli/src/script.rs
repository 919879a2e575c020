//! SQL text as the shell sees it: splitting a script into complete statements (each ended by
//! `;` outside quotes, comments and trigger bodies). Whether a statement writes is the server's
//! to say (see `run`), never guessed from the text here.
//!
//! Pure text handling; knows nothing about servers.

/// Splits `text` into the complete statements it holds (without their `;`) and the incomplete
/// rest.
pub(crate) fn split(text: &str) -> (Vec<String>, String) {
    let bytes = text.as_bytes();
    let mut statements = Vec::new();
    let mut start = 0;
    let mut i = 0;
    // Inside CREATE TRIGGER ... BEGIN ... END, `;` ends the body's statements, not this one.
    let mut trigger_depth = 0_usize;
    let mut word_start: Option<usize> = None;
    while i < bytes.len() {
        let b = bytes[i];
        let is_word = b.is_ascii_alphanumeric() || b == b'_';
        if is_word && word_start.is_none() {
            word_start = Some(i);
        }
        if !is_word && let Some(ws) = word_start.take() {
            let word = &text[ws..i];
            if word.eq_ignore_ascii_case("BEGIN") && is_create_trigger(&text[start..ws]) {
                trigger_depth += 1;
            } else if word.eq_ignore_ascii_case("END") && trigger_depth > 0 {
                trigger_depth -= 1;
            }
        }
        match b {
            b'\'' | b'"' | b'`' => i = skip_quoted(bytes, i, b),
            b'[' => i = skip_quoted(bytes, i, b']'),
            b'-' if bytes.get(i + 1) == Some(&b'-') => {
                i = text[i..].find('\n').map_or(bytes.len(), |end| i + end + 1);
            }
            b'/' if bytes.get(i + 1) == Some(&b'*') => {
                i = text[i + 2..]
                    .find("*/")
                    .map_or(bytes.len(), |end| i + 2 + end + 2);
            }
            b';' if trigger_depth == 0 => {
                let statement = text[start..i].trim();
                if !statement.is_empty() {
                    statements.push(statement.to_owned());
                }
                start = i + 1;
                i += 1;
            }
            _ => i += 1,
        }
    }
    (statements, text[start..].to_owned())
}

/// The index after the closing `close` of a quoted run starting at `open` (doubled closers are
/// escapes), or the end of the text.
fn skip_quoted(bytes: &[u8], open: usize, close: u8) -> usize {
    let mut i = open + 1;
    while i < bytes.len() {
        if bytes[i] == close {
            if close != b']' && bytes.get(i + 1) == Some(&close) {
                i += 2;
                continue;
            }
            return i + 1;
        }
        i += 1;
    }
    bytes.len()
}

fn is_create_trigger(prefix: &str) -> bool {
    let words: Vec<String> = prefix
        .split_whitespace()
        .take(4)
        .map(str::to_ascii_uppercase)
        .collect();
    words.first().is_some_and(|w| w == "CREATE") && words.iter().any(|w| w == "TRIGGER")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splits_on_semicolons_outside_quotes_and_comments() {
        let (statements, rest) = split(
            "SELECT 'a;b'; -- c;\nINSERT INTO \"t;\" VALUES (1) /* ; */;\n;  SELECT [x;y] FROM t; SELECT",
        );
        assert_eq!(
            statements,
            [
                "SELECT 'a;b'",
                "-- c;\nINSERT INTO \"t;\" VALUES (1) /* ; */",
                "SELECT [x;y] FROM t"
            ]
        );
        assert_eq!(rest.trim(), "SELECT");
    }

    #[test]
    fn escaped_quotes_and_unterminated_text() {
        assert_eq!(split("SELECT 'it''s;'; x").0, ["SELECT 'it''s;'"]);
        let (statements, rest) = split("SELECT 'open;");
        assert!(statements.is_empty());
        assert_eq!(rest, "SELECT 'open;");
    }

    #[test]
    fn trigger_bodies_stay_whole() {
        let script = "CREATE TRIGGER tr AFTER INSERT ON t BEGIN UPDATE c SET n = n + 1; DELETE FROM d; END; SELECT 1;";
        let (statements, rest) = split(script);
        assert_eq!(statements.len(), 2, "{statements:?}");
        assert!(statements[0].ends_with("END"));
        assert_eq!(statements[1], "SELECT 1");
        assert!(rest.is_empty());
    }
}
