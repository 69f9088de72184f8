"""The one reader of a wisp-core's stdout: frames decoded and handed to the client
(CoreListener) as they arrive, until EOF or a frame that breaks the protocol.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from typing import Protocol

from .. import errors
from . import protocol
from .. import version
from .process import CoreProcess
from ..errors import ShimError
from ..loop import connect_read_pipe

log = logging.getLogger("wisp.core")


class CoreListener(Protocol):
    """The client side, as the supervisor sees it."""

    def next_id(self) -> int: ...

    def dispatch(self, run: CoreProcess, msg: protocol.CoreMessage) -> None:
        """A frame from a ready core (any frame but Ready); may raise ProtocolError."""

    def core_exited(self, run: CoreProcess, how: str) -> None:
        """The core died (`how` says how); its pending calls must fail."""

    def shutting_down(self, run: CoreProcess) -> None:
        """The shim is stopping this core for good; its pending calls must fail."""


async def read_frames(run: CoreProcess, listener: CoreListener) -> tuple[int | None, str | None]:
    """The one reader of the core's stdout: hands each frame on until EOF.

    A protocol on the pipe rather than a loop over asyncio's StreamReader: each reply is
    decoded and its caller's future resolved in the event loop's own read callback. The
    StreamReader path (subprocess transport -> call_soon -> StreamReader -> reader task ->
    future) cost two more event-loop iterations per call (bench/README.md has the figure).
    """
    loop = asyncio.get_running_loop()
    ended: asyncio.Future[str | None] = loop.create_future()
    transport, _ = await connect_read_pipe(
        loop, lambda: _CoreStdout(run, listener, ended), os.fdopen(run.stdout_fd, "rb", buffering=0)
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
            refused = version.mismatch(msg.version)
            if refused:
                ready.set_exception(errors.CoreRefused(refused))  # what the supervisor says
                ready.exception()  # mark retrieved
                raise protocol.ProtocolError(refused)  # and the core is killed
            if msg.protocol != protocol.PROTOCOL_VERSION:
                raise protocol.ProtocolError(f"wisp-core speaks pipe protocol {msg.protocol}, this shim speaks "
                                             f"{protocol.PROTOCOL_VERSION}; rebuild both (`make build`)")
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
