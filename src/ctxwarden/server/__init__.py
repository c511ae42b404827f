"""The network faces of ctxwarden: the HTTP API, the OpenAI-compatible proxy, the MCP server.

Each module imports its web framework, so ``import ctxwarden`` stays light.
"""
