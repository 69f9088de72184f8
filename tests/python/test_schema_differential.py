"""The core's schema verdict (swift/WispCore/Backends/OutputSchema.swift) against `jsonschema`,
the test oracle, over generated schemas (inside wisp's subset: each passes the shim's check) and
generated replies, near-valid and not. Asked through `wisp-core --check-replies`, which runs the
code a `respond` call runs.

Where the core's rules (ECMA-262 patterns, numbers as both Python and JavaScript read them,
strict JSON) and Python's (`re`, its reading alone, `json`) differ, the two may disagree: those
cases are not generated, and each is listed in DOCUMENTED_DIFFERENCES with the core's answer.

`make test` runs a short differential (WISP_SCHEMA_CASES, default 400); `make fuzz` a long one.
"""

from __future__ import annotations

import json
import math
import os
import random
import subprocess

import jsonschema
import pytest

from harness import core_path
from wisp_shim.mcp.schema import SchemaError, check_schema

CASES = int(os.environ.get("WISP_SCHEMA_CASES", "400"))
SEED = int(os.environ.get("WISP_SCHEMA_SEED", str(random.SystemRandom().randrange(1 << 32))))

NFC, NFD = "caf\u00e9", "cafe\u0301"
KEYS = ["a", "b", "n", NFC, NFD]
# No line terminators, no non-ASCII digits or letters that \d \w would judge differently, no
# lone surrogates: see DOCUMENTED_DIFFERENCES.
ALPHABET = list("abcdxyz019 _-.") + ["\u00e9", "\U0001f642", "\t"]
# Patterns whose meaning is the same in ECMA-262 and Python's `re` on ALPHABET.
PATTERNS = ["^[a-z]+$", "^a(b|c)*d?$", "^.{2,4}$", "^[0-9]+$", "^x*$", "^(ab)+$", "^[^0-9]*$", "^(a|\u00e9)+$",
            "^\\d{1,3}$", "^.*\U0001f642.*$", "^(?:xy|z)?[a-d]{0,2}$", "^[a-z ]+ [0-9]$"]


def _number(rng: random.Random):
    kind = rng.randrange(6)
    if kind == 0:
        return rng.randint(-5, 5)
    if kind == 1:
        return rng.choice([2**53 + 1, 2**63, -(2**63) - 1, 10**20 + 1, 9007199254740993])
    if kind == 2:
        return rng.randint(-80, 80) / 8  # exact binary fractions
    if kind == 3:
        return rng.randint(-1000, 1000) / 10
    if kind == 4:
        return float(rng.randint(-3, 3))  # 2.0: an integer to JSON Schema
    return rng.randint(-(10**30), 10**30)


def _past(bound) -> int:
    """A step past a bound that JavaScript's reading sees too: past 2^53, bound + 1 is the bound
    as a double (a documented difference, not generated)."""
    if bound is None or abs(bound) < 2**53:
        return 1
    return 2 * int(math.ulp(float(bound)))


def _string(rng: random.Random) -> str:
    return "".join(rng.choice(ALPHABET) for _ in range(rng.randrange(6)))


def _scalar(rng: random.Random):
    return rng.choice([None, _number(rng), _string(rng), rng.choice(["echo 1", "a", NFC, NFD])])


def gen_schema(rng: random.Random, depth: int = 0) -> dict:
    pick = rng.randrange(12 if depth < 3 else 8)
    if pick == 0:
        s: dict = {"type": "string"}
        if rng.random() < 0.7:
            s["pattern"] = rng.choice(PATTERNS)
        return s
    if pick in (1, 2):
        s = {"type": rng.choice(["integer", "number"])}
        for bound in ("minimum", "maximum"):
            if rng.random() < 0.5:
                b = _number(rng)
                s[bound] = int(b) if s["type"] == "integer" and isinstance(b, float) else b
        if "minimum" in s and "maximum" in s and s["minimum"] > s["maximum"]:
            s["minimum"], s["maximum"] = s["maximum"], s["minimum"]
        return s
    if pick == 3:
        return {"type": rng.choice(["boolean", "null"])}
    if pick == 4:
        return {"enum": [_scalar(rng) for _ in range(rng.randint(1, 3))]}
    if pick == 5:
        return {"const": _scalar(rng)}
    if pick in (6, 7):
        return {"type": "string"} if depth >= 3 else gen_schema(rng, depth + 1)
    if pick == 8:
        return {rng.choice(["anyOf", "oneOf"]): [gen_schema(rng, depth + 1) for _ in range(rng.randint(1, 3))]}
    if pick in (9, 10):
        names = rng.sample(KEYS, rng.randint(0, 3))
        s = {"type": "object", "properties": {n: gen_schema(rng, depth + 1) for n in names}}
        if names and rng.random() < 0.6:
            s["required"] = rng.sample(names, rng.randint(1, len(names)))
        if rng.random() < 0.5:
            s["additionalProperties"] = False
        return s
    s = {"type": "array", "items": gen_schema(rng, depth + 1)}
    if rng.random() < 0.5:
        s["minItems"] = rng.randint(0, 3)
    if rng.random() < 0.4:
        s["maxItems"] = rng.randint(s.get("minItems", 0), 4)
    return s


def gen_value(rng: random.Random, s: dict, depth: int = 0):
    """Mostly a value built to fit `s`, now and then something else."""
    if rng.random() < 0.15 or depth > 6:
        return rng.choice([_scalar(rng), True, False, [], {}, [_scalar(rng)], {rng.choice(KEYS): _scalar(rng)}])
    if "const" in s:
        return s["const"]
    if "enum" in s:
        return rng.choice(s["enum"])
    for choice in ("anyOf", "oneOf"):
        if choice in s:
            return gen_value(rng, rng.choice(s[choice]), depth + 1)
    kind = s.get("type")
    if kind == "string":
        pattern_hits = ["abc", "abbcd", "xy", "123", "xxx", "abab", "\u00e9a", "a\U0001f642", "xyab", "ab 1", "12"]
        return rng.choice(pattern_hits + [_string(rng)])
    if kind in ("integer", "number"):
        lo, hi = s.get("minimum"), s.get("maximum")
        return rng.choice([x for x in (lo, hi, _number(rng), (lo or 0) - _past(lo), (hi or 0) + _past(hi)) if x is not None])
    if kind == "boolean":
        return rng.random() < 0.5
    if kind == "null":
        return None
    if kind == "object":
        props = s.get("properties", {})
        out = {k: gen_value(rng, v, depth + 1) for k, v in props.items() if rng.random() < 0.85}
        if rng.random() < 0.2:
            out[rng.choice(KEYS)] = _scalar(rng)
        return out
    if kind == "array":
        n = rng.randint(max(0, s.get("minItems", 0) - 1), s.get("maxItems", 3) + 1)
        return [gen_value(rng, s["items"], depth + 1) for _ in range(n)]
    return _scalar(rng)


def core_verdicts(pairs: list[tuple[str, str]]) -> list[dict]:
    lines = "".join(json.dumps([schema, reply]) + "\n" for schema, reply in pairs)
    out = subprocess.run([core_path(), "--check-replies"], input=lines.encode(), capture_output=True, timeout=600, check=True)
    verdicts = [json.loads(line) for line in out.stdout.decode().split("\n") if line]
    assert len(verdicts) == len(pairs), out.stderr.decode()[-2000:]
    return verdicts


def oracle(schema: dict, reply: str) -> bool:
    return jsonschema.Draft202012Validator(schema).is_valid(json.loads(reply))


def test_core_verdict_agrees_with_jsonschema_on_generated_schemas_and_values():
    rng = random.Random(SEED)
    cases: list[tuple[dict, str]] = []
    while len(cases) < CASES:
        schema = gen_schema(rng)
        try:
            check_schema(schema)
        except SchemaError:
            continue
        value = gen_value(rng, schema)
        cases.append((schema, json.dumps(value, ensure_ascii=rng.random() < 0.5)))
    verdicts = core_verdicts([(check_schema(s).text, reply) for s, reply in cases])
    disagreements = []
    valid = 0
    for (schema, reply), verdict in zip(cases, verdicts):
        assert "schema_error" not in verdict, (schema, verdict)
        expected = oracle(schema, reply)
        valid += expected
        if verdict["valid"] != expected:
            disagreements.append((schema, reply, verdict, expected))
    assert not disagreements, f"seed {SEED}: {len(disagreements)} of {len(cases)} differ, first: {disagreements[0]}"
    # Both verdicts are exercised.
    assert 0.2 * len(cases) < valid < 0.8 * len(cases), f"seed {SEED}: {valid} of {len(cases)} valid"


# (schema, reply, the core's verdict), where jsonschema on Python says the opposite.
DOCUMENTED_DIFFERENCES = [
    # ECMA-262 `$` is the end of the text; Python's `re` also matches before a final newline.
    ({"type": "string", "pattern": "^abc$"}, json.dumps("abc\n"), False),
    # ECMA-262 `.` matches no line terminator (\n \r U+2028 U+2029); Python's only excludes \n.
    ({"type": "string", "pattern": "^.$"}, json.dumps("\r"), False),
    ({"type": "string", "pattern": "^.$"}, json.dumps("\u2028"), False),
    # ECMA-262 \d and \w are ASCII; Python's are Unicode.
    ({"type": "string", "pattern": "^\\d$"}, json.dumps("\u0663"), False),
    ({"type": "string", "pattern": "^\\w$"}, json.dumps("\u00e9"), False),
    # ECMA-262 \s includes U+FEFF and excludes U+001C; Python's str.isspace the other way round.
    ({"type": "string", "pattern": "^\\s$"}, json.dumps("\ufeff"), True),
    ({"type": "string", "pattern": "^\\s$"}, json.dumps("\x1c"), False),
    # The verdict holds for JavaScript's reading too, where 2^53 + 1 is 2^53 and matches both.
    ({"oneOf": [{"const": 9007199254740993}, {"const": 9007199254740992}]}, "9007199254740993", False),
    # A key twice is no valid reply to the core; Python keeps the last.
    ({"type": "object", "properties": {"a": {"type": "integer"}}}, '{"a": "x", "a": 1}', False),
    # Not JSON (RFC 8259): a lone surrogate, NaN. Python's json takes both.
    ({"type": "string"}, '"\\ud800"', False),
    ({"type": "number"}, "NaN", False),
]


@pytest.mark.parametrize(("schema", "reply", "core"), DOCUMENTED_DIFFERENCES)
def test_documented_differences_get_json_schemas_answer(schema, reply, core):
    (verdict,) = core_verdicts([(check_schema(schema).text, reply)])
    assert verdict.get("valid") is core, verdict
    assert oracle(schema, reply) is not core, "jsonschema now agrees: drop the row"
