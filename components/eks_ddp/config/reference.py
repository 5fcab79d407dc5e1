"""What is generated from the models: the reference table of ``docs/configuration.md`` and the stack file's JSON
Schema (``docs/stack-config.schema.json``, for editors).

``python -m eks_ddp.config`` prints the table; ``--write`` rewrites it in the page, between the
:data:`BEGIN` and :data:`END` markers; ``--schema`` prints the schema.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal, get_args, get_origin

from pydantic.json_schema import GenerateJsonSchema

from eks_ddp.config.messages import core_type, fields_of, is_section
from eks_ddp.config.schema import PROJECT, STACK_FILE, TOP_LEVEL_KEYS, JobConfig, RunConfig, StackFile, WorkloadConfig

Row = tuple[str, str, str, str]


def _type_name(annotation: Any) -> str:
    tp = core_type(annotation)
    if get_origin(tp) is Literal:
        return " \\| ".join(f"`{c}`" for c in get_args(tp))
    if tp is WorkloadConfig:
        return "`cifar10` \\| object"
    if get_origin(tp) is tuple:
        return "list of " + ("object" if get_origin(core_type(get_args(tp)[0])) is Mapping else "string")
    if get_origin(tp) is Mapping:
        return "object of string"
    names = {str: "string", int: "integer", float: "number", bool: "boolean"}
    return names.get(tp, "object")


def _default(f: Any, *, optional: bool = False) -> str:
    """``optional``: the key sits in an object that is itself optional (``workload.data``): no default of its own."""
    if f.default_factory is not None:  # an empty mapping, or the bundled workload
        return "`cifar10`" if f.default_factory is WorkloadConfig else "`{}`"
    if f.is_required() or (f.validate_default and f.default is None):
        return "—" if optional else "(required)"
    if f.default is None:
        return "—"
    if isinstance(f.default, bool):
        return f"`{str(f.default).lower()}`"
    if f.default == ():
        return "`[]`"
    return f"`{f.default}`"


def _rows(prefix: str, cls: type, names: Any = None, *, optional: bool = False) -> list[Row]:
    """A row per key of ``cls`` (of ``names`` only, if given); an object-valued key's own keys follow it."""
    rows: list[Row] = []
    for key, f in fields_of(cls).items():
        if names is not None and f.alias not in names:
            continue
        section = core_type(f.annotation)
        if is_section(section):
            if _type_name(section) != "object":  # the workload's "cifar10" form: a row of its own too
                rows.append((f"{prefix}.{key}", _type_name(section), _default(f), f.description))
            rows += _rows(f"{prefix}.{key}", section, optional=f.default is None)
        else:
            rows.append((f"{prefix}.{key}", _type_name(f.annotation), _default(f, optional=optional), f.description))
    return rows


def reference_rows() -> list[Row]:
    """(key, type, default, meaning) for every stack config key, in the documented order."""
    top = fields_of(StackFile)
    rows: list[Row] = [("aws:region", _type_name(top["aws:region"].annotation), _default(top["aws:region"]),
                        top["aws:region"].description)]
    for key, cls in TOP_LEVEL_KEYS.items():
        f = top[key]
        if not is_section(cls):
            rows.append((f"{PROJECT}:{key}", _type_name(f.annotation), _default(f), f.description))
        elif cls is RunConfig:  # every job key (documented once, under job) plus the workload
            rows.append((f"{PROJECT}:{key}", "list of object", "—", f.description))
            job_keys = set(fields_of(JobConfig))
            rows += _rows(f"{PROJECT}:{key}[i]", cls, [k for k in fields_of(cls) if k not in job_keys])
        else:
            rows += _rows(f"{PROJECT}:{key}[i]" if key in ("nodeGroups", "catalog") else f"{PROJECT}:{key}", cls)
    return rows


def reference_table() -> str:
    lines = ["| key | type | default | meaning |", "|---|---|---|---|"]
    lines += [f"| `{k}` | {t} | {d} | {m} |" for k, t, d, m in reference_rows()]
    return "\n".join(lines)


DOC_PAGE = Path("docs") / "configuration.md"
BEGIN = "<!-- BEGIN generated: python -m eks_ddp.config --write -->"
END = "<!-- END generated -->"


def table_in_page(text: str) -> str:
    """The table between the markers of a page's text; ValueError naming a missing marker."""
    for marker in (BEGIN, END):
        if text.count(marker) != 1:
            raise ValueError(f"{DOC_PAGE}: expected the marker {marker!r} once; found it {text.count(marker)} times")
    return text.split(BEGIN, 1)[1].split(END, 1)[0].strip("\n")


def repo_root() -> Path:
    """The checkout this module lives in: the nearest folder above it that holds the page."""
    for folder in Path(__file__).resolve().parents:
        if (folder / DOC_PAGE).is_file():
            return folder
    raise FileNotFoundError(f"{DOC_PAGE} not found above {Path(__file__).resolve()}: run this from a checkout")


def write_reference(root: Path | None = None) -> bool:
    """Rewrite the table in ``<root>/docs/configuration.md`` (root: this checkout); True when the page changed."""
    page = (root or repo_root()) / DOC_PAGE
    text = page.read_text()
    current = table_in_page(text)
    if current == reference_table():
        return False
    head, rest = text.split(BEGIN, 1)
    page.write_text(f"{head}{BEGIN}\n{reference_table()}\n{END}{rest.split(END, 1)[1]}")
    return True


SCHEMA_FILE = Path("docs") / "stack-config.schema.json"


class _Schema(GenerateJsonSchema):
    """Field titles repeat the keys ("Vpc Cidr"), so descriptions alone; a key set to null is refused (absent is
    not null), so no null."""

    def field_title_should_be_set(self, schema: Any) -> bool:
        return False

    def nullable_schema(self, schema: Any) -> Any:
        return self.generate_inner(schema["schema"])


def _tidy(node: Any) -> None:
    if isinstance(node, dict):
        if "default" in node and node["default"] is None:
            del node["default"]
        if isinstance(node.get("description"), str):
            node["description"] = node["description"].replace("``", "`")
        for value in node.values():
            _tidy(value)
    elif isinstance(node, list):
        for value in node:
            _tidy(value)


def stack_file_schema() -> dict[str, Any]:
    """The JSON Schema of ``Pulumi.<stack>.yaml``: its ``config:`` holds ``aws:region``, the ``eks-ddp:*`` keys
    (unknown ones refused) and any other namespace's keys."""
    body = STACK_FILE.json_schema(by_alias=True, schema_generator=_Schema)
    defs = body.pop("$defs", {})
    properties = {key if ":" in key else f"{PROJECT}:{key}": value for key, value in body["properties"].items()}
    config = {"type": "object", "description": body.get("description", ""), "properties": properties,
              "patternProperties": {rf"^(?!{PROJECT}:)[^:]+:": {}}, "additionalProperties": False}
    schema = {"$schema": "https://json-schema.org/draft/2020-12/schema", "title": f"Pulumi.<stack>.yaml of {PROJECT}",
              "description": "Generated from the stack config's models: python -m eks_ddp.config --schema.",
              "type": "object", "properties": {"config": config}, "$defs": defs}
    _tidy(schema)
    return schema


def schema_text() -> str:
    """The checked-in file's text."""
    return json.dumps(stack_file_schema(), indent=2) + "\n"
