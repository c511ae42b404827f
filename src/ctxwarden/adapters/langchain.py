"""LangChain: a chat message history and a trimmer backed by ctxwarden (``ctxwarden[langchain]``).

- :class:`CtxwardenChatMessageHistory` is a ``BaseChatMessageHistory``: use it wherever LangChain
  takes one (``RunnableWithMessageHistory``'s ``get_session_history``), one per tenant, end user
  and session.
- :class:`CtxwardenTrimmer` is a ``Runnable`` that takes the place of ``trim_messages``: it fits
  the messages it is given into an exact token budget counted with the model's real tokenizer
  (chat template and tools included), keeps tool calls with their results and the question last,
  and adds related memory of the conversation's scope as a quoted data message.

>>> from ctxwarden import Engine
>>> from langchain_core.messages import HumanMessage
>>> engine = Engine.open(":memory:")
>>> history = CtxwardenChatMessageHistory(engine, session="s1", user="alice")
>>> history.add_messages([HumanMessage("hello")])
>>> [m.content for m in history.messages]
['hello']
>>> engine.close()
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ctxwarden.extras import require

require("langchain")

from langchain_core.chat_history import BaseChatMessageHistory  # noqa: E402
from langchain_core.messages import (  # noqa: E402
    BaseMessage,
    convert_to_messages,
    convert_to_openai_messages,
)
from langchain_core.prompt_values import PromptValue  # noqa: E402
from langchain_core.runnables import Runnable, RunnableConfig  # noqa: E402

from ctxwarden.adapters.conversation import Conversation  # noqa: E402
from ctxwarden.engine import Engine  # noqa: E402
from ctxwarden.types import Context, Scope  # noqa: E402

__all__ = ["CtxwardenChatMessageHistory", "CtxwardenTrimmer", "from_openai", "to_openai"]


def to_openai(messages: Sequence[BaseMessage]) -> list[dict[str, Any]]:
    """LangChain messages as OpenAI-shaped dicts (LangChain's own conversion)."""
    converted = convert_to_openai_messages(list(messages))
    return [dict(m) for m in converted]


def from_openai(messages: Sequence[Mapping[str, Any]]) -> list[BaseMessage]:
    """OpenAI-shaped dicts (a context's messages) as LangChain messages."""
    cleaned = []
    for message in messages:
        item = dict(message)
        if item.get("content") is None:
            item["content"] = ""  # an assistant turn that only calls tools
        cleaned.append(item)
    return convert_to_messages(cleaned)


class CtxwardenChatMessageHistory(BaseChatMessageHistory):
    """A LangChain chat history stored in ctxwarden: one conversation of ``tenant``, end
    ``user`` and ``session``; it reads and erases only that conversation.

    ``messages`` is the whole stored conversation, oldest first; ``fitted()`` is the same
    conversation fitted into a token budget (with related memory) for the next model call.
    """

    def __init__(
        self,
        engine: Engine,
        *,
        session: str,
        tenant: str | None = None,
        user: str | None = None,
        model: str | None = None,
        budget: int | None = None,
        scope: Scope | None = None,
    ) -> None:
        self.conversation = Conversation(
            engine,
            session=session,
            tenant=tenant,
            user=user,
            model=model,
            budget=budget,
            scope=scope,
        )

    @property
    def messages(self) -> list[BaseMessage]:  # type: ignore[override]
        """The stored conversation, oldest first."""
        return from_openai(self.conversation.messages())

    def add_messages(self, messages: Sequence[BaseMessage]) -> None:
        """Append ``messages`` as new turns (all or nothing)."""
        self.conversation.add(to_openai(messages))

    def clear(self) -> None:
        """Erase this conversation (tombstones stay; other sessions and users are untouched)."""
        self.conversation.clear()

    def fitted(self, *, budget: int | None = None, model: str | None = None) -> list[BaseMessage]:
        """The stored conversation fitted into ``budget`` tokens for the next model call."""
        context = self.conversation.fit([], budget=budget, model=model, remember=False)
        return from_openai(context.messages)


class CtxwardenTrimmer(Runnable[Any, list[BaseMessage]]):
    """Fit messages into ``max_tokens`` exactly: a drop-in where ``trim_messages`` is used.

    ``trimmer.invoke(messages)`` (or ``trimmer | model`` in a chain, after a prompt template)
    stores the messages it has not seen in the conversation (tenant, end ``user``,
    ``session``), then returns the context :meth:`ctxwarden.Engine.assemble` builds for
    ``model``'s tokenizer: system message first, related memory of ``scope`` as a quoted data
    message, the newest turns that fit with tool calls kept whole, the question last. The count
    includes the chat template, so the model receives at most ``max_tokens`` (see
    :attr:`last_context` for the report of the latest call).

    ``remember=False`` when a chat history (:class:`CtxwardenChatMessageHistory` under
    ``RunnableWithMessageHistory``) stores the turn after the call: the trimmer then fits the
    stored history plus the latest user message and stores nothing itself.
    """

    def __init__(
        self,
        engine: Engine,
        *,
        session: str,
        max_tokens: int | None = None,
        model: str | None = None,
        tenant: str | None = None,
        user: str | None = None,
        scope: Scope | None = None,
        remember: bool = True,
    ) -> None:
        self.conversation = Conversation(
            engine,
            session=session,
            tenant=tenant,
            user=user,
            model=model,
            budget=max_tokens,
            scope=scope,
        )
        self.remember = remember
        self.last_context: Context | None = None

    def invoke(
        self, input: Any, config: RunnableConfig | None = None, **kwargs: Any
    ) -> list[BaseMessage]:
        """Fit ``input`` (a list of messages or a prompt value) into the budget."""
        messages = input.to_messages() if isinstance(input, PromptValue) else input
        context = self.conversation.fit(
            to_openai(convert_to_messages(messages)), remember=self.remember
        )
        self.last_context = context
        return from_openai(context.messages)
