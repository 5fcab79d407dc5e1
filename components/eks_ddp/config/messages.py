"""The one formatter: a stack file's problems as lines of the shape ``<key>: got X; expected Y``.

* :func:`decode`: Pulumi hands the program strings (objects, lists, numbers and booleans as JSON).
* :func:`null_problems`: a key set to ``null`` is refused (absent is not null), and taken out before pydantic reads.
* :func:`problems`: pydantic's ``ValidationError`` as those lines, each naming its YAML key
  (``nodeGroups[0].instanceType``, from the error's ``loc`` and the models' aliases), the value, and what the key's
  type allows; unknown keys with a did-you-mean (difflib, as SkyPilot does), missing ones with their documentation.
"""

from __future__ import annotations

import difflib
import json
import re
from collections.abc import Iterable, Mapping
from typing import Annotated, Any, Literal, get_args, get_origin

from pydantic import ValidationError
from pydantic.json_schema import SkipJsonSchema

from eks_ddp.config.schema import PROJECT, TOP_LEVEL_KEYS, StackFile

QUOTE = ": quote the value in the stack file (YAML reads an unquoted 1.30 as the number 1.3)"


def _json(text: Any) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def decode(raw: Mapping[str, Any], known: Iterable[str]) -> dict[str, Any]:
    """Pulumi's values by key without the namespace, JSON decoded; unknown keys keep their text for the message."""
    keys = {k: k.split(":", 1)[-1] for k in raw}
    return {keys[k]: _json(v) if keys[k] in known and isinstance(v, str) else v for k, v in raw.items()}


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


def words(tp: Any) -> str:
    """What a value of type ``tp`` is, in a message's words."""
    tp = core_type(tp)
    if is_section(tp):
        keys = "an object with keys " + ", ".join(fields_of(tp))
        return f"{tp.SHORT_FORM} or {keys}" if hasattr(tp, "SHORT_FORM") else keys
    if get_origin(tp) is Literal:
        return "one of " + ", ".join(repr(v) for v in get_args(tp))
    if get_origin(tp) is tuple:
        item = core_type(get_args(tp)[0])
        return "a list of " + ("strings" if item is str else words(item).replace("an object", "objects", 1)
                               if is_section(item) else "objects")
    if get_origin(tp) is Mapping:
        return "an object of names to strings"
    return {bool: "true or false", int: "a whole number", float: "a number (finite)", str: "a string"}.get(
        tp, "a value")


def walk(loc: Iterable[Any], root: type = StackFile) -> tuple[str, Any]:
    """The YAML key of ``loc`` (``nodeGroups[0].instanceType``) and its type."""
    key, tp = "", root
    for part in loc:
        tp = core_type(tp)
        if is_section(tp):
            tp = getattr(fields_of(tp).get(part), "annotation", None)
        elif get_origin(tp) is tuple and isinstance(part, int):
            key, tp = f"{key}[{part}]", get_args(tp)[0]
            continue
        else:  # a mapping's key
            tp = get_args(tp)[1] if get_origin(tp) is Mapping else None
        key = f"{key}.{part}" if key else str(part)
    return key, core_type(tp)


def unknown_top_level_key(key: str, value: Any) -> str:
    """An unknown ``eks-ddp:`` key: a typo, or a path set without ``--path`` (stored as one dotted key)."""
    top = re.split(r"[.\[]", key, maxsplit=1)[0]
    if top in TOP_LEVEL_KEYS and top != key:
        # `pulumi config set eks-ddp:image.prebuilt X` (no --path) stores the dotted name as a key.
        text = value if isinstance(value, str) else json.dumps(value)
        return (f"{PROJECT}:{key}: unknown key, a path set without --path; expected it inside {PROJECT}:{top}: "
                f"pulumi config rm '{PROJECT}:{key}' && pulumi config set --path '{key}' '{text}'")
    return f"{PROJECT}:{key}: unknown key; known keys: " + ", ".join(TOP_LEVEL_KEYS) + suggest(key, TOP_LEVEL_KEYS)


def null_problems(data: Any, loc: tuple[Any, ...] = ()) -> list[str]:
    """A line per key set to ``null`` in ``data`` (a top-level section's null is its defaults), taking those keys out
    (pydantic then reads the rest)."""
    out: list[str] = []
    items = list(data.items()) if isinstance(data, dict) else list(enumerate(data)) if isinstance(data, list) else []
    for k, v in items:
        if v is None:
            key, tp = walk((*loc, k))
            if not (loc == () and is_section(tp)):  # `eks-ddp:network:` with every key commented out: its defaults
                out.append(f"{key}: got None; expected {words(tp)} (leave the key out for its default)")
        else:
            out += null_problems(v, (*loc, k))
    for k, v in reversed(items):
        if v is None:
            del data[k]
    return out


def problems(err: ValidationError) -> list[str]:
    """One ``key: got X; expected Y`` line per problem of ``err`` (raised reading a :class:`StackFile`)."""
    out: list[str] = []
    errors = err.errors()
    for e in errors:
        if e["type"] == "too_short" and any(o is not e and o["loc"][:len(e["loc"])] == e["loc"] for o in errors):
            continue  # a list whose items were refused: said per item
        key, tp = walk(e["loc"])
        got = e["input"]
        if e["type"] == "unexpected_keyword_argument":
            parent, owner = walk(e["loc"][:-1])
            name = e["loc"][-1]
            if owner is StackFile:
                out.append(unknown_top_level_key(name, got))
                continue
            key, known = f"{parent}.{name}", fields_of(owner)
            if hint := getattr(owner, "MISPLACED", {}).get(name):
                out.append(f"{key}: {hint}")
            out.append(f"{key}: got {got!r}; expected one of the known keys: {', '.join(known)}" + suggest(name, known))
        elif e["type"] == "missing":
            out.append(f"{key}: required; expected {words(tp)}")
        elif e["type"] in ("too_short", "string_too_short"):
            out.append(f"{key}: got {got!r}; expected a non-empty {'string' if tp is str else 'list'}")
        else:
            quote = QUOTE if isinstance(got, float) and (tp is str or get_origin(tp) is Literal) else ""
            out.append(f"{key}: got {got!r}; expected {words(tp)}{quote}")
    return out
