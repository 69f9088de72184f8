"""Keeps one wisp-core running: started on demand, its readiness awaited, the watchdog that
pings a silent core, and the restart policy (backoff, what a death means for pending calls).

The process itself is core/process.py's, its stdout core/reader.py's; what the frames mean to
callers (calls, replies, lost threads) is the client's business (core/client.py), reached through
the small `CoreListener` interface (core/reader.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import re
import time
from pathlib import Path
from typing import Any

from .. import errors
from . import protocol
from .process import BUILD_HINT, CoreLaunch, CoreProcess, find_core, kill, stop_process
from .reader import CoreListener, read_frames
from ..errors import ShimError

log = logging.getLogger("wisp.core")

# A core writes Ready before loading any model, so this only bounds a wedged start.
READY_TIMEOUT_S = 15.0
RESTART_BACKOFF_MIN_S = 0.1
RESTART_BACKOFF_MAX_S = 5.0
# A core that lived this long was healthy; its crash restarts at the minimum delay.
HEALTHY_RUN_S = 10.0
# The watchdog: while calls are pending and the core has sent nothing for PING_AFTER_S, the
# shim sends a `ping` (answered by the core's dispatcher at once, whatever the model does);
# if nothing at all comes back within PING_TIMEOUT_S, the core is wedged or stopped and is
# restarted like a crashed one. It looks every WATCHDOG_TICK_S, so a wedged core is found
# within PING_AFTER_S + PING_TIMEOUT_S + 2 ticks (6 s). The silence is counted from the core's
# last frame (or from when calls began waiting on an idle core), never from the shim's last
# write: new calls arriving every second must not keep a stopped core from being found.
PING_AFTER_S = 2.0
PING_TIMEOUT_S = 3.0
WATCHDOG_TICK_S = 0.5


class Supervisor:
    """Keeps one wisp-core child running: started on demand, restarted whenever it dies."""

    def __init__(self, launch: CoreLaunch, listener: CoreListener) -> None:
        self.launch = launch
        self._listener = listener
        self._run: CoreProcess | None = None
        self._starting: asyncio.subprocess.Process | None = None
        self._startup_error: ShimError | None = None
        self._changed = asyncio.Event()
        self._kick = asyncio.Event()
        self._closing = False
        self._task: asyncio.Task[None] | None = None
        self.binary: Path | None = None

    def start(self) -> None:
        """Begin starting the core in the background; calls wait for it to be ready."""
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._supervise(), name="wisp-core supervisor")

    async def aclose(self) -> None:
        """Stop the core: close its stdin, then SIGTERM, then SIGKILL."""
        self._closing = True
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
        run = self._run
        procs = [x for x in (self._starting, run.proc if run else None) if x is not None]
        if run is not None:
            if run.watchdog is not None:
                run.watchdog.cancel()
            self._listener.shutting_down(run)
        for proc in procs:
            await stop_process(proc)
        if self.launch.companion is not None:
            self.launch.companion.after_stop()
        self._notify()

    async def running(self) -> CoreProcess:
        """The running core, waiting for a (re)start if needed."""
        while True:
            if self._closing:
                raise ShimError(errors.SHUTTING_DOWN, "wisp is shutting down.")
            run = self._run
            if run is not None and not run.dead:
                return run
            if self._task is None:
                self.start()
            changed = self._changed
            if self._startup_error is not None and self._starting is None:
                # A failed start is retried when someone needs the core, not only on a timer,
                # so building the binary while the server runs is enough to fix it.
                self._kick.set()
            await changed.wait()
            if self._run is None and self._startup_error is not None and self._starting is None:
                raise self._startup_error

    def _notify(self) -> None:
        ev, self._changed = self._changed, asyncio.Event()
        ev.set()

    async def _supervise(self) -> None:
        backoff = RESTART_BACKOFF_MIN_S
        while not self._closing:
            self._kick.clear()
            run = await self._start_once()
            if run is None:
                # Start failed: waiting calls have the reason; retry on the next call or later.
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(self._kick.wait(), timeout=max(backoff, 1.0) * 10)
                backoff = min(backoff * 2, RESTART_BACKOFF_MAX_S)
                continue
            rc, reason = await self._serve(run)
            if self._closing:
                return
            lived = time.monotonic() - run.started
            self._on_death(run, rc, reason)
            if lived >= HEALTHY_RUN_S:
                backoff = RESTART_BACKOFF_MIN_S
            log.warning("restarting wisp-core in %.1f s", backoff)
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._kick.wait(), timeout=backoff)
            backoff = min(backoff * 2, RESTART_BACKOFF_MAX_S)

    async def _start_once(self) -> CoreProcess | None:
        try:
            if self.launch.companion is not None:
                await self.launch.companion.before_start()
            path = find_core(self.launch.core)
            self.binary = path
            argv = [str(path), *self.launch.args]
            # An endpoint URL may carry a user and password: the log names the host only.
            log.info("starting %s", " ".join(re.sub(r"(?<=://)[^/@\s]*@", "", a) for a in argv))
            env = None if self.launch.env is None else {**os.environ, **self.launch.env}
            # stderr is inherited: the core's logs go where the shim's go, never to stdout.
            # Its stdout is a pipe of our own, read by _CoreStdout (see _read).
            out_r, out_w = os.pipe()
            try:
                proc = await asyncio.create_subprocess_exec(*argv, stdin=asyncio.subprocess.PIPE, stdout=out_w, env=env)
            except BaseException:
                os.close(out_r)
                raise
            finally:
                os.close(out_w)
        except ShimError as exc:
            self._startup_failed(exc)
            return None
        except OSError as exc:
            self._startup_failed(ShimError(errors.CORE_UNAVAILABLE, f"could not start wisp-core: {exc}. {BUILD_HINT}"))
            return None
        self._starting = proc
        run = CoreProcess(proc)
        run.stdout_fd = out_r
        run.reader = asyncio.get_running_loop().create_task(read_frames(run, self._listener), name="wisp-core reader")
        try:
            first: set[asyncio.Future[Any]] = {run.ready, run.reader}
            done, _ = await asyncio.wait(first, timeout=READY_TIMEOUT_S,
                                         return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:
            self._starting = None
            await stop_process(proc)
            raise
        if run.ready.done() and run.ready.exception() is None:
            ready = run.ready.result()
            self._starting = None
            self._run = run
            self._startup_error = None
            log.info("wisp-core ready: pid %d, backend %s, model %s", ready.pid, ready.backend, ready.model)
            run.watchdog = asyncio.get_running_loop().create_task(self._watch(run), name="wisp-core watchdog")
            self._notify()
            return run
        await stop_process(proc)
        failure = await _failed_start(run, hung=not done)
        self._starting = None
        self._startup_failed(failure)
        return None

    def _startup_failed(self, exc: ShimError) -> None:
        log.error("%s", exc.message)
        self._startup_error = exc
        self._notify()

    async def _watch(self, run: CoreProcess) -> None:
        """Restart a core that stopped answering while calls wait on it (see PING_AFTER_S)."""
        while not run.dead:
            await asyncio.sleep(WATCHDOG_TICK_S)
            if run.dead:
                return
            now = time.monotonic()
            if not run.pending:
                # Nobody waits: an idle core may be as slow as it likes.
                run.ping = run.busy_since = None
                continue
            if run.ping is not None and run.last_frame >= run.ping[1]:
                run.ping = None  # it said something since: alive
            if run.ping is None:
                # Quiet since its last frame, or since calls began waiting if that is later (a
                # core idle for an hour has not been silent towards a call sent a moment ago).
                if now - max(run.last_frame, run.busy_since or now) >= PING_AFTER_S:
                    ping_id = self._listener.next_id()
                    run.ping = (ping_id, now)
                    run.send(protocol.encode(protocol.Ping(id=ping_id)))
                continue
            if now - run.ping[1] >= PING_TIMEOUT_S:
                run.fault = (
                    f"stopped answering: no reply to a liveness ping within {PING_TIMEOUT_S:g} s while "
                    f"{len(run.pending)} call(s) waited, so wisp stopped it"
                )
                log.error("wisp-core (pid %d) %s", run.proc.pid, run.fault)
                await kill(run.proc)
                return

    async def _serve(self, run: CoreProcess) -> tuple[int | None, str | None]:
        reader = run.reader
        assert reader is not None
        try:
            return await asyncio.shield(reader)
        except asyncio.CancelledError:
            if reader.done():
                return reader.result()
            raise

    def _on_death(self, run: CoreProcess, rc: int | None, reason: str | None) -> None:
        run.dead = True
        self._run = None
        if run.watchdog is not None:
            run.watchdog.cancel()
        if run.fault:
            how = run.fault
        elif reason:
            how = f"was stopped after a protocol error ({reason})"
        elif rc is not None and rc >= 0:
            how = f"exited with status {rc}"
        else:
            how = f"was killed by signal {-(rc or 0)}"
        self._listener.core_exited(run, how)
        self._notify()


async def _failed_start(run: CoreProcess, hung: bool) -> ShimError:
    """Why a core that was stopped before it was ready did not start: it died or hung before
    Ready (nothing was running on it, so nothing was lost), or its Ready was refused."""
    try:
        if run.reader is None:
            raise LookupError("no reader was started")
        rc, reason = await run.reader
    except Exception:
        rc, reason = run.proc.returncode, None
    refused = run.ready.exception() if run.ready.done() else None
    if isinstance(refused, errors.CoreRefused):
        return refused
    detail = f"it did not say it was ready within {READY_TIMEOUT_S:.0f} s" if hung else "it exited before it was ready"
    why = f" ({reason})" if reason else ""
    return ShimError(errors.CORE_UNAVAILABLE,
                     f"wisp-core could not start: {detail}, exit status {rc}{why}. Its log on the MCP server's stderr "
                     "says why; `python -m wisp_shim --check` runs the same start by hand.")
