//! The struct names a field the statement has no column for, and lacks one it has.

#[allow(dead_code)]
struct Book {
    id: i64,
    name: String,
}

fn main() {
    let _ = sqlhttp::query_as!(Book, "SELECT id, title FROM books");
}
