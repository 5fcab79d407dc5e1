"""The docs match the code: the generated config reference, make targets, links, example stack keys.

No test here pins prose: pages are free to be rewritten. What is checked is what a reader relies on without
reading it twice: a table generated from the schema, commands and targets that exist, links that resolve.
"""

from __future__ import annotations

import ast
import io
import re
import shutil
import tokenize
from pathlib import Path

import yaml

from eks_ddp.config import TOP_LEVEL_KEYS
from eks_ddp.tooling import config_docs as ref
from tests.support.util import ROOT

README_MAX_LINES = 250


def doc_files(root: Path = ROOT) -> list[Path]:
    """README.md, every page under docs/, and bench/RESULTS.md (which the pages link to)."""
    return [root / "README.md", *sorted((root / "docs").glob("*.md")), root / "bench" / "RESULTS.md"]


# --- links -------------------------------------------------------------------------------------------------------

_FENCE = re.compile(r"^(```|~~~)[^\n]*\n.*?^\1[^\n]*$", re.S | re.M)
_CODE_SPAN = re.compile(r"`[^`\n]*`")
_LINK = re.compile(r"\[[^\]\n]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
_HEADING = re.compile(r"^#{1,6}[ \t]+(.+?)[ \t]*#*[ \t]*$", re.M)
_SCHEME = re.compile(r"^[a-z][a-z0-9+.-]*:", re.I)


def _prose(text: str) -> str:
    """The text outside fenced code blocks and code spans (links and headings there are not links or headings)."""
    return _CODE_SPAN.sub("", _FENCE.sub("", text))


def heading_anchors(text: str) -> set[str]:
    """The anchors GitHub gives a Markdown file's headings.

    GitHub's rule, from gjtorikian/html-pipeline ``lib/html/pipeline/toc_filter.rb`` (``TableOfContentsFilter``):
    the heading's rendered text, downcased, every character that is not a word character, ``-`` or a space
    removed (``PUNCTUATION_REGEXP = /[^\\p{Word}\\- ]/u``), spaces replaced by ``-``; a repeated anchor gets
    ``-1``, ``-2``, ... The rendered text of ``[text](url)`` is ``text``; code spans and emphasis keep their
    characters, whose markers (backticks, asterisks) are punctuation and so removed.
    """
    seen: dict[str, int] = {}
    anchors = set()
    for heading in _HEADING.findall(_FENCE.sub("", text)):
        rendered = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading).strip()
        name = re.sub(r"[^\w\- ]", "", rendered.lower()).replace(" ", "-")
        anchors.add(f"{name}-{seen[name]}" if seen.get(name) else name)
        seen[name] = seen.get(name, 0) + 1
    return anchors


def broken_links(files: list[Path], root: Path) -> list[str]:
    """``file: target (why)`` for every relative link of ``files`` whose file, folder or anchor does not exist."""
    problems = []
    for file in files:
        text = file.read_text()
        for target in _LINK.findall(_prose(text)):
            if _SCHEME.match(target):
                continue  # http(s), mailto: not checked offline
            path_part, _, anchor = target.partition("#")
            dest = (file.parent / path_part).resolve() if path_part else file.resolve()
            where = f"{file.relative_to(root)}: {target}"
            if not dest.is_relative_to(root.resolve()):
                problems.append(f"{where} (outside the repository)")
            elif not dest.exists():
                problems.append(f"{where} (no such file or folder)")
            elif anchor and dest.suffix != ".md":
                problems.append(f"{where} (an anchor into a file that is not Markdown)")
            elif anchor and anchor not in heading_anchors(dest.read_text()):
                problems.append(f"{where} (no heading with the anchor #{anchor})")
    return problems


def test_every_relative_link_in_the_readme_and_docs_resolves():
    assert not broken_links(doc_files(), ROOT), "\n".join(broken_links(doc_files(), ROOT))


def test_the_link_check_reports_a_planted_broken_link(tmp_path):
    """Negative control: a missing file, a missing anchor and an escape from the repository are reported; working
    links, links in code, a folder and a repeated heading's second anchor are not."""
    (tmp_path / "docs").mkdir()
    (tmp_path / "src").mkdir()
    (tmp_path / "docs" / "page.md").write_text("# Page\n\n## Store (etcd)\n\n## Store (etcd)\n\n```\n# not a heading\n```\n")
    (tmp_path / "README.md").write_text(
        "[ok](docs/page.md) [ok](docs/page.md#store-etcd) [ok](docs/page.md#store-etcd-1) [ok](src) [ok](#readme)\n"
        "[web](https://example.com/x.md) `[code](docs/gone.md)`\n\n```\n[fenced](docs/gone.md)\n```\n\n# Readme\n"
        "[missing](docs/gone.md) [anchor](docs/page.md#not-a-heading) [out](../elsewhere.md)\n")
    assert broken_links([tmp_path / "README.md"], tmp_path) == [
        "README.md: docs/gone.md (no such file or folder)",
        "README.md: docs/page.md#not-a-heading (no heading with the anchor #not-a-heading)",
        "README.md: ../elsewhere.md (outside the repository)",
    ]


# --- paths named in the code ---------------------------------------------------------------------------------------

_REPO_PATH = re.compile(r"(?<![\w./-])(?:components|training|tests|docs|bench)/[\w./-]*\w")


def python_prose(text: str) -> list[str]:
    """A Python file's comments and bare string statements (docstrings, attribute docstrings): where a path is
    named for a reader; string literals in code (test data, commands) are not prose."""
    comments = [t.string for t in tokenize.generate_tokens(io.StringIO(text).readline) if t.type == tokenize.COMMENT]
    return comments + [n.value.value for n in ast.walk(ast.parse(text))
                       if isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant) and isinstance(n.value.value, str)]


def missing_paths(files: list[Path], root: Path) -> list[str]:
    """``file: path`` for every repository path (``components/...``, ``training/...``, ``tests/...``, ``docs/...``,
    ``bench/...``) a Python file's comments or docstrings name that does not exist under ``root``."""
    return [f"{file.relative_to(root)}: {path}" for file in files for chunk in python_prose(file.read_text())
            for path in _REPO_PATH.findall(chunk) if not (root / path).exists()]


def python_files(root: Path = ROOT) -> list[Path]:
    return sorted(p for top in ("components", "training", "tests", "bench") for p in (root / top).rglob("*.py")) + [
        root / "__main__.py"]


def test_every_path_named_in_the_code_exists():
    assert not missing_paths(python_files(), ROOT), "\n".join(missing_paths(python_files(), ROOT))


def test_the_path_check_reports_a_planted_stale_path(tmp_path):
    """Negative control: a missing path in a docstring and in a comment is reported; an existing file or folder, a
    path inside a URL and a string literal in code are not."""
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "page.md").write_text("# Page\n")
    (tmp_path / "mod.py").write_text(
        '"""See docs/page.md and docs/, then components/gone.py."""\n\n'
        "X = 'tests/not_prose.py'  # moved to training/old/place.py\n"
        "Y = 1\n\"\"\"From https://github.com/o/r/blob/main/docs/elsewhere.md.\"\"\"\n")
    assert missing_paths([tmp_path / "mod.py"], tmp_path) == ["mod.py: training/old/place.py", "mod.py: components/gone.py"]


def test_heading_anchors_follow_githubs_rule():
    text = ("## When `pulumi up` cannot reach the cluster\n## Cancel a run; finished runs stay finished\n"
            "## Worker restart: module and script (2026-11-26, `bench/restart_cost.py`)\n## See [EFA](efa.md)\n")
    assert heading_anchors(text) == {
        "when-pulumi-up-cannot-reach-the-cluster", "cancel-a-run-finished-runs-stay-finished",
        "worker-restart-module-and-script-2026-11-26-benchrestart_costpy", "see-efa"}


def test_readme_is_the_short_front_door():
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= README_MAX_LINES, f"README.md has {len(lines)} lines; keep it <= {README_MAX_LINES}"


# --- generated and checked -----------------------------------------------------------------------------------------

def test_config_reference_page_holds_the_schemas_table():
    page = (ROOT / ref.DOC_PAGE).read_text()
    assert ref.table_in_page(page) == ref.reference_table(), "regenerate the table: python -m eks_ddp.tooling.config_docs --write"


def test_every_key_has_its_meaning_written_once_on_the_page():
    """The page's meaning column is the one source of the keys' documentation: none empty, and it is what the JSON
    Schema describes each key with (a run's job keys by their job.* row)."""
    rows = ref.reference_rows()
    assert [key for key, _, _, meaning in rows if not meaning] == []
    assert len({key for key, *_ in rows}) == len(rows)
    schema, meaning = ref.stack_file_schema(), {key: m for key, _, _, m in rows}
    assert schema["$defs"]["RunConfig"]["properties"]["nodes"]["description"] == meaning["eks-ddp:job.nodes"]
    assert schema["properties"]["config"]["properties"]["eks-ddp:runs"]["description"] == meaning["eks-ddp:runs"]


def test_a_new_key_gets_a_row_to_write_its_meaning_in(tmp_path):
    """--write adds a row for a key the page lacks, with an empty meaning (which the test above refuses), and keeps
    every other row's meaning."""
    (tmp_path / "docs").mkdir()
    page = (ROOT / ref.DOC_PAGE).read_text()
    row = next(line for line in page.splitlines() if line.startswith("| `eks-ddp:job.epochs` |"))
    (tmp_path / ref.DOC_PAGE).write_text(page.replace(row + "\n", ""))
    assert ref.write_reference(tmp_path) is True
    assert "| `eks-ddp:job.epochs` | integer | `10` |  |" in (tmp_path / ref.DOC_PAGE).read_text()
    assert [k for k, *_, m in ref.reference_rows(tmp_path) if not m] == ["eks-ddp:job.epochs"]


def test_the_generator_rewrites_a_stale_table_and_only_the_table(tmp_path):
    (tmp_path / "docs").mkdir()
    stale = ref.reference_table().replace("| `aws:region` | string |", "| `aws:region` | number |")
    (tmp_path / ref.DOC_PAGE).write_text(f"# Configuration\n\nbefore\n\n{ref.BEGIN}\n{stale}\n{ref.END}\n\nafter\n")
    assert ref.write_reference(tmp_path) is True
    text = (tmp_path / ref.DOC_PAGE).read_text()
    assert text == f"# Configuration\n\nbefore\n\n{ref.BEGIN}\n{ref.reference_table()}\n{ref.END}\n\nafter\n"
    assert ref.write_reference(tmp_path) is False


def test_config_reference_python_m_write_leaves_a_current_page_unchanged(tmp_path):
    """The command the page names, run as a process on a copy of the library and the page."""
    import os
    import subprocess
    import sys

    shutil.copytree(ROOT / "components" / "eks_ddp", tmp_path / "eks_ddp")
    (tmp_path / "docs").mkdir()
    shutil.copy(ROOT / ref.DOC_PAGE, tmp_path / ref.DOC_PAGE)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])}
    out = subprocess.run([sys.executable, "-m", "eks_ddp.tooling.config_docs", "--write"], cwd=tmp_path, capture_output=True,
                         text=True, timeout=120, env=env)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == f"{ref.DOC_PAGE}: up to date"
    assert (tmp_path / ref.DOC_PAGE).read_text() == (ROOT / ref.DOC_PAGE).read_text()


def test_the_c10d_row_of_the_reference_says_what_it_trusts():
    """The row where c10d is chosen says that torch's TCPStore is unauthenticated and its state unpickled."""
    [row] = [r for r in ref.reference_rows() if r[0] == "eks-ddp:job.rdzvBackend"]
    assert "unauthenticated" in row[3] and "unpickles" in row[3]


def test_every_make_target_the_docs_name_exists():
    targets = set(re.findall(r"^([a-z-]+):", (ROOT / "Makefile").read_text(), re.M))
    for file in doc_files():
        for target in set(re.findall(r"`make ([a-z-]+)", file.read_text())):
            assert target in targets, f"{file.name} mentions `make {target}` but the Makefile has no such target"


def test_dev_stack_sets_every_top_level_key():
    text = (ROOT / "Pulumi.dev.yaml").read_text()
    doc = yaml.safe_load(text)["config"]
    # `runs` is the alternative to `job` (both set is an error), so the file shows it commented out.
    missing = [k for k in TOP_LEVEL_KEYS if k != "runs" and f"eks-ddp:{k}" not in doc]
    assert not missing, f"Pulumi.dev.yaml should show every key, with a comment; missing {missing}"
    assert "eks-ddp:runs" not in doc and re.search(r"^  # eks-ddp:runs:", text, re.M), \
        "Pulumi.dev.yaml should show eks-ddp:runs as a commented-out alternative to eks-ddp:job"


def test_dev_stack_comments_every_key():
    for line in (ROOT / "Pulumi.dev.yaml").read_text().splitlines():
        stripped = line.strip()
        if not stripped or stripped.startswith("#") or stripped in ("config:",) or stripped.endswith(":"):
            continue
        if stripped.startswith("- ") and ":" not in stripped:
            continue  # list items are commented on the key line above or inline
        assert "#" in line, f"uncommented key in Pulumi.dev.yaml: {line!r}"


def test_checkov_skip_says_how_the_shared_volume_is_protected():
    # Review finding B-19: the CKV_K8S_40 reason credited the pod uid with file ownership on EFS.
    skips = yaml.safe_load((ROOT / "tests" / "checkov-skips.yaml").read_text())
    assert "PosixUser" in skips["CKV_K8S_40"] and "access point" in skips["CKV_K8S_40"]


def test_trainer_docstring_shows_the_command_the_cluster_runs():
    """train.py's docstring is where users look for the command: it must be job_command's, with its env."""
    import shlex

    import eks_ddp_trainer.train as train
    from eks_ddp_runtime.launch_command import AGENT_ENV, AgentOptions, job_command
    from eks_ddp_trainer.config import TrainerConfig

    doc = train.__doc__
    block = doc[doc.index("::") + 2:doc.index("The optimisation")]
    words = shlex.split(block.replace("\\\n", " "))
    env = dict(w.split("=", 1) for w in words if "=" in w and not w.startswith("-") and w.split("=")[0].isupper())
    command = [w for w in words if not ("=" in w and not w.startswith("-") and w.split("=")[0].isupper())]
    expected = job_command(
        AgentOptions(min_nodes=1, max_nodes=2, nproc_per_node=1, rdzv_backend="etcd",
                     rdzv_endpoint="ETCD_HOST:2379", rdzv_id="RUN_ID", local_addr="POD_IP"),
        TrainerConfig(data_dir="/shared/data", run_dir="/shared/runs/RUN_ID"))
    assert command == expected
    assert env == AGENT_ENV


def _queue_figures() -> dict[str, int]:
    import dataclasses

    from eks_ddp.core.rules import duration_minutes
    from eks_ddp.infra import kueue
    from eks_ddp.infra.autoscaler import ClusterAutoscalerArgs
    from eks_ddp.workloads.queue import PROVISIONING_RETRY

    tail = next(f.default for f in dataclasses.fields(ClusterAutoscalerArgs) if f.name == "scale_down_unneeded_time")
    return {"retries": PROVISIONING_RETRY["backoffLimitCount"], "requeues": kueue.PODS_READY_REQUEUES,
            "timeout": round(duration_minutes(kueue.PODS_READY_TIMEOUT)), "tail": round(duration_minutes(str(tail)))}


_PREEMPTIONS = re.compile(r"survives (\d+)\s+preemptions \((\d+) retries less the (\d+) requeues\)")
_LIFETIME = re.compile(r"worst case of a run that never gets all its nodes is\s+(\d+) × \((\d+) \+ (\d+)\) = (\d+) "
                       r"minutes")


def queue_figures_said(day_two: str, capacity: str) -> list[str]:
    """What the docs' preemption bound and lifetime worst case say against the constants; [] when they agree."""
    n = _queue_figures()
    want_pre = (n["retries"] - n["requeues"], n["retries"], n["requeues"])
    want_life = (n["requeues"] + 1, n["timeout"], n["tail"], (n["requeues"] + 1) * (n["timeout"] + n["tail"]))
    pre, life = _PREEMPTIONS.search(_prose(day_two)), _LIFETIME.search(_prose(capacity))
    out = []
    if pre is None or tuple(map(int, pre.groups())) != want_pre:
        out.append(f"day-two.md preemptions: got {pre and pre.groups()}; expected {want_pre}")
    if life is None or tuple(map(int, life.groups())) != want_life:
        out.append(f"capacity-and-cost.md lifetime: got {life and life.groups()}; expected {want_life}")
    return out


def test_the_docs_preemption_bound_and_lifetime_worst_case_follow_the_constants():
    """day-two.md's preemptions a run survives = PROVISIONING_RETRY backoffLimitCount - PODS_READY_REQUEUES; the
    lifetime worst case in capacity-and-cost.md = (requeues + 1) attempts x (waitForPodsReady timeout + the
    autoscaler's scale-down tail). The negative control: the old 'about 7' wording and a stale figure are refused."""
    day_two, capacity = (ROOT / "docs" / "day-two.md").read_text(), (ROOT / "docs" / "capacity-and-cost.md").read_text()
    assert queue_figures_said(day_two, capacity) == []
    assert len(queue_figures_said("after about 7 preemptions", capacity)) == 1
    assert len(queue_figures_said(day_two, capacity.replace("= 220 minutes", "= 165 minutes"))) == 1
    # workloads/queue.py's PROVISIONING_RETRY docstring says the same numbers.
    source = (ROOT / "components" / "eks_ddp" / "workloads" / "queue.py").read_text()
    said = re.search(r"(\d+) retries cover those (\d+)\s+and (\d+) preemptions", source)
    n = _queue_figures()
    assert said is not None and tuple(map(int, said.groups())) == (n["retries"], n["requeues"],
                                                                  n["retries"] - n["requeues"])
