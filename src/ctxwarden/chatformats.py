"""Chat formats: the tokens a model family's chat template adds around messages and tools.

A :class:`ChatFormat` is bound to a tokenizer (:mod:`ctxwarden.tokenizers`);
:func:`count_messages` counts a whole OpenAI-style request with it. :mod:`ctxwarden.tokens`
re-exports everything public here.

>>> fmt = get_format("openai")
>>> count_messages(fmt.tokenizer, fmt, [{"role": "user", "content": "hello world"}])
9
"""

from __future__ import annotations

import contextlib
import json
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ctxwarden.errors import InputError, TokenizerError
from ctxwarden.tokenizers import Tokenizer, get_tokenizer

__all__ = [
    "CHAT_FORMATS",
    "ChatFormat",
    "count_messages",
    "get_chat_format",
    "get_format",
]


_CONTENT = "\x00"  # stands for a message's content in the skeletons below
_QWEN25_SYSTEM = "You are Qwen, created by Alibaba Cloud. You are a helpful assistant."
_QWEN_TOOLS = (
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>"
    "{tools}\n</tools>\n\nFor each function call, return a json object with function name and "
    'arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{{"name": <function-name>, '
    '"arguments": <args-json-object>}}\n</tool_call>'
)
_LLAMA3_TOOLS = (
    "Environment: ipython\n"
    "Given the following functions, please respond with a JSON for a function call with its proper "
    'arguments that best answers the given prompt.\n\nRespond in the format {{"name": function '
    'name, "parameters": dictionary of argument name and its value}}.Do not use variables.\n\n'
    "{tools}"
)
_MONTHS = ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec")


@dataclass(frozen=True, kw_only=True)
class _Family:
    """The text a chat template wraps around messages; ``\\x00`` marks where content goes."""

    specials: tuple[str, ...]
    message: str  # "{role}" is replaced by the rendered role
    roles: Mapping[str, str] = field(default_factory=dict)  # role -> rendered role
    by_role: Mapping[str, str] = field(default_factory=dict)  # role -> whole skeleton
    prefix: str = ""  # always present (BOS)
    system_block: str = ""  # always present; a first system message goes inside it
    default_system: str = ""  # rendered when there is no system message
    reply: str = ""  # generation prompt
    json_content: frozenset[str] = frozenset()  # roles whose content the template JSON-encodes
    strip_content: bool = False  # the template trims content itself
    tool_call: str = ""  # one assistant tool call: {name} and {arguments}
    tools: str = ""  # the tools block: {tools}
    tool_json_indent: int | None = None


_MISTRAL_SPECIALS = (
    "<s>",
    "</s>",
    "[INST]",
    "[/INST]",
    "[SYSTEM_PROMPT]",
    "[/SYSTEM_PROMPT]",
    "[TOOL_CALLS]",
    "[AVAILABLE_TOOLS]",
    "[/AVAILABLE_TOOLS]",
    "[TOOL_RESULTS]",
    "[/TOOL_RESULTS]",
)
_CHATML = _Family(
    specials=(
        *("<|im_start|>", "<|im_end|>", "<tool_call>", "</tool_call>"),
        *("<tool_response>", "</tool_response>", "<think>", "</think>"),
    ),
    message="<|im_start|>{role}\n\x00<|im_end|>\n",
    by_role={"tool": "<|im_start|>user\n<tool_response>\n\x00\n</tool_response><|im_end|>\n"},
    # Qwen3 renders an empty think block when enable_thinking=False; counted always (4 tokens).
    reply="<|im_start|>assistant\n<think>\n\n</think>\n\n",
    tool_call='\n<tool_call>\n{{"name": "{name}", "arguments": {arguments}}}\n</tool_call>',
    tools="<|im_start|>system\n\n\n" + _QWEN_TOOLS + "<|im_end|>\n",
)
_FAMILIES: dict[str, _Family] = {
    "chatml": _CHATML,
    "qwen2.5": _Family(
        specials=_CHATML.specials,
        message=_CHATML.message,
        by_role=_CHATML.by_role,
        default_system=f"<|im_start|>system\n{_QWEN25_SYSTEM}<|im_end|>\n",
        reply="<|im_start|>assistant\n",
        tool_call=_CHATML.tool_call,
        tools=_CHATML.tools,
    ),
    "llama3": _Family(
        specials=(
            *("<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>"),
            *("<|eot_id|>", "<|eom_id|>", "<|python_tag|>"),
        ),
        message="<|start_header_id|>{role}<|end_header_id|>\n\n\x00<|eot_id|>",
        roles={"tool": "ipython"},
        prefix="<|begin_of_text|>",
        system_block="<|start_header_id|>system<|end_header_id|>\n\n"
        "Cutting Knowledge Date: December 2023\nToday Date: {date}\n\n\x00<|eot_id|>",
        reply="<|start_header_id|>assistant<|end_header_id|>\n\n",
        json_content=frozenset({"tool", "ipython"}),
        strip_content=True,
        tool_call='{{"name": "{name}", "parameters": {arguments}}}',
        tools=_LLAMA3_TOOLS,
        tool_json_indent=4,
    ),
    "gemma": _Family(
        specials=("<bos>", "<start_of_turn>", "<end_of_turn>"),
        message="<start_of_turn>{role}\n\x00<end_of_turn>\n",
        roles={"assistant": "model", "system": "user", "tool": "user"},
        prefix="<bos>",
        reply="<start_of_turn>model\n",
        strip_content=True,
        tool_call='\n{{"name": "{name}", "arguments": {arguments}}}',
        tools="\n\n{tools}\n\n",
    ),
    "mistral": _Family(
        specials=_MISTRAL_SPECIALS,
        message="[INST] \x00 [/INST]",
        by_role={
            "assistant": " \x00</s>",
            "system": "[SYSTEM_PROMPT] \x00 [/SYSTEM_PROMPT]",
            "tool": '[TOOL_RESULTS] {"content": \x00, "call_id": "a1b2c3d4e"}[/TOOL_RESULTS]',
        },
        prefix="<s>",
        json_content=frozenset({"tool"}),
        strip_content=True,
        tool_call='[TOOL_CALLS] [{{"name": "{name}", "arguments": {arguments}, '
        '"id": "a1b2c3d4e"}}]',
        tools="[AVAILABLE_TOOLS] {tools}[/AVAILABLE_TOOLS]",
    ),
}
# gpt-oss (harmony): the system message the template always renders goes in the prefix; a
# caller's system prompt becomes a developer message. Exact for text conversations (tested
# against openai-harmony's renderer); upper bounds with tools: tool results are charged a long
# function name, tool schemas as JSON (the template's TypeScript form is shorter), and the
# system message's line about tools is counted with the tools block.
_HARMONY_SYSTEM = (
    "<|start|>system<|message|>You are ChatGPT, a large language model trained by OpenAI.\n"
    "Knowledge cutoff: 2024-06\nCurrent date: 2026-11-25\n\nReasoning: medium\n\n"
    "# Valid channels: analysis, commentary, final. Channel must be included for every message."
    "<|end|>"
)
_FAMILIES["harmony"] = _Family(
    specials=(
        *("<|start|>", "<|message|>", "<|end|>", "<|channel|>"),
        *("<|constrain|>", "<|call|>", "<|return|>"),
    ),
    message="<|start|>{role}<|message|>\x00<|end|>",
    by_role={
        "system": "<|start|>developer<|message|># Instructions\n\n\x00<|end|>",
        "developer": "<|start|>developer<|message|># Instructions\n\n\x00<|end|>",
        "assistant": "<|start|>assistant<|channel|>final<|message|>\x00<|end|>",
        "tool": "<|start|>functions.a_long_function_name to=assistant<|channel|>commentary"
        "<|message|>\x00<|end|>",
    },
    prefix=_HARMONY_SYSTEM,
    reply="<|start|>assistant",
    tool_call="<|start|>assistant<|channel|>commentary to=functions.{name} <|constrain|>json"
    "<|message|>{arguments}<|call|>",
    tools="\nCalls to these tools must go to the commentary channel: 'functions'."
    "<|start|>developer<|message|># Tools\n\n## functions\n\nnamespace functions {{\n\n"
    "{tools}\n\n}} // namespace functions<|end|>",
    tool_json_indent=2,
)
CHAT_FORMATS: tuple[str, ...] = ("openai", *_FAMILIES)
# The OpenAI cookbook rule (num_tokens_from_messages) for gpt-3.5/4/4o-era chat models.
_OPENAI_PER_MESSAGE = 3
_OPENAI_PER_NAME = 1
_OPENAI_REPLY = 3
# Estimates for what the cookbook does not cover (tool schemas, tool calls): see tools_tokens.
_OPENAI_TOOLS_FIXED = 20
_OPENAI_PER_TOOL = 10
_OPENAI_PER_TOOL_CALL = 10


def _count_with_specials(tokenizer: Tokenizer, text: str, specials: Sequence[str]) -> int:
    """Count ``text`` with each special-token string costing 1, as a real template render does."""
    if not specials:
        return tokenizer.count(text)
    pattern = re.compile("|".join(re.escape(s) for s in sorted(specials, key=len, reverse=True)))
    total = 0
    pos = 0
    for match in pattern.finditer(text):
        total += tokenizer.count(text[pos : match.start()]) + 1
        pos = match.end()
    return total + tokenizer.count(text[pos:])


def _arguments_variants(arguments: Any) -> list[str]:
    """Renderings of tool-call arguments a server may use: as sent, and re-dumped from JSON."""
    if not isinstance(arguments, str):
        return [json.dumps(arguments, ensure_ascii=False)]
    variants = [arguments]
    with contextlib.suppress(ValueError):
        variants.append(json.dumps(json.loads(arguments), ensure_ascii=False))
    return variants


@dataclass(frozen=True, kw_only=True)
class ChatFormat:
    """How one model family's chat template adds tokens around messages, bound to a tokenizer.

    Get one with :func:`get_chat_format`. Overheads assume content stripped of surrounding
    whitespace (the engine strips at ingest). For the template families (chatml, qwen2.5, llama3)
    ``sum(count(content) + message_overhead) + request_overhead`` equals the token count of the
    real rendered template, or exceeds it by a few tokens (tests/test_tokens.py states the bound);
    openai follows the OpenAI cookbook; gemma and mistral are upper bounds.

    >>> fmt = get_chat_format("chatml", get_tokenizer("qwen"))
    >>> fmt.message_overhead("user"), fmt.request_overhead(has_system=False)
    (5, 7)
    """

    name: str
    tokenizer: Tokenizer
    _memo: dict[tuple[Any, ...], int] = field(default_factory=dict, compare=False, repr=False)

    @property
    def _family(self) -> _Family:
        return _FAMILIES[self.name]

    def _specials(self) -> tuple[str, ...]:
        # SentencePiece v1 has no control tokens for [INST] and friends: they are plain text.
        if self.name == "mistral" and self.tokenizer.name == "mistral-sp-v1":
            return ("<s>", "</s>")
        return self._family.specials

    def _skeleton_count(self, text: str) -> int:
        return _count_with_specials(self.tokenizer, text.replace(_CONTENT, ""), self._specials())

    def _memoized(self, key: tuple[Any, ...], compute: Callable[[], int]) -> int:
        value = self._memo.get(key)
        if value is None:
            value = compute()
            self._memo[key] = value  # a dict store is atomic; racing threads compute the same
        return value

    def _skeleton(self, role: str) -> str:
        family = self._family
        if role in family.by_role:
            return family.by_role[role]
        return family.message.replace("{role}", family.roles.get(role, role))

    def message_overhead(self, role: str, *, name: str | None = None) -> int:
        """Tokens a message of ``role`` adds beyond ``tokenizer.count(content_text(...))``.

        ``name`` counts only for openai (the cookbook's +1 plus the name's tokens); the other
        templates drop it.
        """
        if self.name == "openai":
            base = self._memoized(
                ("msg", role), lambda: _OPENAI_PER_MESSAGE + self.tokenizer.count(role)
            )
            return base + (self.tokenizer.count(name) + _OPENAI_PER_NAME if name else 0)
        return self._memoized(("msg", role), lambda: self._skeleton_count(self._skeleton(role)))

    def request_overhead(self, *, has_system: bool) -> int:
        """Tokens a request adds once: BOS, injected system text, the reply priming.

        ``has_system`` is whether the first message is a system message (templates inject a
        default system prompt or header otherwise).
        """
        if self.name == "openai":
            return _OPENAI_REPLY
        return self._memoized(("req", has_system), lambda: self._request_overhead(has_system))

    def _request_overhead(self, has_system: bool) -> int:
        family = self._family
        total = self._skeleton_count(family.prefix + family.reply)
        if family.system_block:
            # Llama 3.1+ always renders the system header with the knowledge-date lines; a first
            # system message sits inside it, so its own message_overhead is taken back out. The
            # date is today's in Llama 3.2/3.3: take the most expensive one.
            block = max(
                self._skeleton_count(family.system_block.replace("{date}", f"{d} {m} {y}"))
                for d in ("01", "26", "31")
                for m in _MONTHS
                for y in ("2024", "2025", "2026", "2027", "2028", "2029", "2030")
            )
            total += block - (self.message_overhead("system") if has_system else 0)
        elif not has_system and family.default_system:
            total += self._skeleton_count(family.default_system)
        return total

    def content_text(self, role: str, content: str) -> str:
        """The text the template puts in the prompt for ``content``: count this, not content.

        It is ``content`` itself except where a template transforms it: llama3 and mistral
        JSON-encode tool results; llama3, gemma and mistral trim.
        """
        family = self._family if self.name != "openai" else None
        if family is None:
            return content
        if family.strip_content and role not in family.json_content:
            content = content.strip()
        if role in family.json_content:
            return json.dumps(content, ensure_ascii=False)
        return content

    def message_tokens(self, role: str, content: str, *, name: str | None = None) -> int:
        """``count(content_text(role, content)) + message_overhead(role, name=name)``."""
        text = self.content_text(role, content)
        return self.tokenizer.count(text) + self.message_overhead(role, name=name)

    def tool_call_tokens(self, name: str, arguments: Any) -> int:
        """Tokens one assistant tool call adds (function name plus arguments JSON)."""
        if self.name == "openai":
            worst = max(self.tokenizer.count(a) for a in _arguments_variants(arguments))
            return self.tokenizer.count(name) + worst + _OPENAI_PER_TOOL_CALL
        template = self._family.tool_call
        return max(
            self._skeleton_count(template.format(name=name, arguments=a))
            for a in _arguments_variants(arguments)
        )

    def tools_tokens(self, tokenizer: Tokenizer, tools: Sequence[Mapping[str, Any]]) -> int:
        """Tokens the tool schemas add to a request (0 for no tools).

        Template families render the tools as their template does (an upper bound by a few
        tokens). OpenAI renders schemas in an undocumented TypeScript-like form; the estimate
        here is the compact JSON of each function plus 10 tokens per tool and 20 per request,
        which is more than that rendering (JSON repeats "type"/"properties" keys and quotes).
        """
        if not tools:
            return 0
        if self.name == "openai":
            total = _OPENAI_TOOLS_FIXED
            for tool in tools:
                function = tool.get("function", tool)
                text = json.dumps(function, ensure_ascii=False, separators=(",", ":"))
                total += tokenizer.count(text) + _OPENAI_PER_TOOL
            return total
        family = self._family
        if self.name == "mistral":
            rendered = json.dumps(list(tools), ensure_ascii=False)
        else:
            indent = family.tool_json_indent
            parts = [json.dumps(t, ensure_ascii=False, indent=indent) for t in tools]
            rendered = (
                "".join(f"{p}\n\n" for p in parts) if indent else "".join(f"\n{p}" for p in parts)
            )
        return _count_with_specials(
            tokenizer, family.tools.format(tools=rendered), self._specials()
        )


_formats: dict[tuple[str, str, int], ChatFormat] = {}


def get_chat_format(name: str, tokenizer: Tokenizer) -> ChatFormat:
    """The chat format ``name`` (one of ``CHAT_FORMATS``) bound to ``tokenizer``; cached.

    >>> get_chat_format("openai", get_tokenizer("o200k_base")).message_overhead("user")
    4
    """
    key = name.strip().lower() if isinstance(name, str) else ""
    if key not in CHAT_FORMATS:
        raise TokenizerError(f"unknown chat format {name!r}: known are {', '.join(CHAT_FORMATS)}")
    cache_key = (key, tokenizer.name, id(tokenizer))
    fmt = _formats.get(cache_key)
    if fmt is None:
        fmt = _formats.setdefault(cache_key, ChatFormat(name=key, tokenizer=tokenizer))
    return fmt


_DEFAULT_FORMAT_TOKENIZER = {
    "openai": "o200k_base",
    "chatml": "qwen",
    "qwen2.5": "qwen",
    "llama3": "llama3",
    "gemma": "gemma3",
    "mistral": "mistral-tekken",
    "harmony": "o200k_harmony",
}


def get_format(name: str, tokenizer: Tokenizer | None = None) -> ChatFormat:
    """:func:`get_chat_format`, with the family's usual tokenizer when none is given.

    Pass the model's tokenizer where it can differ from the family default: Mistral's
    SentencePiece v1 (7B v0.1/v0.2, Mixtral 8x7B) spells ``[INST]`` as plain text.
    """
    key = name.strip().lower() if isinstance(name, str) else ""
    if tokenizer is None:
        if key not in _DEFAULT_FORMAT_TOKENIZER:
            raise TokenizerError(
                f"unknown chat format {name!r}: known are {', '.join(CHAT_FORMATS)}"
            )
        tokenizer = get_tokenizer(_DEFAULT_FORMAT_TOKENIZER[key])
    return get_chat_format(key, tokenizer)


def _content_of(message: Mapping[str, Any], index: int) -> str:
    content = message.get("content")
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, Sequence):
        texts = []
        for part in content:
            if not isinstance(part, Mapping) or part.get("type") != "text":
                kind = part.get("type") if isinstance(part, Mapping) else type(part).__name__
                raise TokenizerError(
                    f"messages[{index}].content: cannot count a part of type {kind!r}; "
                    "only text parts can be counted"
                )
            texts.append(str(part.get("text", "")))
        # Servers join text parts with newlines before templating (vLLM does).
        return "\n".join(texts)
    raise InputError(
        f"must be a string or a list of parts, not {type(content).__name__}",
        field=f"messages[{index}].content",
    )


def count_messages(
    tokenizer: Tokenizer,
    fmt: ChatFormat,
    messages: Sequence[Mapping[str, Any]],
    tools: Sequence[Mapping[str, Any]] = (),
) -> int:
    """Tokens a whole OpenAI-style chat request costs the model, reply priming included.

    Messages may carry ``name``, assistant ``tool_calls`` (``{"function": {"name", "arguments"}}``),
    role ``tool`` with ``tool_call_id``, and content as a string or a list of text parts.

    >>> tok = get_tokenizer("o200k_base")
    >>> count_messages(tok, get_chat_format("openai", tok), [{"role": "user", "content": "hi"}])
    8
    """
    if fmt.tokenizer.name != tokenizer.name:
        raise TokenizerError(
            f"chat format is bound to '{fmt.tokenizer.name}' but counting with "
            f"'{tokenizer.name}': use get_chat_format(name, tokenizer)"
        )
    has_system = bool(messages) and messages[0].get("role") == "system"
    total = fmt.request_overhead(has_system=has_system) + fmt.tools_tokens(tokenizer, tools)
    for index, message in enumerate(messages):
        role = message.get("role")
        if not isinstance(role, str) or not role:
            raise InputError("must be a non-empty string", field=f"messages[{index}].role")
        name = message.get("name")
        total += fmt.message_tokens(role, _content_of(message, index), name=name or None)
        for call_index, call in enumerate(message.get("tool_calls") or ()):
            function = call.get("function") if isinstance(call, Mapping) else None
            if not isinstance(function, Mapping) or not isinstance(function.get("name"), str):
                raise InputError(
                    "must be {'function': {'name': str, 'arguments': str}}",
                    field=f"messages[{index}].tool_calls[{call_index}]",
                )
            total += fmt.tool_call_tokens(function["name"], function.get("arguments", "{}"))
    if fmt.name == "chatml" and messages and messages[-1].get("role") == "assistant":
        # Qwen3 adds an empty think block to a trailing assistant message as well.
        total += fmt._skeleton_count("<think>\n\n</think>\n\n")
    return total
