"""The stack config's reference: the table of ``docs/configuration.md`` and the stack file's JSON Schema
(``docs/stack-config.schema.json``, whose descriptions editors show as hints on ``Pulumi.<stack>.yaml``).

Each key's meaning is written once, for its readers, in the page's table (the "meaning" column); the models give the
rest of its row (key, type, default). ``python -m eks_ddp.tooling.config_docs --write`` rewrites the table between :data:`BEGIN`
and :data:`END` from the models, keeping each key's meaning (a new key's is empty: write it there); ``--schema``
prints the JSON Schema with the page's meanings as its descriptions.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, Literal, get_args, get_origin

from pydantic.json_schema import GenerateJsonSchema

from eks_ddp.config.messages import core_type, fields_of, is_section
from eks_ddp.config.schema import PROJECT, STACK_FILE, JobConfig, RunConfig, StackFile, WorkloadConfig

Row = tuple[str, str, str, str]
DOC_PAGE = Path("docs") / "configuration.md"
SCHEMA_FILE = Path("docs") / "stack-config.schema.json"
BEGIN = "<!-- BEGIN generated: python -m eks_ddp.tooling.config_docs --write -->"
END = "<!-- END generated -->"


def _type_name(annotation: Any) -> str:
    tp = core_type(annotation)
    if get_origin(tp) is Literal:
        return " \\| ".join(f"`{c}`" for c in get_args(tp))
    if tp is WorkloadConfig:
        return "`cifar10` \\| object"
    if get_origin(tp) is tuple:
        return "list of " + ("string" if core_type(get_args(tp)[0]) is str else "object")
    names = {str: "string", int: "integer", float: "number", bool: "boolean", Mapping: "object of string"}
    return names.get(get_origin(tp) or tp, "object")


def _default(f: Any, *, optional: bool = False) -> str:
    """``optional``: the key sits in an object that is itself optional (``workload.data``): no default of its own."""
    if f.default_factory is not None:  # an empty mapping, or the bundled workload
        return "`cifar10`" if f.default_factory is WorkloadConfig else "`{}`"
    if f.is_required():
        return "—" if optional else "(required)"
    if f.default is None:
        return "—"
    return "`[]`" if f.default == () else f"`{json.dumps(f.default) if isinstance(f.default, bool) else f.default}`"


def _keys(prefix: str, cls: type, names: Any = None, *, optional: bool = False) -> Iterator[tuple[str, type, Any]]:
    """(key, owning model, (field, optional)) per key of ``cls`` (of ``names``, if given); an object's keys follow it."""
    for key, f in fields_of(cls).items():
        if names is None or key in names:
            yield f"{prefix}.{key}", cls, (f, optional)
            if is_section(section := core_type(f.annotation)):
                yield from _keys(f"{prefix}.{key}", section, optional=f.default is None)


def _all_keys() -> Iterator[tuple[str, type, Any]]:
    """Every documented key in the stack file's order: a section's keys under its name, a list's under ``name[i]``,
    a run's job keys once, under ``job``."""
    for key, f in fields_of(StackFile).items():
        tp, name = core_type(f.annotation), key if ":" in key else f"{PROJECT}:{key}"
        listed = get_origin(tp) is tuple
        model = core_type(get_args(tp)[0]) if listed else tp
        if listed or not is_section(model):
            yield name, StackFile, (f, False)
        if is_section(model):
            names = [k for k in fields_of(model) if k not in fields_of(JobConfig)] if model is RunConfig else None
            yield from _keys(name + "[i]" * listed, model, names)


def meanings(root: Path | None = None) -> dict[str, str]:
    """Each key's meaning, as the page's table gives it."""
    rows = table_in_page(((root or repo_root()) / DOC_PAGE).read_text()).splitlines()[2:]
    return {m[1]: m[2] for m in (re.match(r"\| `([^`]+)` \|.*\| ([^|]*) \|$", r) for r in rows) if m}


def reference_rows(root: Path | None = None) -> list[Row]:
    """(key, type, default, meaning) for every stack config key, in the documented order."""
    meaning = meanings(root)
    return [(key, _type_name(f.annotation), _default(f, optional=optional), meaning.get(key, ""))
            for key, _, (f, optional) in _all_keys()]


def reference_table(root: Path | None = None) -> str:
    lines = ["| key | type | default | meaning |", "|---|---|---|---|"]
    return "\n".join(lines + [f"| `{k}` | {t} | {d} | {m} |" for k, t, d, m in reference_rows(root)])


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
    text, table = page.read_text(), reference_table(root)
    if table_in_page(text) == table:
        return False
    head, rest = text.split(BEGIN, 1)
    page.write_text(f"{head}{BEGIN}\n{table}\n{END}{rest.split(END, 1)[1]}")
    return True


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


def _described(node: dict[str, Any], text: str) -> dict[str, Any]:
    return dict(sorted({**node, "description": text}.items()))  # keys in pydantic's order


def stack_file_schema() -> dict[str, Any]:
    """The JSON Schema of ``Pulumi.<stack>.yaml``: its ``config:`` holds ``aws:region``, the ``eks-ddp:*`` keys
    (unknown ones refused) and any other namespace's keys; each key's description is its meaning on the page."""
    body = STACK_FILE.json_schema(by_alias=True, schema_generator=_Schema)
    defs, meaning = body.pop("$defs", {}), meanings()
    properties = {key if ":" in key else f"{PROJECT}:{key}": value for key, value in body["properties"].items()}
    for key, value in properties.items():  # a section's: its model's docstring
        properties[key] = _described(value, meaning[key]) if key in meaning else value
    prefix = {cls: key.rsplit(".", 1)[0] for key, cls, _ in _all_keys() if cls is not StackFile}
    models = {cls.__name__: cls for cls in prefix}
    for name, model in defs.items():
        props = next(m["properties"] for m in [model, *model.get("anyOf", [])] if "properties" in m)
        for key, value in props.items():  # a run's job keys: their job.* meaning
            known = [f"{prefix[c]}.{key}" for c in models[name].__mro__ if meaning.get(f"{prefix.get(c)}.{key}")]
            if not known:
                raise LookupError(f"{DOC_PAGE}: no meaning for {prefix[models[name]]}.{key}; expected one in its row")
            props[key] = _described(value, meaning[known[0]])
    config = {"type": "object", "description": body.get("description", ""), "properties": properties,
              "patternProperties": {rf"^(?!{PROJECT}:)[^:]+:": {}}, "additionalProperties": False}
    schema = {"$schema": "https://json-schema.org/draft/2020-12/schema", "title": f"Pulumi.<stack>.yaml of {PROJECT}",
              "description": "Generated from the stack config's models: python -m eks_ddp.tooling.config_docs --schema.",
              "type": "object", "properties": {"config": config}, "$defs": defs}
    _tidy(schema)
    return schema


def schema_text() -> str:
    """The checked-in file's text."""
    return json.dumps(stack_file_schema(), indent=2) + "\n"


def main(argv: list[str]) -> None:
    """``python -m eks_ddp.tooling.config_docs``: print the table; ``--write``: rewrite it in the page; ``--schema``:
    print the JSON Schema."""
    if argv == ["--write"]:
        print(f"{DOC_PAGE}: {'rewritten' if write_reference() else 'up to date'}")
    elif argv == ["--schema"]:
        print(schema_text(), end="")
    elif argv:
        raise SystemExit(f"python -m eks_ddp.tooling.config_docs: got {' '.join(argv)!r}; expected no argument, "
                         "--write or --schema")
    else:
        print(reference_table())


if __name__ == "__main__":
    import sys

    main(sys.argv[1:])
