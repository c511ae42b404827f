"""Tests of ctxwarden.toolcalls and the shared deterministic JSON repair (ctxwarden.jsonrepair)."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ctxwarden.errors import InputError
from ctxwarden.jsonrepair import MAX_DEPTH, repair_json
from ctxwarden.toolcalls import (
    Problem,
    ToolCall,
    check_call,
    check_reply,
    gate,
    repair,
    repair_request_messages,
    tool_schemas,
    validate,
)

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather for a city",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string"},
                "days": {"type": "integer", "minimum": 1},
                "unit": {"type": "string", "enum": ["c", "f"]},
            },
            "required": ["city"],
            "additionalProperties": False,
        },
    },
}
DELETE = {
    "type": "function",
    "function": {
        "name": "delete_file",
        "parameters": {
            "type": "object",
            "properties": {"path": {"type": "string"}},
            "required": ["path"],
        },
    },
}
PING = {"name": "ping"}  # a bare function object without parameters
TOOLS = [WEATHER, DELETE, PING]


def call(arguments: str, name: str = "get_weather", call_id: str = "c1") -> ToolCall:
    return ToolCall(id=call_id, name=name, arguments=arguments)


# ---------------------------------------------------------------- jsonrepair: fixed cases


@pytest.mark.parametrize(
    ("text", "value", "repairs"),
    [
        ('```json\n{"a": 1}\n```', {"a": 1}, ("code_fence",)),
        ("```\n[1, 2]\n```", [1, 2], ("code_fence",)),
        ('{"a": 1, "b": [1, 2,],}', {"a": 1, "b": [1, 2]}, ("trailing_comma",)),
        ("{'a': 'it\\'s'}", {"a": "it's"}, ("single_quotes",)),
        ('{"a": True, "b": None}', {"a": True, "b": None}, ("python_literal",)),
        ('{"a": {"b": [1, 2', {"a": {"b": [1, 2]}}, ("missing_close",)),
        ('{city: "Oslo", days_2: 3}', {"city": "Oslo", "days_2": 3}, ("unquoted_key",)),
        (
            'Sure! Here are the arguments: {"city": "Oslo"} Let me know.',
            {"city": "Oslo"},
            ("prose_before", "prose_after"),
        ),
        ('{"a": 1 "b": 2}', {"a": 1, "b": 2}, ("missing_comma",)),
        ('{"a": 1, // one\n "b": 2 /* two */}', {"a": 1, "b": 2}, ("comment",)),
        ('{"a": "line\nbreak"}', {"a": "line\nbreak"}, ("control_character",)),
        ('{"a": "open', {"a": "open"}, ("unterminated_string", "missing_close")),
        ('{"re": "\\d+"}', {"re": "\\d+"}, ("invalid_escape",)),
        ("[1,,2]", [1, 2], ("extra_comma",)),
        ('I think [this] is it: {"x": 1}', {"x": 1}, ("prose_before",)),
        ("3 things to note: {'x': 1}", {"x": 1}, ("prose_before", "single_quotes")),
        ("'just text'", "just text", ("single_quotes",)),
        (
            "Here:\n```json\n{'city': 'Oslo', 'ok': True,}\n```\nDone.",
            {"city": "Oslo", "ok": True},
            ("code_fence", "single_quotes", "python_literal", "trailing_comma"),
        ),
    ],
)
def test_repair_json_fixes_common_malformations(text: str, value: Any, repairs: tuple[str, ...]):
    result = repair_json(text)
    assert result.ok, result.error
    assert result.value == value
    assert result.repairs == repairs
    assert result.repaired
    assert result.text is not None
    assert json.loads(result.text) == value


@pytest.mark.parametrize(
    "text",
    ["", "   ", "no json here", "{a b c}", '{"a" 1}', "[1, 2}", "{'a': NaN}", "3 apples", "{]"],
)
def test_repair_json_fails_clearly_instead_of_guessing(text: str):
    result = repair_json(text)
    assert not result.ok
    assert result.text is None
    assert result.value is None
    assert result.error


def test_repair_json_rejects_deep_nesting_without_raising():
    deep = "[" * (MAX_DEPTH + 50)
    result = repair_json(deep)
    assert not result.ok
    assert "nested deeper" in (result.error or "")
    # valid but deeper than json.loads' own recursion limit: still no exception
    assert repair_json("[" * 100_000 + "]" * 100_000).ok in (True, False)


def test_repair_json_surrogate_pairs_and_lone_surrogates():
    assert repair_json("{'e': '\\ud83d\\ude00'}").value == {"e": "\U0001f600"}
    lone = repair_json("{'e': '\\ud83d x'}")
    assert lone.ok
    assert lone.value == {"e": "\\ud83d x"}
    assert "invalid_escape" in lone.repairs


def test_repair_json_non_string_input_is_a_failure_not_an_exception():
    assert not repair_json(None).ok  # type: ignore[arg-type]


# ---------------------------------------------------------------- jsonrepair: properties

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda kids: st.lists(kids, max_size=4) | st.dictionaries(st.text(), kids, max_size=4),
    max_leaves=20,
)
dump_styles = st.sampled_from(
    [
        {},
        {"indent": 2},
        {"separators": (",", ":")},
        {"ensure_ascii": False},
        {"sort_keys": True, "indent": "\t"},
    ]
)


@settings(max_examples=300, deadline=None)
@given(json_values, dump_styles)
def test_repair_is_identity_on_valid_json(value: Any, style: dict[str, Any]):
    text = json.dumps(value, **style)
    result = repair(text)
    assert result.ok
    assert result.text == text
    assert result.repairs == ()
    assert not result.repaired


@settings(max_examples=500, deadline=None)
@given(st.text())
def test_repair_never_raises_and_output_is_valid_json(text: str):
    result = repair(text)
    if result.ok:
        assert result.text is not None
        # Compare serialised forms: NaN parses to a float that is not equal to itself.
        assert json.dumps(json.loads(result.text)) == json.dumps(result.value)
        again = repair(result.text)
        assert again.text == result.text
        assert again.repairs == ()
    else:
        assert result.error


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet="{}[]\"':,01 aTrueNn\\/*\n"))
def test_repair_never_raises_on_json_like_noise(text: str):
    result = repair_json(text)
    assert result.ok or result.error


json_objects = st.dictionaries(
    st.text(alphabet="abcdefgh_", min_size=1, max_size=6),
    st.none()
    | st.booleans()
    | st.integers()
    | st.text(max_size=10)
    | st.lists(st.integers(), max_size=3),
    max_size=5,
)


@settings(max_examples=200, deadline=None)
@given(json_objects)
def test_repair_reads_python_repr_of_a_dict(value: dict[str, Any]):
    result = repair(repr(value))
    assert result.ok, result.error
    assert result.value == value


@settings(max_examples=200, deadline=None)
@given(json_objects.filter(bool))
def test_repair_restores_truncated_closers_and_trailing_commas(value: dict[str, Any]):
    text = json.dumps(value)
    truncated = text.rstrip("]}")
    assert repair(truncated).value == value
    with_commas = text[:-1] + ",}"
    assert repair(with_commas).value == value
    fenced = f"Here you go:\n```json\n{text}\n```\nAnything else?"
    assert repair(fenced).value == value


# ---------------------------------------------------------------- ToolCall


def test_tool_call_round_trips_openai_shape():
    data = {"id": "c9", "type": "function", "function": {"name": "ping", "arguments": "{}"}}
    assert ToolCall.from_openai(data).to_openai() == data


def test_tool_call_accepts_object_arguments_and_missing_arguments():
    as_object = ToolCall.from_openai({"id": "c", "function": {"name": "f", "arguments": {"a": 1}}})
    assert json.loads(as_object.arguments) == {"a": 1}
    missing = ToolCall.from_openai({"function": {"name": "f"}})
    assert missing.arguments == ""
    assert missing.id == ""


@pytest.mark.parametrize(
    ("data", "field"),
    [
        ({"id": "c"}, "tool_calls.function"),
        ({"function": {"arguments": "{}"}}, "tool_calls.function.name"),
    ],
)
def test_tool_call_from_openai_names_the_bad_field(data: dict[str, Any], field: str):
    with pytest.raises(InputError) as info:
        ToolCall.from_openai(data)
    assert info.value.field == field


# ---------------------------------------------------------------- validate


def test_validate_accepts_a_good_call():
    assert validate(call('{"city": "Oslo", "days": 2, "unit": "c"}'), TOOLS) == []


@pytest.mark.parametrize(
    ("arguments", "code", "path", "fragment"),
    [
        ('{"days": 2}', "schema", "$", "'city' is a required property"),
        ('{"city": 5}', "schema", "$.city", "not of type 'string'"),
        ('{"city": "Oslo", "unit": "k"}', "schema", "$.unit", "is not one of"),
        ('{"city": "Oslo", "extra": 1}', "schema", "$", "Additional properties"),
        ('{"city": "Oslo", "days": 0}', "schema", "$.days", "minimum"),
        ('["Oslo"]', "not_object", "$", "must be a JSON object"),
        ("{'city': 'Oslo'}", "invalid_json", "$", "not valid JSON"),
    ],
)
def test_validate_reports_each_kind_of_problem(arguments: str, code: str, path: str, fragment: str):
    problems = validate(call(arguments), TOOLS)
    assert problems
    assert problems[0].code == code
    assert problems[0].path == path
    assert fragment in problems[0].message


def test_validate_unknown_tool_lists_the_offered_ones():
    problems = validate(call("{}", name="launch_rockets"), TOOLS)
    assert [p.code for p in problems] == ["unknown_tool"]
    assert "delete_file, get_weather, ping" in problems[0].message


def test_validate_accepts_openai_dicts_and_precompiled_schemas():
    schemas = tool_schemas(TOOLS)
    assert set(schemas) == {"get_weather", "delete_file", "ping"}
    assert schemas["ping"] == {"type": "object"}
    data = {"id": "x", "type": "function", "function": {"name": "ping", "arguments": "{}"}}
    assert validate(data, schemas) == []


def test_tool_schemas_rejects_a_broken_definition_naming_the_field():
    with pytest.raises(InputError) as info:
        tool_schemas([WEATHER, {"function": {"name": "f", "parameters": {"type": "nope"}}}])
    assert info.value.field == "tools[1].function.parameters"
    with pytest.raises(InputError) as info:
        tool_schemas([{"type": "function", "function": {"description": "nameless"}}])
    assert info.value.field == "tools[0].function.name"


# ---------------------------------------------------------------- gate


@pytest.mark.parametrize(
    ("name", "patterns", "allowed"),
    [
        ("delete_file", ["delete_file"], False),
        ("Delete_File", ["delete_*"], False),
        ("post_message", ["delete_*", "post*"], False),
        ("get_weather", ["delete_*", "post*"], True),
        ("get_weather", [], True),
    ],
)
def test_gate_matches_names_and_globs_case_insensitively(
    name: str, patterns: list[str], allowed: bool
):
    decision = gate(call("{}", name=name), patterns)
    assert decision.allowed is allowed
    if not allowed:
        assert decision.pattern in patterns
        assert name in decision.reason


# ---------------------------------------------------------------- check_call / check_reply


def test_check_reply_records_valid_repaired_invalid_and_held():
    calls = [
        call('{"city": "Oslo"}', call_id="a"),
        call("```json\n{'city': 'Bergen', 'days': 2,}\n```", call_id="b"),
        call('{"city": 7}', call_id="c"),
        call('{"path": "/tmp/x"}', name="delete_file", call_id="d"),
        call("", name="ping", call_id="e"),
        call("{}", name="unknown", call_id="f"),
    ]
    report = check_reply(calls, TOOLS, destructive=["delete_*"])
    statuses = {c.call.id: c.status for c in report.calls}
    assert statuses == {
        "a": "valid",
        "b": "repaired",
        "c": "invalid",
        "d": "held",
        "e": "repaired",
        "f": "invalid",
    }
    repaired = report.calls[1]
    assert json.loads(repaired.call.arguments) == {"city": "Bergen", "days": 2}
    assert repaired.original_arguments == calls[1].arguments
    assert repaired.repairs == ("code_fence", "single_quotes", "trailing_comma")
    assert any(step.startswith("repaired") for step in repaired.steps)
    assert report.calls[4].repairs == ("empty_arguments",)
    assert [c.call.id for c in report.invalid] == ["c", "f"]
    assert [c.call.id for c in report.held] == ["d"]
    assert [c.id for c in report.runnable_calls()] == ["a", "b", "e"]
    assert not report.ok
    assert "delete_file" in report.held_notice()
    assert "approval" in report.held_notice().lower()
    encoded = json.loads(json.dumps(report.to_json()))
    assert encoded["calls"][3]["gate"]["allowed"] is False


def test_check_call_does_not_hold_a_call_it_cannot_validate_but_records_the_gate():
    check = check_call(call("{'oops'", name="delete_file"), TOOLS, destructive=["delete_file"])
    assert check.status == "invalid"
    assert not check.gate.allowed
    assert any(step.startswith("gated") for step in check.steps)
    assert any(step.startswith("repair failed") for step in check.steps)


def test_check_call_unwraps_double_encoded_arguments():
    doubly = json.dumps(json.dumps({"city": "Oslo"}))
    check = check_call(call(doubly), TOOLS)
    assert check.status == "repaired"
    assert check.repairs == ("double_encoded",)
    assert json.loads(check.call.arguments) == {"city": "Oslo"}


def test_check_call_schema_problem_is_left_for_the_model():
    check = check_call(call('{"city": "Oslo", "unit": "kelvin"}'), TOOLS)
    assert check.status == "invalid"
    assert check.repairs == ()
    assert "only the model" in check.steps[-1]


def test_check_reply_all_good_is_ok():
    report = check_reply([call('{"city": "Oslo"}')], TOOLS, destructive=["delete_*"])
    assert report.ok
    assert report.held_notice() == ""


def test_check_reply_rejects_bad_tools_up_front():
    with pytest.raises(InputError):
        check_reply([call("{}")], [{"function": {"name": 3}}])


# ---------------------------------------------------------------- model re-ask


def test_repair_request_messages_then_check_the_answer():
    bad = call('{"city": 7, "unit": "kelvin"}')
    problems = validate(bad, TOOLS)
    messages = repair_request_messages(bad, problems, schema=WEATHER["function"]["parameters"])
    assert [m["role"] for m in messages] == ["system", "user"]
    text = messages[1]["content"]
    assert "get_weather" in text
    assert bad.arguments in text
    for problem in problems:
        assert str(problem) in text
    assert '"additionalProperties": false' in text
    # A model's answer with prose and a fence around it is accepted through check_call.
    answer = 'Here is the fix:\n```json\n{"city": "Oslo", "unit": "c"}\n```'
    fixed = check_call(replace(bad, arguments=answer), TOOLS)
    assert fixed.status == "repaired"
    assert json.loads(fixed.call.arguments) == {"city": "Oslo", "unit": "c"}


def test_problem_str_names_the_path():
    assert str(Problem(code="schema", message="bad", path="$.a")) == "$.a: bad"
    assert str(Problem(code="schema", message="bad")) == "bad"
