"""What the server process imports of the SDK: its server side only. A seam (listed in
transport/sdk_seams.py, which cannot hold it: it imports the SDK, and this must run before anything does).

`import mcp.server.lowlevel` runs `mcp/__init__.py` and `mcp/server/__init__.py` first, and those
import the client side (sessions, session groups, the HTTP client and its TLS stack) and the
high-level MCPServer, none of which wisp's server uses. `import_server_side_only` puts both
packages in `sys.modules` as bare packages (their `__path__`, not their `__init__`), so a
submodule import finds its file as usual and nothing else is loaded. wisp imports names from
the submodules that define them, never from these packages.

It also holds back uvicorn until `imports_done`: sse_starlette (the SDK's SSE dependency)
imports it, when it can, only to patch uvicorn's exit-signal handler, which wisp never lets
uvicorn install (http_server.serve handles the stop signals itself and imports uvicorn when it
serves HTTP). A stdio server never uses it.

The two together: the shim's imports at 51 MB of RSS instead of 66, and a fifth less of its
start-up CPU (bench/README.md). Only the server process calls this (`start` in __main__.py, for
`python -m wisp_shim` and the `wisp` script). A process that imports wisp_shim as a library
(the tests, an embedding program) keeps the SDK's packages whole, for its own
`from mcp import Client`.
"""

from __future__ import annotations

import importlib.util
import logging
import sys

# Outermost first: finding a subpackage's spec reads its parent's __path__.
BARE_PACKAGES = ("mcp", "mcp.server")
HELD_BACK = ("uvicorn",)
# The module that then logs, at debug, that uvicorn is "not installed": true of this process
# for now, misleading in a debug log. Quiet until imports_done.
HELD_BACK_NOTICE = "sse_starlette.sse"


def import_server_side_only() -> bool:
    """Import the BARE_PACKAGES without running their `__init__`, and hold back HELD_BACK.
    False, and nothing changed, when the SDK is already imported or is not laid out as this
    expects (then it loads as it always does: slower, never wrong)."""
    if any(name in sys.modules for name in BARE_PACKAGES + HELD_BACK):
        return False
    added: list[str] = []
    try:
        for name in BARE_PACKAGES:
            spec = importlib.util.find_spec(name)
            if spec is None or spec.submodule_search_locations is None:
                raise ImportError(f"{name} is not a package")
            # module_from_spec sets __path__, __spec__ and __file__, and executes nothing.
            module = importlib.util.module_from_spec(spec)
            sys.modules[name] = module
            added.append(name)
            parent, _, child = name.rpartition(".")
            if parent:
                setattr(sys.modules[parent], child, module)
    except (ImportError, ValueError, AttributeError):
        for name in added:
            sys.modules.pop(name, None)
        return False
    for name in HELD_BACK:
        # None in sys.modules: `import uvicorn` raises ImportError (sse_starlette expects one
        # where uvicorn is not installed) instead of loading it.
        sys.modules[name] = None  # type: ignore[assignment]
    logging.getLogger(HELD_BACK_NOTICE).setLevel(logging.INFO)
    return True


def imports_done() -> None:
    """From here on HELD_BACK imports as usual."""
    for name in HELD_BACK:
        if name in sys.modules and sys.modules[name] is None:
            del sys.modules[name]
            logging.getLogger(HELD_BACK_NOTICE).setLevel(logging.NOTSET)
