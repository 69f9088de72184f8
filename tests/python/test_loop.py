"""The shim's event loop (wisp_shim/loop.py): the read size of its pipe transports, and the
selector that polls before it sleeps."""

from __future__ import annotations

import asyncio
import fcntl
import os
import selectors
import time

import pytest

from wisp_shim import loop as wisp_loop


class _Chunks(asyncio.Protocol):
    def __init__(self) -> None:
        self.sizes: list[int] = []
        self.done = asyncio.get_running_loop().create_future()

    def data_received(self, data: bytes) -> None:
        self.sizes.append(len(data))

    def eof_received(self) -> None:
        self.done.set_result(None)


async def test_a_pipe_transport_reads_at_most_the_chunk_at_a_time():
    # asyncio's own size is 256 KiB: with 1 MiB waiting in the pipe before the first read, a
    # transport that ignored the chunk would take it in reads of up to 256 KiB.
    r, w = os.pipe()
    setpipe = getattr(fcntl, "F_SETPIPE_SZ", None)  # Linux: a pipe holds 64 KiB unless grown
    try:
        if setpipe is None:
            raise OSError("no F_SETPIPE_SZ")
        fcntl.fcntl(w, setpipe, 1 << 20)
    except OSError as exc:
        os.close(r)
        os.close(w)
        pytest.skip(f"cannot grow a pipe past the chunk here ({exc}), so cannot see the read size")
    os.set_blocking(w, False)
    sent = 0
    payload = b"x" * (1 << 20)
    try:
        while sent < len(payload):
            try:
                sent += os.write(w, payload[sent:])
            except BlockingIOError:
                break  # the pipe is full (its capacity is the kernel's); that is enough
    finally:
        os.close(w)
    loop = asyncio.get_running_loop()
    transport, chunks = await wisp_loop.connect_read_pipe(loop, _Chunks, os.fdopen(r, "rb", buffering=0))
    try:
        await asyncio.wait_for(chunks.done, 10)
    finally:
        transport.close()
    assert sum(chunks.sizes) == sent
    assert sent > 2 * wisp_loop.PIPE_READ_CHUNK
    assert max(chunks.sizes) == wisp_loop.PIPE_READ_CHUNK, chunks.sizes


def test_the_selector_polls_until_spin_until_then_sleeps_as_asked():
    sel = wisp_loop.SpinSelector()
    r, w = os.pipe()
    try:
        sel.register(r, selectors.EVENT_READ)
        # Something ready while it polls: returned at once.
        os.write(w, b"!")
        sel.spin_until = time.monotonic() + 5
        t = time.monotonic()
        assert [k.fd for k, _ in sel.select(None)] == [r]
        assert time.monotonic() - t < 1
        os.read(r, 1)
        # Nothing ready: the poll ends at spin_until, then the window is closed and the
        # timeout is what is left of it.
        sel.spin_until = time.monotonic() + 0.02
        t = time.monotonic()
        assert sel.select(0.05) == []
        assert 0.045 <= time.monotonic() - t and sel.spin_until == 0.0
    finally:
        sel.close()
        os.close(r)
        os.close(w)
