"""Schemathesis against a real ``ctxwarden serve``, longer than CI's run: a table per operation.

    python bench/schema_fuzz.py [--examples 500] [--operations PATTERN] [--embed off]
                                [--seed 20]

Starts ``ctxwarden serve --no-auth`` (the CLI, in a child process, on a free loopback port, over
a fresh SQLite file holding a few records), loads its OpenAPI document from ``/openapi.json``
and sends every operation ``--examples`` generated requests, half valid and half not
(schemathesis' positive and negative modes; strings from all of Unicode, lone surrogates and NUL
included). Each answer is checked as tests/test_server_schema.py checks it (that one bounded to
20 examples an operation): a 5xx is counted apart; a *conformance failure* is an answer whose
status, content type or body the document does not declare, or a 422 that names no field. The
table: operation, cases, 5xx, conformance failures, the slowest answer (seconds, wall time:
loaded machines make it noisy). The distinct failures follow the table (at most five an
operation), so a run that finds something says what.

``--embed`` is the server's embedding setting (``CTXWARDEN_EMBED``): ``background`` runs MiniLM
as a deployment does; ``off`` (the default here) keeps the run about the HTTP surface.
"""

from __future__ import annotations

import argparse
import contextlib
import fnmatch
import os
import socket
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import schemathesis
from hypothesis import HealthCheck, Phase, given, seed, settings
from schemathesis import GenerationMode
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

#: Distinct failure messages kept per operation.
FAILURES_SHOWN = 5


def refusals_name_the_field(ctx: Any, response: Any, case: Any) -> bool | None:
    """A 422 names the field it refuses, or the line and column of broken JSON (the same
    check as tests/test_server_schema.py's; not registered with ``@schemathesis.check``, whose
    registry is global: that test's check has this name)."""
    if response.status_code != 422:
        return None
    error = response.json()["error"]
    if not (error.get("field") or error.get("line")):
        raise AssertionError(f"a 422 that names no field: {error['message']}")
    return True


CONFORMANCE = (
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
    refusals_name_the_field,
)


@dataclass
class Result:
    """What one operation's generated requests got back."""

    operation: str
    cases: int = 0
    server_errors: int = 0
    conformance: int = 0
    unanswered: int = 0  # the connection failed or timed out
    slowest: float = 0.0
    failures: Counter[str] = field(default_factory=Counter)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextlib.contextmanager
def serve(folder: Path, embed: str) -> Any:
    """``ctxwarden serve --no-auth`` on a free loopback port over a new store in ``folder``;
    yields its base URL once ``/health`` answers, stops it afterwards."""
    port = free_port()
    command = [sys.executable, "-m", "ctxwarden.cli", "--db", str(folder / "fuzz.db")]
    env = {**os.environ, "CTXWARDEN_EMBED": embed}
    server = subprocess.Popen(
        [*command, "serve", "--no-auth", "--host", "127.0.0.1", "--port", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        env=env,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            with contextlib.suppress(httpx.TransportError):
                if httpx.get(f"{base}/health", timeout=2).status_code == 200:
                    break
            if server.poll() is not None or time.monotonic() > deadline:
                raise SystemExit("ctxwarden serve did not start")
            time.sleep(0.1)
        yield base
    finally:
        server.terminate()
        _, err = server.communicate(timeout=60)
        if server.returncode not in (0, -15):
            print(err.decode(errors="replace")[-2000:], file=sys.stderr)


def seed_store(base: str) -> None:
    """A few records, so reads by id and searches meet stored memories too."""
    records = [
        {"id": "m1", "content": "the deploy moved to friday", "session": "s", "author": "ana"},
        {"id": "m2", "content": "omar owns the checklist", "session": "s", "author": "omar"},
        {"id": "m3", "content": "the cat is called Bailey", "session": "t", "author": "ana"},
    ]
    httpx.post(f"{base}/v1/ingest", json={"records": records}, timeout=60).raise_for_status()


def fuzz(operation: Any, name: str, examples: int, at: int) -> Result:
    """``examples`` generated cases (positive and negative) against one operation."""
    result = Result(name)
    strategy = operation.as_strategy(GenerationMode.POSITIVE) | operation.as_strategy(
        GenerationMode.NEGATIVE
    )

    @seed(at)
    @given(case=strategy)
    @settings(
        max_examples=examples,
        deadline=None,
        database=None,
        phases=[Phase.explicit, Phase.generate],  # nothing fails the test: nothing to shrink
        suppress_health_check=list(HealthCheck),
    )
    def run(case: Any) -> None:
        began = time.perf_counter()
        try:
            response = case.call(timeout=120)
        except Exception as exc:  # a transport failure: the server did not answer
            result.unanswered += 1
            result.failures[f"no answer: {type(exc).__name__}: {exc}"[:200]] += 1
            return
        result.slowest = max(result.slowest, time.perf_counter() - began)
        result.cases += 1
        if response.status_code >= 500:
            result.server_errors += 1
            result.failures[f"{response.status_code}: {response.text[:160]}"] += 1
        try:
            case.validate_response(response, checks=CONFORMANCE)
        except (Exception, BaseExceptionGroup) as exc:  # schemathesis' FailureGroup
            result.conformance += 1
            for failure in getattr(exc, "exceptions", (exc,)):
                title = getattr(failure, "title", type(failure).__name__)
                message = getattr(failure, "message", str(failure))
                result.failures[" ".join(f"{title}: {message}".split())[:200]] += 1

    run()
    return result


def table(results: list[Result]) -> str:
    lines = [
        "| operation | cases | 5xx | conformance failures | unanswered | slowest (s) |",
        "|---|---|---|---|---|---|",
    ]
    for r in results:
        lines.append(
            f"| {r.operation} | {r.cases:,} | {r.server_errors} | {r.conformance} | "
            f"{r.unanswered} | {r.slowest:.3f} |"
        )
    total = Result(f"all {len(results)} operations")
    for r in results:
        total.cases += r.cases
        total.server_errors += r.server_errors
        total.conformance += r.conformance
        total.unanswered += r.unanswered
        total.slowest = max(total.slowest, r.slowest)
    lines.append(
        f"| **{total.operation}** | {total.cases:,} | {total.server_errors} | "
        f"{total.conformance} | {total.unanswered} | {total.slowest:.3f} |"
    )
    for r in results:
        for message, count in r.failures.most_common(FAILURES_SHOWN):
            lines.append(f"- {r.operation}: {count} x {message}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> list[Result]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--examples", type=int, default=500, help="generated cases an operation")
    parser.add_argument(
        "--operations", default="*", help="only operations matching this glob ('POST /v1/*')"
    )
    parser.add_argument("--embed", choices=("off", "background", "sync"), default="off")
    parser.add_argument("--seed", type=int, default=20)
    args = parser.parse_args(argv)
    if args.examples < 1:
        parser.error("--examples must be at least 1")
    began = time.perf_counter()
    results: list[Result] = []
    with (
        tempfile.TemporaryDirectory(prefix="schemafuzz-") as folder,
        serve(Path(folder), args.embed) as base,
    ):
        loaded = schemathesis.openapi.from_url(f"{base}/openapi.json")
        loaded.config.update(base_url=base)
        loaded.config.generation.codec = None  # all of Unicode (UTF-8 leaves surrogates out)
        document = httpx.get(f"{base}/openapi.json", timeout=30).json()
        operations = [
            (method.upper(), path)
            for path, item in document["paths"].items()
            for method in item
            if fnmatch.fnmatch(f"{method.upper()} {path}", args.operations)
        ]
        if not operations:
            parser.error(f"--operations: no operation matches {args.operations!r}")
        for number, (method, path) in enumerate(operations):
            name = f"{method} {path}"
            seed_store(base)  # again: an erasure fuzzed before may have emptied the store
            results.append(fuzz(loaded[path][method], name, args.examples, args.seed + number))
            print(f"done: {name}", flush=True)
    print()
    print(table(results))
    print(f"\n{args.examples} examples an operation, {time.perf_counter() - began:.0f} s in all")
    return results


if __name__ == "__main__":
    main()
