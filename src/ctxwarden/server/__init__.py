"""The network faces of ctxwarden: the HTTP API, the OpenAI-compatible proxy, the MCP server.

They need the ``server`` extra (``pip install 'ctxwarden[server]'``: FastAPI, uvicorn, MCP, the
Prometheus client, orjson); importing any of them without it raises
:class:`~ctxwarden.errors.MissingExtraError` (an ImportError) that names the extra. Each module
imports its web framework, so ``import ctxwarden`` stays light.
"""

from ctxwarden.extras import require

require("server")
