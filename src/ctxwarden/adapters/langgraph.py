"""LangGraph: a long-term ``BaseStore`` and a pre-model hook backed by ctxwarden
(``ctxwarden[langgraph]``).

- :class:`CtxwardenStore` is a LangGraph ``BaseStore`` (``graph.compile(store=...)``,
  ``create_react_agent(..., store=...)``; tools reach it through ``get_store()``). The store's
  ``tenant`` and end ``user`` are fixed when it is built, the isolation boundary: a namespace
  is a session inside them (``("memories", "prefs")`` is the session ``lg:memories/prefs``), so
  whatever namespace a graph asks for, it reads and writes only that tenant's and user's items.
  Items are memories with their value kept as given; ``search(query=...)`` is ctxwarden's
  full-text search, so stored items also feed the related block of contexts in user or tenant
  scope.
- :class:`CtxwardenHooks` (and :func:`pre_model_hook`, its ``pre``) are
  ``create_react_agent``'s ``pre_model_hook`` and ``post_model_hook``: the pre hook fits the
  graph's messages into an exact token budget for the model's tokenizer (system prompt and
  tools included), keeps tool calls with their results and the question last, adds related
  memory, and returns them as ``llm_input_messages`` (the graph's state is left as it is); the
  post hook stores the model's answer.

>>> from ctxwarden import Engine
>>> engine = Engine.open(":memory:")
>>> store = CtxwardenStore(engine, user="alice")
>>> store.put(("prefs",), "food", {"likes": "ramen"})
>>> store.get(("prefs",), "food").value
{'likes': 'ramen'}
>>> engine.close()
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from ctxwarden.extras import require

require("langgraph")

from langchain_core.messages import BaseMessage  # noqa: E402
from langchain_core.runnables import RunnableConfig  # noqa: E402
from langchain_core.utils.function_calling import convert_to_openai_tool  # noqa: E402
from langgraph.store.base import (  # noqa: E402
    BaseStore,
    GetOp,
    Item,
    ListNamespacesOp,
    Op,
    PutOp,
    Result,
    SearchItem,
    SearchOp,
)

from ctxwarden.adapters.conversation import Conversation  # noqa: E402
from ctxwarden.adapters.langchain import from_openai, to_openai  # noqa: E402
from ctxwarden.engine import Engine  # noqa: E402
from ctxwarden.errors import InputError  # noqa: E402
from ctxwarden.types import Memory, Scope, check_scope_name  # noqa: E402

__all__ = ["CtxwardenHooks", "CtxwardenStore", "namespace_session", "pre_model_hook"]

_MARK = "langgraph"  # the metadata key of a store item: namespace, key, value, created_at
_PREFIX = "lg:"


def namespace_session(namespace: tuple[str, ...]) -> str:
    """The session that holds a namespace's items.

    >>> namespace_session(("memories", "prefs"))
    'lg:memories/prefs'
    """
    if not namespace or not all(isinstance(label, str) and label for label in namespace):
        raise InputError(f"{namespace!r} must be non-empty labels", field="namespace")
    if any("/" in label or "." in label for label in namespace):
        raise InputError(f"{namespace!r}: labels may not contain '/' or '.'", field="namespace")
    return _PREFIX + "/".join(namespace)


def _time(seconds: float) -> datetime:
    return datetime.fromtimestamp(seconds, tz=UTC)


class CtxwardenStore(BaseStore):
    """A LangGraph ``BaseStore`` over ``engine``, inside one ``tenant`` and end ``user``.

    ``put`` replaces an item (the old version is erased, a tombstone stays), ``put(..., None)``
    and ``delete`` erase it. ``search(prefix, query=...)`` ranks by ctxwarden's full-text search
    over the item's text; ``filter`` keeps items whose value has each given key equal to the
    given value. Listing without a query and ``list_namespaces`` walk the tenant's memories:
    keep namespaces few and items per namespace moderate, or search with a query.
    """

    def __init__(self, engine: Engine, *, tenant: str | None = None, user: str | None = None):
        if tenant is not None:
            check_scope_name(tenant, "tenant")
        if user is not None:
            check_scope_name(user, "user")
        self.engine = engine
        self.tenant = tenant or engine.config.tenant
        self.user = user

    # -- the BaseStore protocol --------------------------------------------------------------

    def batch(self, ops: Iterable[Op]) -> list[Result]:
        """Run ``ops`` in order; one result per op (None for puts)."""
        results: list[Result] = []
        for op in ops:
            if isinstance(op, GetOp):
                results.append(self._get(op.namespace, op.key))
            elif isinstance(op, PutOp):
                self._put(op.namespace, op.key, op.value)
                results.append(None)
            elif isinstance(op, SearchOp):
                results.append(self._search(op))
            elif isinstance(op, ListNamespacesOp):
                results.append(self._namespaces(op))
            else:
                raise InputError(f"unknown store operation {type(op).__name__}", field="op")
        return results

    async def abatch(self, ops: Iterable[Op]) -> list[Result]:
        """:meth:`batch` (the engine's store calls are short and synchronous)."""
        return self.batch(ops)

    # -- operations --------------------------------------------------------------------------

    def _find(self, namespace: tuple[str, ...], key: str) -> Memory | None:
        conversation = Conversation(
            self.engine, session=namespace_session(namespace), tenant=self.tenant, user=self.user
        )
        memories: list[Memory] = conversation.memories()
        return next(
            (
                m
                for m in reversed(memories)
                if isinstance(m.metadata.get(_MARK), Mapping)
                and m.metadata[_MARK].get("key") == key
            ),
            None,
        )

    def _get(self, namespace: tuple[str, ...], key: str) -> Item | None:
        memory = self._find(namespace, key)
        return None if memory is None else _item(memory, Item)

    def _put(self, namespace: tuple[str, ...], key: str, value: object) -> None:
        session = namespace_session(namespace)
        old = self._find(namespace, key)
        if value is None:
            if old is not None:
                self.engine.delete(old.id, tenant=self.tenant, reason="langgraph delete")
            return
        if not isinstance(value, Mapping):
            raise InputError(f"expected a dict, got {type(value).__name__}", field="value")
        created = _item(old, Item).created_at.timestamp() if old is not None else None
        mark = {
            "namespace": list(namespace),
            "key": key,
            "value": json.loads(json.dumps(value, default=str)),
            "created_at": created if created is not None else self.engine.clock(),
        }
        record = {
            "id": f"lg-{uuid.uuid4().hex}",
            "role": "user",
            "author": "langgraph-store",
            "content": f"{key}: {json.dumps(value, ensure_ascii=False, default=str)}",
            "metadata": {_MARK: mark},
        }
        # The new version first, then the old one erased: a failed write keeps the old item.
        self.engine.ingest(
            [record], tenant=self.tenant, session=session, user=self.user, fold=False
        )
        if old is not None:
            self.engine.delete(old.id, tenant=self.tenant, reason="langgraph update")

    def _items(self) -> Iterator[Memory]:
        # Every store item of this tenant and user (a walk over the tenant's memories).
        self.engine.flush_log()
        for memory in self.engine.store.iter_memories(self.tenant):
            if (
                memory.user == self.user
                and memory.session.startswith(_PREFIX)
                and isinstance(memory.metadata.get(_MARK), Mapping)
            ):
                yield memory

    def _search(self, op: SearchOp) -> list[SearchItem]:
        prefix = tuple(op.namespace_prefix)
        found: list[tuple[Memory, float | None]] = []
        if op.query:
            scope: Scope = "user" if self.user is not None else "tenant"
            wanted = (op.offset + op.limit) * 4 + 16  # room for other namespaces' hits
            hits = self.engine.search(
                op.query, tenant=self.tenant, user=self.user, scope=scope, limit=wanted
            )
            found = [(m, s) for m, s in hits if isinstance(m.metadata.get(_MARK), Mapping)]
        else:
            found = [(m, None) for m in self._items()]
            found.sort(key=lambda pair: pair[0].created_at, reverse=True)
        selected = [
            (m, s)
            for m, s in found
            if tuple(m.metadata[_MARK]["namespace"])[: len(prefix)] == prefix
            and _matches(m.metadata[_MARK]["value"], op.filter)
        ]
        page = selected[op.offset : op.offset + op.limit]
        return [_item(m, SearchItem, score=s) for m, s in page]

    def _namespaces(self, op: ListNamespacesOp) -> list[tuple[str, ...]]:
        names = {tuple(m.metadata[_MARK]["namespace"]) for m in self._items()}
        for condition in op.match_conditions or ():
            names = {n for n in names if _condition(n, condition.match_type, condition.path)}
        if op.max_depth is not None:
            names = {n[: op.max_depth] for n in names}
        ordered = sorted(names)
        return ordered[op.offset : op.offset + op.limit]


def _matches(value: Mapping[str, Any], wanted: Mapping[str, Any] | None) -> bool:
    return all(value.get(k) == v for k, v in (wanted or {}).items())


def _condition(name: tuple[str, ...], kind: str, path: Sequence[str]) -> bool:
    if len(path) > len(name):
        return False
    part = name[: len(path)] if kind == "prefix" else name[len(name) - len(path) :]
    return all(p in ("*", n) for p, n in zip(path, part, strict=True))


def _item(memory: Memory, cls: type[Any], **extra: Any) -> Any:
    mark = memory.metadata[_MARK]
    return cls(
        value=dict(mark["value"]),
        key=str(mark["key"]),
        namespace=tuple(mark["namespace"]),
        created_at=_time(float(mark["created_at"])),
        updated_at=_time(memory.created_at),
        **extra,
    )


class CtxwardenHooks:
    """The hooks of ``create_react_agent`` over one conversation per thread.

    ``pre`` (``pre_model_hook=``) stores the graph's new messages and returns them fitted as
    ``llm_input_messages``; ``post`` (``post_model_hook=``) stores the model's answer right
    away, so a thread's last answer is in memory before its next turn. The conversation is
    ``session`` (else the run's ``thread_id``) of ``tenant`` and end ``user``; the model
    receives at most ``max_tokens`` (else the model's window minus its reserve) counted with
    ``model``'s tokenizer. Pass the agent's system prompt as ``system`` and its tools as
    ``tools`` (rather than the agent's ``prompt=``) so that they are counted; ``pre`` puts the
    system message first.
    """

    def __init__(
        self,
        engine: Engine,
        *,
        max_tokens: int | None = None,
        model: str | None = None,
        session: str | None = None,
        tenant: str | None = None,
        user: str | None = None,
        scope: Scope | None = None,
        system: str | None = None,
        tools: Sequence[Any] = (),
    ) -> None:
        # Checked now, so a bad name or budget fails when the agent is built.
        Conversation(
            engine,
            session=session or "-",
            tenant=tenant,
            user=user,
            model=model,
            budget=max_tokens,
            scope=scope,
        )
        self.engine = engine
        self.max_tokens = max_tokens
        self.model = model
        self.session = session
        self.tenant = tenant
        self.user = user
        self.scope = scope
        self.system = system
        self.tool_schemas = [convert_to_openai_tool(tool) for tool in tools]
        self._conversations: dict[str, Conversation] = {}

    def conversation(self, config: RunnableConfig) -> Conversation:
        """The conversation of a run: ``session``, else the run's ``thread_id``."""
        name = self.session or (config.get("configurable") or {}).get("thread_id")
        if not isinstance(name, str) or not name:
            raise InputError(
                "no session: pass session= or run the graph with a thread_id", field="session"
            )
        found = self._conversations.get(name)
        if found is None:
            found = Conversation(
                self.engine,
                session=name,
                tenant=self.tenant,
                user=self.user,
                model=self.model,
                budget=self.max_tokens,
                scope=self.scope,
            )
            self._conversations[name] = found
        return found

    def pre(self, state: Any, config: RunnableConfig) -> dict[str, list[BaseMessage]]:
        """``pre_model_hook``: the graph's messages fitted, as ``llm_input_messages``."""
        context = self.conversation(config).fit(
            to_openai(_messages(state)), system=self.system, tools=self.tool_schemas
        )
        return {"llm_input_messages": from_openai(context.messages)}

    def post(self, state: Any, config: RunnableConfig) -> dict[str, Any]:
        """``post_model_hook``: store the model's answer; the state is left as it is."""
        self.conversation(config).remember(to_openai(_messages(state)))
        return {}


def _messages(state: Any) -> list[BaseMessage]:
    return list(state["messages"] if isinstance(state, Mapping) else state.messages)


def pre_model_hook(
    engine: Engine,
    *,
    max_tokens: int | None = None,
    model: str | None = None,
    session: str | None = None,
    tenant: str | None = None,
    user: str | None = None,
    scope: Scope | None = None,
    system: str | None = None,
    tools: Sequence[Any] = (),
) -> Callable[[Any, RunnableConfig], dict[str, list[BaseMessage]]]:
    """``CtxwardenHooks(...).pre``: a pre-model hook for ``create_react_agent`` that fits the
    graph's messages (see :class:`CtxwardenHooks` for the arguments)."""
    return CtxwardenHooks(
        engine,
        max_tokens=max_tokens,
        model=model,
        session=session,
        tenant=tenant,
        user=user,
        scope=scope,
        system=system,
        tools=tools,
    ).pre
