"""A real PostgreSQL for the tests of `--store`: its own cluster made by `initdb` in a temporary
directory, served by `pg_ctl` on a Unix socket in that directory and a free port, stopped and
removed afterwards. The binaries are found under /usr/lib/postgresql/<version>/bin (Debian's
`postgresql` package; the newest there) or on PATH; without them the tests skip saying so.

PostgreSQL refuses to run as root: as root (CI's containers) the cluster belongs to `nobody`,
its commands run through `runuser` (util-linux), and a machine without it skips saying why."""

from __future__ import annotations

import contextlib
import glob
import os
import shutil
import socket
import subprocess
import tempfile
from pathlib import Path
from typing import NoReturn

import pytest

USER = "wisp"


def _bin_dir() -> Path | None:
    def version(d: str) -> tuple[int, ...]:
        part = Path(d).parent.name
        return tuple(int(x) for x in part.split(".") if x.isdigit())

    dirs = sorted((d for d in glob.glob("/usr/lib/postgresql/*/bin") if (Path(d) / "initdb").is_file()), key=version)
    if dirs:
        return Path(dirs[-1])
    found = shutil.which("initdb")
    return Path(found).parent if found else None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Postgres:
    """One running cluster: `url(password)` names it for `--store`; `stop()` and `start()` take
    it down and bring it back on the same socket and port."""

    def __init__(self, bindir: Path, root: Path, as_user: list[str], fsync: bool = False):
        self.bindir, self.root, self.as_user, self.fsync = bindir, root, as_user, fsync
        self.data, self.port = root / "data", _free_port()

    def _run(self, tool: str, *args: str) -> None:
        subprocess.run([*self.as_user, str(self.bindir / tool), *args], check=True, cwd=self.root,
                       stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, timeout=120)

    def init(self) -> None:
        self._run("initdb", "-D", str(self.data), "-U", USER, "--auth=trust", "-E", "UTF8", "--no-sync")

    def start(self) -> None:
        # The tests' cluster skips fsync (its durability is not what they test); the bench's keeps it.
        opts = f"-k {self.root} -c listen_addresses= -p {self.port} -c fsync={'on' if self.fsync else 'off'}"
        self._run("pg_ctl", "-D", str(self.data), "-o", opts, "-l", str(self.root / "log"), "-w", "start")

    def stop(self) -> None:
        self._run("pg_ctl", "-D", str(self.data), "-m", "fast", "-w", "stop")

    def sql(self, statement: str, database: str = "postgres") -> str:
        """What the server answers `statement`, as psql prints it unaligned (one value: that value)."""
        return subprocess.run([str(self.bindir / "psql"), "-XAtq", "-h", str(self.root), "-p", str(self.port), "-U", USER,
                               "-d", database, "-c", statement],
                              check=True, capture_output=True, text=True, timeout=60).stdout.strip()

    def url(self, password: str | None = None, database: str = "postgres") -> str:
        auth = f"{USER}:{password}" if password else USER
        return f"postgresql://{auth}@/{database}?host={self.root}&port={self.port}"


def _absent(why: str) -> NoReturn:
    """A skip naming why; a failure where CI installed PostgreSQL and said so (WISP_REQUIRE_POSTGRES=1)."""
    if os.environ.get("WISP_REQUIRE_POSTGRES") == "1":
        pytest.fail(f"WISP_REQUIRE_POSTGRES=1, but {why}")
    pytest.skip(why)


@contextlib.contextmanager
def postgres(fsync: bool = False):
    bindir = _bin_dir()
    if bindir is None:
        _absent("PostgreSQL's initdb is not installed (Debian: apt-get install postgresql); .ci/run installs it")
    as_user: list[str] = []
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        runuser = shutil.which("runuser")
        if runuser is None:
            _absent("running as root, where PostgreSQL will not start, and no runuser to start it as nobody")
        as_user = [runuser, "-u", "nobody", "--"]
    root = Path(tempfile.mkdtemp(prefix="wisp-pg-"))
    try:
        if as_user:
            shutil.chown(root, user="nobody")
        root.chmod(0o755)
        pg = Postgres(bindir, root, as_user, fsync)
        pg.init()
        pg.start()
        try:
            yield pg
        finally:
            with contextlib.suppress(subprocess.CalledProcessError, subprocess.TimeoutExpired):
                pg.stop()
    finally:
        shutil.rmtree(root, ignore_errors=True)
