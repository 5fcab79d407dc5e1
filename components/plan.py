"""Offline plan: what ``pulumi up`` would create for a stack, without the CLI or AWS.

    python -m components.plan --stack dev [--out DIR]

Runs ``__main__.py`` under Pulumi's mock engine with ``Pulumi.<stack>.yaml``,
prints the resource tree (type, name, parent), the count per type and the
stack outputs, and writes every rendered Kubernetes manifest to DIR as YAML.
Bad config exits 2 with the config error alone.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import yaml

from components.mocks import PROJECT_ROOT, ProgramResult, Recorded

# Not manifests: providers, and Helm releases (their charts render in the cluster).
_NOT_MANIFESTS = ("pulumi:providers:", "kubernetes:helm.sh/")


class PlanError(Exception):
    """A stack that cannot be planned (missing file, bad config)."""


def load_stack_file(stack: str, root: Path = PROJECT_ROOT) -> dict[str, Any]:
    """The stack's config as Pulumi hands it to the program: full keys, JSON for objects."""
    path = root / f"Pulumi.{stack}.yaml"
    if not path.exists():
        known = ", ".join(sorted(p.name[len("Pulumi."):-len(".yaml")] for p in root.glob("Pulumi.*.yaml")))
        raise PlanError(f"--stack: no file {path.name}; stacks here: {known}")
    doc = yaml.safe_load(path.read_text()) or {}
    config: dict[str, Any] = {}
    for key, value in (doc.get("config") or {}).items():
        if isinstance(value, dict) and set(value) == {"secure"}:
            value = "[secret]"
        config[key] = value if isinstance(value, str) else json.dumps(value)
    return config


def render_manifests(result: ProgramResult) -> list[dict[str, Any]]:
    """Kubernetes objects as they would be applied, from the recorded inputs."""
    manifests = []
    for r in result.resources:
        if not r.type.startswith("kubernetes:") or r.type.startswith(_NOT_MANIFESTS) or not r.custom:
            continue
        manifests.append(_manifest(r))
    return manifests


def _manifest(r: Recorded) -> dict[str, Any]:
    inputs = _ints(r.inputs)
    body = {k: v for k, v in inputs.items() if k not in ("apiVersion", "kind", "metadata")}
    metadata = dict(inputs.get("metadata") or {})
    metadata.setdefault("name", r.name)
    return {"apiVersion": inputs.get("apiVersion"), "kind": inputs.get("kind"), "metadata": metadata, **body}


def _ints(value: Any) -> Any:
    """Whole-number floats back to ints: the engine's wire format carries every number as a float,
    and the API server (and scanners) reject ``replicas: 1.0``."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, dict):
        return {k: _ints(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_ints(v) for v in value]
    return value


def _tree_lines(result: ProgramResult) -> list[str]:
    children: dict[str, list[Recorded]] = {}
    for r in result.resources:
        children.setdefault(r.parent_urn if result.by_urn(r.parent_urn) else "", []).append(r)
    lines: list[str] = []

    def walk(urn: str, depth: int) -> None:
        for r in sorted(children.get(urn, []), key=lambda x: (x.type, x.name)):
            lines.append(f"{'  ' * depth}{r.type}  {r.name}")
            walk(r.urn, depth + 1)

    walk("", 0)
    return lines


def write_manifests(manifests: list[dict[str, Any]], out: Path) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    for old in out.glob("*.yaml"):
        old.unlink()
    paths = []
    for i, m in enumerate(manifests):
        ns = m["metadata"].get("namespace")
        ns = ns if isinstance(ns, str) else "cluster"
        path = out / f"{i:02d}-{m['kind'].lower()}-{ns}-{m['metadata']['name']}.yaml"
        path.write_text(yaml.safe_dump(m, sort_keys=False))
        paths.append(path)
    return paths


def plan(stack: str, root: Path = PROJECT_ROOT, overrides: dict[str, Any] | None = None) -> ProgramResult:
    """Run the program offline for ``stack``; raise PlanError on bad config."""
    import pulumi

    from components.mocks import run_program

    config = load_stack_file(stack, root)
    # Preflight calls AWS; offline there is nothing to ask. `pulumi up` runs it.
    config["eks-ddp:preflight"] = "false"
    config.update(overrides or {})
    region = config.get("aws:region", "us-west-2")
    try:
        return run_program(config, stack=stack, program=root / "__main__.py", region=region)
    except pulumi.RunError as err:
        raise PlanError(str(err)) from None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="eks-ddp-plan", description=__doc__.split("\n\n")[0])
    parser.add_argument("--stack", default="dev", help="stack name: reads Pulumi.<stack>.yaml (default: dev)")
    parser.add_argument("--out", type=Path, help="write rendered Kubernetes manifests to this folder")
    parser.add_argument("--project-dir", type=Path, default=PROJECT_ROOT,
                        help="folder holding __main__.py and the Pulumi.<stack>.yaml files (default: this project)")
    args = parser.parse_args(argv)
    start = time.perf_counter()
    try:
        result = plan(args.stack, args.project_dir)
    except PlanError as err:
        print(f"eks-ddp-plan: {err}", file=sys.stderr)
        return 2
    elapsed = time.perf_counter() - start

    print(f"# Plan for stack {args.stack!r}: {len(result.resources)} resources ({elapsed:.1f} s, offline)")
    print("\n## Resource tree (type  name)")
    print("\n".join(_tree_lines(result)))
    print("\n## Resources per type")
    counts = result.counts()
    width = max(len(t) for t in counts)
    for typ, n in counts.items():
        print(f"{typ:<{width}}  {n}")
    print("\n## Outputs")
    for key, value in sorted(result.outputs.items()):
        shown = "[secret]" if key in result.secret_outputs else value
        if key == "costEstimate":
            shown = "(see Cost estimate below)"
        if isinstance(shown, (dict, list)):
            shown = json.dumps(shown, indent=2)
        print(f"{key}: {shown}")
    if "costEstimate" in result.outputs:
        from components import cost

        print("\n## Cost estimate")
        print(cost.render(result.outputs["costEstimate"]))
    print("\npreflight: skipped offline (runs on `pulumi up` unless eks-ddp:preflight is false)")
    if args.out:
        paths = write_manifests(render_manifests(result), args.out)
        print(f"\nwrote {len(paths)} Kubernetes manifests to {args.out}/")
    return 0


if __name__ == "__main__":
    sys.exit(main())
