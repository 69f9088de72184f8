"""The shared server's token: where it comes from (WISP_HTTP_TOKEN, --token-file, or one wisp
makes on first use), the checks its file must pass, and the one verdict on a request's
credentials: exactly one `Authorization: Bearer <token>` header, compared in constant time.
"""

from __future__ import annotations

import hmac
import json
import logging
import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from starlette.types import Send

log = logging.getLogger("wisp.http")

TOKEN_BYTES = 32
# A token set by hand must be hard to guess too, and must fit an HTTP header as it is.
MIN_TOKEN_CHARS = 16
MAX_TOKEN_FILE_BYTES = 4096
# A longer token cannot be wisp's: refused by length before it is compared.
MAX_TOKEN_CHARS = MAX_TOKEN_FILE_BYTES
_BEARER = b"bearer "


class HttpConfigError(Exception):
    """A --http setting wisp refuses to start with; the message says what to do."""


@dataclass(frozen=True)
class Token:
    value: bytes
    where: str  # said by --check and the start-up log: never the token itself


def default_token_path() -> Path:
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "wisp" / "http-token"


def _valid_token(text: str, where: str) -> bytes:
    token = text.strip()
    if not MIN_TOKEN_CHARS <= len(token) <= MAX_TOKEN_CHARS or not all("!" <= c <= "~" for c in token):
        raise HttpConfigError(
            f"the token in {where} must be at least {MIN_TOKEN_CHARS} printable ASCII characters (at most "
            f"{MAX_TOKEN_CHARS}) with no spaces; make one with: "
            "python3 -c 'import secrets; print(secrets.token_urlsafe(32))'"
        )
    return token.encode("ascii")


def read_token_file(path: Path) -> bytes:
    """The token in `path`, which must be a regular file of this user's that no one else may read."""
    try:
        # O_NONBLOCK: a FIFO put there must be refused, not waited on.
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        raise HttpConfigError(
            f"the token file {path} does not exist; create it (mode 0600) or leave out --token-file") from None
    except OSError as exc:
        raise HttpConfigError(f"the token file {path} cannot be opened: {exc.strerror}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise HttpConfigError(
                f"the token file {path} is not a regular file; point --token-file at a file that holds only the token")
        if st.st_uid != os.getuid():
            raise HttpConfigError(
                f"the token file {path} belongs to another user (uid {st.st_uid}); use a file of your own")
        mode = stat.S_IMODE(st.st_mode)
        if mode & 0o077:
            raise HttpConfigError(
                f"the token file {path} is readable or writable by others (mode {mode:04o}); "
                f"only its owner may use it: chmod 600 {path}"
            )
        if st.st_size > MAX_TOKEN_FILE_BYTES:
            raise HttpConfigError(f"the token file {path} is {st.st_size} bytes; it must hold only the token")
        # The size was read before: a file that grew since is still read no further than the bound.
        data = os.read(fd, MAX_TOKEN_FILE_BYTES + 1)
    finally:
        os.close(fd)
    if len(data) > MAX_TOKEN_FILE_BYTES:
        raise HttpConfigError(
            f"the token file {path} is over {MAX_TOKEN_FILE_BYTES} bytes; it must hold only the token")
    try:
        text = data.decode("ascii")
    except UnicodeDecodeError:
        text = ""
    return _valid_token(text, str(path))


def _generate_token(path: Path) -> bytes:
    """A new token in `path` (0600, in a 0700 directory); a token another wisp wrote there first wins."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    st = os.lstat(path.parent)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid():
        raise HttpConfigError(f"{path.parent} is not a directory of yours; set XDG_CONFIG_HOME or use --token-file")
    if stat.S_IMODE(st.st_mode) != 0o700:
        os.chmod(path.parent, 0o700)
    import secrets

    token = secrets.token_urlsafe(TOKEN_BYTES)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), 0o600)
    try:
        os.write(fd, (token + "\n").encode("ascii"))
        os.fsync(fd)
    finally:
        os.close(fd)
    try:
        os.link(tmp, path)  # never replaces a token file that is already there
    except FileExistsError:
        pass
    finally:
        os.unlink(tmp)
    return read_token_file(path)


def load_token(token_file: str | None, env: str | None, generate: bool = True) -> Token:
    """`env` (WISP_HTTP_TOKEN, as config.py read it), else --token-file, else the generated one
    (made on first use)."""
    if env:
        return Token(_valid_token(env, "WISP_HTTP_TOKEN"), "the environment variable WISP_HTTP_TOKEN")
    if token_file:
        path = Path(token_file).expanduser()
        return Token(read_token_file(path), str(path))
    path = default_token_path()
    if not os.path.lexists(path):
        if not generate:
            return Token(b"", f"{path} (not made yet: wisp writes a new token there when it starts with --http)")
        log.info("wrote a new HTTP token to %s", path)
        return Token(_generate_token(path), str(path))
    return Token(read_token_file(path), str(path))


# --- a request's credentials ----------------------------------------------------------------


@dataclass(frozen=True)
class Refusal:
    """Why a request's credentials are refused, as the HTTP answer says it."""

    status: int
    error: str
    description: str

    async def send(self, send: Send) -> None:
        """The answer, with `Connection: close`: a peer that has not shown the token keeps no connection."""
        body = json.dumps({"error": self.error, "error_description": self.description}).encode()
        challenge = f'Bearer error="{self.error}", error_description="{self.description}"'.encode()
        await send({"type": "http.response.start", "status": self.status, "headers": [
            (b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
            (b"www-authenticate", challenge), (b"connection", b"close")]})
        await send({"type": "http.response.body", "body": body, "more_body": False})


MISSING = Refusal(401, "invalid_token", "Authentication required: send Authorization: Bearer <token>")
WRONG = Refusal(401, "invalid_token", "The bearer token is not this server's")
AMBIGUOUS = Refusal(400, "invalid_request", "Send exactly one Authorization header")


class Credentials:
    """The one verdict on a request's credentials: None when it carries exactly one
    Authorization header whose bearer token is wisp's, else the refusal to send."""

    def __init__(self, token: bytes) -> None:
        if len(token) < MIN_TOKEN_CHARS:
            raise HttpConfigError("no token to serve with")  # an empty one would let `Bearer ` in
        self._token = token

    def judge(self, headers: list[tuple[bytes, bytes]]) -> Refusal | None:
        found = [value for name, value in headers if name == b"authorization"]
        if not found:
            return MISSING
        if len(found) > 1:
            return AMBIGUOUS  # which one counts is a guess wisp does not make
        value = found[0]
        if len(value) > len(_BEARER) + MAX_TOKEN_CHARS or value[: len(_BEARER)].lower() != _BEARER:
            return WRONG
        # Constant time, on the header's bytes as sent.
        return None if hmac.compare_digest(value[len(_BEARER):], self._token) else WRONG
