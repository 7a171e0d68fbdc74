"""Rendering: golden sbatch scripts, hostile values quoted, shellcheck-clean, consistent with submitit."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from swiftslurm.render import render_sbatch
from swiftslurm.rundir.layout import logs_dir, plan_file, slurm_log
from tests.conftest import REPO, plan_for
from tests.unit.test_render import CASES


def _shellcheck() -> str:
    found = shutil.which("shellcheck") or str(Path(os.sys.executable).parent / "shellcheck")
    if not Path(found).exists():
        pytest.fail("shellcheck not found: install the dev extras (pip install -e '.[dev]')")
    return found


@pytest.mark.parametrize("case", sorted(CASES))
def test_rendered_scripts_are_shellcheck_clean(case: str, tmp_path: Path) -> None:
    script = tmp_path / "job.sbatch"
    script.write_text(render_sbatch(plan_for(*CASES[case])))
    done = subprocess.run([_shellcheck(), "-s", "bash", str(script)], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout


def test_sbatch_templates_are_shellcheck_clean() -> None:
    templates = sorted((REPO / "sbatch").glob("*.sbatch"))
    assert templates
    done = subprocess.run([_shellcheck(), "-s", "bash", *map(str, templates)], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout


def run_template(tmp_path: Path, run_dir: Path, job_id: str, srun: str, python_ok: bool) -> subprocess.CompletedProcess:
    """sbatch/swiftslurm.sbatch run by bash with stand-ins for srun and for a `python3` that can (or cannot)
    import swiftslurm."""
    run_dir.mkdir()
    plan_file(run_dir).write_text("{}")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "srun").write_text(f"#!/bin/bash\n{srun}\n")
    (bin_dir / "python3").write_text(f"#!/bin/bash\nexit {0 if python_ok else 1}\n")
    for tool in ("srun", "python3"):
        (bin_dir / tool).chmod(0o755)
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "SLURM_JOB_ID": job_id}
    script = REPO / "sbatch" / "swiftslurm.sbatch"
    return subprocess.run(["bash", str(script), str(run_dir)], capture_output=True, text=True, env=env, cwd=tmp_path)


def test_sbatch_template_writes_into_the_run_dirs_log_not_the_submit_dir(tmp_path: Path) -> None:
    """Issue 17, item 5: `sbatch sbatch/swiftslurm.sbatch RUN_DIR` from anywhere: what the job prints (srun's and
    the wrapper's lines) goes to RUN_DIR/logs/slurm-<job id>.out, the file rundir.py names and `status`/`logs`
    read; the submit directory's output file gets only the pointer to it. srun is a stand-in printing its argv."""
    run_dir = tmp_path / "a'; echo run"
    done = run_template(tmp_path, run_dir, "77", 'echo "srun ran $*"; echo "srun complains" >&2', python_ok=True)
    assert done.returncode == 0, done.stderr
    log = slurm_log(logs_dir(run_dir), "77")
    assert done.stdout == f"swiftslurm.sbatch: the output of this job goes to {log}\n" and done.stderr == ""
    srun = f"srun ran --ntasks-per-node=1 --kill-on-bad-exit=1 --unbuffered python3 -m swiftslurm.node {run_dir}"
    assert log.read_text() == f"{srun}\nsrun complains\n"


def test_sbatch_template_with_a_python_that_lacks_swiftslurm_says_which_setting_to_fix(tmp_path: Path) -> None:
    """Found in the issue-17 walkthrough: without SWIFTSLURM_PYTHON the template ran the system python3, and
    every node died with `ModuleNotFoundError: No module named 'hostlist'`. Now it says what to set, in the run
    dir's log, before srun starts anything."""
    run_dir = tmp_path / "run"
    done = run_template(tmp_path, run_dir, "78", 'echo "srun ran"', python_ok=False)
    assert done.returncode == 2
    said = slurm_log(logs_dir(run_dir), "78").read_text()
    assert "python3 cannot import swiftslurm" in said and "SWIFTSLURM_PYTHON" in said and "srun ran" not in said
