"""The configuration reference table, generated from the models' fields (``python -m eks_ddp.config``)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal, get_args, get_origin

from eks_ddp.config.reader import PROJECT, core_type, fields_of, is_section
from eks_ddp.config.schema import TOP_LEVEL_KEYS, JobConfig, RunConfig, WorkloadConfig
from eks_ddp.config.stack_file import StackFile

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
