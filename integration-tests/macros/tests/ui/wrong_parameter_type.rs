//! PostgreSQL inferred `int8` for the first parameter; a string is given.

fn main() {
    let _ = sqlhttp::query!("SELECT title FROM books WHERE id = ? AND year > ?", "seven", 1999);
}
