"""`python -m wisp_shim`: logging (stderr only), the local model's use, the stdio server's run and
`--check`; the flags and variables are config.py's."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import logging
import os
import signal
import sys
from typing import Awaitable, Callable, NoReturn

import anyio

from . import http_server
from . import llama_server, local_model, logs
from . import protocol, sdk_imports
from . import errors
from .client import Core
from .errors import ShimError
from .loop import WispEventLoop
from .config import core_launch, http_options, log_level, max_threads, parse_args
from .core_process import CoreLaunch
from .version import version

log = logging.getLogger("wisp")

APPLE_ALTERNATIVES = (
    "Without Apple's model, wisp can use its own local model: run `make local-model` in the wisp repository "
    "(then `--backend auto` starts it whenever Apple's model is unavailable), or point --endpoint at an "
    "OpenAI-compatible server."
)


class LocalModelUse:
    """What this run does about wisp's own local model (local_model.decide), as the core's hooks:
    start it before the core, stop it after, and make a failed call's error say what the core
    cannot know (the server was killed by a signal; the local model is not installed)."""

    def __init__(self, ns: argparse.Namespace, config: CoreLaunch, platform: str = sys.platform) -> None:
        self.config = config
        self.plan = local_model.plan(ns.backend, ns.endpoint, llama_server=ns.llama_server,
                                     model_path=ns.model_path, context_size=ns.context_size,
                                     max_threads=max_threads(ns), platform=platform)
        self.lm = self.plan.lm
        self.active = False  # the core runs against self.lm
        self._probed = False
        decision = self.plan.decision
        if decision == local_model.NOT_INSTALLED:
            log.warning("%s", self.plan.missing)  # the core then explains that no backend is available
        if decision == local_model.LOCAL:
            self._activate()
        if decision in (local_model.LOCAL, local_model.PROBE_APPLE, local_model.NOT_INSTALLED, local_model.APPLE_ONLY):
            config.explain = self.explain
        if decision in (local_model.LOCAL, local_model.PROBE_APPLE):
            config.before_start = self.before_start
            config.after_stop = self.after_stop

    def _activate(self) -> None:
        assert self.lm is not None
        self.active = True
        self.config.args += self.lm.core_args()
        self.config.env = {**(self.config.env or {}), **self.lm.core_env()}

    async def before_start(self) -> None:
        if self.plan.decision == local_model.PROBE_APPLE and not self._probed:
            # Asked once, of a core of its own: only the core can see FoundationModels.
            apple, _ = await _status(CoreLaunch(core=self.config.core, args=_with_backend(self.config.args, "apple"),
                                                env=self.config.env))
            self._probed = True
            if apple.available:
                log.info("Apple's on-device model is available; the local model is not started")
            else:
                log.info("Apple's model is not available (%s); using the local model", apple.reason)
                self._activate()
        if not self.active:
            return
        assert self.lm is not None
        try:
            await self.lm.ensure_running()
        except local_model.LocalModelError as exc:
            raise ShimError(errors.MODEL_UNAVAILABLE, str(exc)) from None

    def after_stop(self) -> None:
        if self.lm is not None:
            self.lm.stop()

    async def explain(self, error: ShimError, since: float) -> ShimError:
        if error.code not in errors.MODEL_CODES:
            return error
        if self.active and self.lm is not None:
            died = await self.lm.died_since(since)
            if died:
                return ShimError(error.code, f"{died}. wisp restarts it; wisp-core saw: {error.message}")
            return error
        if self.plan.decision == local_model.NOT_INSTALLED:
            other = "" if "--endpoint" in error.message else "; or point --endpoint at an OpenAI-compatible server"
            return ShimError(error.code, f"{error.message.rstrip('.')}. {self.plan.missing}{other}")
        if self.plan.decision in (local_model.APPLE_ONLY, local_model.PROBE_APPLE):
            return ShimError(error.code, f"{error.message} {APPLE_ALTERNATIVES}")
        return error


def _with_backend(args: list[str], backend: str) -> list[str]:
    """The core's args with any --backend replaced by this one."""
    kept = [a for i, a in enumerate(args) if a != "--backend" and (i == 0 or args[i - 1] != "--backend")]
    return kept + ["--backend", backend]


STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT)
CORE_START_DELAY_S = 2.0


async def _serve(config: CoreLaunch, max_threads: int) -> None:
    from .stdio import stdio_server  # the SDK's stdio transport on asyncio pipes (stdio.py)

    from .server import build_server
    from .transport import guard

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
                # Answers lines the SDK drops, and applies backpressure (transport.py).
                read, write = guard(read, write)
                await server.run(read, write, server.create_initialization_options())
        finally:
            with anyio.CancelScope(shield=True):
                await core.aclose()
            tg.cancel_scope.cancel()


async def _status(config: CoreLaunch,
                  then: Callable[[], Awaitable[str | None]] | None = None) -> tuple[protocol.StatusResult, str]:
    """The core's status; with `then`, also what it says while the core still runs (None: fine)."""
    core = Core(config)
    core.start()
    try:
        with anyio.fail_after(60):
            st = await core.status()
        if then is not None:
            problem = await then()
            if problem:
                st.available, st.reason = False, problem
        return st, str(core.binary)
    except TimeoutError:
        raise ShimError(errors.TIMEOUT, "wisp-core did not answer `status` within 60 s") from None
    finally:
        with anyio.CancelScope(shield=True):
            await core.aclose()


async def _check(config: CoreLaunch, use: LocalModelUse | None = None,
                 http: http_server.HttpOptions | None = None) -> int:
    async def decode() -> str | None:
        # /health and the core's status never make the server compute: one short decode does.
        if use is not None and use.active and use.lm is not None:
            lm = use.lm
            decoded = await llama_server.decode(lm, timeout=60)
            return decoded or await asyncio.to_thread(llama_server.refuses_unkeyed, lm)
        return None

    try:
        st, binary = await _status(config, decode)
        apple = None
        if st.backend != "apple":
            # Say why Apple's model is not the one in use: it is the default wherever it can run.
            apple_only = CoreLaunch(core=config.core, args=_with_backend(config.args, "apple"), env=config.env)
            apple, _ = await _status(apple_only)
    except ShimError as exc:
        print(f"wisp: {exc}", file=sys.stderr)
        return 1
    # --check is run by a person, not an MCP client, so stdout is theirs.
    print(f"backend:      {st.backend}")
    print(f"model:        {st.model}")
    print(f"available:    {'yes' if st.available else 'no'}" + (f" ({st.reason})" if st.reason else ""))
    print(f"context size: {st.context_size} tokens")
    print(f"max threads:  {st.max_threads}")
    if st.state_dir or st.state_error:
        print(f"state dir:    {st.state_dir or 'not in use: ' + (st.state_error or '')}")
    if apple is not None:
        why = f" ({apple.reason})" if apple.reason else ""
        print(f"apple model:  {'available' if apple.available else 'not available'}{why}")
    if use is not None:
        print(f"local model:  {_local_model_line(use)}")
        if use.plan.facts is not None and use.lm is not None:
            print(f"model file:   {use.plan.facts.describe(use.lm.context_size)}")
        if use.active and st.available:
            print("model key:    required (a request without it was refused)")
    print(f"core:         {binary}")
    print(f"version:      {version()} (wisp-mcp and wisp-core)")
    for line in http_server.describe(http) if http is not None else ():
        print(line)
    return 0 if st.available else 1


def _local_model_line(use: LocalModelUse) -> str:
    if use.active and use.lm is not None:
        return f"in use: {use.lm.program} serving {use.lm.model}"
    if use.plan.missing:
        return use.plan.missing
    return "installed, not in use (Apple's model is available)"


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
    config = core_launch(ns)
    from .task_records import TaskLimits  # after the SDK's server side is in (start)

    try:
        TaskLimits.from_env()  # refused here, before anything starts, rather than at the first call
    except ValueError as exc:
        raise SystemExit(f"wisp: {exc}") from None
    http = http_options(ns, generate_token=not ns.check)
    use = LocalModelUse(ns, config)
    if ns.check or http is not None:
        _imports_done()  # their imports come as they go; the stdio server's, in _serve
    if ns.check:
        return anyio.run(_check, config, use if use.plan.decision != local_model.LEAVE_TO_CORE else None, http)
    # wisp's event loop polls briefly for the core's reply before sleeping (loop.py).
    if http is not None:
        try:
            anyio.run(http_server.serve, config, max_threads(ns), http, _exit_now,
                      backend_options={"loop_factory": WispEventLoop})
        except http_server.HttpConfigError as exc:
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
