"""The README's "Config reference" table, generated from the schema (``python -m components.config``)."""

from __future__ import annotations

from dataclasses import MISSING, fields
from typing import Any

from .config_reader import resolve
from .config_schema import PROJECT, TOP_LEVEL_KEYS, yaml_key


def _type_name(annotation: Any) -> str:
    kind = resolve(annotation)
    if isinstance(kind, tuple):
        return " \\| ".join(f"`{c}`" for c in kind)
    return {"tuple": "list of string", "str": "string", "int": "integer", "float": "number",
            "bool": "boolean"}.get(kind, str(kind))


def reference_rows() -> list[tuple[str, str, str, str]]:
    """(key, type, default, meaning) for every stack config key, in README order."""
    rows: list[tuple[str, str, str, str]] = [
        ("aws:region", "string", "(required)", "AWS region of the stack.")]
    for top, cls in TOP_LEVEL_KEYS.items():
        if cls is bool:
            rows.append((f"{PROJECT}:{top}", "boolean", "`true`",
                         "Check zone offerings, EFA, vCPU quotas and reservations before creating anything."))
            continue
        prefix = f"{PROJECT}:{top}[i]" if top == "nodeGroups" else f"{PROJECT}:{top}"
        for f in fields(cls):
            if f.default is MISSING and f.default_factory is MISSING:
                default = "(required)"
            elif f.default is None:
                default = "—"
            elif isinstance(f.default, bool):
                default = f"`{str(f.default).lower()}`"
            elif f.default == ():
                default = "`[]`"
            else:
                default = f"`{f.default}`"
            rows.append((f"{prefix}.{yaml_key(f)}", _type_name(f.type), default, f.metadata["doc"]))
    return rows


def reference_table() -> str:
    lines = ["| key | type | default | meaning |", "|---|---|---|---|"]
    lines += [f"| `{k}` | {t} | {d} | {m} |" for k, t, d, m in reference_rows()]
    return "\n".join(lines)
