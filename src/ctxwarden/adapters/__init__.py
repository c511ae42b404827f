"""Adapters: ctxwarden as the memory of the agent frameworks people already use.

One module per framework, each imported on its own so that ``import ctxwarden`` never pulls a
framework in; a module whose framework is missing raises
:class:`~ctxwarden.errors.MissingExtraError` (an ``ImportError``) naming the extra to install.

- :mod:`ctxwarden.adapters.langchain` (``ctxwarden[langchain]``): ``CtxwardenChatMessageHistory``
  and ``CtxwardenTrimmer`` (where ``trim_messages`` is used).
- :mod:`ctxwarden.adapters.langgraph` (``ctxwarden[langgraph]``): ``CtxwardenStore`` (a
  ``BaseStore``) and ``pre_model_hook``.
- :mod:`ctxwarden.adapters.llamaindex` (``ctxwarden[llamaindex]``): ``CtxwardenMemory`` (a
  ``BaseMemory``, an agent's ``memory=``).
- :mod:`ctxwarden.adapters.openai_agents` (``ctxwarden[agents]``): ``CtxwardenSession`` (the
  Agents SDK's ``Session``).

All of them stand on :class:`ctxwarden.adapters.conversation.Conversation`, which needs no
framework: one conversation (tenant, end user, session) stored in an :class:`~ctxwarden.Engine`,
read back in order, and fitted into a token budget. An adapter reads only the scope it was given.
"""

from ctxwarden.adapters.conversation import Conversation

__all__ = ["Conversation"]
