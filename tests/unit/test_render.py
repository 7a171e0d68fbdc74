"""Rendering: golden sbatch scripts, hostile values quoted, shellcheck-clean, consistent with submitit."""

from __future__ import annotations

import os
import shlex
from pathlib import Path

import pytest

from swiftslurm.errors import ConfigError
from swiftslurm.render import display_command, render_sbatch, swift_command
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
