//! The column `title` is TEXT; the field is an integer.

#[allow(dead_code)]
struct Book {
    id: i64,
    title: i64,
}

fn main() {
    let _ = sqlhttp::query_as!(Book, "SELECT id, title FROM books");
}
