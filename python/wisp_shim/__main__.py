"""`python -m wisp_shim`: logging (stderr only), the stdio server's run and `--check`; the flags
and variables are config.py's, the local model's part in the run localmodel/plugin.py's."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import os
import signal
import sys
from typing import TYPE_CHECKING, NoReturn

from . import logs, sdk_imports
from .config import log_level, max_threads, parse_args
from .version import version

# The layers (the pipe's client and msgspec, anyio, the HTTP server, the local model) are imported
# where the run needs them, once the flags are parsed: `--help` and `--version` load none of them
# (test_version.py).
if TYPE_CHECKING:
    from .core.process import CoreLaunch, ModelCompanion
    from .http.options import HttpOptions

log = logging.getLogger("wisp")

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT)
CORE_START_DELAY_S = 2.0


async def _serve(config: CoreLaunch, max_threads: int) -> None:
    import anyio

    from .core.client import Core
    from .mcp.server import build_server
    from .transport.guard import guard
    from .transport.stdio import stdio_server  # the SDK's stdio transport on asyncio pipes (transport/stdio.py)

    _imports_done()
    core = Core(config)
    # The core (and the local model) start once the client has listed the tools, or after
    # CORE_START_DELAY_S, or at the first call that needs it, whichever comes first: started
    # at once, on 2 vCPUs it took CPU from the handshake (spawn -> tools/list 1.17x the bare
    # server's instead of 1.02x), and no tool call can come before the handshake anyway.
    asyncio.get_running_loop().call_later(CORE_START_DELAY_S, core.start)
    server = build_server(core, max_threads)
    async with anyio.create_task_group() as tg:

        async def on_signal() -> None:
            # SIGHUP comes when the terminal or the client's session closes, SIGQUIT from ^\ :
            # left to their defaults they would end the shim without stopping the core.
            with anyio.open_signal_receiver(*STOP_SIGNALS) as signals:
                async for signum in signals:
                    log.info("got %s; stopping wisp-core and exiting", signal.Signals(signum).name)
                    with anyio.CancelScope(shield=True):
                        await core.aclose()
                    # Exit now: the stdio transport reads stdin in a worker thread that no
                    # cancellation can interrupt, and with the core down nothing is left to save.
                    _exit_now()

        tg.start_soon(on_signal)
        try:
            async with stdio_server() as (read, write):
                # Answers lines the SDK drops, and applies backpressure (transport/guard.py).
                read, write = guard(read, write)
                await server.run(read, write, server.create_initialization_options())
        finally:
            with anyio.CancelScope(shield=True):
                await core.aclose()
            tg.cancel_scope.cancel()


async def _check(config: CoreLaunch, use: ModelCompanion | None = None,
                 http: HttpOptions | None = None) -> int:
    from .core.probe import probe_status
    from .errors import ShimError
    from .http import server as http_server

    try:
        st, binary = await probe_status(config, use.check if use is not None else None)
        apple = None
        if st.backend != "apple":
            # Say why Apple's model is not the one in use: it is the default wherever it can run.
            apple, _ = await probe_status(config.with_backend("apple"))
    except ShimError as exc:
        sys.stderr.write(f"wisp: {exc}\n")
        return 1
    lines = [
        f"backend:      {st.backend}",
        f"model:        {st.model}",
        f"available:    {'yes' if st.available else 'no'}" + (f" ({st.reason})" if st.reason else ""),
        f"context size: {st.context_size} tokens",
        f"max threads:  {st.max_threads}",
    ]
    for e in st.endpoints or ():
        said = (f"up, model {e.model}, context {e.context_size}, slots {e.slots if e.slots is not None else 'none'}"
                if e.up else f"down ({e.reason})" if e.reason else "down")
        lines.append(f"endpoint:     {e.endpoint}: {said}, {e.pinned} threads pinned")
    # The core says what the store is (engine and versions, or why not known); this says where and what ails it.
    where = st.store_location or (f"not in use: {st.store_error}" if st.store_error else "")
    trouble = f" (not usable now: {st.store_error})" if st.store_location and st.store_error else ""
    lines.append("store:        " + ", ".join(p for p in (st.store_about, where) if p) + trouble)
    if apple is not None:
        why = f" ({apple.reason})" if apple.reason else ""
        lines.append(f"apple model:  {'available' if apple.available else 'not available'}{why}")
    lines += use.describe(st.available) if use is not None else []
    lines += [f"core:         {binary}", f"version:      {version()} (wisp-mcp and wisp-core)"]
    lines += http_server.describe(http) if http is not None else []
    # --check is run by a person, not an MCP client, so stdout is theirs.
    sys.stdout.write("\n".join(lines) + "\n")
    return 0 if st.available else 1


def _exit_now() -> NoReturn:
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(0)


def _imports_done() -> None:
    sdk_imports.imports_done()
    gc.freeze()
    gc.enable()


def main(argv: list[str] | None = None) -> int:
    ns = parse_args(argv)
    level = log_level(ns)
    logs.setup(level)  # stderr only, through a bounded buffer that never blocks (logs.py)
    if level != "debug":
        # The SDK logs every request at info; wisp's own lines are the useful ones.
        logging.getLogger("mcp").setLevel(logging.WARNING)
    if ns.install_local_model:
        from .localmodel import download

        return download.main()
    import anyio

    from .core.process import CoreLaunch
    from .http import server as http_server
    from .http.options import options as http_options
    from .http.token import HttpConfigError
    from .localmodel import plugin
    from .loop import WispEventLoop
    from .mcp.task_records import TaskLimits  # after the SDK's server side is in (start)

    config = CoreLaunch.from_flags(ns)

    try:
        TaskLimits.from_env()  # refused here, before anything starts, rather than at the first call
    except ValueError as exc:
        raise SystemExit(f"wisp: {exc}") from None
    http = http_options(ns, generate_token=not ns.check)
    use = plugin.attach(ns, config)
    if ns.check or http is not None:
        _imports_done()  # their imports come as they go; the stdio server's, in _serve
    if ns.check:
        return anyio.run(_check, config, use, http)
    # wisp's event loop polls briefly for the core's reply before sleeping (loop.py).
    if http is not None:
        try:
            anyio.run(http_server.serve, config, max_threads(ns), http, _exit_now,
                      backend_options={"loop_factory": WispEventLoop})
        except HttpConfigError as exc:
            raise SystemExit(f"wisp: {exc}") from None
    else:
        anyio.run(_serve, config, max_threads(ns), backend_options={"loop_factory": WispEventLoop})
    # Everything is shut down by now; interpreter teardown of the SDK's import graph would keep
    # an MCP client waiting through every exit (bench: cold_start).
    _exit_now()


def start() -> int:
    """The server process: `python -m wisp_shim` and the `wisp` script."""
    # Start-up imports the SDK (a few hundred thousand objects, all kept for the process's
    # life): the cyclic collector would walk them again and again for the few cycles among
    # them. Off until they are in, then they are frozen out of every later collection.
    gc.disable()
    sdk_imports.import_server_side_only()
    return main()


if __name__ == "__main__":
    sys.exit(start())
