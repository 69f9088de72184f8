"""wisp's MCP server: a thin Python shim over the Swift wisp-core process.

Run it with `python -m wisp_shim` (or the `wisp-mcp` or `wisp` script); see the README for client
configuration. Its version is pyproject.toml's, read at run time (version.py).
"""
