//! From a description's type names to Rust types: each column's type as the SDK decodes its
//! cells (ADR 0050), each parameter's marker for the compile-time check, and the override syntax
//! a column's name may carry (`AS "n: i64"`, `AS "n!"`, `AS "n?"`, as sqlx spells them).
//!
//! Knows the two engines' type names and the SDK's types; nothing about files.

use proc_macro2::TokenStream;
use quote::quote;

/// A column's name with what its override says.
pub(crate) struct Named {
    /// The name the field takes.
    pub(crate) field: String,
    /// `Some(true)` for `"n!"` (never NULL), `Some(false)` for `"n?"` (may be NULL).
    pub(crate) non_null: Option<bool>,
    /// The Rust type `"n: T"` names.
    pub(crate) rust: Option<String>,
}

/// Reads the overrides off a column's name.
pub(crate) fn named(column: &str) -> Named {
    let (head, rust) = match column.split_once(':') {
        Some((head, ty)) => (head.trim_end(), Some(ty.trim().to_owned())),
        None => (column, None),
    };
    let (field, non_null) = if let Some(field) = head.strip_suffix('!') {
        (field, Some(true))
    } else if let Some(field) = head.strip_suffix('?') {
        (field, Some(false))
    } else {
        (head, None)
    };
    Named {
        field: field.to_owned(),
        non_null,
        rust,
    }
}

/// The Rust type a cell of `type_name` decodes to on `engine`; `None` when the macro cannot
/// know (a SQLite expression, a declared type without a clear affinity, a PostgreSQL type the
/// SDK has no Rust type for), which is read as `sqlhttp::Value`.
pub(crate) fn column_type(engine: &str, type_name: Option<&str>) -> Option<TokenStream> {
    let name = type_name?.to_ascii_lowercase();
    if engine == "postgresql" {
        return Some(match name.as_str() {
            "bool" => quote!(bool),
            "int2" => quote!(i16),
            "int4" => quote!(i32),
            "int8" => quote!(i64),
            "oid" => quote!(u32),
            "float4" => quote!(f32),
            "float8" => quote!(f64),
            "text" | "varchar" | "bpchar" | "name" | "char" | "numeric" | "date" | "time"
            | "timetz" | "timestamp" | "timestamptz" | "interval" | "uuid" | "inet" | "cidr" => {
                quote!(::std::string::String)
            }
            "json" | "jsonb" => quote!(::sqlhttp::macros::serde_json::Value),
            "bytea" => quote!(::sqlhttp::Blob),
            _ => return None,
        });
    }
    // SQLite's affinity rules (https://sqlite.org/datatype3.html, 3.1), in their order.
    Some(if name.contains("int") {
        quote!(i64)
    } else if name.contains("char") || name.contains("clob") || name.contains("text") {
        quote!(::std::string::String)
    } else if name.contains("blob") {
        quote!(::sqlhttp::Blob)
    } else if name.contains("real") || name.contains("floa") || name.contains("doub") {
        quote!(f64)
    } else if name.contains("bool") {
        // Stored as 0 or 1; the SDK reads those as a bool (ADR 0050).
        quote!(bool)
    } else {
        return None;
    })
}

/// The marker of a PostgreSQL parameter type the check knows (`sqlhttp::macros::pg`).
pub(crate) fn param_marker(engine: &str, type_name: Option<&str>) -> Option<TokenStream> {
    if engine != "postgresql" {
        return None;
    }
    let name = type_name?;
    const KNOWN: &[&str] = &[
        "bool",
        "int2",
        "int4",
        "int8",
        "oid",
        "float4",
        "float8",
        "numeric",
        "text",
        "varchar",
        "bpchar",
        "name",
        "bytea",
        "json",
        "jsonb",
        "date",
        "time",
        "timetz",
        "timestamp",
        "timestamptz",
        "interval",
        "uuid",
        "inet",
        "cidr",
    ];
    KNOWN.contains(&name).then(|| {
        let ident = proc_macro2::Ident::new(name, proc_macro2::Span::call_site());
        quote!(::sqlhttp::macros::pg::#ident)
    })
}
