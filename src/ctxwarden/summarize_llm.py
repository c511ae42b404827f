"""The LLM summariser, made safe: structured output under a schema, checked against the facts.

:class:`LLMSummarizer` asks a model behind an OpenAI-compatible chat endpoint for the JSON object
of a :class:`~ctxwarden.summary.Summary`. Its reply has to pass, in order:

1. **The schema** (:func:`summary_schema`, checked with ``jsonschema`` after deterministic repairs:
   :func:`ctxwarden.jsonrepair.repair_json`, extra keys dropped, a string where a list belongs
   made a list). Where the server supports it the same schema constrains decoding, so the model
   cannot write anything else (``structured_output``, below).
2. **No echo of the prompt**: a line holding a placeholder such as ``<people, teams, projects
   named>`` or a field's description is the template, not a summary.
3. **The facts**: every fact sentence that the extractive summary of the same items within the same
   ``max_tokens`` keeps (:class:`~ctxwarden.summarize.ExtractiveSummarizer`) must keep its values
   (numbers, times, names; a caseless-script sentence whole), and cite its message's ``[id]``.
4. **The length**: the rendered summary counts at most ``max_tokens``.

A rejected reply is answered with what was wrong and asked again, up to ``retries`` times; a
summary that passed everything but the length is then truncated (and kept only if the facts
survive). Otherwise :class:`~ctxwarden.errors.SummarizeError` is raised with a ``reason`` code
(``invalid``, ``echo``, ``lost_facts``, ``dropped_ids``, ``timeout``, ``upstream``): never a
placeholder. Compaction then falls back to the extractive summary for that cluster and says so.

``structured_output`` picks the request field:

- ``"json_schema"``: ``response_format={"type": "json_schema", "json_schema": {"name",
  "strict", "schema"}}`` (OpenAI, llama.cpp's ``llama-server``, vLLM, Ollama);
- ``"json_object_schema"``: ``response_format={"type": "json_object", "schema": ...}``
  (llama-cpp-python's server and ``llama-server``: a grammar built from the schema);
- ``"json_object"``: JSON mode without a schema; ``"off"``: no ``response_format`` at all;
- ``"auto"`` (default): the first of these the server accepts; a 400 or 422 answer moves to the
  next one (so does an error status whose message names ``response_format``, as
  llama-cpp-python's 500 does), and the one that worked is kept for later calls.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Literal

import jsonschema

from ctxwarden.errors import (
    ConfigError,
    InputError,
    SummarizeError,
    UpstreamError,
    UpstreamTimeoutError,
)
from ctxwarden.jsonrepair import repair_json
from ctxwarden.summarize import ExtractiveSummarizer
from ctxwarden.summary import (
    LIST_FIELDS,
    Summary,
    SummaryItem,
    TokenCounter,
    _check_inputs,
    _source_ids,
    _time_range,
    truncate_summary,
)
from ctxwarden.types import format_time

__all__ = ["STRUCTURED_OUTPUTS", "LLMSummarizer", "SummaryOutcome", "summary_schema"]

logger = logging.getLogger(__name__)

StructuredOutput = Literal["auto", "json_schema", "json_object_schema", "json_object", "off"]
#: The ``structured_output`` choices; ``auto`` tries the others in this order.
STRUCTURED_OUTPUTS: tuple[str, ...] = (
    "auto",
    "json_schema",
    "json_object_schema",
    "json_object",
    "off",
)

_SYSTEM_PROMPT = (
    "You write structured summaries of chat logs. You answer with one JSON object and nothing "
    "else: no code fence, no comments, no prose."
)
#: What each field holds, as the prompt says it (prose, no placeholders to copy).
_FIELD_HINTS = {
    "key_entities": "the people, teams, projects and systems the messages name",
    "main_events": "what happened, one short sentence each, starting with the [id] of its message",
    "decisions": "what was decided or changed, with the value now in force, starting with [id]",
    "open_loops": "questions and tasks left open, starting with [id]",
    "spam_patterns": "repeated or automated messages, as 'author xN: what they say'",
}
_FIELDS_TEXT = "\n".join(f'- "{name}": {hint}' for name, hint in _FIELD_HINTS.items())
#: A placeholder: words in angle brackets (``<what happened>``), as templates write them.
_PLACEHOLDER = re.compile(r"<[^<>\n]*[A-Za-z][^<>\n]*\s[^<>\n]*>")
_CITED = re.compile(r"\[([^\[\]]+)\]")
_RETRY_STATUSES = (400, 422)  # a server that does not know the structured-output field


def summary_schema(max_items: int = 50) -> dict[str, Any]:
    """The JSON Schema of a model's summary reply: the five lists of strings, nothing else.

    ``time_range`` and ``source_ids`` are not asked for: they come from the inputs.

    >>> sorted(summary_schema()["required"])
    ['decisions', 'key_entities', 'main_events', 'open_loops', 'spam_patterns']
    """
    if max_items < 1:
        raise InputError("must be 1 or more", field="max_items")
    strings = {"type": "array", "items": {"type": "string"}, "maxItems": max_items}
    return {
        "type": "object",
        "properties": {name: dict(strings) for name in LIST_FIELDS},
        "required": list(LIST_FIELDS),
        "additionalProperties": False,
    }


@dataclass(frozen=True, kw_only=True)
class SummaryOutcome:
    """A summary and how it was had: model calls made, deterministic repairs applied (JSON
    repairs, ``extra_keys_dropped``, ``string_as_list``), whether it was re-asked after an
    invalid reply, re-asked to shorten, truncated as the last resort, each rejected reply's
    ``"code: what was wrong"`` and the ``structured_output`` the server took."""

    summary: Summary
    calls: int
    repairs: tuple[str, ...]
    reasked_invalid: bool
    reasked_shorter: bool
    truncated: bool
    rejections: tuple[str, ...] = ()
    structured_output: str = "off"


def _normal(text: str) -> str:
    return " ".join(text.split()).casefold()


class LLMSummarizer:
    """Summaries written by a model behind an OpenAI-compatible chat endpoint (see the module doc).

    ``client`` is an :class:`ctxwarden.llm.LLMClient` (anything with its ``chat`` method); its
    timeout and API key are the client's. ``retries`` is how many times a rejected reply is
    asked again (0: never). After ``give_up_after`` server failures in a row (timeouts, error
    statuses) the server is not asked for ``pause_seconds``: every call fails at once with
    reason ``unavailable`` (so a compaction run does not wait out the timeout per cluster).
    ``keep_facts`` turns the fact check (step 3) off for callers that want the model's own
    choice. ``source_ids`` and ``time_range`` are set from the inputs (the model's are not
    trusted).

    >>> LLMSummarizer(object(), structured_output="xml")
    Traceback (most recent call last):
    ...
    ctxwarden.errors.ConfigError: summarizer.structured_output: 'xml' is not one of auto, \
json_schema, json_object_schema, json_object, off
    """

    def __init__(
        self,
        client: Any,
        model: str | None = None,
        *,
        structured_output: StructuredOutput = "auto",
        retries: int = 2,
        keep_facts: bool = True,
        temperature: float = 0.0,
        max_message_chars: int = 2000,
        give_up_after: int = 3,
        pause_seconds: float = 300.0,
    ) -> None:
        if structured_output not in STRUCTURED_OUTPUTS:
            raise ConfigError(
                f"summarizer.structured_output: {structured_output!r} is not one of "
                + ", ".join(STRUCTURED_OUTPUTS)
            )
        if isinstance(retries, bool) or not isinstance(retries, int) or retries < 0:
            raise ConfigError(f"summarizer.retries: {retries!r} must be 0 or more")
        self.client = client
        self.model = model
        self.structured_output = structured_output
        self.retries = retries
        self.keep_facts = keep_facts
        self.temperature = temperature
        self.max_message_chars = max_message_chars
        self.give_up_after = give_up_after
        self.pause_seconds = pause_seconds
        # consecutive server failures (timeouts, errors), and until when the server is skipped
        self._failures = 0
        self._paused_until = 0.0
        # auto: the modes still to try, the first being the one in use
        self._modes = (
            list(STRUCTURED_OUTPUTS[1:]) if structured_output == "auto" else [structured_output]
        )

    def summarize(
        self, items: Sequence[SummaryItem], *, max_tokens: int, tokenizer: TokenCounter
    ) -> Summary:
        """Summarise ``items``; the rendered result counts at most ``max_tokens``."""
        return self.summarize_detailed(items, max_tokens=max_tokens, tokenizer=tokenizer).summary

    def summarize_detailed(
        self, items: Sequence[SummaryItem], *, max_tokens: int, tokenizer: TokenCounter
    ) -> SummaryOutcome:
        """Like :meth:`summarize`, and say how the summary was had."""
        _check_inputs(items, max_tokens)
        required = self._required_facts(items, max_tokens, tokenizer) if self.keep_facts else []
        schema = summary_schema(max(8, len(items) + 4))
        messages: list[dict[str, str]] = [
            {"role": "system", "content": _SYSTEM_PROMPT},
            {"role": "user", "content": self._request(items, max_tokens, required)},
        ]
        calls = 0
        repairs: list[str] = []
        rejections: list[str] = []
        reasked_invalid = reasked_shorter = False
        fitting_but_long: Summary | None = None
        code = ""
        for attempt in range(self.retries + 1):
            text = self._ask(messages, max_tokens, schema)
            calls += 1
            summary, error = self._read(text, items, repairs, schema)
            if summary is None:
                code, detail = "invalid", error
                ask = (
                    f"That reply is not valid: {error}. Reply again with only the JSON object, "
                    f"with exactly these fields, each a list of strings:\n{_FIELDS_TEXT}"
                )
            else:
                problems = self._problems(summary, items, required)
                size = tokenizer.count(summary.render())
                if not problems and size <= max_tokens:
                    return SummaryOutcome(
                        summary=summary, calls=calls, repairs=tuple(dict.fromkeys(repairs)),
                        reasked_invalid=reasked_invalid, reasked_shorter=reasked_shorter,
                        truncated=False, rejections=tuple(rejections),
                        structured_output=self._modes[0],
                    )  # fmt: skip
                if problems:
                    code, detail = problems[0][0], "; ".join(p for _, p in problems)
                    ask = (
                        f"That summary is rejected: {detail}. Write it again from the messages, "
                        "keeping every fact listed, with its [id]. Reply with only the JSON object."
                    )
                else:
                    fitting_but_long = summary
                    code, detail = "too_long", f"{size} tokens, the limit is {max_tokens}"
                    ask = (
                        f"That summary is {size} tokens long; the limit is {max_tokens}. "
                        "Shorten it: fewer and shorter list items, keep names, numbers, dates "
                        "and [id]s exactly. Reply with only the JSON object."
                    )
            rejections.append(f"{code}: {detail}")
            logger.info("summary reply %d rejected: %s: %s", calls, code, detail)
            if attempt < self.retries:
                reasked_invalid = reasked_invalid or code == "invalid"
                reasked_shorter = reasked_shorter or code == "too_long"
                messages += [
                    {"role": "assistant", "content": text},
                    {"role": "user", "content": ask},
                ]
        if fitting_but_long is not None:
            cut = truncate_summary(fitting_but_long, max_tokens=max_tokens, tokenizer=tokenizer)
            problems = self._problems(cut, items, required)
            if not problems:
                logger.warning(
                    "summary of %d items truncated to fit %d tokens after the model's shortening",
                    len(items),
                    max_tokens,
                )
                return SummaryOutcome(
                    summary=cut, calls=calls, repairs=tuple(dict.fromkeys(repairs)),
                    reasked_invalid=reasked_invalid, reasked_shorter=reasked_shorter,
                    truncated=True, rejections=tuple(rejections),
                    structured_output=self._modes[0],
                )  # fmt: skip
            code = problems[0][0]
            rejections.append(f"{code} after truncation: " + "; ".join(p for _, p in problems))
        raise SummarizeError(
            f"the model's summary was rejected {calls} time(s): {' | '.join(rejections)}; "
            "raise summarizer_retries, use a stronger model or the extractive summarizer",
            reason=code,
        )

    # -- steps

    @staticmethod
    def _required_facts(
        items: Sequence[SummaryItem], max_tokens: int, tokenizer: TokenCounter
    ) -> list[tuple[str, str, tuple[str, ...]]]:
        """The facts the extractive summary of ``items`` within ``max_tokens`` keeps."""
        extractive = ExtractiveSummarizer()
        facts = extractive.facts(items)
        if not facts:
            return []
        try:
            text = _normal(
                extractive.summarize(items, max_tokens=max_tokens, tokenizer=tokenizer).render()
            )
        except SummarizeError:
            return []
        return [fact for fact in facts if all(_normal(v) in text for v in fact[2])]

    @staticmethod
    def _problems(
        summary: Summary,
        items: Sequence[SummaryItem],
        required: Sequence[tuple[str, str, tuple[str, ...]]],
    ) -> list[tuple[str, str]]:
        """What is wrong with a valid summary, as ``(code, message)``: echo, lost facts, ids."""
        lines = [line for name in LIST_FIELDS for line in getattr(summary, name)]
        inputs = _normal(" ".join(item.content for item in items))
        out: list[tuple[str, str]] = []
        echoed = []
        for line in lines:
            placeholders = [p for p in _PLACEHOLDER.findall(line) if _normal(p) not in inputs]
            # a field's description: its first five words, which no chat line says
            hints = [
                h
                for h in _FIELD_HINTS.values()
                if " ".join(_normal(h).split()[:5]) in _normal(line)
            ]
            if placeholders or hints:
                echoed.append((placeholders + hints)[0])
        if echoed:
            out.append(("echo", f"it repeats the template ({echoed[0]!r}) instead of the messages"))
        text = _normal(summary.render())
        lost = [
            (id_, s) for id_, s, values in required if not all(_normal(v) in text for v in values)
        ]
        if lost:
            shown = "; ".join(f"[{i}] {s}" for i, s in lost[:5])
            more = f" and {len(lost) - 5} more" if len(lost) > 5 else ""
            out.append(("lost_facts", f"it loses {len(lost)} fact(s): {shown}{more}"))
        cited = {
            part.strip()
            for line in lines
            for group in _CITED.findall(line)
            for part in group.split(",")
        }
        dropped = [i for i in dict.fromkeys(id_ for id_, _, _ in required) if i not in cited]
        if dropped:
            out.append(
                ("dropped_ids", "it does not cite the ids of facts it keeps: " + ", ".join(dropped))
            )
        return out

    def _request(
        self,
        items: Sequence[SummaryItem],
        max_tokens: int,
        required: Sequence[tuple[str, str, tuple[str, ...]]],
    ) -> str:
        lines = []
        for item in items:
            when = format_time(item.created_at, precision="minutes") if item.created_at else ""
            where = f"#{item.channel}" if item.channel else ""
            who = f"{item.author}:" if item.author else ""
            content = " ".join(item.content.split())
            if len(content) > self.max_message_chars:
                content = content[: self.max_message_chars] + " ..."
            head = " ".join(part for part in (f"[{item.id}]", when, where, who) if part)
            lines.append(f"{head} {content}")
        words = max(10, int(max_tokens * 0.6))
        keep = ""
        if required:
            keep = (
                "\nThese facts must stay, with their [id] and their names, numbers, dates and "
                "times exactly as written:\n"
                + "\n".join(f"- [{id_}] {sentence}" for id_, sentence, _ in required)
                + "\n"
            )
        return (
            f"Summarise these {len(items)} messages as one JSON object with these fields, each "
            f"a list of strings ([] when there is nothing):\n{_FIELDS_TEXT}\n"
            "Write about the messages below, never these descriptions. Keep names, numbers, "
            f"dates and final values exactly as written. The whole summary must stay under "
            f"{max_tokens} tokens (about {words} words).\n{keep}\nMessages:\n" + "\n".join(lines)
        )

    def _ask(
        self, messages: Sequence[Mapping[str, str]], max_tokens: int, schema: Mapping[str, Any]
    ) -> str:
        if self._paused_until > time.monotonic():
            # A server that timed out or failed give_up_after times in a row is not asked for
            # every cluster of a run (each would wait out the timeout): each falls back at once.
            raise SummarizeError(
                f"the summariser's model server failed {self._failures} times in a row; not "
                f"asked again for {self.pause_seconds:g}s",
                reason="unavailable",
            )
        try:
            text = self._chat(messages, max_tokens, schema)
        except SummarizeError as exc:
            self._failures += 1
            if self.give_up_after and self._failures >= self.give_up_after:
                self._paused_until = time.monotonic() + self.pause_seconds
            raise exc from exc.__cause__
        self._failures = 0
        return text

    def _chat(
        self, messages: Sequence[Mapping[str, str]], max_tokens: int, schema: Mapping[str, Any]
    ) -> str:
        while True:
            mode = self._modes[0]
            try:
                result = self.client.chat(
                    messages,
                    model=self.model,
                    temperature=self.temperature,
                    # Room for the JSON syntax and the ids around a summary of max_tokens; no
                    # more (a small model under a grammar may write until the cap).
                    max_tokens=max_tokens * 3 // 2 + 64,
                    response_format=_response_format(mode, schema),
                )
            except UpstreamTimeoutError as exc:
                raise SummarizeError(
                    f"the summariser's model server sent no answer in time: {exc}; raise "
                    "summarizer_timeout or use a faster model",
                    reason="timeout",
                ) from exc
            except UpstreamError as exc:
                status = getattr(exc, "status", None)
                # 400 or 422; llama-cpp-python's server answers 500 with a validation error
                refused = status in _RETRY_STATUSES or (
                    status is not None and "response_format" in str(exc)
                )
                if refused and len(self._modes) > 1:
                    # The server does not take this structured-output field: the next one.
                    logger.info("structured output %r refused (%s); trying the next", mode, status)
                    self._modes.pop(0)
                    continue
                raise SummarizeError(
                    f"the summariser's model server failed: {exc}", reason="upstream"
                ) from exc
            text = result.text
            if not isinstance(text, str) or not text.strip():
                return ""
            return text

    @staticmethod
    def _read(
        text: str, items: Sequence[SummaryItem], repairs: list[str], schema: Mapping[str, Any]
    ) -> tuple[Summary | None, str]:
        """Repair and validate one reply: (summary, "") or (None, what is wrong)."""
        if not text:
            return None, "the reply is empty"
        fixed = repair_json(text)
        if not fixed.ok:
            return None, f"the reply is not JSON ({fixed.error})"
        data = fixed.value
        if not isinstance(data, dict):
            return None, f"the reply is a JSON {type(data).__name__}, not an object"
        found = list(fixed.repairs)
        missing = [name for name in LIST_FIELDS if name not in data]
        if missing:
            return None, f"field(s) missing: {', '.join(missing)}"
        time_range = data.get("time_range")
        if set(data) - set(LIST_FIELDS) - {"time_range", "source_ids"}:
            found.append("extra_keys_dropped")
        data = {name: data[name] for name in LIST_FIELDS}
        for name in LIST_FIELDS:
            if isinstance(data[name], str):
                found.append("string_as_list")
                data[name] = [data[name]] if data[name].strip() else []
        error = next(iter(jsonschema.Draft202012Validator(schema).iter_errors(data)), None)
        if error is not None:
            where = "".join(
                f"[{p}]" if isinstance(p, int) else (f".{p}" if i else str(p))
                for i, p in enumerate(error.absolute_path)
            )
            return None, f"{where or 'reply'}: {error.message}"
        try:
            summary = Summary.from_mapping(data)
        except InputError as exc:
            return None, str(exc)
        known = _time_range(items)
        if known is None and time_range is not None:
            try:
                known = Summary.from_mapping({"time_range": time_range}).time_range
            except InputError:
                found.append("time_range_dropped")
        repairs.extend(found)
        return replace(summary, time_range=known, source_ids=_source_ids(items)), ""


def _response_format(mode: str, schema: Mapping[str, Any]) -> dict[str, Any] | None:
    if mode == "json_schema":
        return {
            "type": "json_schema",
            "json_schema": {"name": "summary", "strict": True, "schema": dict(schema)},
        }
    if mode == "json_object_schema":
        return {"type": "json_object", "schema": dict(schema)}
    if mode == "json_object":
        return {"type": "json_object"}
    return None
