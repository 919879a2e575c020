//! Writing rows in the output formats: an aligned table (buffered: it needs every width),
//! CSV, a JSON array of objects and NDJSON (all three streamed row by row).
//!
//! Knows the formats and how a cell is rendered in each; nothing about where rows come from.

use std::io::{self, Write};
use std::time::Duration;

use comfy_table::{Cell, ContentArrangement, Table, presets};
use sqlhttp::Value;

use crate::args::Format;

/// Writes a result set: the column names once, then each row, then a closing summary.
pub(crate) trait RowWriter {
    fn start(&mut self, columns: &[String]) -> io::Result<()>;
    fn row(&mut self, row: &[Value]) -> io::Result<()>;
    fn finish(&mut self, rows: u64, elapsed: Duration) -> io::Result<()>;
}

/// The writer for `format` over `out`.
pub(crate) fn writer<'a, W: Write + 'a>(format: Format, out: W) -> Box<dyn RowWriter + 'a> {
    match format {
        Format::Table => Box::new(TableWriter {
            out,
            table: Table::new(),
        }),
        Format::Csv => Box::new(CsvWriter {
            out,
            line_end: b"\n",
        }),
        Format::CsvCrlf => Box::new(CsvWriter {
            out,
            line_end: b"\r\n",
        }),
        Format::Json => Box::new(JsonWriter {
            out,
            columns: Vec::new(),
            rows: 0,
        }),
        Format::Ndjson => Box::new(NdjsonWriter {
            out,
            columns: Vec::new(),
        }),
    }
}

/// A number or a blob as text: integers exactly, reals as JSON writes them (`1.0`), blobs in
/// base64; `None` for NULL, text as it is.
fn text_of(value: &Value) -> Option<String> {
    match value {
        Value::Null => None,
        Value::Text(s) => Some(s.clone()),
        Value::Integer(i) => Some(i.to_string()),
        Value::Blob(bytes) => Some(base64_of(bytes)),
        other => Some(serde_json::to_string(other).unwrap_or_default()),
    }
}

/// Standard base64 with padding, as the protocol writes blobs.
fn base64_of(bytes: &[u8]) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

/// A cell as text in a table: NULL as `NULL`.
fn display(value: &Value) -> String {
    text_of(value).unwrap_or_else(|| "NULL".to_owned())
}

struct TableWriter<W> {
    out: W,
    table: Table,
}

impl<W: Write> RowWriter for TableWriter<W> {
    fn start(&mut self, columns: &[String]) -> io::Result<()> {
        self.table
            .load_style(presets::ASCII_FULL_CONDENSED)
            .set_content_arrangement(ContentArrangement::Disabled)
            .set_header(columns.iter().map(Cell::new));
        Ok(())
    }

    fn row(&mut self, row: &[Value]) -> io::Result<()> {
        self.table
            .add_row(row.iter().map(|v| Cell::new(display(v))));
        Ok(())
    }

    fn finish(&mut self, rows: u64, elapsed: Duration) -> io::Result<()> {
        if self.table.header().is_some_and(|h| h.cell_count() > 0) {
            writeln!(self.out, "{}", self.table)?;
        }
        writeln!(
            self.out,
            "({rows} row{}, {})",
            if rows == 1 { "" } else { "s" },
            format_elapsed(elapsed)
        )?;
        self.out.flush()
    }
}

/// `12.3 ms` or `4.56 s`.
pub(crate) fn format_elapsed(elapsed: Duration) -> String {
    let millis = elapsed.as_secs_f64() * 1000.0;
    if millis < 1000.0 {
        format!("{millis:.1} ms")
    } else {
        format!("{:.2} s", millis / 1000.0)
    }
}

/// Writes one CSV field: quoted when it holds a delimiter, a quote, a line break or surrounding
/// space, or when it is an empty string (so it differs from NULL, an empty unquoted field).
pub(crate) fn write_csv_field(out: &mut impl Write, field: Option<&str>) -> io::Result<()> {
    let Some(text) = field else {
        return Ok(());
    };
    let needs_quotes = text.is_empty()
        || text.contains([',', '"', '\n', '\r'])
        || text.starts_with(' ')
        || text.ends_with(' ');
    if !needs_quotes {
        return out.write_all(text.as_bytes());
    }
    out.write_all(b"\"")?;
    out.write_all(text.replace('"', "\"\"").as_bytes())?;
    out.write_all(b"\"")
}

fn csv_text(value: &Value) -> Option<String> {
    text_of(value)
}

struct CsvWriter<W> {
    out: W,
    /// LF by default (what `tail`, `read` and `$(...)` expect); CRLF for RFC 4180 readers.
    line_end: &'static [u8],
}

impl<W: Write> CsvWriter<W> {
    fn line(&mut self, fields: impl Iterator<Item = Option<String>>) -> io::Result<()> {
        for (index, field) in fields.enumerate() {
            if index > 0 {
                self.out.write_all(b",")?;
            }
            write_csv_field(&mut self.out, field.as_deref())?;
        }
        self.out.write_all(self.line_end)
    }
}

impl<W: Write> RowWriter for CsvWriter<W> {
    fn start(&mut self, columns: &[String]) -> io::Result<()> {
        self.line(columns.iter().map(|c| Some(c.clone())))
    }

    fn row(&mut self, row: &[Value]) -> io::Result<()> {
        self.line(row.iter().map(csv_text))
    }

    fn finish(&mut self, _rows: u64, _elapsed: Duration) -> io::Result<()> {
        self.out.flush()
    }
}

/// Writes `{"a":1,"b":"x"}` in column order.
fn write_object(out: &mut impl Write, columns: &[String], row: &[Value]) -> io::Result<()> {
    out.write_all(b"{")?;
    for (index, (name, value)) in columns.iter().zip(row).enumerate() {
        if index > 0 {
            out.write_all(b",")?;
        }
        serde_json::to_writer(&mut *out, name)?;
        out.write_all(b":")?;
        serde_json::to_writer(&mut *out, value)?;
    }
    out.write_all(b"}")
}

struct JsonWriter<W> {
    out: W,
    columns: Vec<String>,
    rows: u64,
}

impl<W: Write> RowWriter for JsonWriter<W> {
    fn start(&mut self, columns: &[String]) -> io::Result<()> {
        self.columns = columns.to_vec();
        self.out.write_all(b"[")
    }

    fn row(&mut self, row: &[Value]) -> io::Result<()> {
        self.out
            .write_all(if self.rows == 0 { b"\n" } else { b",\n" })?;
        self.rows += 1;
        write_object(&mut self.out, &self.columns, row)
    }

    fn finish(&mut self, _rows: u64, _elapsed: Duration) -> io::Result<()> {
        self.out.write_all(b"\n]\n")?;
        self.out.flush()
    }
}

struct NdjsonWriter<W> {
    out: W,
    columns: Vec<String>,
}

impl<W: Write> RowWriter for NdjsonWriter<W> {
    fn start(&mut self, columns: &[String]) -> io::Result<()> {
        self.columns = columns.to_vec();
        Ok(())
    }

    fn row(&mut self, row: &[Value]) -> io::Result<()> {
        write_object(&mut self.out, &self.columns, row)?;
        self.out.write_all(b"\n")
    }

    fn finish(&mut self, _rows: u64, _elapsed: Duration) -> io::Result<()> {
        self.out.flush()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn text(s: &str) -> Value {
        Value::Text(s.to_owned())
    }

    fn render(format: Format) -> String {
        let mut out = Vec::new();
        {
            let mut writer = writer(format, &mut out);
            writer.start(&["id".into(), "name".into()]).unwrap();
            writer
                .row(&[Value::Integer(1), text("a, \"b\"\nc")])
                .unwrap();
            writer.row(&[Value::Integer(2), Value::Null]).unwrap();
            writer.row(&[Value::Integer(3), text("")]).unwrap();
            writer.finish(3, Duration::from_millis(5)).unwrap();
        }
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn csv_quotes_what_it_must_and_tells_null_from_empty() {
        assert_eq!(
            render(Format::Csv),
            "id,name\n1,\"a, \"\"b\"\"\nc\"\n2,\n3,\"\"\n"
        );
        assert_eq!(
            render(Format::CsvCrlf),
            "id,name\r\n1,\"a, \"\"b\"\"\nc\"\r\n2,\r\n3,\"\"\r\n"
        );
    }

    #[test]
    fn json_and_ndjson_keep_column_order() {
        let json: serde_json::Value = serde_json::from_str(&render(Format::Json)).unwrap();
        assert_eq!(
            json,
            json!([{"id": 1, "name": "a, \"b\"\nc"}, {"id": 2, "name": null}, {"id": 3, "name": ""}])
        );
        let ndjson = render(Format::Ndjson);
        assert_eq!(ndjson.lines().count(), 3);
        assert!(ndjson.starts_with("{\"id\":1,\"name\":"));
    }

    #[test]
    fn blobs_and_reals() {
        assert_eq!(base64_of(b""), "");
        assert_eq!(base64_of(b"f"), "Zg==");
        assert_eq!(base64_of(b"fo"), "Zm8=");
        assert_eq!(base64_of(b"foo"), "Zm9v");
        assert_eq!(base64_of(&[0xff, 0xfe, 0x00, 0x10]), "//4AEA==");
        assert_eq!(text_of(&Value::Real(1.0)).as_deref(), Some("1.0"));
        assert_eq!(
            text_of(&Value::Blob(b"hi".to_vec())).as_deref(),
            Some("aGk=")
        );
    }

    #[test]
    fn table_aligns_and_counts() {
        let table = render(Format::Table);
        assert!(table.contains("NULL"), "{table}");
        assert!(table.ends_with("(3 rows, 5.0 ms)\n"), "{table}");
    }
}
