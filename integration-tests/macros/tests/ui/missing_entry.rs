//! A statement never prepared: no entry in the cache.

fn main() {
    let _ = sqlhttp::query!("SELECT title FROM books WHERE title LIKE ?", "D%");
}
