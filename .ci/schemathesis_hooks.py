"""Schemathesis hooks for .ci/run (ADR 0030, ADR 0044): the positive-data check, minus the
answers that no schema can foresee.

`positive_data_acceptance` says a request the document allows must not be refused. The
document allows what it can judge: shapes, lengths, the values each engine takes (the server
serves each engine's own document). Three refusals depend on what no schema describes, and are
let through here, each narrowly:

- 400 SQL_ERROR for statement text the engine cannot run, or parameters its statement does
  not take ("0" is a string, not a statement): whether text is SQL is the engine's judgement.
  Text with no statement at all is the document's business (`minLength`, `pattern`), so that
  refusal passes only for text holding a comment (`--`, `/*`), which the pattern cannot see.
- 410 TRANSACTION_EXPIRED for a transaction token no server issued: the token names state that
  does not exist, as a 404 would (the server cannot tell never-issued from expired).
- 422 IDEMPOTENCY_KEY_REUSED when the fuzzer sends one key with two bodies: the key names state
  an earlier request made.

Every other refusal of schema-valid data still fails the run.
"""

import json

import schemathesis
from schemathesis.openapi.checks import RejectedPositiveData
from schemathesis.specs.openapi.checks import positive_data_acceptance

NO_STATEMENT = "the SQL text contains no statement"


def _texts(body):
    if not isinstance(body, dict):
        return []
    texts = [body.get("sql")]
    statements = body.get("statements")
    if isinstance(statements, list):
        texts += [s.get("sql") for s in statements if isinstance(s, dict)]
    return [t for t in texts if isinstance(t, str)]


def _beyond_the_schema(response, case):
    try:
        error = json.loads(response.content)["error"]
    except (ValueError, KeyError, TypeError):
        return False
    code, message = error.get("code"), error.get("message", "")
    if response.status_code == 400 and code == "SQL_ERROR":
        if message != NO_STATEMENT:
            return True
        return any("--" in t or "/*" in t for t in _texts(case.body))
    if response.status_code == 410 and code == "TRANSACTION_EXPIRED":
        return True
    return response.status_code == 422 and code == "IDEMPOTENCY_KEY_REUSED"


@schemathesis.check
def positive_data_acceptance_beyond_sql(ctx, response, case):
    try:
        return positive_data_acceptance(ctx, response, case)
    except RejectedPositiveData:
        if _beyond_the_schema(response, case):
            return None
        raise
