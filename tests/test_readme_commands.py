"""The `pulumi stack output` commands of README.md and docs/*.md work when pasted into bash.

Each line of their bash blocks that runs a stack output is executed by bash with ``pulumi`` answering the
outputs of the dev stack (run under mocks) and ``aws``/``kubectl`` recording their argument
lists: every command the output holds must run, with its own arguments (``$(output)`` alone
would pass ``&&`` to the first command as an argument and never run the second).
"""

from __future__ import annotations

import re
import shlex
import subprocess

import pytest

from tests.support.util import ROOT

DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
BASH = "\n".join(m for p in DOCS for m in re.findall(r"```bash\n(.*?)```", p.read_text(), re.S))
LINES = list(dict.fromkeys(  # each distinct line once, wherever the docs repeat it
    line.split("  #", 1)[0].strip() for line in BASH.splitlines()
    if "pulumi stack output" in line and "$(" in line and not line.lstrip().startswith("#")))


def test_readme_runs_stack_outputs():
    assert any("kubectl)" in line for line in LINES), LINES


@pytest.mark.parametrize("line", LINES, ids=[re.search(r"output (\w+)", x).group(1) for x in LINES])
def test_readme_stack_output_command_runs_every_command_it_holds(line, dev_result, tmp_path):
    name = re.search(r"pulumi stack output (\w+)", line).group(1)
    value = dev_result.outputs[name]
    assert isinstance(value, str), (name, value)
    (tmp_path / name).write_text(value)
    log = tmp_path / "log"
    script = f"""
pulumi() {{ cat {shlex.quote(str(tmp_path))}/"$3"; }}
aws() {{ printf '%s\\n' "aws $*" >> {shlex.quote(str(log))}; }}
kubectl() {{ printf '%s\\n' "kubectl $*" >> {shlex.quote(str(log))}; }}
python() {{ printf '%s\\n' "python $*" >> {shlex.quote(str(log))}; }}
eks-ddp-fetch-results() {{ printf '%s\\n' "eks-ddp-fetch-results $*" >> {shlex.quote(str(log))}; }}
{line}
"""
    proc = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0, proc.stderr
    ran = log.read_text().splitlines()
    expected = [c.strip() for c in value.split("&&")]
    assert len(ran) == len(expected), (line, value, ran)
    for got, want in zip(ran, expected, strict=True):
        want = re.sub(r"\$\(date \+%s\)", r"", want)
        # bash removes the quotes: compare the words it passes (a quoted filter pattern is one argument)
        assert got.startswith(" ".join(shlex.split(want.split("$(")[0].rstrip()))), (got, want)
        assert "&&" not in got and "$(" not in got, got
