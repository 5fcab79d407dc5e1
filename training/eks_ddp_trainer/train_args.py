"""The trainer's command line (``python -m eks_ddp_trainer.train --help``), generated from ``TrainerConfig``.

Each field of config.TrainerConfig is a flag: ``global_batch_size`` is ``--global-batch-size``, its docstring the
help, its default the default, a field without one a required flag, a ``Literal`` the choices and a ``bool`` a
switch. A bad flag or value exits CONFIG_ERROR (eks_ddp_runtime/exitcodes.py), never argparse's 2, so the Job does
not retry it.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import inspect
import sys
import types
import typing
from typing import Any, NoReturn

from eks_ddp_runtime import exitcodes
from eks_ddp_trainer.config import TrainerConfig

DESCRIPTION = "Elastic DDP training of a CIFAR-10 classifier; the torchrun target."


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        # argparse's own exit code 2 looks like any crash; a bad flag must not be retried.
        self.print_usage(sys.stderr)
        self.exit(exitcodes.CONFIG_ERROR, f"{self.prog}: error: {message}\n")


def field_docs(cls: type) -> dict[str, str]:
    """The docstring under each field of a dataclass (``{}`` when its source is not shipped)."""
    try:
        tree = ast.parse(inspect.getsource(cls)).body[0]
    except (OSError, TypeError):
        return {}
    body = tree.body if isinstance(tree, ast.ClassDef) else []
    docs = {}
    for node, after in zip(body, body[1:], strict=False):
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and isinstance(after, ast.Expr) \
                and isinstance(after.value, ast.Constant) and isinstance(after.value.value, str):
            docs[node.target.id] = " ".join(after.value.value.split())
    return docs


def build_parser(cls: type = TrainerConfig) -> argparse.ArgumentParser:
    p = _Parser(prog="torchrun ... -m eks_ddp_trainer.train", description=DESCRIPTION)
    docs, hints = field_docs(cls), typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        kind, kw = hints[f.name], dict[str, Any](help=docs.get(f.name, "").replace("%", "%%"))
        args = [a for a in typing.get_args(kind) if a is not type(None)]
        if typing.get_origin(kind) in (typing.Union, types.UnionType):  # X | None: optional, default None
            kind, args = args[0], list(typing.get_args(args[0]))
        if kind is bool:
            kw.update(action="store_true")
        elif typing.get_origin(kind) is typing.Literal:
            kw.update(choices=args)
        else:
            kw.update(type=kind)
        if f.default is dataclasses.MISSING:
            kw.update(required=True)
        else:
            kw.update(default=f.default)
            if f.default is not None and not isinstance(f.default, bool):
                kw["help"] += " (default %(default)s)"
        p.add_argument("--" + f.name.replace("_", "-"), dest=f.name, **kw)
    return p


def parse_args(argv: list[str] | None = None) -> TrainerConfig:
    p = build_parser()
    cfg = TrainerConfig(**vars(p.parse_args(argv)))
    if problem := cfg.problem():
        p.error(problem)
    return cfg
