"""wisp's MCP server: a thin Python shim over the Swift wisp-core process.

Run it with `python -m wisp_shim`; see the README for client configuration.
"""

__version__ = "0.1.0"
