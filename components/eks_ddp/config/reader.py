"""What is particular to reading a stack file, around pydantic: Pulumi's raw values, the coercion rules, the messages.

* :func:`decode`: Pulumi hands the program strings (objects, lists, numbers and booleans as JSON).
* The field types (``Bool``, ``Int``, ``Float``, ``Str``, ``Strings``, :func:`one_of`, ...): what a key accepts,
  as ``pulumi config set --path`` stores it ("20" for 20, "0.1" for 0.1, 2024 for a digit-only runId), and what it
  refuses. Each refusal is one finished line, ``<key>: got X; expected Y``, with :data:`KEY` standing for the key.
* :func:`problems`: a ``ValidationError`` as those lines, each naming its YAML key (``nodeGroups[0].instanceType``),
  unknown keys with a did-you-mean, missing ones with their documentation.
"""

from __future__ import annotations

import difflib
import json
import math
import re
from collections.abc import Callable, Iterable, Mapping
from types import MappingProxyType
from typing import Annotated, Any, get_args, get_origin

from pydantic import AfterValidator, BeforeValidator, PlainValidator, StringConstraints, ValidationError
from pydantic.json_schema import SkipJsonSchema
from pydantic_core import PydanticCustomError

PROJECT = "eks-ddp"

KEY = "\x00"
"""Stands for the key in a message raised while validating its value; :func:`problems` puts the YAML key in."""


class _Null:
    """A key the stack file gives as ``null``: refused like any other wrong value (``None`` means "not given")."""

    def __repr__(self) -> str:
        return "None"

    def __bool__(self) -> bool:
        return False


NULL = _Null()


class UnknownKey:
    """The value of a key the stack file may not spell although the class has a field of that name."""

    def __init__(self, value: Any):
        self.value = value

    def __repr__(self) -> str:
        return repr(self.value)


def problem(*lines: str) -> PydanticCustomError:
    """A validation error carrying finished message lines (``KEY`` stands for the key being validated)."""
    message = lines[0].replace(f"{KEY}: ", "").replace(KEY, "")
    return PydanticCustomError("stack_config", "{message}", {"message": message, "lines": list(lines)})


def with_problem(err: ValidationError, value: Any, *lines: str) -> ValidationError:
    """``err`` (raised reading ``value``) plus one more problem of ``value``, for a check that runs either way."""
    details: list[Any] = []
    for e in err.errors():
        kind = PydanticCustomError(e["type"], "{message}", e["ctx"]) if e["type"] == "stack_config" else e["type"]
        details.append({"type": kind, "loc": e["loc"], "input": e["input"], **({"ctx": e["ctx"]} if "ctx" in e else {})})
    details.append({"type": problem(*lines), "loc": (), "input": value})
    return ValidationError.from_exception_data(err.title, details)


def refuse(value: Any, allowed: str) -> PydanticCustomError:
    return problem(f"{KEY}: got {value!r}; expected {allowed}")


def unknown_key() -> PydanticCustomError:
    """A key the stack file may not spell: reported like pydantic's own unknown keys."""
    return PydanticCustomError("unexpected_keyword_argument", "Unexpected keyword argument")


def given(data: dict[str, Any]) -> dict[str, Any]:
    """A YAML object's keys as given: ``null`` becomes :data:`NULL`, which every field type refuses."""
    return {k: NULL if v is None else v for k, v in data.items()}


def _bool(value: Any) -> bool:
    if isinstance(value, bool):
        return value
    raise refuse(value, "true or false")


_INT_TEXT = re.compile(r"^-?\d+$")


def _int(value: Any) -> int:
    # `pulumi config set --path` stores what it cannot read as an int as a string: accept "20".
    if isinstance(value, str) and _INT_TEXT.match(value.strip()):
        return int(value)
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    raise refuse(value, "a whole number")


def _float(value: Any) -> float:
    # ... and every non-integer number too: `--path job.learningRate 0.1` arrives as "0.1".
    if isinstance(value, str):
        try:
            value = float(value)
        except ValueError:
            pass
    if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
        return float(value)
    raise refuse(value, "a number (finite)")


def _string(hint: str = "") -> Any:
    def check(value: Any) -> str:
        # ... while a digit-only value (runId 2024) arrives as an int.
        if isinstance(value, int) and not isinstance(value, bool):
            return str(value)
        if isinstance(value, str) and value:
            return value
        if isinstance(value, float):
            # An unquoted 1.35 in YAML is a number, and 1.30 becomes 1.3: reading it back is guesswork.
            raise refuse(value, "a string: quote the value in the stack file (YAML reads an unquoted 1.30 as the "
                                "number 1.3)" + hint)
        raise refuse(value, "a non-empty string")
    return check


def _list(allowed: str, *, strings: bool = False, empty_strings: bool = False, non_empty: bool = False) -> Any:
    """A list (of non-empty ``strings``, "" too with ``empty_strings``; ``non_empty``: one item at least)."""
    def check(value: Any) -> tuple[Any, ...]:
        if isinstance(value, (list, tuple)) and (value or not non_empty) and (not strings or all(
                isinstance(v, str) and (v or empty_strings) for v in value)):
            return tuple(value)
        raise refuse(value, allowed)
    return check


def _env_object(value: Any) -> Any:
    if isinstance(value, Mapping):
        return value
    raise refuse(value, "an object of variable names to strings")


def _env_value(value: Any) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return str(value)  # OMP_NUM_THREADS: 4 is what anyone writes; the pod gets "4"
    raise refuse(value, "a string")


_NUMBER_TEXT = r"^\s*[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?\s*$"
_NonEmpty = Annotated[str, StringConstraints(min_length=1)]

Bool = Annotated[bool, BeforeValidator(_bool)]
Int = Annotated[int, BeforeValidator(_int, json_schema_input_type=int | Annotated[str, StringConstraints(
    pattern=r"^\s*-?\d+\s*$")])]
Float = Annotated[float, BeforeValidator(_float, json_schema_input_type=float | Annotated[str, StringConstraints(
    pattern=_NUMBER_TEXT)])]
Str = Annotated[str, BeforeValidator(_string(), json_schema_input_type=_NonEmpty | int)]
Strings = Annotated[tuple[str, ...], BeforeValidator(_list("a list of strings", strings=True),
                                                     json_schema_input_type=list[_NonEmpty])]
Env = Annotated[Mapping[Any, Annotated[str, BeforeValidator(_env_value, json_schema_input_type=str | float)]],
                BeforeValidator(_env_object), AfterValidator(MappingProxyType)]


def quoted_string(hint: str) -> BeforeValidator:
    """A non-empty string whose "quote it" message ends with ``hint`` (what the key allows)."""
    return BeforeValidator(_string(hint), json_schema_input_type=_NonEmpty | int)


def string_list(allowed: str, *, empty: bool = False) -> BeforeValidator:
    """A list of strings, with its own words for what is allowed (``empty``: "" is an item too)."""
    return BeforeValidator(_list(allowed, strings=True, empty_strings=empty),
                           json_schema_input_type=list[str] if empty else list[_NonEmpty])


def a_list(allowed: str, *, non_empty: bool = False) -> BeforeValidator:
    """A list (of sections), refused as a whole when it is not one."""
    return BeforeValidator(_list(allowed, non_empty=non_empty))


def items_as_given(allowed: str) -> PlainValidator:
    """A list whose items are kept as given (checked with the other keys, after reading)."""
    return PlainValidator(_list(allowed), json_schema_input_type=list[dict[str, Any]])


def one_of(literal: Any) -> BeforeValidator:
    """One of a Literal's values; the message lists them."""
    options = get_args(literal)

    def check(value: Any) -> Any:
        if value in options:
            return value
        raise refuse(value, "one of " + ", ".join(repr(o) for o in options))
    return BeforeValidator(check)


def rule(check: Any, *args: Any) -> AfterValidator:
    """A ``rules.py`` predicate, ``check(key, value, *args) -> str | None``, as a field's validator."""
    def validate(value: Any) -> Any:
        if (bad := check(KEY, value, *args)) is not None:
            raise problem(bad)
        return value
    return AfterValidator(validate)


def decode(raw: Mapping[str, Any], known: Iterable[str]) -> dict[str, Any]:
    """Pulumi's values by key without the namespace, JSON decoded; unknown keys keep their text for the message."""
    known = set(known)
    out: dict[str, Any] = {}
    for full_key, text in raw.items():
        key = full_key.split(":", 1)[1] if ":" in full_key else full_key
        if key in known and isinstance(text, str):
            try:
                text = json.loads(text)
            except json.JSONDecodeError:
                pass
        out[key] = text
    return out


# --- ValidationError -> one line per problem ----------------------------------------------------------------------

def suggest(key: str, known: Iterable[str]) -> str:
    close = difflib.get_close_matches(key, list(known), n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def fields_of(cls: Any) -> dict[str, Any]:
    """A section's fields the stack file spells, by YAML key (``SkipJsonSchema`` marks the ones it does not)."""
    return {f.alias: f for f in cls.__pydantic_fields__.values()
            if not any(isinstance(m, SkipJsonSchema) for m in f.metadata)}


def core_type(annotation: Any) -> Any:
    """The type under ``Annotated`` and ``| None``."""
    while True:
        if get_origin(annotation) is Annotated:
            annotation = get_args(annotation)[0]
        elif type(None) in get_args(annotation):
            annotation = next(a for a in get_args(annotation) if a is not type(None))
        else:
            return annotation


def is_section(tp: Any) -> bool:
    return isinstance(tp, type) and hasattr(tp, "__pydantic_fields__")


def _walk(root: type, loc: tuple[Any, ...]) -> tuple[str, Any, Any]:
    """The YAML key of ``loc`` (``nodeGroups[0].instanceType``), its field (if a section's) and its type."""
    key, tp, field = "", root, None
    for part in loc:
        tp, field = core_type(tp), None
        if is_section(tp):
            field = next((f for f in tp.__pydantic_fields__.values() if f.alias == part), None) \
                or tp.__pydantic_fields__.get(part)  # a default's problem is located by the field's name
            tp, part = (field.annotation, field.alias or part) if field else (None, part)
        elif get_origin(tp) is tuple and isinstance(part, int):
            key, tp = f"{key}[{part}]", get_args(tp)[0]
            continue
        else:  # a mapping's key
            tp = get_args(tp)[1] if get_origin(tp) in (dict, Mapping) else None
        key = f"{key}.{part}" if key else str(part)
    return key, field, core_type(tp)


def _unknown_keys_first(errors: list[Any]) -> list[Any]:
    """An object's unknown keys before its other problems (pydantic reports them after its fields)."""
    out: list[Any] = []
    for e in errors:
        if e["type"] == "unexpected_keyword_argument":
            parent = e["loc"][:-1]
            at = next((i for i, o in enumerate(out) if o["loc"][:len(parent)] == parent
                       and not (o["type"] == "unexpected_keyword_argument" and o["loc"][:-1] == parent)), len(out))
            out.insert(at, e)
        else:
            out.append(e)
    return out


def problems(err: ValidationError, root: type, top_level: Callable[[str, Any], str]) -> list[str]:
    """One ``key: got X; expected Y`` line per problem of ``err`` (raised validating ``root``).

    ``top_level(key, value)`` words an unknown key of the root itself (a stack file's are namespaced)."""
    out: list[str] = []
    for e in _unknown_keys_first(err.errors()):
        if e["type"] == "unexpected_keyword_argument":
            name = e["loc"][-1]
            parent, _, owner = _walk(root, e["loc"][:-1])
            if owner is root:
                out.append(top_level(name, e["input"]))
                continue
            key, known = f"{parent}.{name}" if parent else str(name), fields_of(owner)
            if hint := getattr(owner, "MISPLACED", {}).get(name):
                out.append(f"{key}: {hint}")
            out.append(f"{key}: got {e['input']!r}; expected one of the known keys: {', '.join(known)}"
                       + suggest(name, known))
            continue
        key, field, _ = _walk(root, e["loc"])
        if e["type"] == "stack_config":
            out += [line.replace(KEY, key) for line in e["ctx"]["lines"]]
        elif e["type"] == "missing":
            out.append(f"{key}: required; {field.description}")
        else:  # a value a Python caller passed that no stack-file rule words
            out.append(f"{key}: got {e['input']!r}; expected {e['msg']}")
    return out
