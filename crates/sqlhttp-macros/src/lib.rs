//! Checked queries for the [sqlhttp](https://docs.rs/sqlhttp) SDK: `query!`, `query_as!`,
//! `query_scalar!` and `execute!` check a statement at compile time against its description
//! (`POST /api/v1/describe/statement`) and expand to the SDK's own builders. Use them through
//! `sqlhttp` with its `macros` feature (`sqlhttp::query!`), which this crate's expansions name.
//!
//! At compile time each macro reads the statement's cached description from `.sqlhttp/` beside
//! the application's `Cargo.toml` (`SQLHTTP_OFFLINE_DIR` to put it elsewhere), which
//! `sqlhttp prepare` fills from a live server and `sqlhttp prepare --check` verifies, and checks
//! the number of arguments, each argument's type where the engine inferred the parameter's
//! (PostgreSQL), and each column's name and type: `query!` generates a struct of them,
//! `query_as!` fills yours field by field, `query_scalar!` reads one column. Nullability and
//! types the description cannot give are set in the SQL with sqlx's overrides:
//! `AS "n: i64"`, `AS "n!"` (never NULL), `AS "n?"` (may be NULL). See ADR 0055.
//!
//! Knows Rust syntax, the cache and the SDK's expansion targets; never the network: a build
//! needs no server, and the same cache gives the same build.

#![forbid(unsafe_code)]

mod cache;
mod types;

use proc_macro::TokenStream;
use proc_macro2::{Span, TokenStream as Tokens};
use quote::{format_ident, quote, quote_spanned};
use syn::parse::ParseStream;
use syn::punctuated::Punctuated;
use syn::{Expr, LitStr, Path, Token};

/// A read whose rows are a struct the macro generates, one field per column, each of the
/// column's type (`Option<_>` unless the column is known never NULL):
/// `query!("SELECT id, title FROM books WHERE id = ?", id).fetch_one(&client).await?`.
#[proc_macro]
pub fn query(input: TokenStream) -> TokenStream {
    expand(input, Kind::Query)
}

/// A read whose rows fill your struct field by field (a field per column, of the column's
/// type): `query_as!(Book, "SELECT id, title FROM books", ).fetch_all(&client).await?`.
#[proc_macro]
pub fn query_as(input: TokenStream) -> TokenStream {
    expand(input, Kind::QueryAs)
}

/// A read of one column, each row its value:
/// `query_scalar!("SELECT count(*) AS \"n: i64\" FROM books").fetch_one(&client).await?`.
#[proc_macro]
pub fn query_scalar(input: TokenStream) -> TokenStream {
    expand(input, Kind::Scalar)
}

/// A statement run for its effect: `execute!("DELETE FROM books WHERE id = ?", id).on(&client).await?`.
#[proc_macro]
pub fn execute(input: TokenStream) -> TokenStream {
    expand(input, Kind::Execute)
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    Query,
    QueryAs,
    Scalar,
    Execute,
}

/// A macro's input: `[Type,] "SQL" [, argument]*`.
struct Input {
    target: Option<Path>,
    sql: LitStr,
    args: Vec<Expr>,
}

fn parse(input: ParseStream<'_>, with_target: bool) -> syn::Result<Input> {
    let target = if with_target {
        let path: Path = input.parse()?;
        input.parse::<Token![,]>()?;
        Some(path)
    } else {
        None
    };
    let sql: LitStr = input.parse()?;
    let mut args = Vec::new();
    if !input.is_empty() {
        input.parse::<Token![,]>()?;
        let rest = Punctuated::<Expr, Token![,]>::parse_terminated(input)?;
        args.extend(rest);
    }
    Ok(Input { target, sql, args })
}

fn expand(input: TokenStream, kind: Kind) -> TokenStream {
    let parsed = syn::parse::Parser::parse(
        |stream: ParseStream<'_>| parse(stream, kind == Kind::QueryAs),
        input,
    );
    match parsed.and_then(|input| generate(&input, kind)) {
        Ok(tokens) => tokens.into(),
        Err(err) => err.to_compile_error().into(),
    }
}

/// One result column, as the expansion uses it.
struct Field {
    /// The column's name on the wire.
    wire: String,
    ident: syn::Ident,
    rust: Tokens,
    /// The type named in the error messages: the column's own.
    sql_type: String,
}

fn generate(input: &Input, kind: Kind) -> syn::Result<Tokens> {
    let sql_text = input.sql.value();
    let span = input.sql.span();
    let (entry, path) = cache::lookup(&sql_text).map_err(|e| syn::Error::new(span, e))?;
    let described = &entry.describe;
    let engine = entry.engine.as_str();
    // The parameters.
    let wanted = described.params.len();
    if input.args.len() != wanted {
        return Err(syn::Error::new(
            span,
            format!(
                "wrong number of arguments: the statement takes {wanted} parameter{}, {} given",
                if wanted == 1 { "" } else { "s" },
                input.args.len()
            ),
        ));
    }
    let names: Vec<syn::Ident> = (0..wanted)
        .map(|i| format_ident!("__sqlhttp_arg{i}"))
        .collect();
    let args = &input.args;
    let checks =
        described
            .params
            .iter()
            .zip(&names)
            .zip(args)
            .filter_map(|((param, name), arg)| {
                let marker = types::param_marker(engine, param.type_name.as_deref())?;
                let at = syn::spanned::Spanned::span(arg);
                Some(quote_spanned!(at=> ::sqlhttp::macros::param::<#marker, _>(&#name);))
            });
    let checks: Vec<Tokens> = checks.collect();
    let tracked = path.to_string_lossy().into_owned();
    let track = quote!(
        const _: &[u8] = ::core::include_bytes!(#tracked);
    );

    if kind == Kind::Execute {
        return Ok(quote! {{
            #track
            match (#(#args,)*) {
                (#(#names,)*) => {
                    #(#checks)*
                    ::sqlhttp::macros::CheckedExecute::new(
                        #sql_text,
                        move |statement: ::sqlhttp::Execute| statement #(.bind(#names))*,
                    )
                }
            }
        }});
    }
    if described.columns.is_empty() {
        return Err(syn::Error::new(
            span,
            "the statement returns no columns: run it with `execute!`",
        ));
    }
    let mut fields = Vec::new();
    for column in &described.columns {
        let named = types::named(&column.name);
        let ident = syn::parse_str::<syn::Ident>(&named.field)
            .or_else(|_| syn::parse_str::<syn::Ident>(&format!("r#{}", named.field)))
            .map_err(|_| {
                syn::Error::new(
                    span,
                    format!(
                        "column `{}` is not a Rust name: name it in the SQL (`AS name`)",
                        column.name
                    ),
                )
            })?;
        let inferred = types::column_type(engine, column.type_name.as_deref());
        // A type neither inferred nor named is `sqlhttp::Value`, which holds NULL itself.
        let dynamic = named.rust.is_none() && inferred.is_none();
        let base = match &named.rust {
            Some(rust) => syn::parse_str::<syn::Type>(rust)
                .map(|ty| quote!(#ty))
                .map_err(|e| {
                    syn::Error::new(
                        span,
                        format!("column `{}`: `{rust}` is not a type: {e}", column.name),
                    )
                })?,
            None => inferred.unwrap_or_else(|| quote!(::sqlhttp::Value)),
        };
        let never_null = named.non_null.unwrap_or(column.nullable == Some(false));
        let rust = if never_null || (dynamic && named.non_null.is_none()) {
            base
        } else {
            quote!(::core::option::Option<#base>)
        };
        fields.push(Field {
            wire: column.name.clone(),
            ident,
            sql_type: column
                .type_name
                .clone()
                .unwrap_or_else(|| "an expression".to_owned()),
            rust,
        });
    }
    let bind = quote! {
        move |statement: ::sqlhttp::Query| statement #(.bind(#names))*
    };
    let wrap = |row: Tokens, decoded: Tokens, map: Tokens, extra: Tokens| {
        quote! {{
            #track
            #extra
            match (#(#args,)*) {
                (#(#names,)*) => {
                    #(#checks)*
                    ::sqlhttp::macros::Checked::<#decoded, #row, _>::new(#sql_text, #bind, #map)
                }
            }
        }}
    };
    if kind == Kind::Scalar {
        if fields.len() != 1 {
            return Err(syn::Error::new(
                span,
                format!(
                    "query_scalar! reads one column; the statement returns {}",
                    fields.len()
                ),
            ));
        }
        let rust = &fields[0].rust;
        return Ok(wrap(
            quote!(#rust),
            quote!(#rust),
            quote!(|value| value),
            Tokens::new(),
        ));
    }
    let record = record(&fields);
    let row = quote!(__SqlhttpRecord);
    if kind == Kind::Query {
        return Ok(wrap(row.clone(), row, quote!(|row| row), record));
    }
    let Some(target) = &input.target else {
        return Err(syn::Error::new(
            Span::call_site(),
            "query_as! names its struct first",
        ));
    };
    let checked = fit(target, &fields);
    let idents: Vec<&syn::Ident> = fields.iter().map(|f| &f.ident).collect();
    let map = quote!(|row: __SqlhttpRecord| #target { #(#idents: row.#idents),* });
    Ok(wrap(quote!(#target), row, map, quote!(#record #checked)))
}

/// The struct the rows decode into: one field per column, named as the column (its overrides
/// stripped) and read from the column's name on the wire.
fn record(fields: &[Field]) -> Tokens {
    let members = fields.iter().map(|field| {
        let Field {
            wire, ident, rust, ..
        } = field;
        quote!(#[serde(rename = #wire)] #ident: #rust)
    });
    quote! {
        #[derive(::core::fmt::Debug, ::core::clone::Clone, ::core::cmp::PartialEq,
                 ::sqlhttp::macros::serde::Deserialize)]
        #[serde(crate = "::sqlhttp::macros::serde")]
        #[allow(non_camel_case_types, dead_code)]
        struct __SqlhttpRecord { #(#members,)* }
    }
}

/// The compile-time check of `query_as!`'s struct against the columns: a marker type per
/// column, named as the column, and a never-called function that fills the struct from them,
/// so a missing or unknown field and a field whose type is not the column's are errors that
/// name the column and both types.
fn fit(target: &Path, fields: &[Field]) -> Tokens {
    let mut markers = Vec::new();
    let mut members = Vec::new();
    for field in fields {
        let ident = &field.ident;
        let rust = &field.rust;
        let marker = format_ident!("{}", ident.to_string().trim_start_matches("r#"));
        let doc = format!("column `{}`, of type {}", field.wire, field.sql_type);
        markers.push(quote! {
            #[doc = #doc]
            #[allow(non_camel_case_types)]
            enum #marker {}
            impl ::sqlhttp::macros::FromColumn<#marker> for #rust {}
        });
        members.push(quote!(#ident: ::sqlhttp::macros::column::<#marker, _>()));
    }
    quote! {
        #(#markers)*
        #[allow(dead_code, unreachable_code, clippy::diverging_sub_expression)]
        fn __sqlhttp_fits() -> #target {
            #target { #(#members),* }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::types::named;

    #[test]
    fn overrides_are_read_off_a_column_name() {
        let n = named("n: i64");
        assert_eq!(
            (n.field.as_str(), n.non_null, n.rust.as_deref()),
            ("n", None, Some("i64"))
        );
        let n = named("id!");
        assert_eq!(
            (n.field.as_str(), n.non_null, n.rust),
            ("id", Some(true), None)
        );
        let n = named("note?: String");
        assert_eq!(
            (n.field.as_str(), n.non_null, n.rust.as_deref()),
            ("note", Some(false), Some("String"))
        );
        let n = named("title");
        assert_eq!(
            (n.field.as_str(), n.non_null, n.rust),
            ("title", None, None)
        );
    }
}
