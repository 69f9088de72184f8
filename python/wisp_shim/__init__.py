"""wisp's MCP server: a thin Python shim over the Swift wisp-core process.

Run it with `python -m wisp_shim` (or the `wisp-mcp` or `wisp` script); see the README for client
configuration. Its version is pyproject.toml's, read at run time (version.py).
"""

# The shim's layers, lowest first: a module imports from its own layer and those below it, never
# from one above (tests/python/test_layers.py holds every module to it, lazy imports included).
# "" is the package's shared leaves (config, errors, facts, logs, loop, sdk_imports, version);
# each other name is a subpackage, and `__main__` is the run itself.
LAYERS = ("", "core", "localmodel", "transport", "mcp", "http", "__main__")
