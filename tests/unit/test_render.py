"""Rendering: golden sbatch scripts, hostile values quoted, shellcheck-clean, consistent with submitit."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest

from swiftslurm.errors import ConfigError
from swiftslurm.render import display_command, render_sbatch, swift_command
from swiftslurm.rundir.layout import logs_dir, plan_file, slurm_log
from swiftslurm.submit.jobs import executor_parameters
from tests.conftest import REPO, plan_for

GOLDEN = REPO / "tests" / "golden"
UPDATE = os.environ.get("SWIFTSLURM_UPDATE_GOLDEN") == "1"

CASES = {
    "a100x16_qwen3-8b_zero3": [
        "+cluster=a100x16",
        "model=qwen3-8b",
        "dataset=[AI-ModelScope/alpaca-gpt4-data-en]",
        "strategy=zero3",
        "run_dir=/scratch/r",
    ],
    "local-slurm_tiny": ["+cluster=local-slurm", "run_dir=/scratch/tiny"],
    "h100x8_megatron": [
        "+cluster=h100x8",
        "model=qwen3-vl-8b-instruct",
        "dataset=[AI-ModelScope/LaTeX_OCR:human_handwrite]",
        "strategy=megatron",
        "task=megatron_sft",
        "strategy.tp=4",
        "strategy.pp=2",
        "strategy.sequence_parallel=true",
        "run_dir=/scratch/vl",
        "cluster.setup=[module load cuda/12.4,source /opt/venv/bin/activate]",
    ],
    "recipe_h100x8-qwen3vl-megatron": ["+recipe=h100x8-qwen3vl-megatron", "run_dir=/scratch/vl"],
    "recipe_a100x16-qwen3moe-megatron-ep": ["+recipe=a100x16-qwen3moe-megatron-ep", "run_dir=/scratch/moe"],
}


def check_golden(name: str, text: str) -> None:
    text = text.replace(str(REPO), "<repo>")  # the checkout's location is not part of the rendering
    path = GOLDEN / name
    if UPDATE or not path.exists():
        path.write_text(text)
    assert text == path.read_text(), f"{name} changed; SWIFTSLURM_UPDATE_GOLDEN=1 pytest ... to accept"


@pytest.mark.parametrize("case", sorted(CASES))
def test_sbatch_script_matches_golden(case: str) -> None:
    check_golden(f"{case}.sbatch", render_sbatch(plan_for(*CASES[case])))


@pytest.mark.parametrize("case", sorted(CASES))
def test_swift_command_matches_golden(case: str) -> None:
    check_golden(f"{case}.cmd", display_command(swift_command(plan_for(*CASES[case]))) + "\n")


def test_hostile_run_dir_is_quoted_in_the_script() -> None:
    hostile = "/scratch/a'; echo x"
    script = render_sbatch(plan_for("+cluster=local-slurm", f'run_dir="{hostile}"'))
    srun_line = script.strip().splitlines()[-1]
    assert shlex.split(srun_line)[-1] == hostile  # one argument, exactly the path
    assert f'#SBATCH --chdir="{hostile}"' in script


def test_hostile_values_survive_the_swift_command_unchanged() -> None:
    plan = plan_for("swift.system='you are; $(rm -rf /) `x`'")
    argv = swift_command(plan)
    assert argv[argv.index("--system") + 1] == "you are; $(rm -rf /) `x`"
    line = display_command(argv).replace("\\\n", "")
    assert "you are; $(rm -rf /) `x`" in shlex.split(line)


def test_newline_in_an_sbatch_value_is_refused() -> None:
    with pytest.raises(ConfigError, match="newline"):
        render_sbatch(plan_for("+cluster=local-slurm", "cluster.account='a\nb'"))


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


def test_submitit_asks_for_the_same_allocation_as_job_sbatch(tmp_path: Path) -> None:
    """submitit renders its own script; its #SBATCH lines must carry the facts job.sbatch carries."""
    import submitit

    plan = plan_for(
        "+cluster=a100x16", "model=qwen3-8b", "dataset=[AI-ModelScope/alpaca-gpt4-data-en]", "strategy=zero3"
    )
    executor = submitit.AutoExecutor(folder=tmp_path, cluster="slurm")
    executor.update_parameters(**executor_parameters(plan))
    text = executor._executor._make_submission_file_text("python -c pass", "UUID")  # type: ignore[attr-defined]
    ours = render_sbatch(plan)
    for expected in (
        "--nodes=2",
        "--ntasks-per-node=1",
        "--gpus-per-node=a100:8",
        "--partition=gpu",
        "--time=1440",
        "--signal=USR2@120",
        "--requeue",
        "--cpus-per-task=64",
        "--mem=960GB",
    ):
        assert expected in text, expected
    for expected in (
        "--nodes=2",
        "--ntasks-per-node=1",
        "--gpus-per-node=a100:8",
        "--partition=gpu",
        "--time=24:00:00",
        "--signal=USR2@120",
        "--requeue",
        "--cpus-per-task=64",
        "--mem=960G",
    ):
        assert expected in ours, expected


def test_your_callbacks_are_kept_and_graceful_exit_is_replaced_by_swiftslurm_stop() -> None:
    argv = swift_command(plan_for("+cluster=local-slurm", "swift.callbacks=[graceful_exit,mine]"))
    callbacks = argv[argv.index("--callbacks") + 1 : argv.index("--callbacks") + 4]
    assert callbacks == ["mine", "swiftslurm_stop", "swiftslurm_commit"]
    assert "graceful_exit" not in argv


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
