"""`--store URL` (PostgreSQL) as far as it is built: the URL is taken from the flag or
WISP_STORE, refused beside --state-dir naming both, and its password never shown: not in the
shim's or the core's log (debug included), `--check`, nor an error, whether the database is
reachable or not. The store itself (threads kept in PostgreSQL) is issue 47's remaining work."""

from __future__ import annotations

import subprocess

import pytest

from harness import shim_command, shim_env
from harness.postgres import postgres

PASSWORD = "pw-7f3c9e-never-shown"


def run_check(*args: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(shim_command("--backend", "echo", "--check", "--log-level", "debug", *args),
                          env=shim_env(**env), capture_output=True, text=True, timeout=120)


def assert_hidden(p: subprocess.CompletedProcess) -> None:
    assert PASSWORD not in p.stdout and PASSWORD not in p.stderr, (p.stdout, p.stderr)


def test_state_dir_and_store_together_refused_naming_both(tmp_path):
    url = f"postgresql://wisp:{PASSWORD}@/db?host={tmp_path}"
    p = run_check("--state-dir", str(tmp_path / "s"), "--store", url)
    assert p.returncode != 0
    assert "--state-dir" in p.stderr and "--store" in p.stderr and "both given" in p.stderr, p.stderr
    assert "postgresql://wisp:***@/db" in p.stderr
    assert_hidden(p)


def test_store_from_the_environment_refused_beside_state_dir(tmp_path):
    p = run_check(WISP_STORE=f"postgres://u:{PASSWORD}@h/db", WISP_STATE_DIR=str(tmp_path / "s"))
    assert p.returncode != 0 and "both given" in p.stderr, p.stderr
    assert_hidden(p)


@pytest.mark.parametrize("url", ["mysql://u:{pw}@h/db", "{pw}"])
def test_not_a_postgresql_url_refused_without_quoting_it(url):
    p = run_check("--store", url.format(pw=PASSWORD))
    assert p.returncode != 0 and "postgresql:// or postgres://" in p.stderr, p.stderr
    assert_hidden(p)


def test_password_never_shown_reachable_or_not():
    with postgres() as pg:
        for url in (pg.url(PASSWORD), pg.url() + f"&password={PASSWORD}"):
            p = run_check("--store", url)
            assert p.returncode == 0, p.stderr
            assert "server version" in p.stdout, p.stdout
            assert_hidden(p)
        pg.stop()
        p = run_check("--store", pg.url(PASSWORD))
        assert "not reachable" in p.stdout and str(pg.root) in p.stdout, p.stdout
        assert_hidden(p)
        pg.start()
