"""`python -m wisp_shim`: flags, logging (stderr only), and the stdio server's run."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import logging
import math
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
from .core_process import PROGRESS_EVERY_S, CoreLaunch
from .facts import BACKENDS, DEFAULT_MAX_THREADS, FLAG_MAXIMUMS, FLAG_MINIMUMS

log = logging.getLogger("wisp")

LOG_LEVELS = ("debug", "info", "warning", "error")

DESCRIPTION = """\
wisp: an MCP server (stdio) that hands work to a local language model and keeps
conversation threads with it. An MCP client starts it; you normally don't run it by hand.

It starts the wisp-core process (Swift) in the background. Every option below can also
be set with the environment variable shown; a flag wins over the environment.
"""

EPILOG = """\
examples:
  python -m wisp_shim --check                      is a model available? (prints status, exit 0 if so)
  python -m wisp_shim --backend echo               no model: replies "echo N: <prompt>" (for trying wisp)
  python -m wisp_shim --backend openai --endpoint http://127.0.0.1:8080/v1 --model qwen3
                                                   any OpenAI-compatible server (llama.cpp, Ollama, vLLM)

environment (a flag wins over its variable):
  WISP_BACKEND, WISP_MODEL, WISP_ENDPOINT, WISP_MAX_THREADS, WISP_MAX_QUEUE,
  WISP_CONTEXT_SIZE, WISP_LLAMA_SERVER, WISP_MODEL_PATH, WISP_ECHO_DELAY_MS, WISP_TIMEOUT,
  WISP_CORE, WISP_LOG_LEVEL    the flags above
  WISP_ROOTS                   --root: directories the model's file tools may read, ':'-separated
  WISP_API_KEY                 API key for --endpoint (environment only: it stays out of process listings)
  WISP_LOCAL_MODEL             0: never start the local model; 1: start it even on macOS
  WISP_LOCAL_CPU_THREADS       local model: the server's CPU threads (default half the available CPUs, at
                               most 4; WISP_LOCAL_THREADS, its old name, still works)
  WISP_CACHE_DIR               where `make local-model-native` caches llama-server (default ~/.cache/wisp)
  WISP_HTTP                    --http
  WISP_HTTP_TOKEN              --http: the bearer token (environment only: it stays out of process listings)
  WISP_TASK_TTL                MCP tasks: the longest a task's result is kept, in seconds (default 3600)
  WISP_MAX_TASKS               MCP tasks: tasks one client may hold, running or kept (default 32, at most 256)
  WISP_SLOTS                   llama-server's parallel slots, each live thread kept on one (default:
                               what its /props says; the local model's: one per live thread, as
                               memory allows; 0: name no slot)
  WISP_KEEP_ALIVE              Ollama: keep the model loaded this long between turns (default 30m)
  WISP_CONDENSE_TO             share of the context a thread is condensed down to on servers that
                               cannot shift their cache (default 0.5)
  WISP_PROGRESS_EVERY_S        progress notifications at least this often during a call (default 5)

wisp-core not found? Run `make build` in the wisp repository.
stdout carries only MCP messages; logs go to stderr. SIGTERM, SIGINT, SIGHUP and SIGQUIT
stop running calls and the core, and wisp exits.

shared server: python -m wisp_shim --http 127.0.0.1:8765 serves every MCP client on the
machine from one core and one model; clients send `Authorization: Bearer <token>` (docs/http.md).
"""


def _env_int(name: str) -> int | None:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return None
    try:
        return int(raw)
    except ValueError:
        raise SystemExit(f"wisp: {name}={raw!r} is not an integer") from None


def _env_float(name: str, default: float) -> float:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        return float(raw)
    except ValueError:
        raise SystemExit(f"wisp: {name}={raw!r} is not a number") from None


# Above any count anyone means (--max-sessions): the core's flags have their own (FLAG_MAXIMUMS).
MAX_FLAG_VALUE = 2**31 - 1
# The longest time a setting takes, in seconds (11.5 days): far above any use, far below what a
# monotonic deadline can hold.
MAX_SECONDS = 1_000_000.0


def _at_least(minimum: int, maximum: int = MAX_FLAG_VALUE) -> Callable[[str], int]:
    """An argparse type: an integer from minimum to maximum, so a bad value is refused here with
    a clear message instead of by a core that would then fail to start again and again."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be at least {minimum}, got {value}")
        if value > maximum:
            raise argparse.ArgumentTypeError(f"must be at most {maximum}, got {value}")
        return value

    return parse


def _core_flag(flag: str) -> Callable[[str], int]:
    return _at_least(FLAG_MINIMUMS[flag], FLAG_MAXIMUMS[flag])


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        prog="python -m wisp_shim",
        description=DESCRIPTION,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("--backend", choices=BACKENDS, help="model backend (WISP_BACKEND; default auto: apple where available, else openai)")
    ap.add_argument("--model", metavar="NAME", help="model name for the backend (WISP_MODEL)")
    ap.add_argument("--endpoint", metavar="URL", help="OpenAI-compatible base URL for --backend openai (WISP_ENDPOINT)")
    ap.add_argument("--max-threads", type=_core_flag("--max-threads"), metavar="N", help=f"live threads kept before the least recently used is evicted; also the local model's parallel slots unless WISP_SLOTS says, as memory allows (WISP_MAX_THREADS; default {DEFAULT_MAX_THREADS})")
    ap.add_argument("--max-queue", type=_core_flag("--max-queue"), metavar="N", help="calls waiting on one thread before new ones get `busy` (WISP_MAX_QUEUE)")
    ap.add_argument("--context-size", type=_core_flag("--context-size"), metavar="N", help="context window in tokens, when the backend cannot tell; the local model's per thread (WISP_CONTEXT_SIZE)")
    ap.add_argument("--llama-server", metavar="PATH",
                    help="local model: a compiled llama-server binary (WISP_LLAMA_SERVER; default: the one "
                         "`make local-model-native` built, else llama-server on PATH, else the xllamacpp wheel)")
    ap.add_argument("--model-path", "--local-model", metavar="GGUF",
                    help="local model: serve this GGUF instead of SmolLM2-135M-Instruct, with its own chat template "
                         "and its trained context as the bound (WISP_MODEL_PATH)")
    ap.add_argument("--root", action="append", metavar="DIR", help="directory the model's file tools may use; repeat for more (WISP_ROOTS, ':'-separated)")
    ap.add_argument("--allow-hardlinks", action="store_true", help="let the model's file tools read files with more than one hard link (WISP_ALLOW_HARDLINKS=1; default: refused, as such a file may be one from outside the roots)")
    ap.add_argument("--state-dir", metavar="DIR", help="durable threads: store every thread in DIR (created, mode 0700) so a crash or restart loses none (WISP_STATE_DIR; default: memory only)")
    ap.add_argument("--max-stored-threads", type=_core_flag("--max-stored-threads"), metavar="N", help="stored threads kept before the least recently used is deleted (WISP_MAX_STORED_THREADS; default 1000)")
    ap.add_argument("--echo-delay-ms", type=_core_flag("--echo-delay-ms"), metavar="N", help="echo backend: extra delay per reply (WISP_ECHO_DELAY_MS)")
    ap.add_argument("--timeout", type=float, metavar="SECONDS", help="time limit for one respond call (WISP_TIMEOUT; default 300)")
    ap.add_argument("--core", metavar="PATH", help="the wisp-core binary (WISP_CORE; default: bundled copy, then .build/release/wisp-core)")
    ap.add_argument("--log-level", choices=LOG_LEVELS, help="stderr log level for wisp and wisp-core (WISP_LOG_LEVEL; default info)")
    ap.add_argument("--check", action="store_true", help="start the core, print backend, model and availability, and exit (0 if a model is available)")
    http = ap.add_argument_group("shared server (MCP over streamable HTTP instead of stdio, for every client on the machine)")
    http.add_argument("--http", metavar="HOST:PORT", help=f"serve MCP at http://HOST:PORT/mcp (WISP_HTTP; e.g. {http_server.DEFAULT_HTTP}); every request needs the bearer token")
    http.add_argument("--token-file", metavar="PATH", help="--http: read the token from PATH (mode 0600) when WISP_HTTP_TOKEN is not set (default: a generated one in $XDG_CONFIG_HOME/wisp/http-token)")
    http.add_argument("--allow-remote", action="store_true", help="--http: allow an address that is not loopback (put a TLS proxy in front)")
    http.add_argument("--eager", action="store_true", help="--http: start the core and the local model at once, not with the first request")
    http.add_argument("--max-sessions", type=_at_least(1), metavar="N", help=f"--http: 2025-11-25 MCP sessions open at once; 2026-07-28 clients open none (default {http_server.DEFAULT_MAX_SESSIONS})")
    http.add_argument("--session-idle-timeout", type=float, metavar="SECONDS", help=f"--http: a session without a request this long is closed (default {http_server.DEFAULT_SESSION_IDLE_S:g})")
    return ap.parse_args(argv)


# The core's counting flags a user sets through the shim (--slots is the local model's to give,
# and WISP_SLOTS its to read), each with its variable.
ENV_FLAGS = {"WISP_" + flag[2:].replace("-", "_").upper(): flag for flag in FLAG_MINIMUMS if flag != "--slots"}


def core_launch(ns: argparse.Namespace) -> CoreLaunch:
    # Flags become core flags; WISP_* variables reach the core through the inherited environment,
    # so they are checked here: a core refusing its configuration would only be restarted in vain.
    for name, flag in ENV_FLAGS.items():
        raw = os.environ.get(name)
        if raw:
            try:
                _core_flag(flag)(raw)
            except argparse.ArgumentTypeError as exc:
                raise SystemExit(f"wisp: {name}: {exc}") from None
    args: list[str] = []
    for flag, value in (
        ("--backend", ns.backend),
        ("--model", ns.model),
        ("--endpoint", ns.endpoint),
        ("--max-threads", ns.max_threads),
        ("--max-queue", ns.max_queue),
        ("--context-size", ns.context_size),
        ("--echo-delay-ms", ns.echo_delay_ms),
        ("--state-dir", ns.state_dir),
        ("--max-stored-threads", ns.max_stored_threads),
        ("--log-level", ns.log_level),
    ):
        if value is not None:
            args += [flag, str(value)]
    for root in ns.root or ():
        args += ["--root", root]
    if ns.allow_hardlinks:
        args.append("--allow-hardlinks")
    timeout = ns.timeout if ns.timeout is not None else _env_float("WISP_TIMEOUT", 300.0)
    if not (math.isfinite(timeout) and 0 < timeout <= MAX_SECONDS):
        raise SystemExit(f"wisp: --timeout / WISP_TIMEOUT must be a finite number of seconds above 0 and at most "
                         f"{MAX_SECONDS:g}, got {timeout}")
    every = _env_float("WISP_PROGRESS_EVERY_S", PROGRESS_EVERY_S)
    if not (math.isfinite(every) and 0 < every <= MAX_SECONDS):
        raise SystemExit(f"wisp: WISP_PROGRESS_EVERY_S must be a finite number of seconds above 0 and at most "
                         f"{MAX_SECONDS:g}, got {every}")
    # As the core reads it: the flag wins over the variable, and an empty value means none.
    state_dir = (ns.state_dir if ns.state_dir is not None else os.environ.get("WISP_STATE_DIR")) or None
    return CoreLaunch(core=ns.core or os.environ.get("WISP_CORE") or None, args=args, timeout_s=timeout, state_dir=state_dir,
                      progress_every_s=every)


APPLE_ALTERNATIVES = (
    "Without Apple's model, wisp can use its own local model: run `make local-model` in the wisp repository "
    "(then `--backend auto` starts it whenever Apple's model is unavailable), or point --endpoint at an "
    "OpenAI-compatible server."
)


def max_threads(ns: argparse.Namespace) -> int:
    return ns.max_threads or _env_int("WISP_MAX_THREADS") or DEFAULT_MAX_THREADS


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


async def _status(config: CoreLaunch, then: Callable[[], Awaitable[str | None]] | None = None) -> tuple[protocol.StatusResult, str]:
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


def http_options(ns: argparse.Namespace, generate_token: bool = True) -> http_server.HttpOptions | None:
    """--http's settings, checked before anything starts (None: serve stdio)."""
    where = ns.http or os.environ.get("WISP_HTTP") or None
    if where is None:
        for flag, value in (("--token-file", ns.token_file), ("--allow-remote", ns.allow_remote), ("--eager", ns.eager),
                            ("--max-sessions", ns.max_sessions), ("--session-idle-timeout", ns.session_idle_timeout)):
            if value:
                raise SystemExit(f"wisp: {flag} is for the shared server: add --http HOST:PORT (or set WISP_HTTP)")
        return None
    idle = ns.session_idle_timeout if ns.session_idle_timeout is not None else http_server.DEFAULT_SESSION_IDLE_S
    if not (math.isfinite(idle) and idle > 0):
        raise SystemExit(f"wisp: --session-idle-timeout must be a finite number of seconds above 0, got {idle}")
    try:
        bind = http_server.parse_bind(where)
        http_server.check_bind(bind, ns.allow_remote)
        token = http_server.load_token(ns.token_file, generate=generate_token)
    except http_server.HttpConfigError as exc:
        raise SystemExit(f"wisp: {exc}") from None
    return http_server.HttpOptions(bind=bind, token=token, eager=ns.eager,
                                   max_sessions=ns.max_sessions or http_server.DEFAULT_MAX_SESSIONS, session_idle_s=idle)


async def _check(config: CoreLaunch, use: LocalModelUse | None = None, http: http_server.HttpOptions | None = None) -> int:
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
            apple, _ = await _status(CoreLaunch(core=config.core, args=_with_backend(config.args, "apple"), env=config.env))
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
        print(f"apple model:  {'available' if apple.available else 'not available'}" + (f" ({apple.reason})" if apple.reason else ""))
    if use is not None:
        print(f"local model:  {_local_model_line(use)}")
        if use.plan.facts is not None and use.lm is not None:
            print(f"model file:   {use.plan.facts.describe(use.lm.context_size)}")
        if use.active and st.available:
            print("model key:    required (a request without it was refused)")
    print(f"core:         {binary}")
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
    level = ns.log_level or os.environ.get("WISP_LOG_LEVEL") or "info"
    if level not in LOG_LEVELS:
        level = "info"
    logs.setup(level)  # stderr only, through a bounded buffer that never blocks (logs.py)
    if level != "debug":
        # The SDK logs every request at info; wisp's own lines are the useful ones.
        logging.getLogger("mcp").setLevel(logging.WARNING)
    config = core_launch(ns)
    from .tasks import TaskLimits  # after the SDK's server side is in (start)

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
            anyio.run(http_server.serve, config, max_threads(ns), http, _exit_now, backend_options={"loop_factory": WispEventLoop})
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
