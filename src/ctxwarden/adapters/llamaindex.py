"""LlamaIndex: a ``BaseMemory`` backed by ctxwarden (``ctxwarden[llamaindex]``).

:class:`CtxwardenMemory` holds one conversation (tenant, end user, session); pass it as an
agent's ``memory=`` (``FunctionAgent``, ``ReActAgent``, ``AgentWorkflow``: ``await
agent.run(user_msg, memory=memory)``). ``get()`` returns the conversation fitted into an exact
token budget for the model's tokenizer, with related memory of the scope and the question last
(the agent adds its in-turn scratchpad of tool calls after it: leave room for it in
``budget``); ``get_all()`` the whole stored conversation; ``put``/``put_messages`` append turns;
``set`` makes the stored conversation the given one; ``reset`` erases it (tombstones stay).

>>> from ctxwarden import Engine
>>> from llama_index.core.llms import ChatMessage
>>> engine = Engine.open(":memory:")
>>> memory = CtxwardenMemory.from_defaults(engine=engine, session="s1", user="alice")
>>> memory.put(ChatMessage(role="user", content="hello"))
>>> [m.content for m in memory.get_all()]
['hello']
>>> engine.close()
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from ctxwarden.extras import require

require("llamaindex")

from llama_index.core.base.llms.types import (  # noqa: E402
    ChatMessage,
    MessageRole,
    TextBlock,
    ToolCallBlock,
)
from llama_index.core.memory.types import BaseMemory  # noqa: E402
from pydantic import PrivateAttr  # noqa: E402

from ctxwarden.adapters.conversation import Conversation  # noqa: E402
from ctxwarden.engine import Engine  # noqa: E402
from ctxwarden.types import Context, Scope  # noqa: E402

__all__ = ["CtxwardenMemory", "from_openai", "to_openai"]

_ROLES = {"developer": "system", "function": "tool", "chatbot": "assistant", "model": "assistant"}


def _arguments(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


def to_openai(message: ChatMessage) -> dict[str, Any]:
    """A LlamaIndex chat message as an OpenAI-shaped dict (tool-call blocks as ``tool_calls``,
    ``additional_kwargs["tool_call_id"]`` as ``tool_call_id``)."""
    role = str(message.role.value if isinstance(message.role, MessageRole) else message.role)
    role = _ROLES.get(role, role)
    text = "".join(b.text for b in message.blocks if isinstance(b, TextBlock))
    out: dict[str, Any] = {"role": role, "content": text}
    calls = [
        {
            "id": block.tool_call_id or "",
            "type": "function",
            "function": {"name": block.tool_name, "arguments": _arguments(block.tool_kwargs)},
        }
        for block in message.blocks
        if isinstance(block, ToolCallBlock)
    ]
    for raw in message.additional_kwargs.get("tool_calls") or ():
        if isinstance(raw, Mapping) and isinstance(raw.get("function"), Mapping):
            calls.append(dict(raw))  # an OpenAI-style call kept by some LLM integrations
    if calls:
        out["tool_calls"] = calls
    if message.additional_kwargs.get("tool_call_id"):
        out["tool_call_id"] = str(message.additional_kwargs["tool_call_id"])
    return out


def from_openai(message: Mapping[str, Any]) -> ChatMessage:
    """An OpenAI-shaped dict (a fitted context's message) as a LlamaIndex chat message."""
    blocks: list[Any] = []
    if message.get("content"):
        blocks.append(TextBlock(text=str(message["content"])))
    for call in message.get("tool_calls") or ():
        function = call.get("function") or {}
        try:
            arguments: Any = json.loads(function.get("arguments") or "{}")
        except ValueError:
            arguments = function.get("arguments") or ""
        blocks.append(
            ToolCallBlock(
                tool_call_id=call.get("id") or None,
                tool_name=function.get("name") or "",
                tool_kwargs=arguments,
            )
        )
    extra = {"tool_call_id": message["tool_call_id"]} if message.get("tool_call_id") else {}
    return ChatMessage(role=message.get("role", "user"), blocks=blocks, additional_kwargs=extra)


class CtxwardenMemory(BaseMemory):
    """A LlamaIndex ``BaseMemory`` over one conversation (``tenant``, end ``user``,
    ``session``) in a ctxwarden :class:`~ctxwarden.Engine`; it reads and erases only that
    conversation. Build it with :meth:`from_defaults`.
    """

    _conversation: Conversation = PrivateAttr()
    _last_context: Context | None = PrivateAttr(default=None)

    @classmethod
    def class_name(cls) -> str:
        """The name LlamaIndex serialises this memory under."""
        return "CtxwardenMemory"

    @classmethod
    def from_defaults(  # type: ignore[override]
        cls,
        *,
        engine: Engine,
        session: str,
        tenant: str | None = None,
        user: str | None = None,
        model: str | None = None,
        budget: int | None = None,
        scope: Scope | None = None,
        **kwargs: Any,
    ) -> CtxwardenMemory:
        """A memory for ``session`` of ``tenant`` and end ``user``; ``model`` and ``budget``
        are what :meth:`get` fits for, ``scope`` what related memory may draw on."""
        memory = cls(**kwargs)
        memory._conversation = Conversation(
            engine,
            session=session,
            tenant=tenant,
            user=user,
            model=model,
            budget=budget,
            scope=scope,
        )
        return memory

    @property
    def conversation(self) -> Conversation:
        """The conversation this memory holds."""
        return self._conversation

    @property
    def last_context(self) -> Context | None:
        """The context the latest :meth:`get` built (its report explains every choice)."""
        return self._last_context

    def get(self, input: str | None = None, **kwargs: Any) -> list[ChatMessage]:
        """The conversation fitted for the next model call; ``input`` (the user's message, if
        not yet stored) drives retrieval and comes last."""
        context = self._conversation.fit([], query=input, remember=False)
        self._last_context = context
        return [from_openai(m) for m in context.messages]

    def get_all(self) -> list[ChatMessage]:
        """The whole stored conversation, oldest first."""
        return [from_openai(m) for m in self._conversation.messages()]

    def put(self, message: ChatMessage) -> None:
        """Append one turn."""
        self._conversation.add([to_openai(message)])

    def put_messages(self, messages: list[ChatMessage]) -> None:
        """Append turns, all or nothing."""
        self._conversation.add([to_openai(m) for m in messages])

    def set(self, messages: list[ChatMessage]) -> None:
        """Make the stored conversation ``messages``: the turns past what is already stored
        are added; when the stored conversation is not their beginning, it is replaced."""
        given = [to_openai(m) for m in messages]
        if not _starts_with(given, self._conversation.messages()):
            self._conversation.clear()
        self._conversation.remember(given)

    def reset(self) -> None:
        """Erase the conversation (tombstones stay; other sessions and users are untouched)."""
        self._conversation.clear()


def _starts_with(given: Sequence[Mapping[str, Any]], stored: Sequence[Mapping[str, Any]]) -> bool:
    def key(m: Mapping[str, Any]) -> tuple[str, str]:
        return str(m.get("role")), str(m.get("content") or "").strip()

    return len(stored) <= len(given) and all(
        key(a) == key(b) for a, b in zip(given, stored, strict=False)
    )
