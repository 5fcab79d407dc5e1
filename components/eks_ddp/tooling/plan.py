"""Offline plan: what ``pulumi up`` would create for a stack, without the CLI or AWS.

    eks-ddp-plan [--project-dir DIR] [--stack dev] [--out OUT]     (python -m eks_ddp.tooling.plan in this repository)

Runs the Pulumi program of DIR (default: the current folder; its ``Pulumi.yaml`` names the project and,
optionally, ``main``) under Pulumi's mock engine with ``Pulumi.<stack>.yaml``, prints the resource tree (type,
name, parent), the count per type and the stack outputs, and writes every rendered Kubernetes manifest to OUT
as YAML. Any program that uses the components works: its config is read under its own project name, and its
folder comes first on the import path. eks-ddp's own program also gets its cost estimate, version notices
and placeholder notes. Bad eks-ddp config exits 2 with the config error alone; a program that fails exits 1
with the exception and the line of the program it came from (``--traceback`` for all of it).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import os
import re
import sys
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from eks_ddp.config import OFFLINE_PLAN_ENV, PROJECT
from eks_ddp.core import k8s_versions
from eks_ddp.tooling.manifests import render_manifests
from eks_ddp.tooling.mocks import PROJECT_ROOT, ProgramResult, Recorded


class PlanError(Exception):
    """A stack that cannot be planned (missing file, bad config)."""


class _Yaml12Loader(yaml.SafeLoader):
    """YAML as Pulumi reads stack files (YAML 1.2): only true/false are booleans, so `yes` stays a string."""


_Yaml12Loader.yaml_implicit_resolvers = {
    first: [(tag, regexp) for tag, regexp in resolvers if tag != "tag:yaml.org,2002:bool"]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
_Yaml12Loader.add_implicit_resolver(
    "tag:yaml.org,2002:bool", re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"), list("tTfF"))



@dataclass(frozen=True)
class Project:
    """A Pulumi project folder: its name (the config namespace) and its program file."""

    root: Path
    name: str
    program: Path


def load_project(root: Path) -> Project:
    """``root/Pulumi.yaml``'s ``name`` and ``main`` (a file, or a folder holding ``__main__.py``)."""
    path = root / "Pulumi.yaml"
    if not path.is_file():
        raise PlanError(f"--project-dir: no Pulumi.yaml in {root.resolve()}; run from your Pulumi project's folder "
                        "or name it with --project-dir DIR")
    try:
        doc = yaml.load(path.read_text(), Loader=_Yaml12Loader) or {}
    except yaml.YAMLError as err:
        raise PlanError(f"{path}: not valid YAML ({getattr(err, 'problem', None) or err})") from None
    name = doc.get("name") if isinstance(doc, dict) else None
    if not isinstance(name, str) or not name:
        raise PlanError(f"{path}: expected a project 'name:'")
    main = root / str(doc.get("main") or ".")
    program = main / "__main__.py" if main.is_dir() else main
    if not program.is_file():
        raise PlanError(f"{path}: no program at {program} (Pulumi.yaml 'main:', default __main__.py)")
    return Project(root=root, name=name, program=program)


def load_stack_file(stack: str, root: Path = PROJECT_ROOT) -> dict[str, Any]:
    """The stack's config as Pulumi hands it to the program: full keys, JSON for objects."""
    path = root / f"Pulumi.{stack}.yaml"
    if not path.exists():
        known = ", ".join(sorted(p.name[len("Pulumi."):-len(".yaml")] for p in root.glob("Pulumi.*.yaml")))
        raise PlanError(f"--stack: no file {path.name} in {root.resolve()}; stacks there: {known or 'none'} "
                        "(--project-dir names another folder)")
    try:
        doc = yaml.load(path.read_text(), Loader=_Yaml12Loader) or {}
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f"{path.name}:{mark.line + 1}:{mark.column + 1}" if mark else path.name
        problem = getattr(err, "problem", None) or str(err)
        raise PlanError(f"{where}: not valid YAML ({problem})") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("config") or {}, dict):
        raise PlanError(f"{path.name}: expected a mapping with a 'config:' mapping of keys")
    config: dict[str, Any] = {}
    for key, value in (doc.get("config") or {}).items():
        if isinstance(value, dict) and set(value) == {"secure"}:
            value = "[secret]"
        config[key] = value if isinstance(value, str) else json.dumps(value)
    return config


PLACEHOLDER_RESERVATION = "cr-0123456789abcdef0"
"""The example p4de stack's capacityReservationId: AWS's documentation id, which no account holds."""


def placeholder_notes(config: dict[str, Any]) -> list[str]:
    """What ``pulumi up`` would reject that the offline plan let through (the example stacks' placeholders)."""
    from eks_ddp.core.rules import public_access_cidrs

    notes = []
    try:
        groups = json.loads(config.get("eks-ddp:nodeGroups", "[]"))
        notes += [f"`pulumi up` (preflight) rejects nodeGroups[{i}].capacityReservationId: "
                  f"{PLACEHOLDER_RESERVATION} is the example's placeholder; set your reservation's id, or remove the "
                  "key for on-demand capacity" for i, g in enumerate(groups)
                  if isinstance(g, dict) and g.get("capacityReservationId") == PLACEHOLDER_RESERVATION]
    except (AttributeError, TypeError, json.JSONDecodeError):
        pass
    try:
        cluster = json.loads(config.get("eks-ddp:cluster", "{}"))
        cidrs = cluster.get("publicAccessCidrs") or []
        if cluster.get("endpointPublicAccess") is False:
            return notes  # a private-only endpoint takes no CIDRs (the stack config says so if some are set)
    except (AttributeError, TypeError, json.JSONDecodeError):
        return notes
    return [*notes, *(f"`pulumi up` rejects {p}" for p in public_access_cidrs("cluster.publicAccessCidrs", cidrs))]


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


INDEX_FILE = ".eks-ddp-plan.json"
"""The manifests a plan wrote to its --out folder: the next plan deletes those and nothing else."""
_MANIFEST_NAME = re.compile(r"^\d{2,}-[a-z0-9]+-[a-z0-9.-]+\.yaml$")


def _owned(out: Path) -> set[str]:
    try:
        names = json.loads((out / INDEX_FILE).read_text())["files"]
    except (OSError, ValueError, KeyError, TypeError):
        return set()
    # Only plain manifest names: an index edited to name another file never gets that file deleted.
    return {n for n in names if isinstance(n, str) and _MANIFEST_NAME.match(n)}


def write_manifests(manifests: list[dict[str, Any]], out: Path) -> list[Path]:
    """Write one YAML file per manifest into ``out``. Deletes only the files an earlier plan listed in
    ``out``'s index (INDEX_FILE); refuses (PlanError) to overwrite a file it did not write."""
    names = []
    for i, m in enumerate(manifests):
        ns = m["metadata"].get("namespace")
        ns = ns if isinstance(ns, str) else "cluster"
        names.append(f"{i:02d}-{m['kind'].lower()}-{ns}-{m['metadata']['name']}.yaml")
    if out.exists() and not out.is_dir():
        raise PlanError(f"--out: {out} is a file, not a folder; name a folder for the manifests")
    owned = _owned(out)
    if clashes := [n for n in names if (out / n).exists() and n not in owned]:
        more = f" and {len(clashes) - 1} more" if len(clashes) > 1 else ""
        raise PlanError(f"--out: {out} already holds {clashes[0]}{more}, which eks-ddp-plan did not write; "
                        "name an empty folder or one an earlier plan wrote")
    paths = []
    try:
        out.mkdir(parents=True, exist_ok=True)
        for stale in owned - set(names):
            (out / stale).unlink(missing_ok=True)
        for name, m in zip(names, manifests, strict=True):
            (out / name).write_text(yaml.safe_dump(m, sort_keys=False))
            paths.append(out / name)
        (out / INDEX_FILE).write_text(json.dumps({"files": names}, indent=1) + "\n")
    except OSError as err:  # a parent that is a file, no permission, a full disk: say which path, no traceback
        raise PlanError(f"--out: cannot write {err.filename or out}: {err.strerror or err}") from None
    return paths


def plan(stack: str, root: Path = PROJECT_ROOT, overrides: dict[str, Any] | None = None) -> ProgramResult:
    """Run the program of the project in ``root`` offline for ``stack``; raise PlanError on bad eks-ddp config.
    The program's own exceptions propagate."""
    import pulumi

    from eks_ddp.tooling.mocks import run_program

    project = load_project(root)
    config = load_stack_file(stack, root)
    # Preflight calls AWS; offline there is nothing to ask. `pulumi up` runs it. A value that is not a
    # boolean stays, so the plan rejects it as `pulumi up` would.
    if project.name == PROJECT and config.get("eks-ddp:preflight", "true") in ("true", "false"):
        config["eks-ddp:preflight"] = "false"
    config.update(overrides or {})
    region = config.get("aws:region", "us-west-2")
    previous = os.environ.get(OFFLINE_PLAN_ENV)
    os.environ[OFFLINE_PLAN_ENV] = "1"
    # The program imports its own packages, as under `pulumi up`: its own folder (a `main:` folder is run as a
    # directory, which puts it first) and the project's, ahead of anything installed or in this repository.
    folders = list(dict.fromkeys([str(project.program.parent.resolve()), str(root.resolve())]))
    sys.path[:0] = folders
    try:
        return run_program(config, stack=stack, project=project.name, program=project.program, region=region)
    except pulumi.RunError as err:
        raise PlanError(str(err)) from None
    finally:
        for folder in folders:
            with contextlib.suppress(ValueError):
                sys.path.remove(folder)
        if previous is None:
            os.environ.pop(OFFLINE_PLAN_ENV, None)
        else:
            os.environ[OFFLINE_PLAN_ENV] = previous


LIBRARY_DIRS = tuple(str(Path(str(m.__file__)).resolve().parent) + os.sep
                     for m in map(sys.modules.get, ("eks_ddp", "pulumi")) if m is not None and m.__file__)
"""The library's and Pulumi's own folders: a frame in them is never "your line", wherever they are installed
(inside the project too, as with an editable install of this repository)."""


def program_error(err: BaseException, project: Path) -> str:
    """One line for a program that raised: the exception, and the deepest line of the project's own code (never
    a line of the library's: an Args' check raises there, but the line to fix is the one that built the Args)."""
    where = ""
    root = str(project.resolve())
    for frame in traceback.extract_tb(err.__traceback__):
        if frame.filename.startswith(root) and not frame.filename.startswith(LIBRARY_DIRS):
            where = f" (at {frame.filename}:{frame.lineno}: {frame.line})"
    return f"the program failed: {type(err).__name__}: {err}{where}"


def version_warnings(stack: str, root: Path = PROJECT_ROOT, today: dt.date | None = None) -> list[str]:
    """The Kubernetes support notice for the stack's version and upgrade policy (extended support costs 6x)."""
    from eks_ddp.config import load_stack_config

    config = load_stack_file(stack, root)
    cfg = load_stack_config({k: v for k, v in config.items() if k.startswith("eks-ddp:")},
                            region=config.get("aws:region", "us-west-2"), placeholders_ok=True)
    notice = k8s_versions.support_notice(cfg.cluster.kubernetes_version, cfg.cluster.upgrade_policy,
                                         today or dt.date.today())
    return [notice] if notice else []


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="eks-ddp-plan", description=__doc__.split("\n\n")[0])
    parser.add_argument("--stack", default="dev", help="stack name: reads Pulumi.<stack>.yaml (default: dev)")
    parser.add_argument("--out", type=Path, help="write rendered Kubernetes manifests to this folder (files it did "
                        "not write are never deleted or overwritten)")
    parser.add_argument("--project-dir", type=Path, default=Path.cwd(),
                        help="the Pulumi project: Pulumi.yaml, its program and Pulumi.<stack>.yaml (default: the "
                             "current folder)")
    parser.add_argument("--traceback", action="store_true", help="show the whole traceback of a failing program")
    args = parser.parse_args(argv)
    start = time.perf_counter()
    try:
        project = load_project(args.project_dir)
        result = plan(args.stack, args.project_dir)
    except PlanError as err:
        print(f"eks-ddp-plan: {err}", file=sys.stderr)
        return 2
    except Exception as err:  # the user's program: say what and where, not a page of engine frames
        if args.traceback:
            traceback.print_exc()
        print(f"eks-ddp-plan: {program_error(err, args.project_dir)}", file=sys.stderr)
        if not args.traceback:
            print("eks-ddp-plan: --traceback shows all of it", file=sys.stderr)
        return 1
    elapsed = time.perf_counter() - start
    ours = project.name == PROJECT

    print(f"# Plan for project {project.name!r}, stack {args.stack!r}: {len(result.resources)} resources "
          f"({elapsed:.1f} s, offline)")
    print("\n## Resource tree (type  name)")
    print("\n".join(_tree_lines(result)))
    print("\n## Resources per type")
    counts = result.counts()
    width = max((len(t) for t in counts), default=0)
    for typ, n in counts.items():
        print(f"{typ:<{width}}  {n}")
    print("\n## Outputs")
    for key, value in sorted(result.outputs.items()):
        shown = "[secret]" if key in result.secret_outputs else value
        if key == "costEstimate" and ours:
            shown = "(see Cost estimate below)"
        if isinstance(shown, (dict, list)):
            shown = json.dumps(shown, indent=2)
        print(f"{key}: {shown}")
    if (queue_text := queue_report(result)) is not None:
        print("\n## Queue: who is admitted, who waits (Kueue's rules, simulated offline)")
        print(queue_text)
    if ours:
        _eks_ddp_notes(result, args.stack, args.project_dir)
    if args.out:
        try:
            paths = write_manifests(render_manifests(result), args.out)
        except PlanError as err:
            print(f"eks-ddp-plan: {err}", file=sys.stderr)
            return 2
        print(f"\nwrote {len(paths)} Kubernetes manifests to {args.out}/")
    return 0


def queue_report(result: ProgramResult) -> str | None:
    """For a program with a Kueue queue (the stack's, or a library program's RunQueue): which run is admitted, which
    waits and why, which would be preempted, at what size (tooling/contracts/queue.py ``explain``); else None."""
    from eks_ddp.tooling.contracts import queue

    manifests = render_manifests(result)
    text = queue.explain(manifests)
    if text is None:
        return None
    autoscaler = any(r.type == "eks-ddp:autoscaler:ClusterAutoscaler" or "cluster-autoscaler" in
                     str(r.inputs.get("chart", "")) for r in result.resources)
    warnings = queue.wiring(manifests, kueue_managed(result), autoscaler)
    return "\n".join([text, *(f"WARNING {w}" for w in warnings)])


def kueue_managed(result: ProgramResult) -> list[dict[str, Any]] | None:
    """The ``managedJobsNamespaceSelector`` of each Kueue the program installs (its Helm release's configuration,
    infra/kueue.py ``manager_config``); None when it installs none (a Kueue of the cluster's own is not seen)."""
    managed: list[dict[str, Any]] | None = None
    for release in result.of_type("kubernetes:helm.sh/v3:Release"):
        if "kueue" not in str(release.inputs.get("chart", "")):
            continue
        raw = ((release.inputs.get("values") or {}).get("managerConfig") or {}).get("controllerManagerConfigYaml")
        config = yaml.safe_load(raw) if isinstance(raw, str) else None
        selector = config.get("managedJobsNamespaceSelector") if isinstance(config, dict) else None
        managed = [*(managed or []), selector] if isinstance(selector, dict) else managed
    return managed


def _eks_ddp_notes(result: ProgramResult, stack: str, root: Path) -> None:
    """eks-ddp's own program: cost, version notices, placeholders, preflight."""
    if "costEstimate" in result.outputs:
        from eks_ddp.tooling import cost

        print("\n## Cost estimate")
        print(cost.render(result.outputs["costEstimate"]))
    for notice in version_warnings(stack, root):
        print(f"\nWARNING: {notice}")
    from eks_ddp.tooling import cli_version

    if too_old := cli_version.problem():  # `pulumi up` (preflight) refuses it
        print(f"\nWARNING: {too_old}")
    for note in placeholder_notes(load_stack_file(stack, root)):
        print(f"\nnote: {note}")
    print("\npreflight: skipped offline (runs on `pulumi up` unless eks-ddp:preflight is false)")


if __name__ == "__main__":
    sys.exit(main())
