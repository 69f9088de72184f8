"""The wisp-core child process: finding the binary, starting it, reading its stdout, the
watchdog, restarting it with backoff when it dies, and stopping it.

What the frames mean to callers (calls, replies, lost threads) is the client's business
(client.py), reached through the small `CoreListener` interface below.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from . import errors
from . import protocol
from .errors import ShimError
from .loop import spin_for_reply

if TYPE_CHECKING:
    from .client import PendingCall

log = logging.getLogger("wisp.core")

CORE_NAME = "wisp-core"
BUILD_HINT = (
    "Build it with `make build` in the wisp repository (or `swift build -c release --product wisp-core`), "
    "or point --core / WISP_CORE at an existing wisp-core binary."
)

# What the core's flags accept, for the shim to refuse a bad value before starting it (a core
# that refuses its flags would fail to start again and again); a test checks they agree.
BACKENDS = ("auto", "apple", "openai", "echo")
DEFAULT_MAX_THREADS = 32
FLAG_MINIMUMS = {"--max-threads": 1, "--max-queue": 0, "--context-size": 1, "--max-stored-threads": 1, "--echo-delay-ms": 0}

# A core writes Ready before loading any model, so this only bounds a wedged start.
READY_TIMEOUT_S = 15.0
RESTART_BACKOFF_MIN_S = 0.1
RESTART_BACKOFF_MAX_S = 5.0
# A core that lived this long was healthy; its crash restarts at the minimum delay.
HEALTHY_RUN_S = 10.0
# How long a closing core gets after stdin EOF, and then after SIGTERM, before SIGKILL:
# together well under the 2 s in which wisp promises to exit on a signal.
EOF_GRACE_S = 0.5
TERM_GRACE_S = 1.0
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
# Bounds for the shim's memory of thread ids, which must not grow without limit
# across a long session.
MAX_REMEMBERED_IDS = 4096


@dataclass
class CoreLaunch:
    """How the shim launches wisp-core (the core's own flags are in `args`)."""

    core: str | None = None
    args: list[str] = field(default_factory=list)
    timeout_s: float = 300.0
    env: dict[str, str] | None = None
    # The state dir configured (--state-dir / WISP_STATE_DIR), for what wisp tells callers about
    # retention; whether the core could use it, its Ready (durable) and status say.
    state_dir: str | None = None
    # Awaited before each start of the core, e.g. to bring up the local model server it will
    # talk to (local_model.py); `args` is read after it, so it may add to them. A ShimError it
    # raises fails the start like a missing binary.
    before_start: Callable[[], Awaitable[None]] | None = None
    # Called once the core is stopped for good (aclose), e.g. to stop that server.
    after_stop: Callable[[], None] | None = None
    # Awaited when a respond call fails, with the call's start (time.monotonic()); returns the
    # error the caller sees, e.g. one naming the signal that killed the local model server
    # during the call (the core sees only a broken connection).
    explain: Callable[[ShimError, float], Awaitable[ShimError]] | None = None


def find_core(explicit: str | None = None) -> Path:
    """The wisp-core binary: --core / WISP_CORE, a copy bundled in the package, then
    the repository's release build, searched upward from the package and the cwd."""
    if explicit:
        path = Path(explicit).expanduser()
        if path.is_file() and os.access(path, os.X_OK):
            return path
        raise ShimError(errors.CORE_MISSING, f"the wisp-core binary named by --core/WISP_CORE ({path}) is not an executable file. {BUILD_HINT}")
    here = Path(__file__).resolve().parent
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
    raise ShimError(errors.CORE_MISSING, f"the wisp-core binary was not found (looked for {candidates[0]} and .build/release/{CORE_NAME} above {here} and {Path.cwd()}). {BUILD_HINT}")


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
        (transport.py: 128 calls, 64 MiB), not by the core."""
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


class CoreListener(Protocol):
    """The client side, as the supervisor sees it."""

    def next_id(self) -> int: ...

    def dispatch(self, run: CoreProcess, msg: protocol.CoreMessage) -> None:
        """A frame from a ready core (any frame but Ready); may raise ProtocolError."""

    def core_exited(self, run: CoreProcess, how: str) -> None:
        """The core died (`how` says how); its pending calls must fail."""

    def shutting_down(self, run: CoreProcess) -> None:
        """The shim is stopping this core for good; its pending calls must fail."""


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
            await _stop_process(proc)
        if self.launch.after_stop is not None:
            self.launch.after_stop()
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
            if self.launch.before_start is not None:
                await self.launch.before_start()
            path = find_core(self.launch.core)
            self.binary = path
            argv = [str(path), *self.launch.args]
            log.info("starting %s", " ".join(argv))
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
        run.reader = asyncio.get_running_loop().create_task(self._read(run), name="wisp-core reader")
        try:
            done, _ = await asyncio.wait({run.ready, run.reader}, timeout=READY_TIMEOUT_S, return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:
            self._starting = None
            await _stop_process(proc)
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
        # Died or hung before Ready: nothing was running on it, so nothing was lost.
        detail = "it exited before it was ready" if done else f"it did not say it was ready within {READY_TIMEOUT_S:.0f} s"
        await _stop_process(proc)
        try:
            rc, reason = await run.reader
        except Exception:
            rc, reason = proc.returncode, None
        self._starting = None
        why = f" ({reason})" if reason else ""
        self._startup_failed(
            ShimError(
                errors.CORE_UNAVAILABLE,
                f"wisp-core could not start: {detail}, exit status {rc}{why}. Its log on the MCP server's stderr says "
                "why; `python -m wisp_shim --check` runs the same start by hand.",
            )
        )
        return None

    def _startup_failed(self, exc: ShimError) -> None:
        log.error("%s", exc.message)
        self._startup_error = exc
        self._notify()

    async def _read(self, run: CoreProcess) -> tuple[int | None, str | None]:
        """The one reader of the core's stdout: hands each frame on until EOF.

        A protocol on the pipe rather than a loop over asyncio's StreamReader: each reply is
        decoded and its caller's future resolved in the event loop's own read callback. The
        StreamReader path (subprocess transport -> call_soon -> StreamReader -> reader task ->
        future) cost two more event-loop iterations per call, ~40 us of a ~110 us round trip.
        """
        loop = asyncio.get_running_loop()
        ended: asyncio.Future[str | None] = loop.create_future()
        transport, _ = await loop.connect_read_pipe(
            lambda: _CoreStdout(run, self._listener, ended), os.fdopen(run.stdout_fd, "rb", buffering=0)
        )
        try:
            reason = await ended
        finally:
            transport.close()
        if reason is not None:
            log.error("protocol error from wisp-core: %s; killing it", reason)
            with contextlib.suppress(ProcessLookupError):
                run.proc.kill()
        if not run.ready.done():
            run.ready.set_exception(ShimError(errors.CORE_UNAVAILABLE, reason or "exited before ready"))
            run.ready.exception()  # mark retrieved
        rc = await run.proc.wait()
        return rc, reason

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
                await _terminate(run.proc)
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


class _CoreStdout(asyncio.Protocol):
    """The core's stdout: frames are handed on as they arrive. `ended` gets None at EOF,
    or the reason the stream can no longer be trusted."""

    def __init__(self, run: CoreProcess, listener: CoreListener, ended: asyncio.Future[str | None]) -> None:
        self._run = run
        self._listener = listener
        self._ended = ended
        self._decoder = protocol.FrameDecoder()

    def data_received(self, data: bytes) -> None:
        if self._ended.done():
            return
        self._run.last_frame = time.monotonic()
        try:
            for payload in self._decoder.feed(data):
                self._handle(protocol.decode_message(payload))
        except protocol.ProtocolError as exc:
            self._ended.set_result(str(exc))

    def _handle(self, msg: protocol.CoreMessage) -> None:
        ready = self._run.ready
        if isinstance(msg, protocol.Ready):
            if ready.done():
                raise protocol.ProtocolError("a second ready frame")
            if msg.protocol != protocol.PROTOCOL_VERSION:
                raise protocol.ProtocolError(f"wisp-core speaks pipe protocol {msg.protocol}, this shim speaks {protocol.PROTOCOL_VERSION}; rebuild both (`make build`)")
            ready.set_result(msg)
        elif not ready.done():
            raise protocol.ProtocolError("the first frame was not ready")
        else:
            self._listener.dispatch(self._run, msg)

    def connection_lost(self, exc: Exception | None) -> None:
        if self._ended.done():
            return
        try:
            self._decoder.finish()
        except protocol.ProtocolError as err:
            self._ended.set_result(str(err))
            return
        self._ended.set_result(None)


def _signal(proc: asyncio.subprocess.Process, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        proc.send_signal(sig)


async def _wait(proc: asyncio.subprocess.Process, grace: float | None) -> bool:
    try:
        await asyncio.wait_for(proc.wait(), grace)
        return True
    except asyncio.TimeoutError:
        return False


async def _terminate(proc: asyncio.subprocess.Process) -> None:
    """SIGTERM, then SIGKILL. SIGCONT goes with the SIGTERM: a stopped process (SIGSTOP) keeps
    a SIGTERM pending until it runs again, and only SIGKILL or SIGCONT can change that."""
    if proc.returncode is not None:
        return
    _signal(proc, signal.SIGTERM)
    _signal(proc, signal.SIGCONT)
    if not await _wait(proc, TERM_GRACE_S):
        _signal(proc, signal.SIGKILL)
        await _wait(proc, None)


async def _stop_process(proc: asyncio.subprocess.Process) -> None:
    """Close the core's stdin (a healthy core exits at EOF), then _terminate."""
    if proc.returncode is not None:
        return
    if proc.stdin is not None:
        with contextlib.suppress(Exception):
            proc.stdin.close()
    # No signal yet: Popen.send_signal polls first, and that can reap a core that is just
    # exiting under asyncio's child watcher, which then reports status 255. A stopped core,
    # which cannot see the EOF, gets its SIGCONT with the SIGTERM.
    if not await _wait(proc, EOF_GRACE_S):
        await _terminate(proc)
