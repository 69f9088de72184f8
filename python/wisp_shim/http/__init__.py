"""The shared-server layer (--http): its settings, checked before anything starts (options), MCP's
streamable HTTP under uvicorn (server), its guards on connections, bodies and ids (guards) and
its bearer token (token)."""
