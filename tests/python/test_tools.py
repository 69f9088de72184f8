"""Model tools end to end: a real MCP client, the shim, the core, the echo backend's
`!tool NAME JSON` directive (which calls a tool exactly as a model's tool call would)."""

from __future__ import annotations

import json
import os

import pytest

from conftest import error_text, ok, wisp

pytestmark = pytest.mark.anyio


@pytest.fixture
def workspace(tmp_path):
    root = tmp_path / "root"
    (root / "sub").mkdir(parents=True)
    (tmp_path / "outside.txt").write_text("secret\n")
    (root / "a.txt").write_text("line one\nline two\nneedle here\n")
    (root / "sub" / "b.txt").write_text("deep needle\n")
    (root / "escape").symlink_to(tmp_path / "outside.txt")
    (root / "loop1").symlink_to(root / "loop2")
    (root / "loop2").symlink_to(root / "loop1")
    os.mkfifo(root / "fifo")
    (root / "huge.txt").write_bytes(b"x" * 3_000_000)
    (root / "bin.dat").write_bytes(b"\x7fELF\x00\x01\x02")
    return root


async def tool(client, thread: str, name: str, args) -> str:
    payload = args if isinstance(args, str) else json.dumps(args)
    r = ok(await client.call_tool("respond", {"prompt": f"!tool {name} {payload}", "thread_id": thread}))
    return r["text"]


ESCAPES = [
    ("dotdot chain", {"path": "../outside.txt"}, "outside the readable roots"),
    ("long dotdot chain", {"path": "sub/" + "../" * 12 + "etc/passwd"}, "outside the readable roots"),
    ("absolute outside", {"path": "/etc/passwd"}, "outside the readable roots"),
    ("symlink pointing out", {"path": "escape"}, "outside the readable roots"),
    ("symlink loop", {"path": "loop1"}, "no such file"),
    ("proc self", {"path": "/proc/self/environ"}, "outside the readable roots"),
    ("fifo", {"path": "fifo"}, "not a regular file"),
    ("dev zero", {"path": "/dev/zero"}, "outside the readable roots"),
    ("nul byte", {"path": "a.txt\u0000.png"}, "NUL byte"),
    ("directory to read_file", {"path": "sub"}, "is a directory; use list_directory"),
    ("binary", {"path": "bin.dat"}, "binary file"),
    ("wrong type", {"path": 5}, "'path' must be a string"),
    ("not json", "{path: a.txt", "arguments must be a JSON object"),
]


async def test_escape_attempts_are_refused_with_clear_messages(workspace):
    async with wisp("--root", str(workspace)) as client:
        ok(await client.call_tool("respond", {"prompt": "hi", "thread_id": "t", "tools": ["read_file", "list_directory"]}))
        n = 1
        for name, args, message in ESCAPES:
            n += 1
            text = await tool(client, "t", "read_file", args)
            assert text.startswith(f"echo {n}: tool read_file failed: "), (name, text)
            assert message in text, (name, text)
        # Reading inside the root works, and a huge file comes back capped with a note.
        n += 1
        assert await tool(client, "t", "read_file", {"path": "a.txt", "start_line": 2, "end_line": 3}) == f"echo {n}: tool read_file -> line two\nneedle here\n"
        n += 1
        huge = await tool(client, "t", "read_file", {"path": "huge.txt"})
        assert len(huge) < 7_000 and ("[file continues" in huge or "[cut at" in huge)
        n += 1
        listing = await tool(client, "t", "list_directory", {"path": "."})
        assert listing.startswith(f"echo {n}: tool list_directory -> ") and "sub/" in listing.split("\n")


async def test_only_tools_bound_at_creation_can_be_called(workspace):
    async with wisp("--root", str(workspace)) as client:
        ok(await client.call_tool("respond", {"prompt": "hi", "thread_id": "t", "tools": ["read_file"]}))
        text = await tool(client, "t", "search_text", {"pattern": "needle"})
        assert text == "echo 2: tool search_text failed: tool 'search_text' is not bound to this thread; bound: read_file"
        ok(await client.call_tool("respond", {"prompt": "hi", "thread_id": "s", "tools": ["search_text"]}))
        found = await tool(client, "s", "search_text", {"pattern": "needle"})
        assert sorted(found.split(" -> ", 1)[1].split("\n")) == ["a.txt:3: needle here", "sub/b.txt:1: deep needle"]


async def test_unknown_tool_at_creation_lists_the_valid_names(workspace):
    async with wisp("--root", str(workspace)) as client:
        message = error_text(await client.call_tool("respond", {"prompt": "hi", "tools": ["rm_rf"]}))
        assert "unknown tool" in message and "read_file" in message and "list_directory" in message and "search_text" in message
