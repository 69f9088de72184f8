"""Model tools end to end: a real MCP client, the shim, the core, the echo backend's
`!tool NAME JSON` directive (which calls a tool exactly as a model's tool call would)."""

from __future__ import annotations

import json
import time

import pytest

from harness import ESCAPES, error_text, ok, wisp, workspace  # noqa: F401 (workspace: the fixture)

pytestmark = pytest.mark.anyio


async def tool(client, thread: str, name: str, args) -> str:
    payload = args if isinstance(args, str) else json.dumps(args)
    r = ok(await client.call_tool("respond", {"prompt": f"!tool {name} {payload}", "thread_id": thread}))
    return r["text"]


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
        lines = found.split(" -> ", 1)[1].split("\n")
        assert sorted(lines[:-1]) == ["a.txt:3: needle here", "sub/b.txt:1: deep needle"]
        # The hard link is skipped, and the answer says so and how to allow it.
        assert lines[-1].startswith("[1 hard-linked") and "--allow-hardlinks" in lines[-1]


async def test_unknown_tool_at_creation_lists_the_valid_names(workspace):
    async with wisp("--root", str(workspace)) as client:
        message = error_text(await client.call_tool("respond", {"prompt": "hi", "tools": ["rm_rf"]}))
        assert "unknown tool" in message and "read_file" in message and "list_directory" in message and "search_text" in message


async def test_the_catalogue_in_respond_description_is_the_cores(tmp_path):
    """tools/list is answered before the core is up, so the shim names the catalogue itself."""
    from harness import core_exchange
    from wisp_shim.core import protocol
    from wisp_shim.facts import MODEL_TOOLS

    frames = core_exchange(["--backend", "echo"], protocol.frame(protocol.encode_payload(protocol.Status(id=1))), timeout=30)
    status = next(f for f in frames if f.get("id") == 1)
    assert sorted(status["result"]["tools"]) == sorted(MODEL_TOOLS)
    async with wisp() as client:
        respond = next(t for t in (await client.list_tools()).tools if t.name == "respond")
        described = respond.input_schema["properties"]["tools"]["description"]
        assert all(name in described for name in MODEL_TOOLS)


async def test_a_thread_with_tools_may_read_the_clients_roots(workspace, tmp_path):
    from mcp import Client, StdioServerParameters, stdio_client
    from mcp.types import ListRootsResult, Root

    from harness import REPO, shim_command

    offered = tmp_path / "client-root"
    offered.mkdir()
    (offered / "notes.txt").write_text("from the client's root\n")

    async def list_roots(context) -> ListRootsResult:
        return ListRootsResult(roots=[Root(uri=offered.as_uri(), name="project")])

    argv = shim_command("--backend", "echo", "--root", str(workspace))
    params = StdioServerParameters(command=argv[0], args=argv[1:], env={}, cwd=str(REPO))
    async with Client(stdio_client(params), mode="legacy", list_roots_callback=list_roots) as client:
        ok(await client.call_tool("respond", {"prompt": "hi", "thread_id": "t", "tools": ["read_file"]}))
        path = str(offered / "notes.txt")
        assert await tool(client, "t", "read_file", {"path": path}) == "echo 2: tool read_file -> from the client's root\n"
        # Its own root still works beside the client's.
        assert await tool(client, "t", "read_file", {"path": "a.txt", "end_line": 1}) == "echo 3: tool read_file -> line one\n"
    # Without the client's roots, the same path is refused.
    async with wisp("--root", str(workspace)) as client:
        ok(await client.call_tool("respond", {"prompt": "hi", "thread_id": "t", "tools": ["read_file"]}))
        assert "outside the readable roots" in await tool(client, "t", "read_file", {"path": str(offered / "notes.txt")})


async def test_hard_links_are_read_only_with_allow_hardlinks(workspace):
    async with wisp("--root", str(workspace)) as client:
        ok(await client.call_tool("respond", {"prompt": "hi", "thread_id": "t", "tools": ["read_file"]}))
        refused = await tool(client, "t", "read_file", {"path": "hardlink"})
        assert "has 2 hard links" in refused and "--allow-hardlinks" in refused and "WISP_ALLOW_HARDLINKS=1" in refused
    async with wisp("--root", str(workspace), "--allow-hardlinks") as client:
        ok(await client.call_tool("respond", {"prompt": "hi", "thread_id": "t", "tools": ["read_file"]}))
        assert await tool(client, "t", "read_file", {"path": "hardlink"}) == "echo 2: tool read_file -> linked secret\n"


async def test_a_catastrophic_regex_answers_fast_and_unsupported_syntax_is_named(tmp_path):
    (tmp_path / "bomb.txt").write_text("a" * 100_000 + "b\n")
    async with wisp("--root", str(tmp_path)) as client:
        ok(await client.call_tool("respond", {"prompt": "hi", "thread_id": "t", "tools": ["search_text"]}))
        start = time.monotonic()
        text = await tool(client, "t", "search_text", {"pattern": "(a+)+$", "regex": True})
        elapsed = time.monotonic() - start
        print(f"search_text (a+)+$ over a 100 KB line, end to end: {elapsed:.3f} s")
        assert text == "echo 2: tool search_text -> no matches"
        assert elapsed < 1.0
        text = await tool(client, "t", "search_text", {"pattern": "(a)\\1", "regex": True})
        assert text.startswith("echo 3: tool search_text failed: regex: backreference \\1 is not supported"), text
