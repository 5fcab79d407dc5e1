"""Reading raw stack values (as Pulumi stores them) into the schema's dataclasses.

Collects every problem instead of stopping at the first, so one run of the validator names every
bad key, its value and what is allowed.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import MISSING, fields
from types import MappingProxyType
from typing import Any, get_args

from eks_ddp.config.schema import (
    PROJECT,
    SUPPORTED_KUBERNETES_VERSIONS,
    TOP_LEVEL_KEYS,
    CapacityType,
    ModelName,
    NatMode,
    RdzvBackend,
    RunState,
    ScanSeverity,
    UpgradePolicy,
    WorkloadConfig,
    yaml_key,
)

_INT_TEXT = re.compile(r"^-?\d+$")
#: What a string key allows, added to the "quote it" message when a number arrives.
_STRING_HINTS = {"kubernetesVersion": ", e.g. kubernetesVersion: \"" + SUPPORTED_KUBERNETES_VERSIONS[-1]
                 + "\"; allowed: " + ", ".join(SUPPORTED_KUBERNETES_VERSIONS)}


class Reader:
    """Turns one raw object into a dataclass, collecting problems instead of stopping."""

    def __init__(self) -> None:
        self.problems: list[str] = []

    def bad(self, key: str, value: Any, allowed: str) -> None:
        self.problems.append(f"{key}: got {value!r}; expected {allowed}")

    def obj(self, cls: type, raw: Any, prefix: str) -> Any:
        if raw is None:
            raw = {}
        if not isinstance(raw, dict):
            self.bad(prefix, raw, "an object with keys " + ", ".join(yaml_key(f) for f in fields(cls)))
            raw = {}
        known = {yaml_key(f): f for f in fields(cls)}
        for key in raw:
            if key not in known:
                self.bad(f"{prefix}.{key}", raw[key], "one of the known keys: " + ", ".join(known)
                         + suggest(key, known))
        values: dict[str, Any] = {}
        for ykey, f in known.items():
            full = f"{prefix}.{ykey}"
            if ykey not in raw:
                if f.default is MISSING and f.default_factory is MISSING:
                    self.problems.append(f"{full}: required; {f.metadata['doc']}")
                continue
            values[f.name] = self.value(full, raw[ykey], f.type)
        if any(p.startswith(prefix) for p in self.problems):
            return None
        return cls(**values)

    def value(self, key: str, value: Any, typ: Any) -> Any:
        typ = resolve(typ)
        if typ == "bool":
            if isinstance(value, bool):
                return value
            self.bad(key, value, "true or false")
        elif typ == "int":
            # `pulumi config set --path` stores what it cannot read as an int as a string: accept "20".
            if isinstance(value, str) and _INT_TEXT.match(value.strip()):
                return int(value)
            if isinstance(value, int) and not isinstance(value, bool):
                return value
            if isinstance(value, float) and value.is_integer():
                return int(value)
            self.bad(key, value, "a whole number")
        elif typ == "float":
            # ... and every non-integer number too: `--path job.learningRate 0.1` arrives as "0.1".
            if isinstance(value, str):
                try:
                    value = float(value)
                except ValueError:
                    pass
            if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
                return float(value)
            self.bad(key, value, "a number (finite)")
        elif typ == "str":
            # ... while a digit-only value (runId 2024) arrives as an int.
            if isinstance(value, int) and not isinstance(value, bool):
                return str(value)
            if isinstance(value, str) and value:
                return value
            if isinstance(value, float):
                # An unquoted 1.35 in YAML is a number, and 1.30 becomes 1.3: reading it back is guesswork.
                self.bad(key, value, "a string: quote the value in the stack file (YAML reads an unquoted 1.30 as "
                                     "the number 1.3)" + _STRING_HINTS.get(key.rsplit(".", 1)[-1], ""))
            else:
                self.bad(key, value, "a non-empty string")
        elif typ == "tuple":
            if isinstance(value, list) and all(isinstance(v, str) and v for v in value):
                return tuple(value)
            self.bad(key, value, "a list of strings")
        elif isinstance(typ, tuple):  # Literal choices
            if value in typ:
                return value
            self.bad(key, value, "one of " + ", ".join(repr(c) for c in typ))
        elif typ == "WorkloadConfig":
            return self.workload(key, value)
        return None

    def workload(self, key: str, value: Any) -> WorkloadConfig | None:
        """``cifar10`` or ``{image, module | script, args, env, data: {s3}}`` (the value checks are in
        config_checks; here only the shape)."""
        if value == "cifar10":
            return WorkloadConfig()
        if not isinstance(value, dict):
            self.bad(key, value, f"'cifar10' (the bundled trainer) or an object with keys {', '.join(WORKLOAD_KEYS)}")
            return None
        before = len(self.problems)
        for k in value:
            if k not in WORKLOAD_KEYS:
                self.bad(f"{key}.{k}", value[k], "one of the known keys: " + ", ".join(WORKLOAD_KEYS)
                         + suggest(k, dict.fromkeys(WORKLOAD_KEYS)))
        strings = {k: self.value(f"{key}.{k}", value[k], "str") for k in ("image", "module", "script") if k in value}
        args: tuple[str, ...] = ()
        if "args" in value:
            # An empty-string argument is legitimate (--suffix ''); numbers YAML read as numbers are not.
            if isinstance(value["args"], list) and all(isinstance(a, str) for a in value["args"]):
                args = tuple(value["args"])
            else:
                self.bad(f"{key}.args", value["args"], "a list of strings (quote numbers: ['--lr', '0.1'])")
        env: dict[str, str] = {}
        raw_env = value.get("env", {})
        if not isinstance(raw_env, dict):
            self.bad(f"{key}.env", raw_env, "an object of variable names to strings")
        else:
            for name, v in raw_env.items():
                if isinstance(v, str):
                    env[name] = v
                elif isinstance(v, (int, float)) and not isinstance(v, bool):
                    env[name] = str(v)  # OMP_NUM_THREADS: 4 is what anyone writes; the pod gets "4"
                else:
                    self.bad(f"{key}.env.{name}", v, "a string")
        s3_uri = s3_sha256 = None
        if "data" in value:
            data = value["data"]
            if not isinstance(data, dict) or "s3" not in data or not set(data) <= {"s3", "sha256"}:
                self.bad(f"{key}.data", data, "an object with one key, s3, and optionally sha256: {s3: "
                         "'s3://bucket/prefix/', sha256: <the data set's manifest sha256>}")
            else:
                s3_uri = self.value(f"{key}.data.s3", data["s3"], "str")
                if "sha256" in data:
                    s3_sha256 = self.value(f"{key}.data.sha256", data["sha256"], "str")
        egress: tuple[str, ...] = ()
        if "egress" in value:
            if isinstance(value["egress"], list) and all(isinstance(e, str) and e for e in value["egress"]):
                egress = tuple(value["egress"])
            else:
                self.bad(f"{key}.egress", value["egress"], "a list of strings ('https', 'internet:PORTS' or "
                                                           "'CIDR:PORTS')")
        statements: tuple[Any, ...] = ()
        if "iamStatements" in value:
            if isinstance(value["iamStatements"], list):
                statements = tuple(value["iamStatements"])
            else:
                self.bad(f"{key}.iamStatements", value["iamStatements"], "a list of IAM statements (objects with "
                                                                         "Effect, Action and Resource)")
        if len(self.problems) > before:
            return None
        return WorkloadConfig(kind="custom", args=args, env=MappingProxyType(env), s3_uri=s3_uri,
                              s3_sha256=s3_sha256, egress=egress, iam_statements=statements, **strings)


#: The keys of a custom workload object, in documentation order.
WORKLOAD_KEYS = ("image", "module", "script", "args", "env", "data", "egress", "iamStatements")


def resolve(annotation: Any) -> Any:
    """Map a field annotation (a string under ``from __future__``) to a check kind."""
    text = str(annotation).replace(" | None", "")
    literals = {"CapacityType": CapacityType, "NatMode": NatMode, "ModelName": ModelName,
                "RdzvBackend": RdzvBackend, "UpgradePolicy": UpgradePolicy, "ScanSeverity": ScanSeverity,
                "RunState": RunState}
    if text in literals:
        return get_args(literals[text])
    if text.startswith("tuple"):
        return "tuple"
    return text


def suggest(key: str, known: dict[str, Any]) -> str:
    import difflib

    close = difflib.get_close_matches(key, list(known), n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def parse_raw(raw: dict[str, str]) -> tuple[dict[str, Any], list[str]]:
    """Decode Pulumi's string values (JSON for objects, lists, numbers and booleans)."""
    out: dict[str, Any] = {}
    problems: list[str] = []
    for full_key, text in raw.items():
        key = full_key.split(":", 1)[1] if ":" in full_key else full_key
        if key not in TOP_LEVEL_KEYS:
            top = re.split(r"[.\[]", key, maxsplit=1)[0]
            if top in TOP_LEVEL_KEYS and top != key:
                # `pulumi config set eks-ddp:image.prebuilt X` (no --path) stores the dotted name as a key.
                value = text if isinstance(text, str) else json.dumps(text)
                problems.append(f"{PROJECT}:{key}: unknown key, a path set without --path; expected it inside "
                                f"{PROJECT}:{top}: pulumi config rm '{PROJECT}:{key}' && pulumi config set --path "
                                f"'{key}' '{value}'")
                continue
            problems.append(f"{PROJECT}:{key}: unknown key; known keys: "
                            + ", ".join(TOP_LEVEL_KEYS) + suggest(key, TOP_LEVEL_KEYS))
            continue
        if isinstance(text, str):
            try:
                out[key] = json.loads(text)
            except json.JSONDecodeError:
                out[key] = text
        else:
            out[key] = text
    return out, problems

