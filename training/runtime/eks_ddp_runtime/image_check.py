"""What a training pod needs from a workload's image, checked on a system node before any GPU node is asked for.

    python -m eks_ddp_runtime.image_check (--module PKG.MOD | --script PATH)

Run by the image-check Job of an ElasticJob whose workload brings its own image
(components/eks_ddp/workloads/elastic_job/image_check.py), in that image, on the system nodes, with the training
pod's working directory (``/app``) and environment; Pulumi awaits it and the training Job depends on it. So an
image the launcher would refuse fails ``pulumi up`` in a minute on a node that is already there, instead of after
the GPU nodes scaled up and pulled it. In order, each failure one line and exit 2 (the usage error's code):

1. its torch is inside the runtime's range (compat.py ``torch_problem``, the launcher's own check at start);
2. the launcher loads with that torch (``import eks_ddp_runtime.launch``: torch's elastic internals it builds on);
3. the entrypoint is there: the module found as the workers' ``python -m`` would find it, importing none of it
   (modules.py; importing it would run the user's top level, which may read ``LOCAL_RANK`` or the arguments), or
   the script is a file.

An image without the runtime fails on its own: ``python -m`` exits 1 with "No module named eks_ddp_runtime".
"""

from __future__ import annotations

import argparse
import os
import sys

from . import compat, modules

USAGE = compat.USAGE


def problems(module: str | None, script: str | None) -> tuple[list[str], str]:
    """The lines saying what is wrong (empty when nothing is), and what was found."""
    try:
        version = compat.installed_torch_version()
    except Exception as e:  # noqa: BLE001  (no torch, or one that does not import: either is the finding)
        return [f"torch: cannot import it in this image ({type(e).__name__}: {e}); the launcher needs torch "
                f"{compat.supported_range()}"], ""
    problem = compat.torch_problem(version)
    if problem is not None:
        return [problem], ""
    try:
        import eks_ddp_runtime.launch  # noqa: F401
    except Exception as e:  # noqa: BLE001
        return [f"eks_ddp_runtime: the launcher does not load with torch {version} ({type(e).__name__}: {e})"], ""
    found = f"torch {version} (supported: {compat.supported_range()}), the launcher loads"
    if module is not None:
        why = modules.module_problem(module)
        if why is not None:
            return [f"workload.module: {why}"], found
        found += f", module {module} found"
    if script is not None:
        if not os.path.isfile(script):
            return [f"workload.script: got {script!r}; expected a file in the image (none at "
                    f"{os.path.abspath(script)}; the working directory is {os.getcwd()})"], found
        found += f", script {script} found"
    return [], found


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m eks_ddp_runtime.image_check", description=__doc__.split("\n")[0])
    which = p.add_mutually_exclusive_group()
    which.add_argument("--module", help="the workload's module (python -m PKG.MOD)")
    which.add_argument("--script", help="the workload's script (a path in the image)")
    args = p.parse_args(argv)
    lines, found = problems(args.module, args.script)
    for line in lines:
        print(f"image check: {line}", file=sys.stderr, flush=True)
    if lines:
        return USAGE
    print(f"image check: ok: {found}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
