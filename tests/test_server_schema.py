"""Schemathesis against serve's OpenAPI schema (issue 20, item 3): generated requests, valid and
invalid, to every operation, with the checks that no answer is a 5xx and that every answer
(errors included) matches the status codes and the body schemas the document declares.

Bounded (a few dozen examples per operation) to stay within tens of seconds; ``bench/`` may run
the same schema longer.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

schemathesis = pytest.importorskip("schemathesis")

from hypothesis import HealthCheck, given, settings  # noqa: E402
from schemathesis import GenerationMode  # noqa: E402
from schemathesis.checks import not_a_server_error  # noqa: E402
from schemathesis.specs.openapi.checks import (  # noqa: E402
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from ctxwarden import Engine  # noqa: E402
from ctxwarden.server.http import create_app  # noqa: E402


@schemathesis.check
def refusals_name_the_field(ctx: Any, response: Any, case: Any) -> bool | None:
    """A 422 names the field it refuses, or the line and column of broken JSON."""
    if response.status_code != 422:
        return None
    error = response.json()["error"]
    if not (error.get("field") or error.get("line")):
        raise AssertionError(f"a 422 that names no field: {error['message']}")
    return True


CHECKS = (
    not_a_server_error,
    refusals_name_the_field,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
)


def _operations() -> list[tuple[str, str]]:
    with Engine.open(":memory:") as engine:
        document = create_app(engine).openapi()
    return [(method, path) for path, item in document["paths"].items() for method in item]


@pytest.fixture(scope="module")
def api_schema() -> Iterator[Any]:
    with Engine.open(":memory:") as engine:
        engine.ingest(
            [
                {"id": "m1", "content": "the deploy moved to friday", "session": "s"},
                {"id": "m2", "content": "omar owns the checklist", "session": "s"},
            ]
        )
        loaded = schemathesis.openapi.from_asgi("/openapi.json", create_app(engine))
        # strings from all of Unicode: lone surrogates and NUL included (the default codec,
        # UTF-8, leaves surrogates out)
        loaded.config.generation.codec = None
        yield loaded


@pytest.mark.parametrize(("method", "path"), _operations())
def test_every_operation_answers_as_documented(api_schema: Any, method: str, path: str) -> None:
    operation = api_schema[path][method.upper()]

    strategy = operation.as_strategy(GenerationMode.POSITIVE) | operation.as_strategy(
        GenerationMode.NEGATIVE
    )

    @given(case=strategy)
    @settings(
        max_examples=20,
        deadline=None,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    def check(case: Any) -> None:
        case.call_and_validate(checks=CHECKS)

    check()
