"""Schemathesis hooks of ``tests/test_contract.py`` (loaded by the ``st`` process through
$SCHEMATHESIS_HOOKS): the one check that replaces schemathesis' own
``positive_data_acceptance``.

A request the schema calls valid must be accepted, except for the refusals no schema can
state because they depend on what the service holds (listed below, each with why): a
body can be well formed and still name a past the log has not reached, a cursor this
listing never issued, a vector whose size is not its collective's, or SQL DuckDB cannot
parse. Those are 422s whose message says so; any other 422 of a schema-valid request
fails the run.
"""

from __future__ import annotations

import re

import schemathesis
from schemathesis.specs.openapi.checks import positive_data_acceptance

STATE_DEPENDENT = (
    # as_of: a stream sequence beyond the end of the log (its end is not in the schema)
    r"^as_of: sequence \d+ is past the end of the log",
    # after: a cursor is what an earlier page answered, not any text
    r"^after: not a cursor of ",
    # a vector's size is the collective's (or the owner's wisdom's) dimension
    r"^(embedding|query): \d+ values, (collective|the wisdom of) ",
    r"^(embedding|query): required, collective .* has no embedder",
    r"^(embedding|query|text): give a vector or a text to embed",
    # a vector's embedder is the collective's
    r"^embedder: collective .* embeds with ",
    # a name one owner gave two collectives (schemathesis makes many of one name)
    r"^collective: \d+ collectives are named ",
    # rules across fields the descriptions state (not as shapes: a body is one object):
    # one context holds at most 300 items; a collective has a dimension or an embedder
    # (of its size); an update changes something
    r"^k \+ recent \+ insights: at most ",
    r"^embedding_dimension: required \(1\.\.\d+\) when the collective has no embedder",
    r"^embedding_dimension: the [\w-]+ embedder makes \d+-d vectors",
    r"^update: give at least one of ",
)
# ... and of POST /v1/sql: one read-only query DuckDB can parse and bind
SQL = r"^query: "


@schemathesis.check
def positive_data_accepted(ctx, response, case):  # type: ignore[no-untyped-def]
    """``positive_data_acceptance``, but a 422 naming a state-dependent refusal passes."""
    try:
        return positive_data_acceptance(ctx, response, case)
    except AssertionError:
        if response.status_code == 422:
            body = response.json()
            problems = body.get("problems") or [str(body.get("message", ""))]
            # (a field of a batch's item is named with its place: items.3.embedder)
            problems = [re.sub(r"^(\w+\.\d+\.)+", "", part) for part in problems]
            known = STATE_DEPENDENT + ((SQL,) if case.operation.path == "/v1/sql" else ())
            if all(any(re.search(p, part) for p in known) for part in problems):
                return None
        raise


@schemathesis.hook
def filter_case(context, case):  # type: ignore[no-untyped-def]
    """No collectives that embed with e5-small: the real model embeds a text in tens of ms
    on a small machine, so a batch of 1,000 (which the schema allows) outlasts the run's
    request timeout. Its embedding is tried by tests/test_search_quality.py."""
    body = case.body
    return not (
        case.operation.path == "/v1/create_collective"
        and isinstance(body, dict)
        and body.get("embedder") == "e5-small"
    )
