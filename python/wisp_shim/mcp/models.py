"""What every tool's pydantic models share (each tool's own are in its module, tools/).

A tool's model is the one declaration of its fields: it gives the inputSchema or outputSchema
that tools/list shows (`tool_schema`), checks a call's arguments (`parse_args`, with errors that
name the field and what it takes, from each field's ErrorWording), and builds the structured
result. Shared here: the argument base and a thread id's field.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError
from pydantic.json_schema import GenerateJsonSchema

from ..errors import got, short
from ..facts import THREAD_ID_CHARS, THREAD_ID_RULE

# The thread-id rule is the core's (facts.py): tools/list is answered before the core is up.


class ArgumentError(Exception):
    """A tool call's arguments are wrong; the message says which and how."""


@dataclass(frozen=True)
class ErrorWording:
    """How an argument's errors read: it must be `what`; `required` when it is missing;
    `items` when the list holds something else."""

    what: str
    required: str | None = None
    items: str | None = None


ThreadId = Annotated[str, Field(pattern=f"^{THREAD_ID_CHARS}$")]


class Arguments(BaseModel):
    # strict: true is not a number and 5.0 not a token count, as JSON wording.
    model_config = ConfigDict(strict=True, extra="forbid", populate_by_name=True)

    def checked(self) -> Arguments:
        """These arguments once each field is valid, checked further where a tool needs it
        (respond's `schema`); raises ArgumentError."""
        return self


class _CleanSchema(GenerateJsonSchema):
    """The schema as a client reads it: an optional field is its type (absent means unset,
    so no `anyOf` with null), and no generated titles or defaults."""

    def nullable_schema(self, schema: Any) -> Any:
        return self.generate_inner(schema["schema"])

    def field_title_should_be_set(self, schema: Any) -> bool:
        return False

    def model_schema(self, schema: Any) -> Any:
        out = super().model_schema(schema)
        out.pop("title", None)
        return out

    def default_schema(self, schema: Any) -> Any:
        return self.generate_inner(schema["schema"])


def _inline(node: Any, defs: dict[str, Any]) -> Any:
    if isinstance(node, dict):
        if "$ref" in node:
            return _inline(defs[node["$ref"].rsplit("/", 1)[-1]], defs)
        return {k: _inline(v, defs) for k, v in node.items()}
    if isinstance(node, list):
        return [_inline(v, defs) for v in node]
    return node


def tool_schema(model: type[BaseModel]) -> dict[str, Any]:
    """The JSON Schema a tool declares for this model, nested models written in place."""
    schema = model.model_json_schema(by_alias=True, schema_generator=_CleanSchema)
    defs = schema.pop("$defs", {})
    return _inline(schema, defs)


@functools.cache
def _fields(model: type[BaseModel]) -> list[tuple[str, ErrorWording]]:
    """Each argument's wire name and its error wording, in declaration order (once per model:
    it is on every call's path)."""
    out = []
    for name, info in model.model_fields.items():
        wording = next((m for m in info.metadata if isinstance(m, ErrorWording)), None)
        assert wording is not None, f"{model.__name__}.{name} has no ErrorWording"
        out.append((info.alias or name, wording))
    return out


def parse_args(model: type[Arguments], args: dict[str, Any]) -> Any:
    """The call's arguments as `model`, or ArgumentError saying what is wrong.
    An argument given as null is taken as absent."""
    fields = _fields(model)
    allowed = [name for name, _ in fields]
    extra = sorted(set(args) - set(allowed))
    if extra:
        # Name a few, each shortened: a hostile call may carry thousands, or huge names.
        named = ", ".join(short(x) if len(x) > 60 else x for x in extra[:5])
        more = f" and {len(extra) - 5} more" if len(extra) > 5 else ""
        takes = ", ".join(allowed) or "no arguments"
        raise ArgumentError(f"unknown argument(s) {named}{more}; this tool takes {takes}.")
    for name, wording in fields:
        if wording.required is not None and args.get(name) is None:
            raise ArgumentError(wording.required)
    given = {k: v for k, v in args.items() if v is not None}
    try:
        parsed = model.model_validate(given)
    except ValidationError as exc:
        raise ArgumentError(_message(exc, dict(fields), given)) from None
    return parsed.checked()


def _message(exc: ValidationError, wording: dict[str, ErrorWording], given: dict[str, Any]) -> str:
    error = exc.errors(include_url=False)[0]
    name = str(error["loc"][0])
    rule = wording[name]
    value = given.get(name)
    if len(error["loc"]) > 1 and rule.items is not None:
        return rule.items
    if error["type"] == "string_pattern_mismatch":
        return (f"`{name}` {short(value)} is not a valid thread id: use {THREAD_ID_RULE} (or omit it to start a new "
                "thread).")
    if error["type"].endswith("_type") or error["type"] in ("int_from_float", "float_parsing", "int_parsing"):
        return f"`{name}` must be {rule.what}, got {got(value)}."
    return f"`{name}` must be {rule.what}, got {short(value)}."
