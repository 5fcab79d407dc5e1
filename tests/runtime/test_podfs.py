"""The training pod's read-only working directory, rehearsed in a local run's workers (eks_ddp_runtime/podfs.py).

Each case runs in a fresh interpreter (an audit hook cannot be removed) from a working directory below the temp
folder, as a local run's project often is, with a run directory below it (``--out`` is relative): writes below the
working directory fail with the pod's errno, naming the path; the run directory, the temp folder, reads and an
existing folder's ``makedirs(exist_ok=True)`` work, as in the pod.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from eks_ddp_runtime.podfs import READ_ONLY_ENV
from tests.support.util import ROOT

REFUSED = {
    "open_w": "open('ckpt.pt', 'w')",
    "open_append": "open('data/existing.txt', 'a')",
    "open_r_plus": "open('data/existing.txt', 'r+')",
    "os_open_creat": "os.open('x.bin', os.O_WRONLY | os.O_CREAT)",
    "pathlib_write": "pathlib.Path('out/x.txt').parent.mkdir(parents=True)",
    "makedirs_new": "os.makedirs('ckpt/epoch1', exist_ok=True)",
    "replace_into": "os.replace(os.path.join(run, 'a.tmp'), 'a.pt')",
    "remove": "os.remove('data/existing.txt')",
    "shutil_copy": "shutil.copy(os.path.join(run, 'a.tmp'), 'copy.pt')",
    "absolute": "open(os.path.join(os.getcwd(), 'abs.txt'), 'w')",
}
ALLOWED = {
    "read": "open('data/existing.txt').read()",
    "run_dir": "open(os.path.join(run, 'ckpt.pt'), 'wb').write(b'x')",
    "run_dir_makedirs": "os.makedirs(os.path.join(run, 'a', 'b'), exist_ok=True)",
    "tmp": "tempfile.NamedTemporaryFile(dir=os.path.dirname(os.getcwd())).write(b'x')",
    "existing_folder": "os.makedirs('data', exist_ok=True)",
    "devnull": "open(os.devnull, 'w').write('x')",
}


def _run(tmp_path, statement: str, *, hooked: bool = True) -> subprocess.CompletedProcess[str]:
    project = tmp_path / "project"
    (project / "data").mkdir(parents=True)
    (project / "data" / "existing.txt").write_text("x")
    run = project / "demo-out" / "run-1"
    run.mkdir(parents=True)
    (run / "a.tmp").write_text("x")
    code = textwrap.dedent(f"""
        import os, pathlib, shutil, sys, tempfile
        from eks_ddp_runtime import podfs
        run = os.environ["EKS_DDP_RUN_DIR"]
        podfs.install()
        try:
            {statement}
        except OSError as e:
            print(f"refused {{e}}")
            sys.exit(3)
        print("done")
    """)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(str(ROOT / p) for p in ("training/runtime", "training")),
           "EKS_DDP_RUN_DIR": str(run)}
    if hooked:
        env[READ_ONLY_ENV] = str(project)
    return subprocess.run([sys.executable, "-c", code], cwd=project, env=env, capture_output=True, text=True,
                          timeout=60)


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_a_write_below_the_working_directory_fails_as_in_the_pod(case, tmp_path):
    proc = _run(tmp_path, REFUSED[case])
    assert proc.returncode == 3, proc.stdout + proc.stderr
    assert "refused [Errno 30] Read-only file system (as in the training pod: writable are only $EKS_DDP_RUN_DIR, " \
           "/tmp and /dev/shm): '" in proc.stdout
    unhooked = _run(tmp_path / "control", REFUSED[case], hooked=False)  # the same write without the rehearsal
    assert unhooked.returncode == 0 and "done" in unhooked.stdout, unhooked.stderr


@pytest.mark.parametrize("case", sorted(ALLOWED))
def test_the_pods_writable_places_stay_writable(case, tmp_path):
    proc = _run(tmp_path, ALLOWED[case])
    assert proc.returncode == 0 and "done" in proc.stdout, proc.stdout + proc.stderr


def test_the_refusal_names_the_path(tmp_path):
    assert "): 'ckpt.pt'" in _run(tmp_path, REFUSED["open_w"]).stdout
    assert "): 'ckpt'" in _run(tmp_path / "2", REFUSED["makedirs_new"]).stdout  # the first folder made, as mkdir -p
