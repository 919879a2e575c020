//! The statement takes one parameter; two are given.

fn main() {
    let _ = sqlhttp::query!("SELECT id, title, year FROM books WHERE id = ?", 1, 2);
}
