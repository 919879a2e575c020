-- Migration 1: the books table.
-- Statements end with `;`. The file is applied as one transaction, together with
-- its record in the history table: all of it, or nothing.
CREATE TABLE books (
    id INTEGER PRIMARY KEY,
    title TEXT NOT NULL,
    year INTEGER
);
CREATE INDEX books_year ON books (year);
