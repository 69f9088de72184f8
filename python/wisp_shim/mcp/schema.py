"""Structured output: the `schema` argument of `respond`.

wisp constrains the model's reply to a JSON Schema on every backend (echo, llama-server's
grammar, Apple's guided generation), so it accepts only the part of JSON Schema that all of
them can express: the supported subset below, checked here before the core is called. This
check is the one judge of which schemas wisp takes: it also bounds what a schema may imply
(nesting, items, the size of the smallest value it asks for), so that no call can make the
core build or check a huge value. Any schema it refuses is `invalid_argument` naming the place.

The reply is judged once, by the core, before the turn joins the thread (JSON Schema's rules
on exact numbers, code points and ECMA-262 patterns: swift/WispCore/Backends/OutputSchema.swift);
the shim trusts that verdict and does not judge it again. `jsonschema` checks that a schema is
valid JSON Schema here, and is the test oracle for the core's verdict
(tests/python/test_schema_differential.py).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

# jsonschema is imported by the first call that passes a schema, not at start: it is a
# noticeable share of the shim's start-up (bench/README.md) (referencing, attrs, the
# meta-schemas) that most sessions never use.

# A schema is sent to the model with every call that uses it and takes room in its context.
MAX_SCHEMA_BYTES = 16 * 1024
# Nested schemas (an object in an array in an object ...), well inside the core's limits.
MAX_DEPTH = 32
# `minItems` above this asks for more items than any reply should hold.
MAX_MIN_ITEMS = 10_000
# The smallest value a schema asks for (echo's value: max(minItems, 1) items of each array)
# must stay well under the pipe's frame limit and cheap to build and check.
MAX_VALUE_BYTES = 1024 * 1024
# Numbers in a schema: what a 64-bit float holds (the shim reads JSON numbers as Python's).
MAX_NUMBER = 1e308

TYPES = ("object", "array", "string", "integer", "number", "boolean", "null")
# Keywords that mean the same on every node.
ANNOTATIONS = frozenset({"description", "title"})
BY_TYPE = {
    "object": frozenset({"properties", "required", "additionalProperties"}),
    "array": frozenset({"items", "minItems", "maxItems"}),
    "string": frozenset({"pattern"}),
    "integer": frozenset({"minimum", "maximum"}),
    "number": frozenset({"minimum", "maximum"}),
    "boolean": frozenset(),
    "null": frozenset(),
}
KNOWN = ANNOTATIONS | {"type", "enum", "const", "anyOf", "oneOf"} | frozenset().union(*BY_TYPE.values())
SUPPORTED = (
    "type (one of " + ", ".join(TYPES) + "), properties, required, additionalProperties: false, items, "
    "minItems, maxItems, pattern, minimum, maximum, enum, const (strings, numbers, null), anyOf, oneOf, "
    "description, title"
)
HINTS = {
    "$ref": "inline the definition where it is used",
    "$defs": "inline each definition where it is used",
    "definitions": "inline each definition where it is used",
    "allOf": "merge the schemas into one",
    "exclusiveMinimum": "use minimum",
    "exclusiveMaximum": "use maximum",
}


class SchemaError(ValueError):
    """The schema is not one wisp can use; the message names the keyword and where it is."""


@dataclass(frozen=True)
class CheckedSchema:
    """A schema check_schema took: its value, and the text the core receives."""

    schema: dict[str, Any]
    # Compact JSON text, key order kept: what the core receives.
    text: str


def check_schema(schema: Any) -> CheckedSchema:
    """Accept `schema` when it is valid JSON Schema inside wisp's supported subset and bounds."""
    if not isinstance(schema, dict):
        raise SchemaError(f"`schema` must be a JSON object (a JSON Schema), got {_kind(schema)}.")
    # Before anything recurses over it (jsonschema, json.dumps): nesting and numbers.
    _check_shape(schema)
    dialect = schema.get("$schema")
    if dialect is not None and not isinstance(dialect, str):
        raise SchemaError(f"`$schema` at #/$schema must be a string (a dialect URI such as "
                          f"https://json-schema.org/draft/2020-12/schema), got {_kind(dialect)}; or leave it out.")
    text = json.dumps(schema, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    size = len(text.encode())
    if size > MAX_SCHEMA_BYTES:
        raise SchemaError(f"`schema` is {size} bytes of JSON, over wisp's {MAX_SCHEMA_BYTES}-byte limit; use a "
                          "smaller schema.")
    import jsonschema

    cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    try:
        # Without format checks: whether a `pattern` is a regular expression wisp can match is
        # the core's to say (ECMA-262 on its linear engine), not Python's `re`.
        cls.check_schema(schema, format_checker=None)
    except jsonschema.exceptions.SchemaError as exc:
        raise SchemaError(f"`schema` is not valid JSON Schema: {exc.message} (at {_pointer(exc.path)}).") from None
    _check_node(schema, "#", 0, root=True)
    _check_size(schema)
    # The core judges replies with 2020-12 semantics whatever `$schema` says (draft 4 alone
    # would call 1.0 no integer): the subset's keywords mean the same in every draft.
    return CheckedSchema(schema=schema, text=text)


def reply_value(text: str) -> Any:
    """The value of a reply the core has judged valid JSON matching its schema, read as the
    core judged it (Python's reading of numbers, which the SDK writes back out exactly). A number
    past a double's range would go out as null: the core refuses those, so one here is its bug."""
    return json.loads(text, parse_float=_finite, parse_constant=_not_json)


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"the number {text[:40]} is past a double's range")
    return value


def _not_json(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _check_shape(schema: dict[str, Any]) -> None:
    """Nesting within MAX_DEPTH schema levels and every number finite and within MAX_NUMBER,
    walked without recursion (a schema nested 150 deep must be an argument error, not a
    RecursionError)."""
    stack: list[tuple[Any, str, int]] = [(schema, "#", 0)]
    while stack:
        node, path, depth = stack.pop()
        # Two JSON levels (a keyword's object or array, then the schema) per schema level at most.
        if depth > 2 * MAX_DEPTH + 4:
            raise SchemaError(f"schema is nested more than {MAX_DEPTH} levels deep (at {path}); use a flatter schema.")
        if isinstance(node, dict):
            stack.extend((v, f"{path}/{_escape(str(k))}", depth + 1) for k, v in node.items())
        elif isinstance(node, list):
            stack.extend((v, f"{path}/{k}", depth + 1) for k, v in enumerate(node))
        elif isinstance(node, float) and not (math.isfinite(node) and abs(node) <= MAX_NUMBER):
            what = "too large" if not math.isnan(node) else "not a number"
            raise SchemaError(f"the number at {path} is {what} for wisp "
                              f"(numbers in a schema must be within ±{MAX_NUMBER:g}).")
        elif isinstance(node, int) and not isinstance(node, bool) and abs(node) > MAX_NUMBER:
            raise SchemaError(f"the number at {path} has {len(str(abs(node)))} digits, too large for wisp "
                              f"(numbers in a schema must be within ±{MAX_NUMBER:g}).")


def _check_size(schema: dict[str, Any]) -> None:
    """Refuses a schema whose smallest value (echo's: max(minItems, 1) items per array) is over
    MAX_VALUE_BYTES, naming the `minItems` that makes it so."""
    size, where = _implied(schema, "#")
    if size > MAX_VALUE_BYTES:
        raise SchemaError(
            f"`minItems` at {where} makes the value this schema asks for at least about {size} bytes, over wisp's "
            f"bound of {MAX_VALUE_BYTES} bytes; use smaller minItems (or fewer nested arrays)."
        )


def _implied(node: dict[str, Any], path: str) -> tuple[int, str]:
    """(bytes of echo's value for `node`, the path of the outermost array with minItems > 1 in it)."""
    if "const" in node:
        return len(json.dumps(node["const"])), path
    if "enum" in node:
        return len(json.dumps(node["enum"][0])), path
    for choice in ("anyOf", "oneOf"):
        if choice in node:
            return _implied(node[choice][0], f"{path}/{choice}/0")
    kind = node.get("type")
    if kind == "object":
        total, where = 2, path
        for name, sub in node.get("properties", {}).items():
            n, w = _implied(sub, f"{path}/properties/{_escape(name)}")
            total += len(json.dumps(name)) + 1 + n
            if n > 64:
                where = w
            if total > MAX_VALUE_BYTES:
                return total, where
        return total, where
    if kind == "array":
        count = max(node.get("minItems", 0), 1)
        n, w = _implied(node["items"], f"{path}/items")
        return 2 + count * (n + 1), (path if count > 1 else w)
    if kind == "string":
        return 30, path
    return 24, path


def _check_node(node: Any, path: str, depth: int, root: bool = False) -> None:
    kind, choice, fixed = _check_keywords(node, path, depth, root)
    if choice:
        for k, branch in enumerate(node[choice]):
            _check_node(branch, f"{path}/{choice}/{k}", depth + 1)
    elif fixed:
        _check_fixed(node, path, fixed, kind)
    elif kind == "object":
        _check_object(node, path, depth)
    elif kind == "array":
        _check_array(node, path, depth)
    elif kind == "string" and "pattern" in node:
        # llama-server's grammar compiler refuses any other pattern, and anchored, a pattern means
        # the same whole-string match on every backend.
        pattern = node["pattern"]
        if not (len(pattern) >= 2 and pattern.startswith("^") and pattern.endswith("$")):
            raise SchemaError(f"`pattern` at {path} must match the whole string: start it with ^ and end it with $ "
                              "(e.g. ^[a-z_]+$).")
    elif kind in ("integer", "number"):
        _check_bounds(node, path, kind)


def _check_keywords(node: Any, path: str, depth: int, root: bool) -> tuple[str | None, str | None, str | None]:
    """The node's own keywords judged: (its type, its anyOf/oneOf, its const/enum)."""
    if not isinstance(node, dict):
        raise SchemaError(f"schema at {path} must be an object (a schema), got {_kind(node)}.")
    if depth > MAX_DEPTH:
        raise SchemaError(f"schema is nested more than {MAX_DEPTH} levels deep (at {path}); use a flatter schema.")
    for keyword in node:
        if keyword in HINTS:
            raise SchemaError(f"schema keyword `{keyword}` at {path} is not supported: {HINTS[keyword]}. "
                              f"Supported: {SUPPORTED}.")
        if keyword not in KNOWN and not (root and keyword == "$schema"):
            raise SchemaError(f"schema keyword `{keyword}` at {path} is not supported. Supported: {SUPPORTED}.")
    kind = node.get("type")
    if isinstance(kind, list):
        raise SchemaError(f"`type` at {path} is a list; wisp takes one type per schema: use anyOf with one schema "
                          "per type.")
    if kind is not None and kind not in TYPES:
        raise SchemaError(f"`type` at {path} is {kind!r}; use one of {', '.join(TYPES)}.")

    allowed = set(ANNOTATIONS) | ({"$schema"} if root else set())
    choice = next((k for k in ("anyOf", "oneOf") if k in node), None)
    fixed = next((k for k in ("const", "enum") if k in node), None)
    if choice:
        allowed.add(choice)
    elif fixed:
        allowed |= {fixed, "type"}
    elif kind is not None:
        allowed |= {"type"} | BY_TYPE[kind]
    else:
        raise SchemaError(f"schema at {path} says nothing about its value: give it a `type`, `enum`, `const` or "
                          "`anyOf`.")
    extra = [k for k in node if k not in allowed]
    if extra:
        keyword = extra[0]
        raise SchemaError(f"schema keyword `{keyword}` at {path} is not supported{_why(keyword, kind, choice, fixed)}. "
                          f"Supported: {SUPPORTED}.")
    return kind, choice, fixed


def _check_fixed(node: dict, path: str, fixed: str, kind: str | None) -> None:
    members = [node["const"]] if fixed == "const" else node["enum"]
    if not members:
        raise SchemaError(f"`enum` at {path} is empty: list at least one value.")
    for k, m in enumerate(members):
        where = f"{path}/const" if fixed == "const" else f"{path}/enum/{k}"
        if not (m is None or isinstance(m, str) or (isinstance(m, (int, float)) and not isinstance(m, bool))):
            raise SchemaError(f"`{fixed}` value at {where} is {_kind(m)}; wisp's {fixed} holds strings, numbers "
                              "and null only.")
        if kind is not None and not _fits(m, kind):
            raise SchemaError(f"`{fixed}` value {json.dumps(m)} at {where} is not of the schema's type {kind}.")


def _check_object(node: dict, path: str, depth: int) -> None:
    properties = node.get("properties", {})
    for name, sub in properties.items():
        _check_node(sub, f"{path}/properties/{_escape(name)}", depth + 1)
    for name in node.get("required", []):
        if name not in properties:
            raise SchemaError(f"`required` at {path} names {name!r}, which is not in `properties`.")
    if node.get("additionalProperties", False) is not False:
        raise SchemaError(f"`additionalProperties` at {path} must be false (or left out): wisp generates only the "
                          "listed properties.")


def _check_array(node: dict, path: str, depth: int) -> None:
    if "items" not in node:
        raise SchemaError(f"schema at {path} is an array without `items`: say what each item is.")
    _check_node(node["items"], f"{path}/items", depth + 1)
    lo, hi = node.get("minItems"), node.get("maxItems")
    if lo is not None and lo > MAX_MIN_ITEMS:
        raise SchemaError(f"`minItems` at {path} is {lo}, over wisp's bound of {MAX_MIN_ITEMS} items; use a "
                          "smaller minItems.")
    if lo is not None and hi is not None and lo > hi:
        raise SchemaError(f"`minItems` ({lo}) is above `maxItems` ({hi}) at {path}.")


def _check_bounds(node: dict, path: str, kind: str) -> None:
    lo, hi = node.get("minimum"), node.get("maximum")
    for name, bound in (("minimum", lo), ("maximum", hi)):
        if kind == "integer" and bound is not None and bound != int(bound):
            raise SchemaError(f"`{name}` at {path} is {bound}, but the schema is an integer: use a whole number.")
    if lo is not None and hi is not None and lo > hi:
        raise SchemaError(f"`minimum` ({lo}) is above `maximum` ({hi}) at {path}.")


def _why(keyword: str, kind: str | None, choice: str | None, fixed: str | None) -> str:
    if choice:
        return f" beside `{choice}` (put it inside each choice)"
    if fixed:
        return f" beside `{fixed}`"
    owners = [t for t, words in BY_TYPE.items() if keyword in words]
    if owners:
        return f" on type {kind} (it applies to {' and '.join(owners)})"
    return ""


def _fits(value: Any, kind: str) -> bool:
    if kind == "null":
        return value is None
    if kind == "string":
        return isinstance(value, str)
    if kind == "integer":
        return isinstance(value, (int, float)) and not isinstance(value, bool) and value == int(value)
    if kind == "number":
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    return False


def _escape(name: str) -> str:
    return name.replace("~", "~0").replace("/", "~1")


def _pointer(path: Any) -> str:
    return "#" + "".join(f"/{_escape(str(p))}" for p in path)


def _kind(value: Any) -> str:
    names = {dict: "an object", list: "an array", str: "a string", bool: "a boolean", type(None): "null"}
    for t, name in names.items():
        if isinstance(value, t):
            return name
    return "a number" if isinstance(value, (int, float)) else type(value).__name__
