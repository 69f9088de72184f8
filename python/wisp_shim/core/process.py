"""One wisp-core child process: how it is launched (CoreLaunch, find_core), one run of it with
the calls waiting on it (CoreProcess), and how it is stopped (stdin EOF, SIGTERM with SIGCONT,
SIGKILL). Reading its stdout is core/reader.py's; restarting it, core/supervisor.py's.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import signal
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Protocol
from pathlib import Path

from .. import config, errors
from . import protocol
from ..errors import ShimError
from ..loop import spin_for_reply
from .pending import PendingCall

log = logging.getLogger("wisp.core")

CORE_NAME = "wisp-core"
BUILD_HINT = (
    "In a wisp checkout, build it with `make build` (or `swift build -c release --product wisp-core`); "
    "an installed wisp-mcp carries its own (reinstall it); or point --core / WISP_CORE at a wisp-core binary."
)


# Bounds for the shim's memory of thread ids, which must not grow without limit
# across a long session.
MAX_REMEMBERED_IDS = 4096
# How long a closing core gets after stdin EOF, and then after SIGTERM, before SIGKILL:
# together well under the 2 s in which wisp promises to exit on a signal.
EOF_GRACE_S = 0.5
TERM_GRACE_S = 1.0


class ModelCompanion(Protocol):
    """A model server the shim runs beside the core: the one interface through which the local
    model (localmodel/plugin.py) plugs into the core's lifetime and into `--check`."""

    async def before_start(self) -> None:
        """Awaited before each start of the core, to bring the server up. CoreLaunch's `args`
        and `env` are read after it, so it may add to them; a ShimError it raises fails the
        start like a missing binary."""

    def after_stop(self) -> None:
        """Called once the core is stopped for good (aclose)."""

    async def explain(self, error: ShimError, since: float) -> ShimError:
        """The error a failed respond call's caller sees, given the call's start
        (time.monotonic()): e.g. one naming the signal that killed the server during the call,
        which the core sees only as a broken connection."""

    async def check(self) -> str | None:
        """`--check`: what only a real request to the server shows (None: fine)."""

    def describe(self, available: bool) -> list[str]:
        """`--check`'s lines about it, given whether the core's model is available."""


@dataclass
class CoreLaunch:
    """How the shim launches wisp-core (the core's own flags are in `args`)."""

    core: str | None = None
    args: list[str] = field(default_factory=list)
    timeout_s: float = config.DEFAULT_TIMEOUT_S
    env: dict[str, str] | None = None
    # The store configured (config.store_kind: "state_dir", "postgresql"), for what wisp tells
    # callers about retention; whether the core could use it, its Ready (durable) and status say.
    store: str | None = None
    # A model server run beside the core, the local model (localmodel/plugin.py); None: none.
    companion: ModelCompanion | None = None
    # A call that asked for progress hears from wisp at least this often (core/client.py).
    progress_every_s: float = config.PROGRESS_EVERY_S

    @classmethod
    def from_flags(cls, ns: argparse.Namespace) -> CoreLaunch:
        """The launch the shim's flags and variables configure (config.py judges each)."""
        return cls(core=config.core_path(ns), args=config.core_args(ns), env=config.core_env(ns),
                   timeout_s=config.timeout_s(ns),
                   store=config.store_kind(ns), progress_every_s=config.progress_every_s())

    def with_backend(self, backend: str) -> CoreLaunch:
        """A launch of the same core with any --backend replaced by this one, and no companion."""
        args = self.args
        kept = [a for i, a in enumerate(args) if a != "--backend" and (i == 0 or args[i - 1] != "--backend")]
        return CoreLaunch(core=self.core, args=kept + ["--backend", backend], env=self.env)


def find_core(explicit: str | None = None) -> Path:
    """The wisp-core binary: --core / WISP_CORE, a copy bundled in the package, then
    the repository's release build, searched upward from the package and the cwd."""
    if explicit:
        path = Path(explicit).expanduser()
        if path.is_file() and os.access(path, os.X_OK):
            return path
        raise ShimError(errors.CORE_MISSING, f"the wisp-core binary named by --core/WISP_CORE ({path}) is not an "
                                             f"executable file. {BUILD_HINT}")
    here = Path(__file__).resolve().parents[1]  # the wisp_shim package, whose data (pyproject.toml) holds bin/
    candidates = [here / "bin" / CORE_NAME]
    seen: set[Path] = set()
    for start in (here, Path.cwd().resolve()):
        for d in (start, *start.parents):
            c = d / ".build" / "release" / CORE_NAME
            if c not in seen:
                seen.add(c)
                candidates.append(c)
    for c in candidates:
        if c.is_file() and os.access(c, os.X_OK):
            return c
    raise ShimError(errors.CORE_MISSING, f"the wisp-core binary was not found (looked for {candidates[0]} and "
                                         f".build/release/{CORE_NAME} above {here} and {Path.cwd()}). {BUILD_HINT}")


class CoreProcess:
    """One run of the core process, from spawn to exit, with the calls waiting on it."""

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc
        self.started = time.monotonic()
        self.ready: asyncio.Future[protocol.Ready] = asyncio.get_running_loop().create_future()
        self.pending: dict[int, PendingCall] = {}
        # Threads this core created for us and that we have not seen closed, oldest first.
        self.alive: OrderedDict[str, None] = OrderedDict()
        self.dead = False
        self.reader: asyncio.Task[tuple[int | None, str | None]] | None = None
        self.stdout_fd = -1  # the read end of the core's stdout
        # The watchdog's view: when the core last sent anything, when the first frame went to it
        # since the watchdog last saw no call pending (None: none since), and the ping it has
        # not answered yet (with when it went out).
        self.last_frame = time.monotonic()
        self.busy_since: float | None = None
        self.ping: tuple[int, float] | None = None
        self.watchdog: asyncio.Task[None] | None = None
        # Why the shim stopped this core itself (the watchdog), for the crash message.
        self.fault: str | None = None

    @property
    def durable(self) -> bool:
        """The core stores threads (--state-dir): a crash loses only turns it could not store."""
        return self.ready.done() and self.ready.exception() is None and self.ready.result().durable

    def remember(self, thread_id: str) -> None:
        self.alive[thread_id] = None
        self.alive.move_to_end(thread_id)
        while len(self.alive) > MAX_REMEMBERED_IDS:
            self.alive.popitem(last=False)

    def send(self, data: bytes) -> None:
        """Queue a whole frame for the core without waiting for it to be read.

        Never waiting is what lets a time limit, a cancel or a ping go out to a core that has
        stopped reading; what can queue here is bounded by the MCP layer's in-flight limits
        (transport/guard.py: 128 calls, 64 MiB), not by the core."""
        stdin = self.proc.stdin
        if self.dead or stdin is None:
            return
        now = time.monotonic()
        if self.busy_since is None:
            self.busy_since = now
        try:
            stdin.write(data)
        except (BrokenPipeError, ConnectionResetError, RuntimeError) as exc:
            # The reader sees the exit too and fails every pending call with the crash message.
            log.warning("write to wisp-core failed: %s", exc)
            return
        spin_for_reply(now - self.last_frame)


def _signal(proc: asyncio.subprocess.Process, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        proc.send_signal(sig)


async def _wait(proc: asyncio.subprocess.Process, grace: float | None) -> bool:
    try:
        await asyncio.wait_for(proc.wait(), grace)
        return True
    except asyncio.TimeoutError:
        return False


async def terminate(proc: asyncio.subprocess.Process) -> None:
    """SIGTERM, then SIGKILL. SIGCONT goes with the SIGTERM: a stopped process (SIGSTOP) keeps
    a SIGTERM pending until it runs again, and only SIGKILL or SIGCONT can change that."""
    if proc.returncode is not None:
        return
    _signal(proc, signal.SIGTERM)
    _signal(proc, signal.SIGCONT)
    if not await _wait(proc, TERM_GRACE_S):
        _signal(proc, signal.SIGKILL)
        await _wait(proc, None)


async def kill(proc: asyncio.subprocess.Process) -> None:
    """SIGKILL at once: for a core that stopped answering, whose clean SIGTERM exit would answer
    its waiting calls "cancelled" before the shim could give them their real verdict."""
    if proc.returncode is not None:
        return
    _signal(proc, signal.SIGKILL)
    await _wait(proc, None)


async def stop_process(proc: asyncio.subprocess.Process) -> None:
    """Close the core's stdin (a healthy core exits at EOF), then terminate."""
    if proc.returncode is not None:
        return
    if proc.stdin is not None:
        with contextlib.suppress(Exception):
            proc.stdin.close()
    # No signal yet: Popen.send_signal polls first, and that can reap a core that is just
    # exiting under asyncio's child watcher, which then reports status 255. A stopped core,
    # which cannot see the EOF, gets its SIGCONT with the SIGTERM.
    if not await _wait(proc, EOF_GRACE_S):
        await terminate(proc)
