//! The OpenAPI document (`docs/openapi.yaml`) as the tests read it, and a small validator of the
//! JSON Schema subset it uses (ADR 0030): a keyword it does not check fails, so the document
//! cannot use one it would silently ignore. [`conforms`] asserts that an answer is documented.
//!
//! Knows the document and the shape of an answer; nothing about the server's source or engines.

use serde_json::Value;

use crate::common::Reply;

/// The crate's directory.
const CRATE: &str = env!("CARGO_MANIFEST_DIR");

/// The document as parsed from the file (its JSON part, after the leading comments), with both
/// engines' `x-sqlite` and `x-postgresql` members.
pub(crate) fn source() -> Value {
    let text = std::fs::read_to_string(format!("{CRATE}/openapi.yaml")).unwrap();
    let start = text.find('{').unwrap();
    serde_json::from_str(&text[start..]).unwrap()
}

/// The document a server on `engine` (`sqlite` or `postgresql`) serves (ADR 0044): the file
/// with that engine's `x-<engine>` members' keywords put in place of the schema's own, and
/// every engine's members removed.
pub(crate) fn document_on(engine: &str) -> Value {
    fn apply(value: &mut Value, engine: &str) {
        match value {
            Value::Object(members) => {
                let own = members.remove(&format!("x-{engine}"));
                members.retain(|name, _| name != "x-sqlite" && name != "x-postgresql");
                if let Some(Value::Object(own)) = own {
                    members.extend(own);
                }
                members
                    .values_mut()
                    .for_each(|member| apply(member, engine));
            }
            Value::Array(items) => items.iter_mut().for_each(|item| apply(item, engine)),
            _ => {}
        }
    }
    let mut doc = source();
    apply(&mut doc, engine);
    doc
}

/// The document a SQLite server serves: what the in-process app's answers are checked against.
pub(crate) fn document() -> Value {
    document_on("sqlite")
}

/// The document's value at a local `$ref` (`#/components/...`).
fn resolve<'a>(doc: &'a Value, reference: &str) -> &'a Value {
    let pointer = reference
        .strip_prefix('#')
        .unwrap_or_else(|| panic!("not a local $ref: {reference}"));
    doc.pointer(pointer)
        .unwrap_or_else(|| panic!("dangling $ref: {reference}"))
}

/// Follows `value`'s `$ref`, if any.
fn deref<'a>(doc: &'a Value, value: &'a Value) -> &'a Value {
    match value.get("$ref").and_then(Value::as_str) {
        Some(reference) => deref(doc, resolve(doc, reference)),
        None => value,
    }
}

/// Whether `value` has the JSON Schema type `name` (an integer is also a number).
fn has_type(value: &Value, name: &str) -> bool {
    match name {
        "null" => value.is_null(),
        "boolean" => value.is_boolean(),
        "integer" => value.is_i64() || value.is_u64(),
        "number" => value.is_number(),
        "string" => value.is_string(),
        "array" => value.is_array(),
        "object" => value.is_object(),
        other => panic!("unknown type {other}"),
    }
}

/// The keywords [`validate`] checks; any other keyword in a schema fails the test, so the
/// document cannot use one this checker would silently ignore.
const KEYWORDS: &[&str] = &[
    "$ref",
    "type",
    "enum",
    "const",
    "properties",
    "required",
    "additionalProperties",
    "items",
    "minItems",
    "minimum",
    "maximum",
    "minLength",
    "maxLength",
    "anyOf",
    "oneOf",
    "allOf",
    // Checked by the fuzzer, not here: the validator has no regular expressions.
    "pattern",
    "contentEncoding",
    // Annotations.
    "description",
    "example",
];

/// Checks `value` against `schema`; the error names where and why.
fn validate(doc: &Value, schema: &Value, value: &Value, at: &str) -> Result<(), String> {
    let fail = |why: String| Err(format!("{at}: {why}; value {value}"));
    let object = schema
        .as_object()
        .unwrap_or_else(|| panic!("a schema is an object: {schema}"));
    for keyword in object.keys() {
        assert!(
            KEYWORDS.contains(&keyword.as_str()),
            "unchecked keyword {keyword} at {at}"
        );
    }
    if let Some(reference) = object.get("$ref").and_then(Value::as_str) {
        validate(doc, resolve(doc, reference), value, at)?;
    }
    if let Some(types) = object.get("type") {
        let names: Vec<&str> = match types {
            Value::String(one) => vec![one.as_str()],
            Value::Array(many) => many.iter().map(|t| t.as_str().unwrap()).collect(),
            other => panic!("bad type {other}"),
        };
        if !names.iter().any(|name| has_type(value, name)) {
            return fail(format!("not of type {types}"));
        }
    }
    if let Some(allowed) = object.get("enum").and_then(Value::as_array)
        && !allowed.contains(value)
    {
        return fail(format!("not one of {allowed:?}"));
    }
    if let Some(constant) = object.get("const")
        && constant != value
    {
        return fail(format!("not {constant}"));
    }
    if let Some(map) = value.as_object() {
        let properties = object.get("properties").and_then(Value::as_object);
        for name in object
            .get("required")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            if !map.contains_key(name.as_str().unwrap()) {
                return fail(format!("missing {name}"));
            }
        }
        for (name, member) in map {
            let inner = format!("{at}.{name}");
            match properties.and_then(|p| p.get(name)) {
                Some(sub) => validate(doc, sub, member, &inner)?,
                None => match object.get("additionalProperties") {
                    Some(Value::Bool(false)) => return fail(format!("unexpected member {name}")),
                    Some(sub @ Value::Object(_)) => validate(doc, sub, member, &inner)?,
                    _ => {}
                },
            }
        }
    }
    if let Some(items) = value.as_array() {
        if let Some(sub) = object.get("items") {
            for (index, item) in items.iter().enumerate() {
                validate(doc, sub, item, &format!("{at}[{index}]"))?;
            }
        }
        if let Some(min) = object.get("minItems").and_then(Value::as_u64)
            && (items.len() as u64) < min
        {
            return fail(format!("fewer than {min} items"));
        }
    }
    if let Some(text) = value.as_str() {
        let chars = text.chars().count() as u64;
        if object
            .get("minLength")
            .and_then(Value::as_u64)
            .is_some_and(|min| chars < min)
            || object
                .get("maxLength")
                .and_then(Value::as_u64)
                .is_some_and(|max| chars > max)
        {
            return fail("length out of bounds".into());
        }
    }
    if let Some(number) = value.as_f64()
        && (object
            .get("minimum")
            .and_then(Value::as_f64)
            .is_some_and(|min| number < min)
            || object
                .get("maximum")
                .and_then(Value::as_f64)
                .is_some_and(|max| number > max))
    {
        return fail("out of range".into());
    }
    for sub in object
        .get("allOf")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        validate(doc, sub, value, at)?;
    }
    if let Some(any) = object.get("anyOf").and_then(Value::as_array)
        && !any.iter().any(|sub| validate(doc, sub, value, at).is_ok())
    {
        return fail("matches none of anyOf".into());
    }
    if let Some(one) = object.get("oneOf").and_then(Value::as_array) {
        let matching = one
            .iter()
            .filter(|sub| validate(doc, sub, value, at).is_ok())
            .count();
        if matching != 1 {
            return fail(format!("matches {matching} of oneOf, not exactly one"));
        }
    }
    Ok(())
}

/// Asserts that `reply`, the answer to `method path`, is documented: its status, its content
/// type, its body against the schema, and the `X-Request-Id` every answer carries.
pub(crate) fn conforms(doc: &Value, method: &str, path: &str, reply: &Reply) {
    let operation = &doc["paths"][path][method.to_ascii_lowercase()];
    assert!(
        operation.is_object(),
        "{method} {path} is not in the document"
    );
    let status = reply.status.to_string();
    let documented = operation["responses"]
        .get(&status)
        .unwrap_or_else(|| panic!("{method} {path}: status {status} is not documented"));
    let response = deref(doc, documented);
    let content_type = reply.header("content-type").unwrap_or_default();
    let media = content_type.split(';').next().unwrap().trim();
    let schema = response["content"]
        .get(media)
        .unwrap_or_else(|| {
            panic!("{method} {path} {status}: content type {content_type} is not documented")
        })
        .get("schema")
        .unwrap();
    let body = if media.ends_with("json") {
        reply.json()
    } else {
        Value::String(String::from_utf8(reply.body.clone()).unwrap())
    };
    if let Err(why) = validate(doc, schema, &body, "body") {
        panic!("{method} {path} {status}: {why}");
    }
    assert!(
        response["headers"].get("X-Request-Id").is_some() && reply.header("x-request-id").is_some(),
        "{method} {path} {status}: X-Request-Id"
    );
    if reply.header("retry-after").is_some() {
        assert!(
            response["headers"].get("Retry-After").is_some(),
            "{method} {path} {status}"
        );
    }
}
