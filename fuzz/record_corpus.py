"""Record real pipe traffic into the fuzz seed corpora.

    .venv/bin/python fuzz/record_corpus.py          # rewrites fuzz/corpus-swift/real-* and fuzz/corpus-python/real-*

Runs one MCP session (the SDK client, the shim, the release wisp-core with the echo
backend) with wisp-core behind a recording proxy, then splits what crossed the pipe into
frames: shim -> core frames seed the Swift decoder's corpus (fuzz/corpus-swift), core ->
shim frames seed the Python decoder's corpus (fuzz/corpus-python). Each frame is one seed
(length prefix included); the whole stream in each direction is one more.

Run as `record_corpus.py --proxy DIR CORE ARGS…` it is that proxy: it starts CORE, copies
stdin to it and its stdout back, and appends both streams to files in DIR.
"""

from __future__ import annotations

import asyncio
import os
import struct
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "python"))


def proxy(out_dir: Path, argv: list[str]) -> int:
    core = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    pid = os.getpid()

    def pump(src, dst, record: Path) -> None:
        with record.open("ab") as rec:
            while True:
                data = os.read(src.fileno(), 1 << 16)
                if not data:
                    break
                rec.write(data)
                rec.flush()
                try:
                    dst.write(data)
                    dst.flush()
                except (BrokenPipeError, ValueError):
                    break
        try:
            dst.close()
        except OSError:
            pass

    to_core = threading.Thread(target=pump, args=(sys.stdin.buffer, core.stdin, out_dir / f"in-{pid}"), daemon=True)
    to_core.start()
    pump(core.stdout, sys.stdout.buffer, out_dir / f"out-{pid}")
    return core.wait()


async def session(core_wrapper: str) -> None:
    from harness import wisp

    async def ignore(*_):
        pass

    async with wisp("--context-size", "256", "--root", str(REPO / "fuzz"), core=core_wrapper) as c:
        r = await c.call_tool("respond", {"prompt": "hello", "thread_id": "t1"})
        await c.call_tool("respond", {"prompt": "again, with \u00e9 and \U0001F600 and \"quotes\"\n", "thread_id": "t1"})
        await c.call_tool("respond", {"prompt": "!sleep 300 streamed", "thread_id": "t2"}, progress_callback=ignore)
        await c.call_tool("respond", {"prompt": "be brief", "instructions": "You are terse.", "tools": ["read_file", "list_directory"], "temperature": 0.2, "max_output_tokens": 64})
        await c.call_tool("respond", {"prompt": "!tool list_directory {\"path\": \".\"}", "thread_id": "tools", "tools": ["list_directory"]})
        await c.call_tool("respond", {"prompt": "!tool read_file {\"path\": \"../etc/passwd\"}", "thread_id": "tools"})
        await c.call_tool("respond", {"prompt": "!fail generation_failed", "thread_id": "t3"})
        await c.call_tool("respond", {"prompt": "x" * 1100, "thread_id": "t1"})  # context overflow
        for i in range(4):
            await c.call_tool("respond", {"prompt": "y" * 200, "thread_id": "small"})  # condensing
        await c.call_tool("respond", {"prompt": "p", "thread_id": "t1", "instructions": "late"})
        await c.call_tool("list_threads", {})
        await c.call_tool("close_thread", {"thread_id": "t2"})
        await c.call_tool("close_thread", {"thread_id": "never"})
        try:
            await asyncio.wait_for(c.call_tool("respond", {"prompt": "!sleep 5000 cancelled", "thread_id": "t1"}), 0.3)
        except asyncio.TimeoutError:
            pass
        await asyncio.sleep(0.3)
        assert r.structured_content["thread_id"] == "t1"


def frames(stream: bytes) -> list[bytes]:
    out, i = [], 0
    while i + 4 <= len(stream):
        (n,) = struct.unpack(">I", stream[i:i + 4])
        out.append(stream[i:i + 4 + n])
        i += 4 + n
    return out


def main() -> int:
    if len(sys.argv) > 2 and sys.argv[1] == "--proxy":
        return proxy(Path(sys.argv[2]), sys.argv[3:])
    from harness import core_path

    with tempfile.TemporaryDirectory() as tmp:
        rec = Path(tmp)
        wrapper = rec / "wisp-core"
        wrapper.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{Path(__file__).resolve()}" --proxy "{rec}" "{core_path()}" "$@"\n')
        wrapper.chmod(0o755)
        asyncio.run(session(str(wrapper)))
        ins = b"".join(p.read_bytes() for p in sorted(rec.glob("in-*")))
        outs = b"".join(p.read_bytes() for p in sorted(rec.glob("out-*")))
    for name, stream, corpus in (("requests", ins, REPO / "fuzz" / "corpus-swift"), ("replies", outs, REPO / "fuzz" / "corpus-python")):
        corpus.mkdir(exist_ok=True)
        for old in corpus.glob("real-*"):
            old.unlink()
        fs = frames(stream)
        seen = set()
        for i, f in enumerate(fs):
            if f not in seen:
                seen.add(f)
                (corpus / f"real-{name}-{i:03d}").write_bytes(f)
        (corpus / f"real-{name}-stream").write_bytes(stream)
        print(f"{corpus.relative_to(REPO)}: {len(seen)} frames of {name} and the whole stream ({len(stream)} bytes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
