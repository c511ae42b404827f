"""OpenAI Agents SDK: a ``Session`` stored in ctxwarden (``ctxwarden[agents]``).

:class:`CtxwardenSession` implements the SDK's ``Session`` protocol (``get_items``,
``add_items``, ``pop_item``, ``clear_session``) over one conversation (tenant, end user, session),
like the SDK's own ``SQLiteSession``: pass it as ``Runner.run(agent, input, session=...)``. Items
are returned as they were given (each memory keeps its item), while their text is what
ctxwarden de-duplicates, searches and compacts.

For the next turn's prompt, :meth:`CtxwardenSession.fit_model_input` is a
``RunConfig(call_model_input_filter=...)``: before every model call it fits the run's input into
an exact token budget for the model's tokenizer (instructions included), keeps function calls
with their outputs, adds related memory of the session's scope as a quoted data message, and
keeps the question last.

>>> import asyncio
>>> from ctxwarden import Engine
>>> engine = Engine.open(":memory:")
>>> session = CtxwardenSession("s1", engine, user="alice")
>>> asyncio.run(session.add_items([{"role": "user", "content": "hi"}]))
>>> asyncio.run(session.get_items())
[{'role': 'user', 'content': 'hi'}]
>>> engine.close()
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from ctxwarden.extras import require

require("agents")

from agents import TResponseInputItem  # noqa: E402
from agents.run_config import CallModelData, ModelInputData  # noqa: E402

from ctxwarden.adapters.conversation import Conversation, message_text  # noqa: E402
from ctxwarden.engine import Engine  # noqa: E402
from ctxwarden.types import Context, Scope  # noqa: E402

__all__ = ["CtxwardenSession", "item_to_message", "message_to_items"]

_ITEM = "agents_item"  # the metadata key that keeps an item as the SDK gave it


def item_to_message(item: Mapping[str, Any]) -> dict[str, Any] | None:
    """A Responses input item as an OpenAI chat message (None for items with no text, such
    as reasoning items without a summary)."""
    kind = item.get("type")
    if kind == "function_call":
        call = {
            "id": str(item.get("call_id") or item.get("id") or ""),
            "type": "function",
            "function": {"name": item.get("name"), "arguments": item.get("arguments") or "{}"},
        }
        return {"role": "assistant", "content": None, "tool_calls": [call]}
    if kind == "function_call_output":
        output = item.get("output")
        text = output if isinstance(output, str) else message_text(output)
        return {"role": "tool", "tool_call_id": str(item.get("call_id") or ""), "content": text}
    role = item.get("role")
    if (kind in (None, "message")) and role in ("user", "assistant", "system", "developer"):
        return {"role": role, "content": message_text(item.get("content"))}
    return None


def message_to_items(message: Mapping[str, Any]) -> list[TResponseInputItem]:
    """An OpenAI chat message (a fitted context's) as Responses input items."""
    role = message.get("role")
    items: list[Any] = []
    if role == "tool":
        items.append(
            {
                "type": "function_call_output",
                "call_id": message.get("tool_call_id") or "",
                "output": message_text(message.get("content")),
            }
        )
        return items
    text = message_text(message.get("content"))
    if text:
        items.append({"role": role, "content": text})
    for call in message.get("tool_calls") or ():
        function = call.get("function") or {}
        items.append(
            {
                "type": "function_call",
                "call_id": call.get("id") or "",
                "name": function.get("name") or "",
                "arguments": function.get("arguments") or "{}",
            }
        )
    return items


def _with_item(item: Mapping[str, Any]) -> dict[str, Any] | None:
    message = item_to_message(item)
    if message is not None:
        # stored as JSON-safe data, so the item comes back as it was given
        message["metadata"] = {_ITEM: json.loads(json.dumps(item, default=str))}
    return message


class CtxwardenSession:
    """The Agents SDK's ``Session`` over one conversation of ``tenant``, end ``user`` and
    ``session_id``; it reads and erases only that conversation.

    ``model`` and ``budget`` are what :meth:`fit_model_input` fits for (the engine's default
    model and its window when None); ``scope`` is what related memory may draw on.
    """

    session_settings: Any = None

    def __init__(
        self,
        session_id: str,
        engine: Engine,
        *,
        tenant: str | None = None,
        user: str | None = None,
        model: str | None = None,
        budget: int | None = None,
        scope: Scope | None = None,
    ) -> None:
        self.session_id = session_id
        self.conversation = Conversation(
            engine,
            session=session_id,
            tenant=tenant,
            user=user,
            model=model,
            budget=budget,
            scope=scope,
        )
        self.last_context: Context | None = None

    async def get_items(self, limit: int | None = None) -> list[TResponseInputItem]:
        """The session's items, oldest first (the latest ``limit`` when given)."""
        return [_item(m) for m in self.conversation.messages(limit, metadata=True)]

    async def add_items(self, items: list[TResponseInputItem]) -> None:
        """Append ``items`` (all or nothing); items with no text (reasoning) are not kept."""
        messages = [_with_item(item) for item in items if isinstance(item, Mapping)]
        self.conversation.add([m for m in messages if m is not None])

    async def pop_item(self) -> TResponseInputItem | None:
        """Remove and return the newest item (None when the session is empty)."""
        message = self.conversation.pop(metadata=True)
        return None if message is None else _item(message)

    async def clear_session(self) -> None:
        """Erase the session's items (of its end user only, when one is named)."""
        self.conversation.clear()

    def fit_model_input(self, data: CallModelData[Any]) -> ModelInputData:
        """A ``call_model_input_filter``: the run's input fitted into the budget.

        New turns in the input are stored (and not again when the SDK saves the turn), the
        instructions count against the budget and stay the instructions.
        """
        messages = [_with_item(i) for i in data.model_data.input if isinstance(i, Mapping)]
        context = self.conversation.fit(
            [m for m in messages if m is not None], system=data.model_data.instructions
        )
        self.last_context = context
        items: list[TResponseInputItem] = []
        for message in context.messages:
            if message.get("role") != "system":
                items.extend(message_to_items(message))
        return ModelInputData(input=items, instructions=data.model_data.instructions)


def _item(message: Mapping[str, Any]) -> TResponseInputItem:
    metadata = message.get("metadata") or {}
    kept = metadata.get(_ITEM) if isinstance(metadata, Mapping) else None
    if isinstance(kept, Mapping):
        return dict(kept)  # type: ignore[return-value]
    converted = message_to_items(message)
    return converted[0] if converted else {"role": "user", "content": ""}
