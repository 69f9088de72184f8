"""https model servers, end to end through a real MCP client, shim and release core, against the
scripted OpenAI-compatible server behind TLS (tls_stub.py) with certificates made in the test:
a CA trusted through SSL_CERT_FILE works for a name and for an IP address; an untrusted CA, a
certificate for another name and an expired one each fail the call at once, naming the problem;
a core that cannot load OpenSSL says what to install, and plain http still works. On Linux only:
there the core's own client makes TLS with OpenSSL; on Apple's systems URLSession does, with the
keychain's trust (SSL_CERT_FILE is OpenSSL's convention)."""

from __future__ import annotations

import asyncio
import shutil
import stat
import subprocess
import sys
import time
from pathlib import Path

import anyio
import pytest

from harness import REPO, core_path, error_text, ok, shim_command, shim_env, wisp
from openai_stub import OpenAIStub, StubConfig
from tls_stub import certificates, served_over_tls

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"),
                                reason="wisp's own TLS client (OpenSSL loaded at run time) is the Linux core's")

# The verifier's words (X509_verify_cert_error_string) for each refusal.
UNTRUSTED = "unable to get local issuer certificate"
WRONG_NAME = "hostname mismatch"
EXPIRED = "certificate has expired"


@pytest.fixture(scope="module")
def certs(tmp_path_factory):
    return certificates(tmp_path_factory.mktemp("certs"))


def trusting(certs, endpoint: str, **env: str):
    return wisp("--endpoint", endpoint, backend="openai", env=shim_env(SSL_CERT_FILE=str(certs["ca"].cert), **env))


async def test_trusted_ca_serves_a_turn_and_a_streamed_turn(certs):
    partials: list[str] = []

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        if message and "filler" in message:
            partials.append(message)

    stub = served_over_tls(OpenAIStub(StubConfig(chunk_delay_s=0.05, words=8)), certs["localhost"])
    with stub:
        assert stub.endpoint.startswith("https://localhost:")
        async with trusting(certs, stub.endpoint) as c:
            st = ok(await c.call_tool("list_threads", {}))
            assert st["available"] is True, st
            first = ok(await c.call_tool("respond", {"prompt": "My name is Alice."}))
            assert first["text"].startswith("reply 1: My name is Alice."), first
            second = ok(await c.call_tool("respond", {"prompt": "Again, slowly.", "thread_id": first["thread_id"]},
                                          progress_callback=on_progress))
    assert second["text"].startswith("reply 2: Again, slowly. filler") and second["turns"] == 2, second
    assert partials, "no progress frame carried the streamed reply's text"
    chats = stub.chats()
    assert len(chats) == 2 and chats[1]["messages"][-1] == {"role": "user", "content": "Again, slowly."}
    assert all(r.headers["host"] == f"localhost:{stub.port}" for r in stub.requests)
    assert stub.handshake_errors == []


async def test_cancel_and_time_limit_close_the_tls_connection(certs):
    """As over http: a cancelled call closes its request at once and keeps no turn; a server
    that goes silent is bounded by the call's time limit."""
    cfg = StubConfig()
    with served_over_tls(OpenAIStub(cfg), certs["localhost"]) as stub:
        async with trusting(certs, stub.endpoint, WISP_TIMEOUT="3") as c:
            tid = ok(await c.call_tool("respond", {"prompt": "first"}))["thread_id"]
            cfg.words, cfg.chunk_delay_s = 200, 0.1  # about 20 s if not cancelled
            with anyio.move_on_after(1.0) as scope:
                await c.call_tool("respond", {"prompt": "long one", "thread_id": tid})
            assert scope.cancelled_caught
            deadline = time.monotonic() + 5
            while stub.disconnects < 1 and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
            assert stub.disconnects == 1  # the stub's next write met a closed TLS connection
            cfg.words, cfg.chunk_delay_s, cfg.first_byte_delay_s = 0, 0.0, 30.0
            t0 = time.monotonic()
            msg = error_text(await c.call_tool("respond", {"prompt": "silent", "thread_id": tid}))
            took = time.monotonic() - t0
            assert msg.startswith("timeout: no reply within 3 s") and f"thread '{tid}' is unchanged" in msg, msg
            assert took < 8, f"the time limit of 3 s fired after {took:.1f} s"
            cfg.first_byte_delay_s = 0.0
            s = ok(await c.call_tool("respond", {"prompt": "after", "thread_id": tid}))
    assert s["text"] == "reply 2: after" and s["turns"] == 2, s
    assert [m["content"] for m in stub.chats()[-1]["messages"]] == ["first", "reply 1: first", "after"]


async def test_ip_address_certificate_serves_127_0_0_1(certs):
    with served_over_tls(OpenAIStub(), certs["ip"], host="127.0.0.1") as stub:
        async with trusting(certs, stub.endpoint) as c:
            r = ok(await c.call_tool("respond", {"prompt": "by address"}))
    assert r["text"] == "reply 1: by address"


@pytest.mark.parametrize("leaf, host, reason", [
    ("untrusted", "localhost", UNTRUSTED),
    ("other-name", "localhost", WRONG_NAME),
    ("localhost", "127.0.0.1", "ip address mismatch"),
    ("expired", "localhost", EXPIRED),
])
async def test_refused_certificate_fails_at_once_naming_the_problem(certs, leaf, host, reason):
    with served_over_tls(OpenAIStub(), certs[leaf], host=host) as stub:
        async with trusting(certs, stub.endpoint) as c:
            t0 = time.monotonic()
            msg = error_text(await c.call_tool("respond", {"prompt": "hello"}))
            elapsed = time.monotonic() - t0
            st = ok(await c.call_tool("list_threads", {}))
    assert msg.startswith("model_unavailable:"), msg
    assert "certificate was refused" in msg and reason in msg.lower() and stub.endpoint in msg, msg
    assert "SSL_CERT_FILE" in msg, msg  # what the user can change
    assert elapsed < 10, f"a refused certificate took {elapsed:.1f} s to fail"
    assert st["available"] is False and reason in st["reason"].lower(), st
    assert stub.chats() == [] and stub.requests == []  # nothing was sent over the refused connection
    assert stub.handshake_errors, "the server saw no failed handshake"


async def test_ssl_cert_dir_is_trusted_too(certs, tmp_path):
    """SSL_CERT_DIR: a directory of CA certificates named by subject hash (`openssl rehash`)."""
    openssl = shutil.which("openssl")
    if openssl is None:
        pytest.skip("no openssl command to name the CA by its subject hash")
    ca = certs["ca"].cert
    digest = subprocess.run([openssl, "x509", "-hash", "-noout", "-in", str(ca)], capture_output=True, text=True,
                            check=True).stdout.strip()
    (tmp_path / f"{digest}.0").write_bytes(ca.read_bytes())
    with served_over_tls(OpenAIStub(), certs["localhost"]) as stub:
        env = shim_env(SSL_CERT_DIR=str(tmp_path), SSL_CERT_FILE=str(tmp_path / "none.pem"))
        async with wisp("--endpoint", stub.endpoint, backend="openai", env=env) as c:
            assert ok(await c.call_tool("respond", {"prompt": "by directory"}))["text"] == "reply 1: by directory"


async def test_system_store_does_not_trust_the_test_ca(certs):
    """Without SSL_CERT_FILE the system's store decides: it has never heard of the test's CA."""
    with served_over_tls(OpenAIStub(), certs["localhost"]) as stub:
        async with wisp("--endpoint", stub.endpoint, backend="openai", env=shim_env()) as c:
            msg = error_text(await c.call_tool("respond", {"prompt": "hello"}))
    assert UNTRUSTED in msg.lower() and stub.requests == [], msg


async def test_plain_http_to_a_tls_port_is_a_clear_error(certs):
    with served_over_tls(OpenAIStub(), certs["localhost"]) as stub:
        plain = stub.endpoint.replace("https://", "http://")
        async with wisp("--endpoint", plain, backend="openai", env=shim_env()) as c:
            t0 = time.monotonic()
            msg = error_text(await c.call_tool("respond", {"prompt": "hello"}))
            assert time.monotonic() - t0 < 10
    assert msg.startswith(("model_unavailable:", "generation_failed:")) and plain in msg, msg


def test_the_core_links_no_tls_or_http_library():
    """OpenSSL is loaded at run time, and only for https; URLSession's stack (FoundationNetworking,
    libcurl) is not in the Linux core at all: a static core could not link them."""
    readelf = shutil.which("readelf")
    if readelf is None:
        pytest.skip("no readelf to list the core's NEEDED libraries")
    dynamic = subprocess.run([readelf, "-d", core_path()], capture_output=True, text=True, check=True).stdout
    needed = [line.split("[", 1)[1].rstrip("]") for line in dynamic.splitlines() if "(NEEDED)" in line]
    assert needed, dynamic  # a dynamic core lists its libraries; none would mean the parse is wrong
    linked = [lib for lib in needed if lib.startswith(("libssl", "libcrypto", "libcurl", "libFoundationNetworking"))]
    assert linked == [], f"the core links {linked}"


def core_without_openssl(tmp_path: Path) -> str:
    """The release core as a system without OpenSSL 3 runs it: dlopen("libssl.so.3") finds a
    file that is no library first (LD_LIBRARY_PATH is searched before the system's), set for
    the core alone, since the shim's own Python needs the real one."""
    lib = tmp_path / "no-openssl"
    lib.mkdir()
    (lib / "libssl.so.3").write_bytes(b"not a shared library\n" * 8)
    wrapper = tmp_path / "wisp-core-without-openssl"
    wrapper.write_text(f'#!/bin/sh\nLD_LIBRARY_PATH="{lib}" exec "{core_path()}" "$@"\n')
    wrapper.chmod(wrapper.stat().st_mode | stat.S_IXUSR)
    return str(wrapper)


def test_no_openssl_check_names_what_to_install(tmp_path):
    core = core_without_openssl(tmp_path)
    run = subprocess.run(shim_command("--backend", "openai", "--endpoint", "https://localhost:1/v1", "--check",
                                      core=core), capture_output=True, text=True, timeout=120, env=shim_env(),
                         cwd=REPO, stdin=subprocess.DEVNULL)
    said = run.stdout + run.stderr
    assert run.returncode == 1, said
    assert "available:    no" in run.stdout and "https endpoint at localhost cannot be used" in run.stdout, said
    assert "libssl.so.3 could not be loaded" in run.stdout and "apt-get install libssl3" in run.stdout, said
    # At start too: the core's first words on stderr.
    assert "wisp-core" in run.stderr and "libssl3" in run.stderr, run.stderr


async def test_no_openssl_https_calls_say_so_and_plain_http_works(tmp_path):
    core = core_without_openssl(tmp_path)
    async with wisp("--endpoint", "https://localhost:1/v1", core=core, backend="openai", env=shim_env()) as c:
        msg = error_text(await c.call_tool("respond", {"prompt": "hello"}))
    assert msg.startswith("model_unavailable:") and "apt-get install libssl3" in msg, msg
    with OpenAIStub() as stub:
        async with wisp("--endpoint", stub.endpoint, core=core, backend="openai", env=shim_env()) as c:
            assert ok(await c.call_tool("respond", {"prompt": "plain"}))["text"] == "reply 1: plain"
