"""The MCP stdio transport on asyncio pipes instead of worker threads.

The SDK's `stdio_server()` reads stdin and writes stdout through `anyio.wrap_file`, which
runs every `readline`, `write` and `flush` in a worker thread: three thread hand-offs per
request, a large share of a round trip on a 2-core machine (bench/README.md has the figure).
Here the same `stdio_server()` is fed streams backed by non-blocking asyncio pipe
transports, so a request costs no thread hand-off at all. Everything else (JSON-RPC
parsing, the message streams) is still the SDK's.

The SDK's fd diversion is kept: while serving, fd 0 reads /dev/null and fd 1 goes to
stderr, so nothing a library or child process prints can corrupt the wire; the real
stdin and stdout are served from private duplicates and restored on exit.

When stdin or stdout is not a pipe or socket (a file, a terminal), this falls back to the
SDK's own transport: asyncio's pipe transports need one, and making a shared terminal
non-blocking would affect the shell too.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import os
import stat
from collections.abc import AsyncIterator
from typing import Any, cast

from ..loop import connect_read_pipe
from .guard import screened

# One JSON-RPC line may carry a 16 MiB prompt, escaped; a longer line is cut here (and
# answered as a parse error) rather than buffered without limit.
MAX_LINE_BYTES = 256 * 1024 * 1024


def _streamable(fd: int) -> bool:
    try:
        mode = os.fstat(fd).st_mode
    except OSError:
        return False
    return stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode)


class _LineReader(asyncio.Protocol):
    """`async for line in stdin`, as the SDK's stdio_server reads it, fed by a pipe transport.

    Reads ahead at most READ_AHEAD_BYTES of whole lines, then pauses the pipe until the
    server takes them: a client that floods requests meets backpressure (its writes block)
    instead of growing the shim. One line longer than that is still read to its end.
    """

    READ_AHEAD_BYTES = 256 * 1024

    def __init__(self) -> None:
        self._buf = bytearray()
        self._scanned = 0  # bytes of _buf already searched for a newline
        self._lines: collections.deque[bytes] = collections.deque()
        self._queued = 0
        self._eof = False
        self._paused = False
        self._waiter: asyncio.Future[None] | None = None
        self._transport: asyncio.ReadTransport | None = None

    # protocol side
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self._buf += data
        while (i := self._buf.find(b"\n", self._scanned)) >= 0:
            line = bytes(self._buf[: i + 1])
            del self._buf[: i + 1]
            self._scanned = 0
            self._lines.append(line)
            self._queued += len(line)
        self._scanned = len(self._buf)
        if len(self._buf) > MAX_LINE_BYTES:
            self._lines.append(bytes(self._buf))  # the SDK answers it as a parse error
            self._buf.clear()
            self._scanned = 0
        if self._lines and self._queued >= self.READ_AHEAD_BYTES and not self._paused and self._transport is not None:
            self._transport.pause_reading()
            self._paused = True
        self._wake()

    def eof_received(self) -> bool:
        self._eof = True
        self._wake()
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self._eof = True
        self._wake()

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    # consumer side
    def __aiter__(self) -> _LineReader:
        return self

    async def __anext__(self) -> str:
        while not self._lines:
            if self._eof:
                if self._buf:  # a last line without its newline
                    line, self._buf = bytes(self._buf), bytearray()
                    text = line.decode("utf-8", errors="replace")
                    return screened(text)
                raise StopAsyncIteration
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        line = self._lines.popleft()
        self._queued -= len(line)
        if self._paused and self._queued < self.READ_AHEAD_BYTES // 2 and self._transport is not None:
            self._paused = False
            self._transport.resume_reading()
        text = line.decode("utf-8", errors="replace")
        # The SDK would read a request with an id such as 1.5 as a notification (transport/guard.py).
        return screened(text)


class _WriteFlow(asyncio.Protocol):
    """The stdout pipe's flow control: the transport calls pause_writing when its buffer
    passes the high-water mark and resume_writing when it drains below the low one."""

    def __init__(self) -> None:
        self._drained = asyncio.Event()
        self._drained.set()
        self._lost = False

    def pause_writing(self) -> None:
        self._drained.clear()

    def resume_writing(self) -> None:
        self._drained.set()

    def connection_lost(self, exc: Exception | None) -> None:
        self._lost = True
        self._drained.set()  # nothing will drain any more: let a waiting flush see the close

    async def drained(self) -> None:
        await self._drained.wait()
        if self._lost:
            raise ConnectionResetError("stdout is closed")


class _Writer:
    """`await stdout.write(text)` then `await stdout.flush()`, as stdio_server writes."""

    def __init__(self, transport: asyncio.WriteTransport, flow: _WriteFlow) -> None:
        self._transport = transport
        self._flow = flow

    async def write(self, text: str) -> None:
        if self._transport.is_closing():
            raise BrokenPipeError("stdout is closed")
        # Writes what the pipe takes now; the rest is buffered by the transport.
        self._transport.write(text.encode())

    async def flush(self) -> None:
        # Waits only while the transport's buffer is over its high-water mark (backpressure).
        await self._flow.drained()


@contextlib.asynccontextmanager
async def stdio_server() -> AsyncIterator[tuple[Any, Any]]:
    """Drop-in for `mcp.server.stdio.stdio_server()`."""
    from mcp.server.stdio import stdio_server as sdk_stdio_server

    if not (_streamable(0) and _streamable(1)):
        async with sdk_stdio_server() as streams:
            yield streams
        return

    loop = asyncio.get_running_loop()
    wire_in = os.dup(0)
    wire_out = os.dup(1)
    saved = [(0, os.dup(0)), (1, os.dup(1))]
    transports: list[asyncio.BaseTransport] = []
    try:
        # The diversion: stray reads see EOF, stray writes land on stderr.
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)
        os.close(devnull)
        os.dup2(2, 1)
        rt, reader = await connect_read_pipe(loop, _LineReader, os.fdopen(wire_in, "rb", buffering=0))
        transports.append(rt)
        wt, wp = await loop.connect_write_pipe(_WriteFlow, os.fdopen(wire_out, "wb", buffering=0))
        transports.append(wt)
        async with sdk_stdio_server(stdin=reader, stdout=_Writer(wt, wp)) as streams:  # type: ignore[arg-type]
            yield streams
    finally:
        if len(transports) == 2:
            # Let replies still in the transport's buffer reach the client before closing.
            out = cast(asyncio.WriteTransport, transports[1])
            for _ in range(100):
                if out.is_closing() or not out.get_write_buffer_size():
                    break
                await asyncio.sleep(0.01)
        for t in transports:
            t.close()
        for fd, copy in saved:
            with contextlib.suppress(OSError):
                os.dup2(copy, fd)
            os.close(copy)
