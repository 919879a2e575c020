-- Reverts migration 2 (`sqlhttp migrate revert`), as one transaction.
DROP INDEX books_isbn;
ALTER TABLE books DROP COLUMN isbn;
