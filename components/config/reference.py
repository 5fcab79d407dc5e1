"""The stack config reference table of ``docs/configuration.md``, generated from the schema.

``python -m eks_ddp.config`` prints the table; ``--write`` rewrites it in the page, between the
:data:`BEGIN` and :data:`END` markers.
"""

from __future__ import annotations

from dataclasses import MISSING, fields
from pathlib import Path
from typing import Any

from eks_ddp.config.reader import resolve
from eks_ddp.config.schema import PROJECT, TOP_LEVEL_KEYS, JobConfig, RunConfig, WorkloadConfig, yaml_key


def _type_name(annotation: Any) -> str:
    kind = resolve(annotation)
    if isinstance(kind, tuple):
        return " \\| ".join(f"`{c}`" for c in kind)
    return {"tuple": "list of string", "str": "string", "int": "integer", "float": "number",
            "bool": "boolean", "Mapping[str, str]": "object of string",
            "WorkloadConfig": "`cifar10` \\| object"}.get(kind, str(kind))


def _field_type(f: Any) -> str:
    return "list of object" if str(f.type).startswith("tuple[Mapping") else _type_name(f.type)


def _default(f: Any) -> str:
    if f.default is MISSING and f.default_factory is MISSING:
        return "(required)"
    if f.default is MISSING:  # a factory: an empty mapping, or the bundled workload
        return "`cifar10`" if f.default_factory is WorkloadConfig else "`{}`"
    if f.default is None:
        return "—"
    if isinstance(f.default, bool):
        return f"`{str(f.default).lower()}`"
    if f.default == ():
        return "`[]`"
    return f"`{f.default}`"


def _runs_rows() -> list[tuple[str, str, str, str]]:
    """``runs`` takes every ``job`` key (documented once, under job) plus the workload and its keys."""
    prefix = f"{PROJECT}:runs[i]"
    rows = [(f"{PROJECT}:runs", "list of object", "—",
             f"Several runs side by side instead of {PROJECT}:job (not both): each entry takes every job key "
             "(its own runId) plus workload.")]
    extra = [f for f in fields(RunConfig) if f.name not in {g.name for g in fields(JobConfig)}]
    for f in extra:
        rows.append((f"{prefix}.{yaml_key(f)}", _type_name(f.type), _default(f), f.metadata["doc"]))
    for f in fields(WorkloadConfig):
        if yaml_key(f) != "-":  # kind: the string or the object says it
            rows.append((f"{prefix}.workload.{yaml_key(f)}", _field_type(f), _default(f), f.metadata["doc"]))
    return rows


def reference_rows() -> list[tuple[str, str, str, str]]:
    """(key, type, default, meaning) for every stack config key, in the reference's order."""
    rows: list[tuple[str, str, str, str]] = [
        ("aws:region", "string", "(required)", "AWS region of the stack.")]
    for top, cls in TOP_LEVEL_KEYS.items():
        if cls is bool:
            rows.append((f"{PROJECT}:{top}", "boolean", "`true`",
                         "Check zone offerings, EFA, vCPU quotas and reservations before creating anything."))
            continue
        if cls is RunConfig:
            rows += _runs_rows()
            continue
        prefix = f"{PROJECT}:{top}[i]" if top in ("nodeGroups", "catalog") else f"{PROJECT}:{top}"
        for f in fields(cls):
            rows.append((f"{prefix}.{yaml_key(f)}", _type_name(f.type), _default(f), f.metadata["doc"]))
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
