-- Migration 2: books get an ISBN, unique where known.
ALTER TABLE books ADD COLUMN isbn TEXT;
CREATE UNIQUE INDEX books_isbn ON books (isbn);
