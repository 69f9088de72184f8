#!/usr/bin/env python3
"""Fails on a Linux-only assumption in the tests that nothing guards: a /proc, /sys or /dev/shm
path, or a GNU-only tool flag (`grep -P`, `sed -i` with no suffix, `readlink -f`, `stat -c`,
`date -d`, `timeout`, `nproc`, `ps --ppid`, `xargs -r`, `find -printf`, `base64 -w`).
`make test` must pass on a Mac, and there is none here to find out on.

    scripts/check-portable-tests.py [PATH ...]     # default: tests/

A use is guarded when
- Swift: it sits inside `#if os(Linux)`;
- Python: the enclosing top-level statement (a def with its decorators, a table), up to two
  lines past the use, asks the platform (`sys.platform`, `platform.system()`, `psutil.LINUX`,
  `os.uname()`, a `skipif`);
- shell: the 15 lines before it ask `uname` or `$OSTYPE`;
- or its line says why it is fine: a `portable: <reason>` comment.
Comments and docstrings are prose, not uses. Process inspection goes through tests/python/harness/
(psutil) instead of /proc.
"""

from __future__ import annotations

import ast
import io
import re
import sys
import tokenize
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

RULES: list[tuple[str, re.Pattern[str]]] = [
    ("a /proc path (Linux only; use tests/python/harness/, i.e. psutil)", re.compile(r"/proc(/|\b)")),
    ("a /sys path (Linux only)", re.compile(r"/sys/")),
    ("/dev/shm (Linux only)", re.compile(r"/dev/shm\b")),
    ("grep -P (GNU grep only)", re.compile(r"\bgrep\s+(-\w*\s+)*-\w*P")),
    ("sed -i without a suffix (GNU sed only; BSD sed needs `sed -i.bak`)", re.compile(r"\bsed\s+(-\w+\s+)*-i(\s|[\"',\]]|$)")),
    ("readlink -f (GNU only before macOS 12.3)", re.compile(r"\breadlink\s+-\w*f|[\"']readlink[\"']\s*,\s*[\"']-\w*f")),
    ("stat -c (GNU stat; BSD stat uses -f)", re.compile(r"\bstat\s+-c\b")),
    ("date -d (GNU date; BSD date uses -j -f)", re.compile(r"\bdate\s+-d\b")),
    ("the timeout command (GNU coreutils, absent on macOS)", re.compile(r"(^|[\s;&|(`$])timeout\s+-?[\dsk]|\[\s*[\"']timeout[\"']")),
    ("nproc (GNU coreutils; use os.cpu_count())", re.compile(r"(^|[\s;&|(`$\[\"'])nproc([\s;&|)`\"']|$)")),
    ("ps --ppid (procps only)", re.compile(r"\bps\b[^\n]*--ppid")),
    ("xargs -r (GNU only)", re.compile(r"\bxargs\s+(-\w+\s+)*-\w*r")),
    ("find -printf (GNU find only)", re.compile(r"\bfind\b[^\n]*-printf")),
    ("base64 -w (GNU only)", re.compile(r"\bbase64\s+-w")),
]

PY_GUARD = re.compile(r"sys\.platform|platform\.system\(|psutil\.(LINUX|MACOS|OSX)|os\.uname\(|skipif")
SH_GUARD = re.compile(r"\buname\b|\$OSTYPE|\$\{OSTYPE")
MARKER = re.compile(r"portable:\s*\S")
SUFFIXES = {".py": "python", ".swift": "swift", ".sh": "shell", ".bash": "shell"}
SELF = Path(__file__).resolve()
# Deliberately bad samples that test this check (tests/python/test_portability_check.py); they
# live in scripts/portability-samples, outside what this check scans, but are skipped by name too.
SAMPLES = "portability-samples"

# Known Linux-only uses being fixed elsewhere, as (file, line) pairs: none now. An entry that
# no longer matches is reported, not failed, so such a change can merge in either order.
KNOWN: set[tuple[str, str]] = set()


def python_skips(text: str) -> tuple[set[int], dict[int, int]]:
    """Lines inside docstrings, and per line the column where a comment starts."""
    doc_lines: set[int] = set()
    comments: dict[int, int] = {}
    try:
        tree = ast.parse(text)
    except SyntaxError:
        return doc_lines, comments
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str):
                doc_lines.update(range(first.lineno, (first.end_lineno or first.lineno) + 1))
    try:
        for tok in tokenize.generate_tokens(io.StringIO(text).readline):
            if tok.type == tokenize.COMMENT:
                comments[tok.start[0]] = tok.start[1]
    except (tokenize.TokenError, IndentationError):
        pass
    return doc_lines, comments


def python_guarded(lines: list[str], i: int) -> bool:
    """Does the top-level statement around line i (0-based) ask the platform?"""
    start = i
    while start > 0 and not (lines[start] and not lines[start][0].isspace() and not lines[start].startswith((")", "]", "}"))):
        start -= 1
    while start > 0 and lines[start - 1].startswith("@"):
        start -= 1
    return any(PY_GUARD.search(line) for line in lines[start:i + 3])


def swift_linux_regions(lines: list[str]) -> set[int]:
    """0-based lines inside `#if os(Linux)` (not its #else)."""
    inside: set[int] = set()
    stack: list[bool] = []
    for n, line in enumerate(lines):
        s = line.strip()
        if s.startswith("#if"):
            stack.append(bool(re.match(r"#if\s+os\(Linux\)\s*$", s)))
        elif s.startswith(("#else", "#elseif")) and stack:
            stack[-1] = False
        elif s.startswith("#endif") and stack:
            stack.pop()
        elif any(stack):
            inside.add(n)
    return inside


def check_file(path: Path, shown: str) -> list[tuple[str, int, str, str]]:
    kind = SUFFIXES.get(path.suffix)
    if kind is None:
        return []
    text = path.read_text(errors="replace")
    lines = text.splitlines()
    doc_lines, comments = python_skips(text) if kind == "python" else (set(), {})
    linux = swift_linux_regions(lines) if kind == "swift" else set()
    found = []
    for n, line in enumerate(lines):
        if n + 1 in doc_lines or MARKER.search(line):
            continue
        code = line
        if kind == "python" and n + 1 in comments:
            code = line[:comments[n + 1]]
        elif kind == "swift":
            code = re.sub(r"^\s*//.*", "", line)
        elif kind == "shell":
            code = re.sub(r"^\s*#.*", "", line)
        for what, pattern in RULES:
            if not pattern.search(code):
                continue
            if kind == "swift" and n in linux:
                continue
            if kind == "python" and python_guarded(lines, n):
                continue
            if kind == "shell" and any(SH_GUARD.search(x) for x in lines[max(0, n - 15):n + 1]):
                continue
            found.append((shown, n + 1, what, line.strip()))
    return found


def main(argv: list[str]) -> int:
    roots = [Path(a) for a in argv] or [REPO / "tests"]
    problems = []
    for root in roots:
        files = [root] if root.is_file() else sorted(
            p for p in root.rglob("*") if p.is_file() and "__pycache__" not in p.parts and SAMPLES not in p.parts)
        for f in files:
            if f.resolve() == SELF:
                continue
            try:
                shown = str(f.resolve().relative_to(REPO))
            except ValueError:
                shown = str(f)
            problems += check_file(f, shown)
    known_seen = set()
    failing = []
    for shown, line_no, what, line in problems:
        if (shown, line) in KNOWN:
            known_seen.add((shown, line))
            continue
        failing.append(f"{shown}:{line_no}: {what}: {line}")
    if not argv:
        for shown, line in sorted(KNOWN - known_seen):
            print(f"check-portable-tests: note: the known case in {shown} is gone; delete it from KNOWN: {line}", file=sys.stderr)
    if failing:
        print("check-portable-tests: Linux-only assumptions in the tests that nothing guards "
              "(guard them, e.g. `@pytest.mark.skipif(sys.platform != \"linux\", reason=...)` or `#if os(Linux)`, "
              "or say why they are fine with a `portable: <reason>` comment):", file=sys.stderr)
        for line in failing:
            print(f"  {line}", file=sys.stderr)
        return 1
    print(f"check-portable-tests: no unguarded Linux-only use in {', '.join(str(r) for r in roots)}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
