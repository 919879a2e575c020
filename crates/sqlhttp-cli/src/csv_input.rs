//! Reading CSV records with csv-core, keeping the one distinction the csv crate's readers drop:
//! an empty unquoted field (NULL) versus a quoted empty one (`""`, the empty string).
//!
//! Pure parsing over a `BufRead`; knows nothing about tables or servers.

use std::io::{self, BufRead};

use csv_core::{ReadFieldResult, Reader};

/// One field: `None` for an empty unquoted field.
pub(crate) type Field = Option<String>;

/// The records of a CSV input, one at a time.
pub(crate) struct CsvRecords<R> {
    input: R,
    parser: Reader,
    field: Vec<u8>,
    done: bool,
}

impl<R: BufRead> CsvRecords<R> {
    pub(crate) fn new(input: R) -> CsvRecords<R> {
        CsvRecords {
            input,
            parser: Reader::new(),
            field: vec![0; 1024],
            done: false,
        }
    }

    /// The next record, or `None` at the end of the input.
    pub(crate) fn next_record(&mut self) -> io::Result<Option<Vec<Field>>> {
        if self.done {
            return Ok(None);
        }
        let mut record = Vec::new();
        loop {
            // One field.
            let mut written = 0;
            let mut quoted = None;
            loop {
                let buffer = self.input.fill_buf()?;
                if quoted.is_none() {
                    quoted = Some(buffer.first() == Some(&b'"'));
                }
                let (result, read, wrote) =
                    self.parser.read_field(buffer, &mut self.field[written..]);
                self.input.consume(read);
                written += wrote;
                match result {
                    ReadFieldResult::InputEmpty => {}
                    ReadFieldResult::OutputFull => {
                        let grown = self.field.len() * 2;
                        self.field.resize(grown, 0);
                    }
                    ReadFieldResult::Field { record_end } => {
                        let text =
                            String::from_utf8(self.field[..written].to_vec()).map_err(|_| {
                                io::Error::new(io::ErrorKind::InvalidData, "the CSV is not UTF-8")
                            })?;
                        let is_null = written == 0 && quoted != Some(true);
                        record.push((!is_null).then_some(text));
                        if record_end {
                            return Ok(Some(record));
                        }
                        break;
                    }
                    ReadFieldResult::End => {
                        self.done = true;
                        return Ok((!record.is_empty()).then_some(record));
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn records(text: &str) -> Vec<Vec<Field>> {
        let mut reader = CsvRecords::new(io::BufReader::with_capacity(3, text.as_bytes()));
        let mut all = Vec::new();
        while let Some(record) = reader.next_record().unwrap() {
            all.push(record);
        }
        all
    }

    fn s(text: &str) -> Field {
        Some(text.to_owned())
    }

    #[test]
    fn quoting_newlines_and_null() {
        let parsed = records("id,name\r\n1,\"a, \"\"b\"\"\nc\"\r\n2,\r\n3,\"\"\n4,caf\u{e9}");
        assert_eq!(
            parsed,
            vec![
                vec![s("id"), s("name")],
                vec![s("1"), s("a, \"b\"\nc")],
                vec![s("2"), None],
                vec![s("3"), s("")],
                vec![s("4"), s("caf\u{e9}")],
            ]
        );
    }

    #[test]
    fn long_fields_grow_the_buffer() {
        let long = "x".repeat(10_000);
        assert_eq!(
            records(&format!("a\n{long}\n")),
            vec![vec![s("a")], vec![s(&long)]]
        );
    }
}
