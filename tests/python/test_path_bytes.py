"""Paths are bytes, end to end: a root named `café` (NFC) beside `cafe\u0301` (NFD, another
directory to Linux) holding a secret. Neither `files` nor any model tool may reach the sibling,
two client roots that differ only in normalisation are two roots, and an absolute NFD path
never resolves to the NFC root's file. Skipped where the file system takes the two names for
one (macOS's APFS and HFS+), since there the question does not arise."""

from __future__ import annotations

import json
import os

import pytest

from harness import REPO, error_text, ok, shim_command, wisp

pytestmark = pytest.mark.anyio

NFC = "caf\u00e9"
NFD = "cafe\u0301"


@pytest.fixture
def siblings(tmp_path):
    nfc, nfd = tmp_path / NFC, tmp_path / NFD
    nfc.mkdir()
    try:
        nfd.mkdir()
    except FileExistsError:
        pytest.skip("this file system takes NFC and NFD names for one name")
    if os.path.samefile(nfc, nfd):
        pytest.skip("this file system takes NFC and NFD names for one name")
    (nfc / "notes.txt").write_text("nfc notes\n")
    (nfc / "secret.txt").write_text("nfc own file\n")
    (nfd / "secret.txt").write_text("the nfd secret\n")
    # A sibling whose name begins with a combining mark: after a "/", `String.split` saw no separator.
    (tmp_path / "\u0301secret.txt").write_text("the combining secret\n")
    return nfc, nfd


async def tool(client, thread: str, name: str, args: dict) -> str:
    r = ok(await client.call_tool("respond", {"prompt": f"!tool {name} {json.dumps(args)}", "thread_id": thread}))
    return r["text"]


async def test_the_nfd_sibling_of_an_nfc_root_is_out_of_reach(siblings):
    nfc, nfd = siblings
    async with wisp("--root", str(nfc)) as client:
        for path in (f"../{NFD}/secret.txt", str(nfd / "secret.txt"), "../\u0301secret.txt"):
            result = await client.call_tool("respond", {"prompt": "read", "files": [path]})
            text = error_text(result)
            assert result.is_error and text.startswith("invalid_argument: files: ") and "outside the readable roots" in text, (path, text)
            assert "secret" not in text.replace("secret.txt", ""), (path, text)
        ok(await client.call_tool("respond", {"prompt": "hi", "thread_id": "t", "tools": ["read_file", "list_directory", "search_text"]}))
        calls = [
            ("read_file", {"path": f"../{NFD}/secret.txt"}),
            ("read_file", {"path": str(nfd / "secret.txt")}),
            ("read_file", {"path": "../\u0301secret.txt"}),
            ("list_directory", {"path": f"../{NFD}"}),
            ("search_text", {"pattern": "secret", "path": f"../{NFD}"}),
            ("search_text", {"pattern": "secret", "path": str(nfd)}),
        ]
        for n, (name, args) in enumerate(calls, start=2):
            text = await tool(client, "t", name, args)
            assert text.startswith(f"echo {n}: tool {name} failed: ") and "outside the readable roots" in text, (name, args, text)
            assert "the nfd secret" not in text and "the combining secret" not in text
        # The root's own files are still read, by their own (NFC) name.
        assert await tool(client, "t", "read_file", {"path": str(nfc / "secret.txt")}) == f"echo {len(calls) + 2}: tool read_file -> nfc own file\n"


async def test_client_roots_that_differ_only_in_normalisation_are_two_roots(siblings):
    from mcp import Client, StdioServerParameters, stdio_client
    from mcp.types import ListRootsResult, Root

    nfc, nfd = siblings
    elsewhere = nfc.parent / "elsewhere"
    elsewhere.mkdir()

    async def list_roots(context) -> ListRootsResult:
        return ListRootsResult(roots=[Root(uri=nfc.as_uri()), Root(uri=nfd.as_uri())])

    argv = shim_command("--backend", "echo", "--root", str(elsewhere))
    params = StdioServerParameters(command=argv[0], args=argv[1:], env={}, cwd=str(REPO))
    async with Client(stdio_client(params), mode="legacy", list_roots_callback=list_roots) as client:
        r = ok(await client.call_tool("respond", {"prompt": "read", "files": [str(nfd / "secret.txt"), str(nfc / "secret.txt")]}))
        assert r["text"] == f"echo 1: read\nfile {nfd / 'secret.txt'}: the nfd secret\nfile {nfc / 'secret.txt'}: nfc own file"
        ok(await client.call_tool("respond", {"prompt": "hi", "thread_id": "t", "tools": ["read_file"]}))
        assert await tool(client, "t", "read_file", {"path": str(nfd / "secret.txt")}) == "echo 2: tool read_file -> the nfd secret\n"
        assert await tool(client, "t", "read_file", {"path": str(nfc / "secret.txt")}) == "echo 3: tool read_file -> nfc own file\n"
