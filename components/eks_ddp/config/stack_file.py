"""The stack file's ``config:`` as one model: ``aws:region`` and every ``eks-ddp:*`` key, read into a StackConfig.

Reading runs in two steps, as one validation: pydantic reads every key into its section (types, unknown keys,
required keys: every problem at once); when all of them read, the checks across keys (``checks.py``) run on the
assembled :class:`StackConfig`. :func:`stack_file_schema` is the JSON Schema of ``Pulumi.<stack>.yaml`` that
editors use (``docs/stack-config.schema.json``).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Annotated, Any

from pydantic import (
    AfterValidator,
    BeforeValidator,
    Field,
    TypeAdapter,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic.dataclasses import dataclass
from pydantic.json_schema import GenerateJsonSchema
from pydantic_core import ArgsKwargs

from eks_ddp.config.checks import ignored_settings, validate
from eks_ddp.config.reader import (
    KEY,
    NULL,
    PROJECT,
    Bool,
    a_list,
    problem,
    suggest,
    with_problem,
)
from eks_ddp.config.schema import (
    SECTION,
    TOP_LEVEL_KEYS,
    CatalogEntryConfig,
    ClusterConfig,
    EtcdConfig,
    ImageConfig,
    JobConfig,
    NetworkConfig,
    NodeGroupConfig,
    ObservabilityConfig,
    RunConfig,
    Section,
    StackConfig,
    StorageConfig,
    cluster_name_for,
    read_object,
)
from eks_ddp.core import catalog, rules


def _region(value: Any) -> Any:
    if not value:
        raise problem(f"{KEY}: required; set it with 'pulumi config set aws:region us-west-2'")
    if bad := rules.region(KEY, value):
        raise problem(bad)
    return value


def _distinct_names(entries: tuple[CatalogEntryConfig, ...]) -> tuple[CatalogEntryConfig, ...]:
    names = [e.name for e in entries]
    if twice := [f"{KEY}[{i}].name: got {n!r} twice; expected each type once"
                 for i, n in enumerate(names) if n in names[:i]]:
        raise problem(*twice)
    return entries


def _no_list(value: Any) -> Any:
    return () if value is None or value is NULL else value


_BOTH = object()
"""Stands for ``eks-ddp:job`` when ``eks-ddp:runs`` is set too: refused, and not read."""

Region = Annotated[str, BeforeValidator(_region)]
NodeGroups = Annotated[tuple[NodeGroupConfig, ...], a_list("a non-empty list of GPU node groups", non_empty=True)]
Runs = Annotated[tuple[RunConfig, ...], a_list("a non-empty list of runs, each an object with the job keys plus "
                                               "workload", non_empty=True)]
Catalog = Annotated[tuple[CatalogEntryConfig, ...], a_list(
    "a list of instance types, each an object with name, gpus, gpuModel, vcpus, memoryGiB, priceUsdPerHour, ..."),
    BeforeValidator(_no_list), AfterValidator(_distinct_names)]


@dataclass(frozen=True, kw_only=True, config=SECTION)
class StackFile(Section):
    """The ``config:`` of ``Pulumi.<stack>.yaml``: the stack's region and its ``eks-ddp:*`` keys (here without
    the ``eks-ddp:`` namespace)."""

    region: Region = Field(None, alias="aws:region", validate_default=True,  # type: ignore[assignment]
                           description="AWS region of the stack.")
    network: NetworkConfig = Field(default_factory=NetworkConfig, description=NetworkConfig.__doc__)
    cluster: ClusterConfig = Field(default_factory=ClusterConfig, description=ClusterConfig.__doc__)
    node_groups: NodeGroups = Field(None, validate_default=True,  # type: ignore[assignment]
                                    description="GPU managed node groups, each an object with the keys below.")
    storage: StorageConfig = Field(default_factory=StorageConfig, description=StorageConfig.__doc__)
    image: ImageConfig = Field(default_factory=ImageConfig, description=ImageConfig.__doc__)
    etcd: EtcdConfig = Field(default_factory=EtcdConfig, description=EtcdConfig.__doc__)
    observability: ObservabilityConfig = Field(default_factory=ObservabilityConfig,
                                               description=ObservabilityConfig.__doc__)
    job: JobConfig | None = Field(None, description=JobConfig.__doc__)
    runs: Runs | None = Field(None, description=(
        f"Several runs side by side instead of {PROJECT}:job (not both): each entry takes every job key (its own "
        "runId) plus workload."))
    catalog: Catalog = Field((), description=(
        "Instance types the built-in catalog does not list, each an object with the keys below."))
    preflight: Bool = Field(True, description=(
        "Check zone offerings, EFA, vCPU quotas and reservations before creating anything."))

    @model_validator(mode="before")
    @classmethod
    def _read_object(cls, data: Any) -> Any:
        data = read_object(cls, data)
        if isinstance(data, dict) and "job" in data and "runs" in data:
            data = {**data, "job": _BOTH}
        return data

    @field_validator("job", mode="before")
    @classmethod
    def _job_or_runs(cls, value: Any) -> Any:
        if value is _BOTH:
            raise problem(f"{PROJECT}:job and {PROJECT}:runs: both set; expected one of them: job (one run of the "
                          "bundled trainer) or runs (a list of runs, each with the job keys plus workload)")
        return value

    @field_validator("cluster", mode="wrap")
    @classmethod
    def _stack_name(cls, value: Any, handler: Any, info: ValidationInfo) -> ClusterConfig:
        """Without cluster.name the cluster is named after the stack, whose name must make a valid one (said
        with the cluster's other problems, if any)."""
        stack = (info.context or {}).get("stack")
        named = isinstance(value, dict) and value.get("name") not in (None, NULL)
        bad = None if named or stack is None else rules.cluster_name("stack name", cluster_name_for(stack))
        bad = bad and (f"{bad} (the cluster is named eks-ddp-<stack>: rename the stack with 'pulumi stack rename', "
                       "or set eks-ddp:cluster.name)")
        try:
            cluster = handler(value)
        except ValidationError as err:
            raise (with_problem(err, value, bad) if bad else err) from None
        if bad:
            raise problem(bad)
        return cluster

    @model_validator(mode="wrap")
    @classmethod
    def _checks(cls, data: Any, handler: Any, info: ValidationInfo) -> Any:
        """Once every key reads, the checks across keys, with the stack's own instance types registered (taken
        back if the config is refused, so a bad stack leaves the catalog as it found it)."""
        file = handler(data)
        if isinstance(data, ArgsKwargs):
            return file
        context = info.context or {}
        cfg = file.stack_config()
        added = [t.name for t in cfg.catalog if t.name not in catalog.CATALOG]
        for t in cfg.catalog:
            catalog.register(t)
        problems = validate(cfg, placeholders_ok=context.get("placeholders_ok", False), today=context.get("today"))
        problems += ignored_settings(cfg, data)
        if problems:
            for name in added:
                catalog.unregister(name)
            raise problem(*problems)
        return file

    def stack_config(self) -> StackConfig:
        """The typed config: ``job:`` (or neither key) is one run, ``runs:`` one per entry."""
        if self.runs is not None:
            runs = self.runs
        else:
            job = self.job or JobConfig()
            runs = (RunConfig(**{name: getattr(job, name) for name in JobConfig.__pydantic_fields__}),)
        return StackConfig(region=self.region, network=self.network, cluster=self.cluster,
                           node_groups=self.node_groups, storage=self.storage, image=self.image, etcd=self.etcd,
                           runs=runs, runs_listed=self.runs is not None,
                           catalog=tuple(e.instance_type() for e in self.catalog), preflight=self.preflight,
                           observability=self.observability)


STACK_FILE = TypeAdapter(StackFile)


def unknown_top_level_key(key: str, value: Any) -> str:
    """An unknown ``eks-ddp:`` key: a typo, or a path set without ``--path`` (stored as one dotted key)."""
    top = re.split(r"[.\[]", key, maxsplit=1)[0]
    if top in TOP_LEVEL_KEYS and top != key:
        # `pulumi config set eks-ddp:image.prebuilt X` (no --path) stores the dotted name as a key.
        text = value if isinstance(value, str) else json.dumps(None if value is NULL else value)
        return (f"{PROJECT}:{key}: unknown key, a path set without --path; expected it inside {PROJECT}:{top}: "
                f"pulumi config rm '{PROJECT}:{key}' && pulumi config set --path '{key}' '{text}'")
    return f"{PROJECT}:{key}: unknown key; known keys: " + ", ".join(TOP_LEVEL_KEYS) + suggest(key, TOP_LEVEL_KEYS)


SCHEMA_FILE = Path("docs") / "stack-config.schema.json"


class _Schema(GenerateJsonSchema):
    """Field titles repeat the keys ("Vpc Cidr"), so descriptions alone; a key set to null is refused (absent is
    not null), so no null."""

    def field_title_should_be_set(self, schema: Any) -> bool:
        return False

    def nullable_schema(self, schema: Any) -> Any:
        return self.generate_inner(schema["schema"])


def _tidy(node: Any) -> None:
    if isinstance(node, dict):
        if "default" in node and node["default"] is None:
            del node["default"]
        if isinstance(node.get("description"), str):
            node["description"] = node["description"].replace("``", "`")
        for value in node.values():
            _tidy(value)
    elif isinstance(node, list):
        for value in node:
            _tidy(value)


def stack_file_schema() -> dict[str, Any]:
    """The JSON Schema of ``Pulumi.<stack>.yaml``: its ``config:`` holds ``aws:region``, the ``eks-ddp:*`` keys
    (unknown ones refused) and any other namespace's keys."""
    body = STACK_FILE.json_schema(by_alias=True, schema_generator=_Schema)
    defs = body.pop("$defs", {})
    properties = {key if ":" in key else f"{PROJECT}:{key}": value for key, value in body["properties"].items()}
    config = {"type": "object", "description": body.get("description", ""), "properties": properties,
              "patternProperties": {rf"^(?!{PROJECT}:)[^:]+:": {}}, "additionalProperties": False}
    schema = {"$schema": "https://json-schema.org/draft/2020-12/schema", "title": f"Pulumi.<stack>.yaml of {PROJECT}",
              "description": "Generated from the stack config's models: python -m eks_ddp.config --schema.",
              "type": "object", "properties": {"config": config}, "$defs": defs}
    _tidy(schema)
    return schema


def schema_text() -> str:
    """The checked-in file's text."""
    return json.dumps(stack_file_schema(), indent=2) + "\n"
