"""What nodeadm and containerd do to the numbers in a launch template's NodeConfig, in Python.

On an AL2023 EKS node, nodeadm reads the ``application/node.eks.aws`` MIME parts of the user
data and merges ``spec.containerd.baseRuntimeSpec`` into its embedded default OCI spec
(amazon-eks-ami ``nodeadm/internal/containerd/base_runtime_spec.go``):
``util.Merge(default, cfg.BaseRuntimeSpec, json.Marshal, json.Unmarshal)``, where ``util.Merge``
(``nodeadm/internal/util/merge.go``) unmarshals both sides into ``map[string]interface{}``, so
every JSON number becomes a Go **float64**, and merges them with ``mergo.WithOverride`` (maps
merge key by key, anything else, lists included, is replaced). The result is written with
``json.MarshalIndent``, which formats float64 with ``strconv.AppendFloat(f, 'f', -1, 64)``
(shortest digits that round-trip, padded with zeros; exponent form at >= 1e21). containerd then
decodes that file into ``oci.Spec`` whose rlimits are **uint64**: Go's decoder calls
``strconv.ParseUint`` on the literal, which rejects fractions, exponents and overflow.

``tests/fixtures/nodeadm-base-runtime-spec.json`` is nodeadm's embedded default spec
(awslabs/amazon-eks-ami, ``nodeadm/internal/containerd/base-runtime-spec.json``, MIT-0).
"""

from __future__ import annotations

import base64
import email
import json
import re
from decimal import Decimal
from pathlib import Path
from typing import Any

import yaml

DEFAULT_SPEC = Path(__file__).parents[1] / "fixtures" / "nodeadm-base-runtime-spec.json"
UINT64_MAX = 2**64 - 1
INT64_MIN = -(2**63)


def node_configs(user_data_b64: str) -> list[dict[str, Any]]:
    """The NodeConfig documents of base64 launch-template user data (MIME multipart)."""
    msg = email.message_from_bytes(base64.b64decode(user_data_b64))
    parts = msg.walk() if msg.is_multipart() else [msg]
    return [yaml.safe_load(p.get_payload(decode=True)) for p in parts
            if p.get_content_type() == "application/node.eks.aws"]


def go_float_literal(f: float) -> str:
    """The literal Go's encoding/json writes for a float64 (``AppendFloat(f, 'f'|'e', -1, 64)``)."""
    if f != 0 and (abs(f) < 1e-6 or abs(f) >= 1e21):
        mant, _, exp = repr(f).partition("e")
        mant = mant.removesuffix(".0")
        return f"{mant}e{exp[0]}{int(exp[1:]):02d}" if exp else mant
    return format(Decimal(repr(f)).normalize(), "f")


def _go_reencode(raw: str) -> str:
    """JSON text -> Go map[string]interface{} (float64 numbers) -> Go JSON text."""
    value = json.loads(raw, parse_int=float, parse_float=float)
    return _dump(value)


def _dump(v: Any) -> str:
    if isinstance(v, dict):
        return "{" + ",".join(f"{json.dumps(k)}:{_dump(x)}" for k, x in sorted(v.items())) + "}"
    if isinstance(v, list):
        return "[" + ",".join(_dump(x) for x in v) + "]"
    if isinstance(v, float):
        return go_float_literal(v)
    return json.dumps(v)


def _merge(dst: Any, src: Any) -> Any:
    """mergo.Merge(&dst, src, WithOverride) on decoded JSON: maps recurse, everything else is replaced."""
    if isinstance(dst, dict) and isinstance(src, dict):
        out = dict(dst)
        for k, v in src.items():
            out[k] = _merge(dst[k], v) if k in dst else v
        return out
    return src


def merged_base_runtime_spec(node_config: dict[str, Any]) -> str:
    """The ``/etc/containerd/base-runtime-spec.json`` text nodeadm writes for this NodeConfig."""
    user = node_config["spec"]["containerd"]["baseRuntimeSpec"]
    default = json.loads(_go_reencode(DEFAULT_SPEC.read_text()), parse_int=float, parse_float=float)
    # The NodeConfig YAML reaches nodeadm as JSON (sigs.k8s.io/yaml keeps integers exact) ...
    user_json = json.dumps(user)
    # ... then util.Merge unmarshals it into interface{} (float64) and marshals the merge.
    merged = _merge(default, json.loads(user_json, parse_int=float, parse_float=float))
    return _dump(merged)


def go_decode_integer(literal: str, *, unsigned: bool) -> int:
    """Go's decode of a JSON number literal into a uint64 (or int64) field; ValueError like Go's error."""
    if not re.fullmatch(r"-?(0|[1-9]\d*)", literal):
        raise ValueError(f"cannot unmarshal number {literal} into an integer field")
    n = int(literal)
    lo, hi = (0, UINT64_MAX) if unsigned else (INT64_MIN, 2**63 - 1)
    if not lo <= n <= hi:
        raise ValueError(f"cannot unmarshal number {literal} into a {'uint64' if unsigned else 'int64'} field")
    return n


def number_literals(json_text: str) -> list[str]:
    """Every number literal of a compact JSON text, in order (strings skipped)."""
    token = re.compile(r'"(?:[^"\\]|\\.)*"|-?\d[\d.eE+-]*')
    return [m.group() for m in token.finditer(json_text) if not m.group().startswith('"')]


def numbers(value: Any) -> list[Any]:
    """Every number of a decoded document, depth first in key order (matches ``number_literals(_dump(...))``)."""
    if isinstance(value, dict):
        return [n for k in sorted(value) for n in numbers(value[k])]
    if isinstance(value, list):
        return [n for x in value for n in numbers(x)]
    if isinstance(value, bool) or not isinstance(value, int | float):
        return []
    return [value]


def through_float64(value: int | float) -> str:
    """A number of the user data after one float64 round trip (what nodeadm writes)."""
    return go_float_literal(float(value))
