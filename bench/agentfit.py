"""What the proxy's Responses and Messages adapters cost per request on long agent transcripts.

    uv run python bench/agentfit.py [--items 1000,20000] [--repeat 9]

Builds a coding-agent transcript of ``--items`` items in each API's shape (a user request, a tool
call, its output, the assistant's answer, repeated) and times what the proxy does with it before
forwarding: check, price (through the proxy's token cache, as each request of a growing
conversation is), fit and render. Prints the first request's time (every item counted) and the
median of the following ones (cached), CPU time (``time.process_time``: the machine is shared).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

from ctxwarden import fit_messages, fit_responses
from ctxwarden.fit import fit
from ctxwarden.server.chatfit import TokenCache
from ctxwarden.tokens import get_format
from ctxwarden.wirefit import Pricer


def transcripts(items: int) -> tuple[dict[str, Any], dict[str, Any]]:
    """A Responses request and a Messages request of about ``items`` items each."""
    inputs: list[Any] = [{"role": "developer", "content": "You are a coding agent."}]
    messages: list[Any] = []
    for i in range(items // 4):
        ask = f"step {i}: please fix the failing test in module {i} and run it again"
        result = {"type": "tool_result", "tool_use_id": f"t{i}", "content": "1 passed " * 5}
        command = {"cmd": f"pytest tests/test_{i}.py -x"}
        inputs += [
            {"role": "user", "content": ask},
            {"type": "function_call", "call_id": f"c{i}", "name": "shell",
             "arguments": json.dumps(command)},
            {"type": "function_call_output", "call_id": f"c{i}", "output": "1 passed " * 5},
            {"role": "assistant", "content": f"done with step {i}, the test passes now"},
        ]  # fmt: skip
        messages += [
            {"role": "user", "content": ask},
            {"role": "assistant",
             "content": [{"type": "tool_use", "id": f"t{i}", "name": "shell", "input": command}]},
            {"role": "user",
             "content": [result]},
            {"role": "assistant", "content": f"done with step {i}, the test passes now"},
        ]  # fmt: skip
    return (
        {"model": "gpt-4o", "input": inputs},
        {"model": "claude", "max_tokens": 1024, "messages": messages},
    )


def one(module: Any, body: dict[str, Any], pricer: Pricer) -> Callable[[], None]:
    def run() -> None:
        module.check(body)
        plan = module.plan(body, pricer)
        fitted = fit(plan.units, cap=100_000, fixed=plan.fixed)
        module.render(body, plan.units, fitted)

    return run


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--items", default="1000,20000")
    parser.add_argument("--repeat", type=int, default=9)
    args = parser.parse_args(argv)
    print("| API | items | first request (ms CPU) | later requests, median (ms CPU) |")
    print("|---|---|---|---|")
    for items in (int(n) for n in args.items.split(",")):
        responses, messages = transcripts(items)
        for name, module, body in (
            ("Responses", fit_responses, responses),
            ("Messages", fit_messages, messages),
        ):
            run = one(module, body, Pricer(get_format("openai"), TokenCache()))
            times = []
            for _ in range(args.repeat):
                started = time.process_time()
                run()
                times.append((time.process_time() - started) * 1000)
            later = statistics.median(times[1:])
            print(f"| {name} | {items:,} | {times[0]:.1f} | {later:.1f} |")


if __name__ == "__main__":
    main()
