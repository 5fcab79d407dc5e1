"""The torch versions the runtime supports, and everything that differs between them, in one place.

The runtime runs inside users' images, whose torch is their own. It supports torch **2.11 to 2.14**
(:data:`TORCH_OLDEST` .. :data:`TORCH_NEWEST`): 2.14.1 is the repository's pin (``make test``), 2.11.0 is what
the lent GPU machines carry and is tested by ``make test-compat`` (its own venv with that torch from the package
index). The launcher refuses any other torch at start with one line naming both ends (:func:`refuse_unsupported_torch`,
exit 2, the Job's usage-error code): its rendezvous builds on torch's private elastic internals, which change
without notice between releases.

What differs inside the range is detected, never assumed from the version number:

* ``shutdown_timeout`` (seconds the agent waits for workers to exit after SIGTERM before SIGKILL) exists in torch
  2.14 as a ``LaunchConfig`` field and a ``LocalElasticAgent.__init__`` keyword (pytorch/pytorch v2.14.1,
  torch/distributed/launcher/api.py ``LaunchConfig.shutdown_timeout``;
  torch/distributed/elastic/agent/server/local_elastic_agent.py ``LocalElasticAgent.__init__``, passed on to
  ``SimpleElasticAgent`` in elastic/agent/server/api.py; the request: pytorch/pytorch#119856). torch 2.11 has
  neither (v2.11.0, the same files, as its wheel ships them: ``LaunchConfig`` ends at ``duplicate_stderr_filters``;
  ``LocalElasticAgent.__init__(spec, logs_specs, start_method, exit_barrier_timeout, log_line_prefix_template)``)
  and waits its fixed 30 s. :func:`agent_kwargs` passes it only where both have it.
* Private names the runtime uses (``_get_addr_and_port`` in launcher/api.py, ``_delay`` and the handler's and
  state holder's attributes in elastic/rendezvous/dynamic_rendezvous.py, ``SimpleElasticAgent._remaining_restarts``
  in elastic/agent/server/api.py, ``torch.cuda._is_in_bad_fork``) are the same in v2.11.0 and v2.14.1. Each is read
  through :func:`require` (a one-line error naming the attribute, the torch and the supported range) or with a
  fallback (:func:`addr_and_port`, :func:`in_bad_fork`), so a torch that moved one fails with that line, not an
  AttributeError deep in a worker restart.

Stdlib only at import time (torch is imported inside the functions), so the check runs before any torch internal.
"""

from __future__ import annotations

import inspect
import re
import sys
from typing import Any

TORCH_OLDEST = (2, 11)
"""The oldest torch (major, minor) the runtime supports; ``make test-compat`` runs the runtime's tests on it."""
TORCH_NEWEST = (2, 14)
"""The newest torch (major, minor) the runtime supports; ``make test`` runs on it (the repository's pin)."""
TORCH_OLDEST_TESTED = "2.11.0"
"""The release ``make test-compat`` installs (from the package index) to test :data:`TORCH_OLDEST`."""
TORCH_NEWEST_TESTED = "2.14.1"
"""The repository's pin (pyproject.toml), which ``make test`` runs on."""
USAGE = 2
"""Exit code for an unsupported torch: a usage error, which the Job's pod failure policy does not retry."""


def supported_range() -> str:
    (a, b), (c, d) = TORCH_OLDEST, TORCH_NEWEST
    return f"{a}.{b} to {c}.{d}"


def parse_version(version: str) -> tuple[int, int] | None:
    """(major, minor) of a torch version string (``2.11.0+cu130``, ``2.12.0a0+git1234``), or None if unreadable."""
    m = re.match(r"^\s*(\d+)\.(\d+)", str(version))
    return (int(m.group(1)), int(m.group(2))) if m else None


def torch_problem(version: str) -> str | None:
    """One line saying why this torch is unsupported, or None when it is inside the range."""
    parsed = parse_version(version)
    if parsed is not None and TORCH_OLDEST <= parsed <= TORCH_NEWEST:
        return None
    why = "cannot read that version" if parsed is None else "outside the supported range"
    return (f"eks_ddp_runtime: torch {version} is not supported ({why}); supported: torch {supported_range()} "
            f"(oldest {TORCH_OLDEST_TESTED}, newest {TORCH_NEWEST_TESTED} tested)")


def installed_torch_version() -> str:
    import torch

    return str(getattr(torch, "__version__", "unknown"))


def refuse_unsupported_torch(main: bool) -> None:
    """Stop before any torch internal is imported when this torch is outside the range. As the launcher's main
    program (``main``): print the one line and exit :data:`USAGE`. Imported as a library: raise ImportError with
    the same line."""
    problem = torch_problem(installed_torch_version())
    if problem is None:
        return
    if main:
        print(problem, file=sys.stderr, flush=True)
        raise SystemExit(USAGE)
    raise ImportError(problem)


def unsupported(what: str) -> RuntimeError:
    return RuntimeError(f"eks_ddp_runtime: {what} in torch {installed_torch_version()}; supported: torch "
                        f"{supported_range()}")


def require(obj: Any, *names: str) -> Any:
    """Guard for the private attributes the runtime reads or overrides: every name must exist on ``obj``.
    Returns ``obj``; raises :func:`unsupported` naming the missing ones."""
    missing = [n for n in names if not hasattr(obj, n)]
    if missing:
        owner = obj if isinstance(obj, type) or inspect.ismodule(obj) else type(obj)
        label = getattr(owner, "__qualname__", None) or getattr(owner, "__name__", repr(owner))
        raise unsupported(f"{label} has no {', '.join(missing)}")
    return obj


def accepts(func: Any, name: str) -> bool:
    """Whether ``func`` takes a keyword argument ``name`` (its signature names it, or takes ``**kwargs``)."""
    try:
        params = inspect.signature(func).parameters
    except (TypeError, ValueError):
        return False
    return name in params or any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())


def agent_kwargs(config: Any, agent_cls: type) -> dict[str, Any]:
    """Keyword arguments for ``agent_cls(spec=..., **agent_kwargs(config, agent_cls))`` from a torchrun
    ``LaunchConfig``: the ones every supported torch has, plus ``shutdown_timeout`` where both the config and the
    agent have it (torch 2.14; see the module docstring)."""
    kwargs = {"logs_specs": config.logs_specs, "start_method": config.start_method,
              "log_line_prefix_template": config.log_line_prefix_template}
    timeout = getattr(config, "shutdown_timeout", None)
    # agent_cls is a class, so this is its own (or inherited) __init__; mypy reads it as an instance attribute.
    if timeout is not None and accepts(agent_cls.__init__, "shutdown_timeout"):  # type: ignore[misc]
        kwargs["shutdown_timeout"] = timeout
    return kwargs


def addr_and_port(params: Any) -> tuple[str | None, int | None]:
    """The master address and port torch's launcher gives the worker spec: torch's own private
    ``launcher.api._get_addr_and_port`` where it exists (v2.11.0 and v2.14.1 alike: ``(None, None)`` unless the
    backend is ``static``), else the same rule here."""
    from torch.distributed.launcher import api as launcher_api

    own = getattr(launcher_api, "_get_addr_and_port", None)
    if own is not None:
        return own(params)
    if params.backend != "static":
        return None, None
    from torch.distributed.elastic.rendezvous.utils import parse_rendezvous_endpoint

    endpoint = params.endpoint.strip()
    if not endpoint:
        raise ValueError("rdzv endpoint: got ''; expected HOST:PORT for the static backend (--master-addr/--master-port)")
    addr, port = parse_rendezvous_endpoint(endpoint, default_port=-1)
    if port == -1:
        raise ValueError(f"rdzv endpoint: got {endpoint!r}; expected HOST:PORT (--master-port)")
    return addr, port


def in_bad_fork() -> bool | None:
    """torch's own "this process is a fork of one that initialised CUDA" flag (``torch.cuda._is_in_bad_fork``,
    what ``torch.cuda.set_device`` checks), or None where this torch does not expose it (callers then assume
    the worst)."""
    import torch

    probe = getattr(torch.cuda, "_is_in_bad_fork", None)
    return None if probe is None else bool(probe())


if __name__ == "__main__":  # `python training/runtime/eks_ddp_runtime/compat.py oldest|newest`: the releases the Makefile installs
    print({"oldest": TORCH_OLDEST_TESTED, "newest": TORCH_NEWEST_TESTED}[sys.argv[1]])
