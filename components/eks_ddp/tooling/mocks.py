"""Run the Pulumi program under Pulumi's mock engine: no CLI, no plugins, no cloud.

Used by the offline plan (``python -m eks_ddp.tooling.plan``) and by the tests. A
:class:`RecordingMocks` fills in what the cloud would assign (ids, ARNs,
endpoints, digests) and answers the invokes the program makes; a recording
monitor keeps every registration with its URN and parent, so tests can
assert on the resource tree. Each :func:`run_program` call starts from fresh
global state (``set_mocks`` is process-global).
"""

from __future__ import annotations

import json
import runpy
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pulumi
from pulumi.runtime import mocks as _mocks
from pulumi.runtime import rpc, settings
from pulumi.runtime.config import set_all_config
from pulumi.runtime.stack import run_pulumi_func
from pulumi.runtime.sync_await import _sync_await

from eks_ddp.tooling.mock_cloud import _INVOKES, _OUTPUTS, ACCOUNT, _node_group, _service  # noqa: F401 (_node_group: tests)

PROJECT_ROOT = Path(__file__).resolve().parents[3]


@dataclass
class Recorded:
    """One registered resource, as the engine saw it."""

    urn: str
    type: str
    name: str
    custom: bool
    parent_urn: str
    inputs: dict[str, Any]
    outputs: dict[str, Any]
    provider: str = ""
    ignore_changes: list[str] = field(default_factory=list)
    """Property paths registered with ``ignore_changes``."""
    retain_on_delete: bool = False
    """Whether the resource was registered with ``retain_on_delete``."""
    replacement_trigger: Any = None
    """The ``replacement_trigger`` resource option's value (None: unset)."""
    dependencies: list[str] = field(default_factory=list)
    """URNs the resource depends on (``depends_on`` and the resources behind its input Outputs)."""
    import_id: str = ""
    """The ``import_`` ID the resource was registered with (adopting an existing cloud resource)."""
    replace_on_changes: list[str] = field(default_factory=list)
    """Property paths registered with ``replace_on_changes``."""
    custom_timeouts: dict[str, str] = field(default_factory=dict)
    """The ``custom_timeouts`` resource option (``create``, ``update``, ``delete``: those set)."""

    @property
    def parent_type(self) -> str:
        """Type token of the parent (the mock URN carries the parent type chain)."""
        qualified = self.urn.split("::")[2]
        chain = qualified.split("$")
        return chain[-2] if len(chain) > 1 else ""


class RecordingMocks(pulumi.runtime.Mocks):
    """Mocks that fill cloud-assigned outputs and answer the program's invokes."""

    def __init__(self, region: str = "us-west-2", zones: int = 4):
        self.region = region
        self.zones = [f"{region}{c}" for c in "abcdef"[:zones]]
        self.zone_ids = [f"usw2-az{i + 1}" for i in range(len(self.zones))]
        """Zone IDs in the order of ``zones`` (an account's name-to-ID mapping); tests may replace it."""
        self.inputs: dict[tuple[str, str], dict[str, Any]] = {}
        self.calls: list[tuple[str, dict[str, Any]]] = []
        self.log_groups: list[str] = []
        """CloudWatch log groups that already exist in the account (``getLogGroups`` answers from it)."""
        self.log_group_tags: dict[str, dict[str, str]] = {}
        """Tags of those log groups by name (``getLogGroup`` answers from it)."""
        self.subnet_zones: dict[str, str] = {}
        """Zone of each existing subnet the program looked up (the fake cloud hands zones out in lookup order)."""
        self.lock = threading.Lock()

    # -- resources ---------------------------------------------------------------------------
    def new_resource(self, args: _mocks.MockResourceArgs) -> tuple[str | None, dict]:
        with self.lock:
            self.inputs[(args.typ, args.name)] = dict(args.inputs)
        state = dict(args.inputs)
        rid = f"{args.name}-id"
        typ = args.typ
        if typ.startswith("aws:"):
            svc = _service(typ)
            state.setdefault("arn", f"arn:aws:{svc}:{self.region}:{ACCOUNT}:{typ.split(':')[-1].lower()}/{args.name}")
        filler = _OUTPUTS.get(typ)
        if filler is not None:
            rid, extra = filler(self, args.name, args.inputs)
            state.update(extra)
        state.setdefault("id", rid)
        return rid, state

    # -- invokes -----------------------------------------------------------------------------
    def call(self, args: _mocks.MockCallArgs) -> tuple[dict, list | None]:
        with self.lock:
            self.calls.append((args.token, dict(args.args)))
        handler = _INVOKES.get(args.token)
        if handler is None:
            return {}, []  # no check failures (None would break the mock monitor)
        return handler(self, args.args), []


def _trigger(request) -> Any:
    """The request's ``replacement_trigger`` as a plain value, None when unset."""
    if not request.HasField("replacement_trigger"):
        return None
    from google.protobuf.json_format import MessageToDict

    return MessageToDict(request.replacement_trigger)


def _timeouts(request) -> dict[str, str]:
    """The request's ``custom_timeouts``, the ones set."""
    t = request.customTimeouts
    return {k: getattr(t, k) for k in ("create", "update", "delete") if getattr(t, k)}


class _RecordingMonitor(_mocks.MockMonitor):
    """The mock monitor, keeping each registration's parent and inputs in order."""

    def __init__(self, mocks: RecordingMocks):
        super().__init__(mocks)
        self.recorded: list[Recorded] = []
        self._rec_lock = threading.Lock()

    def RegisterResource(self, request):  # noqa: N802 (gRPC method name)
        response = super().RegisterResource(request)
        if request.type == "pulumi:pulumi:Stack":
            return response
        reg = self.resources[response.urn]
        inputs = self.mocks.inputs.get((request.type, request.name), {})
        with self._rec_lock:
            self.recorded.append(Recorded(urn=response.urn, type=request.type, name=request.name,
                                          custom=bool(request.custom), parent_urn=request.parent,
                                          inputs=inputs, outputs=dict(reg.state), provider=request.provider,
                                          ignore_changes=list(request.ignoreChanges),
                                          retain_on_delete=bool(request.retainOnDelete),
                                          dependencies=list(request.dependencies),
                                          import_id=request.importId,
                                          replace_on_changes=list(request.replaceOnChanges),
                                          custom_timeouts=_timeouts(request),
                                          replacement_trigger=_trigger(request)))
        return response

    def Invoke(self, request):  # noqa: N802 (gRPC method name)
        if request.tok == "pulumi:pulumi:getResource":  # rehydrating a resource reference: recorded for tests
            with self.mocks.lock:
                self.mocks.calls.append((request.tok, {}))
        return super().Invoke(request)

    def Call(self, request):  # noqa: N802 (gRPC method name)
        """Resource methods (``Cluster.get_kubeconfig``): answered like invokes, from ``_INVOKES``."""
        from google.protobuf import struct_pb2
        from pulumi.runtime.proto import provider_pb2

        _mocks._ensure_event_loop()
        # Drop the ``__self__`` resource reference before deserialising: rebuilding it would start a
        # ``getResource`` task on this worker thread's event loop, which the program's loop later awaits
        # ("attached to a different loop"). The mocks answer from the other arguments alone.
        raw = struct_pb2.Struct()
        raw.CopyFrom(request.args)
        if "__self__" in raw.fields:
            del raw.fields["__self__"]
        args = rpc.deserialize_properties(raw)
        ret, _ = self.mocks.call(_mocks.MockCallArgs(token=request.tok, args=args, provider=request.provider))
        return provider_pb2.CallResponse(**{"return": _sync_await(rpc.serialize_properties(ret, {}))})


@dataclass
class ProgramResult:
    """What a mock run of the program registered and exported."""

    resources: list[Recorded]
    outputs: dict[str, Any]
    secret_outputs: set[str]
    calls: list[tuple[str, dict[str, Any]]] = field(default_factory=list)

    def of_type(self, typ: str) -> list[Recorded]:
        return [r for r in self.resources if r.type == typ]

    def one(self, typ: str, name: str | None = None) -> Recorded:
        found = [r for r in self.of_type(typ) if name is None or r.name == name]
        if len(found) != 1:
            raise AssertionError(f"expected one {typ} named {name!r}, found {[r.name for r in found]}")
        return found[0]

    def by_urn(self, urn: str) -> Recorded | None:
        return next((r for r in self.resources if r.urn == urn), None)

    def counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for r in self.resources:
            out[r.type] = out.get(r.type, 0) + 1
        return dict(sorted(out.items()))


def run_program(config: dict[str, Any], *, stack: str = "dev", project: str = "eks-ddp",
                program: Path | Callable[[], None] | None = None, region: str = "us-west-2",
                mocks: RecordingMocks | None = None, recorded: list[Recorded] | None = None) -> ProgramResult:
    """Run ``__main__.py`` (or ``program``: a file, or a function) under fresh mocks.

    ``config`` maps full keys ("eks-ddp:job", "aws:region") to values; objects and
    lists are JSON-encoded as Pulumi does. Exceptions from the program propagate.
    A function program lets tests build one component alone.
    """
    program = program or PROJECT_ROOT / "__main__.py"
    mocks = mocks or RecordingMocks(region=region)
    monitor = _RecordingMonitor(mocks)
    if recorded is not None:  # the caller sees what was registered even when the program fails
        monitor.recorded = recorded
    encoded = {k: v if isinstance(v, str) else json.dumps(v) for k, v in config.items()}
    set_all_config(encoded, [])
    settings.ROOT.set(None)  # a fresh root Stack for this run
    pulumi.runtime.set_mocks(mocks, project=project, stack=stack, preview=False, monitor=monitor)
    settings.SETTINGS.rpc_manager.clear()
    settings.SETTINGS.outputs.clear()

    def body() -> None:
        if callable(program):
            program()
        else:
            runpy.run_path(str(program), run_name="__main__")

    _sync_await(run_pulumi_func(body))
    root = settings.get_root_resource()
    exported = dict(getattr(root, "outputs", {}) or {})
    outputs: dict[str, Any] = {}
    secrets: set[str] = set()
    for key, value in exported.items():
        out = pulumi.Output.from_input(value)
        outputs[key] = _sync_await(out.future())
        if _sync_await(out.is_secret()):
            secrets.add(key)
    resources = sorted(monitor.recorded, key=lambda r: r.urn)
    return ProgramResult(resources=resources, outputs=outputs, secret_outputs=secrets, calls=list(mocks.calls))


def deserialize(value: Any) -> Any:  # pragma: no cover - convenience for debugging
    return _sync_await(rpc.deserialize_properties(value))
