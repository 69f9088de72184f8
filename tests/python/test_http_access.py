"""Who may reach the shared server (`--http HOST:PORT`): the bearer token (none or a wrong one is
401 and nothing runs; the token file's own checks), loopback unless `--allow-remote`, this
server's own Host and Origin only, and a body over the limit refused before it is parsed.
Every server here listens on 127.0.0.1 on a port the OS picks, with the echo backend."""

from __future__ import annotations

import json
import os
import re
import secrets
import signal
import stat
import subprocess

import httpx2
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from harness import REPO, ok, shim_command, shim_env
from harness.http import (ACCEPT, MODERN_HEADERS, client, http_wisp, modern_call, start_http,
                          threads_of)


# --- 2. the token ---------------------------------------------------------------------------------


async def test_no_token_or_a_wrong_one_is_401_and_the_tool_never_runs():
    async with http_wisp() as server:
        wrong = [
            {},  # none
            {"Authorization": "Bearer " + server.token[:-1] + ("A" if server.token[-1] != "A" else "B")},
            {"Authorization": "Bearer " + server.token[:-1]},  # a prefix of it
            {"Authorization": "Bearer " + server.token + "x"},
            {"Authorization": "Basic " + server.token},
            {"Authorization": "Bearer"},
            {"Authorization": b"Bearer \xe9" + server.token.encode()},  # not ASCII
        ]
        async with httpx2.AsyncClient(timeout=30) as hc:
            for i, auth in enumerate(wrong):
                headers = {"Accept": ACCEPT, **MODERN_HEADERS, **auth}
                r = await hc.post(server.url, json=modern_call("respond", {"prompt": "x", "thread_id": f"probe{i}"}), headers=headers)
                assert r.status_code == 401, (auth, r.status_code, r.text)
                assert r.headers["www-authenticate"].startswith("Bearer"), r.headers
                # A 2025-11-25 initialize and a GET stream are refused the same way.
                init = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
                    "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "0"}}}
                r = await hc.post(server.url, json=init, headers={"Accept": ACCEPT, **auth})
                assert r.status_code == 401 and "mcp-session-id" not in r.headers
                r = await hc.get(server.url, headers={"Accept": "text/event-stream", **auth})
                assert r.status_code == 401
        # Through the SDK's own client with a wrong token: it fails to connect.
        with pytest.raises(Exception):  # noqa: B017 (the SDK names no type for a refused connection)
            async with client(server, "legacy", token="not-the-token-at-all-0123456789"):
                pass
        assert not server.core_pids(), "a request without the token started the core"
        assert await threads_of(server) == {}  # no probe thread was ever made


async def test_a_token_file_readable_by_others_or_not_a_regular_file_is_refused(tmp_path):
    good = tmp_path / "token"
    good.write_text(secrets.token_urlsafe(32) + "\n")
    good.chmod(0o644)
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo, 0o600)
    short = tmp_path / "short"
    short.write_text("abc\n")
    short.chmod(0o600)
    for path, why in ((good, "0644"), (tmp_path, "not a regular file"), (fifo, "not a regular file"),
                      (tmp_path / "missing", "does not exist"), (short, "at least 16")):
        proc = start_http("--token-file", str(path))
        try:
            _, err = proc.communicate(timeout=20)
        finally:
            if proc.poll() is None:
                proc.kill()
        assert proc.returncode not in (0, None) and why in err.decode() and str(path) in err.decode(), (path, err)
    good.chmod(0o600)
    async with http_wisp("--token-file", str(good)) as server:  # WISP_HTTP_TOKEN wins over the file
        assert "WISP_HTTP_TOKEN" in server.log()


async def test_a_generated_token_is_kept_0600_in_a_0700_dir_and_check_says_where_not_what(tmp_path):
    env = shim_env(XDG_CONFIG_HOME=str(tmp_path / "config"))
    path = tmp_path / "config" / "wisp" / "http-token"
    check = subprocess.run(shim_command("--backend", "echo", "--http", "127.0.0.1:8765", "--check"), env=env,
                           capture_output=True, text=True, timeout=60, cwd=REPO)
    assert check.returncode == 0, check.stderr
    assert str(path) in check.stdout and "http://127.0.0.1:8765/mcp" in check.stdout
    assert not path.exists()  # --check looks; it writes nothing
    proc = subprocess.Popen(shim_command("--backend", "echo", "--http", "127.0.0.1:0"), env=env, cwd=REPO,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stderr.readline()
        while "serving MCP at" not in line:
            assert line, "wisp exited before serving"
            line = proc.stderr.readline()
        url = re.search(r"(http://\S+/mcp)", line).group(1)
        token = path.read_text().strip()
        assert len(token) >= 43 and re.fullmatch(r"[A-Za-z0-9_-]+", token)
        assert stat.S_IMODE(path.stat().st_mode) == 0o600 and stat.S_IMODE(path.parent.stat().st_mode) == 0o700
        assert token not in line
        async with httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=30) as hc:
            async with Client(streamable_http_client(url, http_client=hc), mode="legacy") as c:
                ok(await c.call_tool("respond", {"prompt": "with the generated token"}))
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(10)
    check = subprocess.run(shim_command("--backend", "echo", "--http", "127.0.0.1:8765", "--check"), env=env,
                           capture_output=True, text=True, timeout=60, cwd=REPO)
    assert str(path) in check.stdout and token not in check.stdout + check.stderr
    # The next start reuses it.
    again = subprocess.Popen(shim_command("--backend", "echo", "--http", "127.0.0.1:0"), env=env, cwd=REPO,
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        while "serving MCP at" not in (line := again.stderr.readline()):
            assert line
    finally:
        again.send_signal(signal.SIGTERM)
        again.wait(10)
    assert path.read_text().strip() == token


# --- 3. loopback, Host and Origin -------------------------------------------------------------------


@pytest.mark.parametrize("text, want", [
    ("127.0.0.1:8765", ("127.0.0.1", 8765, True)),
    ("localhost:0", ("localhost", 0, True)),
    ("[::1]:8765", ("::1", 8765, True)),
    ("127.3.4.5:1", ("127.3.4.5", 1, True)),
    ("0.0.0.0:8765", ("0.0.0.0", 8765, False)),
    ("[::]:8765", ("::", 8765, False)),
    ("example.com:80", ("example.com", 80, False)),
])
def test_the_address_is_parsed_and_judged_loopback_or_not(text, want):
    from wisp_shim.http.options import parse_bind

    b = parse_bind(text)
    assert (b.host, b.port, b.loopback) == want


@pytest.mark.parametrize("text, says", [
    ("8765", "HOST:PORT"), (":8765", "HOST:PORT"), ("::1:8765", "brackets"),
    ("127.0.0.1:65536", "0 to 65535"), ("127.0.0.1:-1", "0 to 65535"), ("127.0.0.1:http", "0 to 65535"),
])
def test_a_malformed_address_is_refused_with_what_to_write(text, says):
    from wisp_shim.http.options import HttpConfigError, parse_bind

    with pytest.raises(HttpConfigError, match=says):
        parse_bind(text)


def test_only_this_servers_own_host_and_origin_are_allowed():
    from wisp_shim.http.options import parse_bind, security_settings

    s = security_settings(parse_bind("127.0.0.1:0"), 4321)
    assert s.enable_dns_rebinding_protection
    assert sorted(s.allowed_hosts) == ["127.0.0.1:4321", "localhost:4321"]  # no wildcard port
    assert sorted(s.allowed_origins) == ["http://127.0.0.1:4321", "http://localhost:4321"]
    assert sorted(security_settings(parse_bind("[::1]:0"), 80).allowed_hosts) == ["[::1]", "[::1]:80", "localhost", "localhost:80"]


def test_a_non_loopback_bind_without_allow_remote_refuses_to_start():
    for where in ("0.0.0.0:0", "[::]:0", "192.0.2.1:0", "example.com:0"):
        r = subprocess.run(shim_command("--backend", "echo", "--http", where), env=shim_env(WISP_HTTP_TOKEN="x" * 32),
                           capture_output=True, text=True, timeout=30, cwd=REPO)
        assert r.returncode != 0 and "--allow-remote" in r.stderr and "loopback" in r.stderr, (where, r.stderr)
    # WISP_HTTP is the same setting.
    r = subprocess.run(shim_command("--backend", "echo"), env=shim_env(WISP_HTTP="0.0.0.0:0", WISP_HTTP_TOKEN="x" * 32),
                       capture_output=True, text=True, timeout=30, cwd=REPO)
    assert r.returncode != 0 and "--allow-remote" in r.stderr


def test_a_port_in_use_is_refused_at_start_with_the_reason():
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        r = subprocess.run(shim_command("--backend", "echo", "--http", f"127.0.0.1:{port}"), env=shim_env(WISP_HTTP_TOKEN="x" * 32),
                           capture_output=True, text=True, timeout=30, cwd=REPO)
    assert r.returncode != 0 and f"cannot listen on 127.0.0.1:{port}" in r.stderr and "another port" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr


async def test_a_foreign_origin_is_403_and_a_foreign_host_421_even_with_the_token():
    async with http_wisp() as server:
        async with httpx2.AsyncClient(timeout=30) as hc:
            cases = [
                ({"Origin": "http://evil.example"}, 403),
                ({"Origin": f"http://evil.example:{server.port}"}, 403),
                ({"Origin": "http://127.0.0.1:1"}, 403),  # loopback, but another server's origin
                ({"Origin": "null"}, 403),
                ({"Host": f"evil.example:{server.port}"}, 421),  # a rebound DNS name
                ({"Host": "127.0.0.1:1"}, 421),
            ]
            for i, (extra, status) in enumerate(cases):
                body = modern_call("respond", {"prompt": "x", "thread_id": f"foreign{i}"})
                r = await hc.post(server.url, json=body, headers=server.headers(**MODERN_HEADERS, **extra))
                assert r.status_code == status, (extra, r.status_code, r.text)
            # This server's own origin, and localhost for it, are served.
            for origin in (f"http://127.0.0.1:{server.port}", f"http://localhost:{server.port}"):
                r = await hc.post(server.url, json=modern_call("respond", {"prompt": "x", "thread_id": "mine"}),
                                  headers=server.headers(**MODERN_HEADERS, Origin=origin))
                assert r.status_code == 200, (origin, r.text)
        assert await threads_of(server) == {"mine": 2}


async def test_a_body_over_the_limit_is_413_before_anything_runs():
    from wisp_shim.http.server import MAX_BODY_BYTES

    async with http_wisp() as server:
        big = modern_call("respond", {"prompt": "x" * (MAX_BODY_BYTES + 1), "thread_id": "big"})
        async with httpx2.AsyncClient(timeout=60) as hc:
            r = await hc.post(server.url, content=json.dumps(big).encode(), headers=server.headers(**MODERN_HEADERS, **{"Content-Type": "application/json"}))
            assert r.status_code == 413, r.text
            # A prompt just under the frame limit is a tool error from wisp's own check, not a 413.
        assert await threads_of(server) == {}
