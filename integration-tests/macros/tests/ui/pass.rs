//! Every macro, checked against the cache, with overrides: compiles (nothing is sent).

#[derive(Debug)]
#[allow(dead_code)]
struct Book {
    id: i64,
    title: String,
}

fn main() {
    let id = 7_i64;
    let _row = sqlhttp::query!("SELECT id, title, year FROM books WHERE id = ?", id);
    let _books = sqlhttp::query_as!(Book, "SELECT id, title FROM books");
    let _count = sqlhttp::query_scalar!(r#"SELECT count(*) AS "n!: i64" FROM books"#);
    let _gone = sqlhttp::execute!("DELETE FROM books WHERE id = ?", id);
    let _typed = sqlhttp::query!("SELECT title FROM books WHERE id = ? AND year > ?", id, 1999);
}
