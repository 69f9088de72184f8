"""Structured output: the `schema` argument of `respond`.

wisp constrains the model's reply to a JSON Schema on every backend (echo, llama-server's
grammar, Apple's guided generation), so it accepts only the part of JSON Schema that all of
them can express: the supported subset below, checked here before the core is called. The
core builds each backend's schema from it and checks the reply against it before the turn
joins the thread (it has to know before it commits the turn); this module checks the reply
again with `jsonschema`, as a second guard, before it is returned.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import jsonschema

# jsonschema is imported by the first call that passes a schema, not at start: it is ~35 ms
# of the shim's start-up (referencing, attrs, the meta-schemas) that most sessions never use.

# A schema is sent to the model with every call that uses it and takes room in its context.
MAX_SCHEMA_BYTES = 16 * 1024
# Nested schemas (an object in an array in an object ...), well inside the core's limits.
MAX_DEPTH = 32

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
class Checked:
    schema: dict[str, Any]
    # Compact JSON text, key order kept: what the core receives.
    text: str
    validator: jsonschema.protocols.Validator


def check_schema(schema: Any) -> Checked:
    """Accept `schema` when it is valid JSON Schema inside wisp's supported subset."""
    if not isinstance(schema, dict):
        raise SchemaError(f"`schema` must be a JSON object (a JSON Schema), got {_kind(schema)}.")
    text = json.dumps(schema, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    size = len(text.encode())
    if size > MAX_SCHEMA_BYTES:
        raise SchemaError(f"`schema` is {size} bytes of JSON, over wisp's {MAX_SCHEMA_BYTES}-byte limit; use a smaller schema.")
    import jsonschema

    cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    try:
        cls.check_schema(schema)
    except jsonschema.exceptions.SchemaError as exc:
        raise SchemaError(f"`schema` is not valid JSON Schema: {exc.message} (at {_pointer(exc.path)}).") from None
    _check_node(schema, "#", 0, root=True)
    # Replies are checked with 2020-12 semantics whatever `$schema` says, as the core checks them
    # (draft 4 alone would call 1.0 no integer): the subset's keywords mean the same in every draft.
    return Checked(schema=schema, text=text, validator=jsonschema.Draft202012Validator(schema))


def validate_output(checked: Checked, text: str) -> Any:
    """The reply's JSON value; raises ValueError saying what is wrong when it does not match."""
    import jsonschema

    try:
        value = json.loads(text)
    except ValueError as exc:
        raise ValueError(f"the reply is not valid JSON ({exc})") from None
    error = jsonschema.exceptions.best_match(checked.validator.iter_errors(value))
    if error is not None:
        raise ValueError(f"{error.json_path}: {error.message}")
    return value


def _check_node(node: Any, path: str, depth: int, root: bool = False) -> None:
    if not isinstance(node, dict):
        raise SchemaError(f"schema at {path} must be an object (a schema), got {_kind(node)}.")
    if depth > MAX_DEPTH:
        raise SchemaError(f"schema is nested more than {MAX_DEPTH} levels deep (at {path}); use a flatter schema.")
    for keyword in node:
        if keyword in HINTS:
            raise SchemaError(f"schema keyword `{keyword}` at {path} is not supported: {HINTS[keyword]}. Supported: {SUPPORTED}.")
        if keyword not in KNOWN and not (root and keyword == "$schema"):
            raise SchemaError(f"schema keyword `{keyword}` at {path} is not supported. Supported: {SUPPORTED}.")
    kind = node.get("type")
    if isinstance(kind, list):
        raise SchemaError(f"`type` at {path} is a list; wisp takes one type per schema: use anyOf with one schema per type.")
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
        raise SchemaError(f"schema at {path} says nothing about its value: give it a `type`, `enum`, `const` or `anyOf`.")
    extra = [k for k in node if k not in allowed]
    if extra:
        keyword = extra[0]
        raise SchemaError(f"schema keyword `{keyword}` at {path} is not supported{_why(keyword, kind, choice, fixed)}. Supported: {SUPPORTED}.")

    if choice:
        branches = node[choice]
        for k, branch in enumerate(branches):
            _check_node(branch, f"{path}/{choice}/{k}", depth + 1)
        return
    if fixed:
        members = [node["const"]] if fixed == "const" else node["enum"]
        if not members:
            raise SchemaError(f"`enum` at {path} is empty: list at least one value.")
        for k, m in enumerate(members):
            where = f"{path}/const" if fixed == "const" else f"{path}/enum/{k}"
            if not (m is None or isinstance(m, str) or (isinstance(m, (int, float)) and not isinstance(m, bool))):
                raise SchemaError(f"`{fixed}` value at {where} is {_kind(m)}; wisp's {fixed} holds strings, numbers and null only.")
            if kind is not None and not _fits(m, kind):
                raise SchemaError(f"`{fixed}` value {json.dumps(m)} at {where} is not of the schema's type {kind}.")
        return

    if kind == "object":
        properties = node.get("properties", {})
        for name, sub in properties.items():
            _check_node(sub, f"{path}/properties/{_escape(name)}", depth + 1)
        for name in node.get("required", []):
            if name not in properties:
                raise SchemaError(f"`required` at {path} names {name!r}, which is not in `properties`.")
        if node.get("additionalProperties", False) is not False:
            raise SchemaError(f"`additionalProperties` at {path} must be false (or left out): wisp generates only the listed properties.")
    elif kind == "array":
        if "items" not in node:
            raise SchemaError(f"schema at {path} is an array without `items`: say what each item is.")
        _check_node(node["items"], f"{path}/items", depth + 1)
        lo, hi = node.get("minItems"), node.get("maxItems")
        if lo is not None and hi is not None and lo > hi:
            raise SchemaError(f"`minItems` ({lo}) is above `maxItems` ({hi}) at {path}.")
    elif kind == "string" and "pattern" in node:
        # llama-server's grammar compiler refuses any other pattern, and anchored, a pattern means
        # the same whole-string match on every backend.
        pattern = node["pattern"]
        if not (len(pattern) >= 2 and pattern.startswith("^") and pattern.endswith("$")):
            raise SchemaError(f"`pattern` at {path} must match the whole string: start it with ^ and end it with $ (e.g. ^[a-z_]+$).")
    elif kind in ("integer", "number"):
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
