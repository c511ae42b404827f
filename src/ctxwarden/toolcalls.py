"""Tool-call reliability for small models: validate, repair deterministically, gate, report.

A model's reply may carry tool calls whose arguments are not JSON, or are JSON that breaks the
tool's parameter schema, or that name a tool nobody offered. This module checks each call against
the tools of the request, repairs what can be repaired without a model (:func:`repair`), holds back
calls to tools marked destructive (:func:`gate`) and records every step in a
:class:`ToolCallReport`. Asking the model to rewrite a call it could not be repaired is left to
the caller (the proxy); :func:`repair_request_messages` builds that request and
:func:`check_call` checks the answer. Everything here is pure and synchronous.

>>> tools = [{"type": "function", "function": {"name": "weather", "parameters": {
...     "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]
>>> call = ToolCall(id="c1", name="weather", arguments="{'city': 'Oslo',}")
>>> report = check_reply([call], tools)
>>> report.calls[0].status, report.calls[0].call.arguments
('repaired', '{"city": "Oslo"}')
"""

from __future__ import annotations

import fnmatch
import json
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Literal

from jsonschema import exceptions as schema_exceptions
from jsonschema import validators

from ctxwarden.errors import InputError
from ctxwarden.jsonrepair import RepairResult, repair_json

__all__ = [
    "CallCheck",
    "CallStatus",
    "GateDecision",
    "Problem",
    "RepairResult",
    "ToolCall",
    "ToolCallReport",
    "check_call",
    "check_reply",
    "gate",
    "repair",
    "repair_request_messages",
    "tool_schemas",
    "validate",
]

CallStatus = Literal["valid", "repaired", "invalid", "held"]
#: At most this many schema problems are reported per call; the rest say nothing new to a model.
_MAX_PROBLEMS = 10


@dataclass(frozen=True, kw_only=True)
class ToolCall:
    """One tool call as a model emitted it; ``arguments`` is the raw JSON text.

    >>> ToolCall.from_openai({"id": "c1", "type": "function",
    ...     "function": {"name": "f", "arguments": "{}"}}).name
    'f'
    """

    id: str
    name: str
    arguments: str

    @classmethod
    def from_openai(cls, data: Mapping[str, Any]) -> ToolCall:
        """Read an OpenAI ``tool_calls`` entry. Arguments sent as an object (Ollama does) are
        serialised; missing ones become ``""``."""
        function = data.get("function")
        if not isinstance(function, Mapping):
            raise InputError("a tool call needs a 'function' object", field="tool_calls.function")
        name = function.get("name")
        if not isinstance(name, str):
            raise InputError("a tool call needs a function name", field="tool_calls.function.name")
        arguments = function.get("arguments", "")
        if arguments is None:
            arguments = ""
        if not isinstance(arguments, str):
            arguments = json.dumps(arguments, ensure_ascii=False)
        call_id = data.get("id")
        return cls(id=call_id if isinstance(call_id, str) else "", name=name, arguments=arguments)

    def to_openai(self) -> dict[str, Any]:
        """The OpenAI ``tool_calls`` entry for this call."""
        return {
            "id": self.id,
            "type": "function",
            "function": {"name": self.name, "arguments": self.arguments},
        }


@dataclass(frozen=True, kw_only=True)
class Problem:
    """One thing wrong with a call.

    ``code`` is one of ``unknown_tool``, ``invalid_json``, ``not_object`` and ``schema``;
    ``path`` is where in the arguments (``$.city``; ``$`` for the whole), ``message`` says what
    is wrong in words a model can act on.
    """

    code: str
    message: str
    path: str = "$"

    def __str__(self) -> str:
        return f"{self.path}: {self.message}" if self.path != "$" else self.message


@dataclass(frozen=True, kw_only=True)
class GateDecision:
    """Whether a call may run without approval; ``pattern`` is the destructive one it matched."""

    allowed: bool
    reason: str
    pattern: str | None = None


@dataclass(frozen=True, kw_only=True)
class CallCheck:
    """What :func:`check_call` found and did for one call.

    ``call`` carries the repaired arguments when a repair succeeded (else the original);
    ``original_arguments`` the text the model sent. ``steps`` is the readable log of each step.
    ``status``: ``invalid`` (problems remain: ask the model), ``held`` (valid but destructive:
    needs approval), ``repaired`` (valid after deterministic repair), ``valid``.
    """

    call: ToolCall
    original_arguments: str
    status: CallStatus
    problems: tuple[Problem, ...]
    repairs: tuple[str, ...]
    gate: GateDecision
    steps: tuple[str, ...]

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready record for reports (no argument values beyond the problem messages)."""
        return {
            "id": self.call.id,
            "name": self.call.name,
            "status": self.status,
            "repairs": list(self.repairs),
            "problems": [
                {"code": p.code, "path": p.path, "message": p.message} for p in self.problems
            ],
            "gate": {
                "allowed": self.gate.allowed,
                "reason": self.gate.reason,
                "pattern": self.gate.pattern,
            },
            "steps": list(self.steps),
        }


@dataclass(frozen=True, kw_only=True)
class ToolCallReport:
    """The checks of every call of one reply, in the reply's order."""

    calls: tuple[CallCheck, ...]

    @property
    def invalid(self) -> tuple[CallCheck, ...]:
        """Calls that still have problems (candidates for a model re-ask)."""
        return tuple(c for c in self.calls if c.status == "invalid")

    @property
    def held(self) -> tuple[CallCheck, ...]:
        """Calls held back for approval."""
        return tuple(c for c in self.calls if c.status == "held")

    @property
    def ok(self) -> bool:
        """True when every call is valid or repaired and none is held."""
        return all(c.status in ("valid", "repaired") for c in self.calls)

    def runnable_calls(self) -> list[ToolCall]:
        """The calls that may run as they are: valid or repaired, not held."""
        return [c.call for c in self.calls if c.status in ("valid", "repaired")]

    def held_notice(self) -> str:
        """One line per held call saying approval is needed and why ("" when none is held)."""
        return "\n".join(
            f"Approval needed before calling {c.call.name} (call {c.call.id}): {c.gate.reason}."
            for c in self.held
        )

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready record for the ``x-ctxwarden-report``."""
        return {"ok": self.ok, "calls": [c.to_json() for c in self.calls]}


def tool_schemas(tools: Sequence[Mapping[str, Any]]) -> dict[str, Mapping[str, Any]]:
    """Map each tool's name to its parameter schema, checking the schemas.

    Accepts OpenAI ``tools`` entries (``{"type": "function", "function": {...}}``) and bare
    function objects (``{"name": ..., "parameters": ...}``). A tool without parameters gets
    ``{"type": "object"}``. Raises :class:`InputError` naming the tool for a missing name or an
    invalid JSON schema.
    """
    schemas: dict[str, Mapping[str, Any]] = {}
    for index, tool in enumerate(tools):
        function = tool.get("function", tool) if isinstance(tool, Mapping) else None
        if not isinstance(function, Mapping) or not isinstance(function.get("name"), str):
            raise InputError(
                "each tool needs a function with a string 'name'",
                field=f"tools[{index}].function.name",
            )
        parameters = function.get("parameters")
        if parameters is None:
            parameters = {"type": "object"}
        if not isinstance(parameters, Mapping):
            raise InputError(
                "parameters must be a JSON schema object",
                field=f"tools[{index}].function.parameters",
            )
        cls = validators.validator_for(parameters, default=validators.Draft202012Validator)
        try:
            cls.check_schema(dict(parameters))
        except schema_exceptions.SchemaError as exc:
            raise InputError(
                f"not a valid JSON schema: {exc.message}; fix the tool definition",
                field=f"tools[{index}].function.parameters",
            ) from exc
        schemas[function["name"]] = parameters
    return schemas


def _call_of(call: ToolCall | Mapping[str, Any]) -> ToolCall:
    return call if isinstance(call, ToolCall) else ToolCall.from_openai(call)


def _schemas_of(
    tools: Sequence[Mapping[str, Any]] | Mapping[str, Mapping[str, Any]],
) -> Mapping[str, Mapping[str, Any]]:
    # A mapping is taken to be the output of tool_schemas (name -> schema), already checked.
    if isinstance(tools, Mapping):
        return tools
    return tool_schemas(tools)


def _schema_problems(value: Any, schema: Mapping[str, Any]) -> list[Problem]:
    if not isinstance(value, dict):
        return [
            Problem(
                code="not_object",
                message=f"arguments must be a JSON object, got {type(value).__name__}",
            )
        ]
    cls = validators.validator_for(schema, default=validators.Draft202012Validator)
    checker = cls(schema)
    errors = sorted(checker.iter_errors(value), key=lambda e: (list(e.absolute_path), e.message))
    problems = []
    for error in errors[:_MAX_PROBLEMS]:
        path = "$" + "".join(
            f"[{part}]" if isinstance(part, int) else f".{part}" for part in error.absolute_path
        )
        problems.append(Problem(code="schema", message=error.message, path=path))
    return problems


def validate(
    call: ToolCall | Mapping[str, Any],
    tools: Sequence[Mapping[str, Any]] | Mapping[str, Mapping[str, Any]],
) -> list[Problem]:
    """Problems with ``call`` against ``tools`` (empty when the call is valid). No repair.

    ``tools`` is the request's ``tools`` list or the output of :func:`tool_schemas`.

    >>> tools = [{"name": "f", "parameters": {"type": "object",
    ...     "properties": {"n": {"type": "integer"}}, "additionalProperties": False}}]
    >>> [str(p) for p in validate(ToolCall(id="1", name="f", arguments='{"n": "x"}'), tools)]
    ["$.n: 'x' is not of type 'integer'"]
    """
    tool_call = _call_of(call)
    schemas = _schemas_of(tools)
    if tool_call.name not in schemas:
        offered = ", ".join(sorted(schemas)) or "none"
        return [
            Problem(
                code="unknown_tool",
                message=f"no tool named '{tool_call.name}' was offered (offered: {offered})",
            )
        ]
    try:
        value = json.loads(tool_call.arguments)
    except (ValueError, RecursionError) as exc:
        return [Problem(code="invalid_json", message=f"arguments are not valid JSON: {exc}")]
    return _schema_problems(value, schemas[tool_call.name])


def repair(arguments: str) -> RepairResult:
    """Repair malformed JSON arguments deterministically (see ``jsonrepair.repair_json``).

    Empty arguments (``""``, which models send for tools without parameters) become ``{}``
    with the repair ``empty_arguments``. Never raises; valid JSON comes back unchanged.

    >>> repair("{'a': True,}").text
    '{"a": true}'
    """
    if isinstance(arguments, str) and not arguments.strip():
        return RepairResult(ok=True, text="{}", value={}, repairs=("empty_arguments",))
    return repair_json(arguments)


def gate(call: ToolCall | Mapping[str, Any], destructive: Collection[str]) -> GateDecision:
    """Hold back a call whose tool name matches a destructive name or glob pattern.

    Matching ignores case, so a model calling ``Delete_File`` does not slip past ``delete_*``.

    >>> gate(ToolCall(id="1", name="delete_file", arguments="{}"), ["delete_*"]).allowed
    False
    """
    name = _call_of(call).name
    for pattern in sorted(destructive):
        if fnmatch.fnmatchcase(name.casefold(), pattern.casefold()):
            return GateDecision(
                allowed=False,
                reason=f"tool '{name}' is marked destructive (pattern '{pattern}')",
                pattern=pattern,
            )
    return GateDecision(allowed=True, reason="not marked destructive")


def check_call(
    call: ToolCall | Mapping[str, Any],
    tools: Sequence[Mapping[str, Any]] | Mapping[str, Mapping[str, Any]],
    *,
    destructive: Collection[str] = (),
) -> CallCheck:
    """Validate, repair when needed, re-validate and gate one call, logging every step.

    Also checks a model's answer to :func:`repair_request_messages`: pass the call with
    ``arguments`` replaced by the answer's text (prose and fences around the JSON are repaired).
    """
    original = _call_of(call)
    schemas = _schemas_of(tools)
    steps: list[str] = []
    repairs: tuple[str, ...] = ()
    current = original
    problems = validate(current, schemas)
    if not problems:
        steps.append("validated: arguments match the schema")
    elif problems[0].code == "unknown_tool":
        steps.append(f"validated: {problems[0].message}")
    else:
        steps.append(f"validated: {len(problems)} problem(s): {problems[0]}")
        fixed = _unwrap_double_encoded(current.arguments) or repair(current.arguments)
        if fixed.ok and fixed.repairs and fixed.text is not None:
            repairs = fixed.repairs
            current = replace(current, arguments=fixed.text)
            problems = validate(current, schemas)
            verdict = "now valid" if not problems else f"still {len(problems)} problem(s)"
            steps.append(f"repaired ({', '.join(repairs)}): {verdict}")
        elif fixed.ok:
            steps.append(
                "repair: the arguments are JSON; only the model can fix the schema problems"
            )
        else:
            steps.append(f"repair failed: {fixed.error}")
    decision = gate(current, destructive)
    if not decision.allowed:
        steps.append(f"gated: {decision.reason}; approval needed")
    status: CallStatus
    if problems:
        status = "invalid"
    elif not decision.allowed:
        status = "held"
    elif repairs:
        status = "repaired"
    else:
        status = "valid"
    return CallCheck(
        call=current,
        original_arguments=original.arguments,
        status=status,
        problems=tuple(problems),
        repairs=repairs,
        gate=decision,
        steps=tuple(steps),
    )


def _unwrap_double_encoded(arguments: str) -> RepairResult | None:
    """Arguments sent as a JSON string holding the JSON object (a common small-model slip)."""
    try:
        outer = json.loads(arguments)
    except (ValueError, RecursionError):
        return None
    if not isinstance(outer, str):
        return None
    inner = repair(outer)
    if not inner.ok or not isinstance(inner.value, dict):
        return None
    return replace(inner, repairs=("double_encoded", *inner.repairs))


def check_reply(
    tool_calls: Sequence[ToolCall | Mapping[str, Any]],
    tools: Sequence[Mapping[str, Any]] | Mapping[str, Mapping[str, Any]],
    *,
    destructive: Collection[str] = (),
) -> ToolCallReport:
    """Run :func:`check_call` on every call of a reply (tool schemas checked once).

    Raises :class:`InputError` when a tool definition is invalid (a caller's mistake); a bad
    call never raises, it is reported.
    """
    schemas = _schemas_of(tools)
    return ToolCallReport(
        calls=tuple(check_call(c, schemas, destructive=destructive) for c in tool_calls)
    )


def repair_request_messages(
    call: ToolCall | Mapping[str, Any],
    problems: Sequence[Problem],
    *,
    schema: Mapping[str, Any] | None = None,
) -> list[dict[str, Any]]:
    """Messages asking a model to rewrite one call's arguments as valid JSON.

    A standalone two-message conversation (system, user); the model's answer is expected to be
    the corrected arguments object alone. Check it with :func:`check_call` on
    ``replace(call, arguments=answer)``.
    """
    tool_call = _call_of(call)
    listed = "\n".join(f"- {p}" for p in problems) or "- the arguments are not valid"
    parts = [
        f"The call to the tool `{tool_call.name}` had invalid arguments:",
        listed,
        "",
        "The arguments it sent were:",
        tool_call.arguments,
    ]
    if schema is not None:
        parts += ["", "The tool's parameters JSON schema is:", json.dumps(schema, sort_keys=True)]
    parts += [
        "",
        "Reply with only the corrected arguments: one JSON object, double-quoted keys and strings, "
        "no code fence, no comments, no other text.",
    ]
    return [
        {
            "role": "system",
            "content": "You fix tool-call arguments. Answer with one JSON object and nothing else.",
        },
        {"role": "user", "content": "\n".join(parts)},
    ]
