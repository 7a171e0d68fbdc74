"""The command line as a user meets it: dry runs print everything, bad input fails cleanly."""

from __future__ import annotations

import json
from pathlib import Path

from swiftslurm.testing.cli import swiftslurm
from tests.conftest import REPO


def test_dry_run_prints_plan_script_node_table_and_command(tmp_path: Path) -> None:
    done = swiftslurm(
        "+cluster=a100x16",
        "model=qwen3-8b",
        "dataset=[AI-ModelScope/alpaca-gpt4-data-en]",
        "strategy=zero3",
        "dry_run=true",
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert "2 node(s) × 8 GPUs = world size 16" in out
    assert "global 16 = micro 1 × grad accum 1 × data parallel 16" in out
    assert "#SBATCH --nodes=2" in out and "#SBATCH --gpus-per-node=a100:8" in out
    for column in ("NNODES", "NODE_RANK", "MASTER_ADDR", "MASTER_PORT", "NPROC_PER_NODE"):
        assert column in out
    assert "NCCL_IB_DISABLE=0" in out and "TORCH_NCCL_ASYNC_ERROR_HANDLING=1" in out
    assert "--deepspeed zero3" in out and "--model Qwen/Qwen3-8B" in out
    # The memory estimate belongs to the plan; what was done (and how to submit by hand) ends the report.
    assert out.index("memory   ~") < out.index("Nothing submitted") and out.rstrip().endswith("job.sbatch")


def test_dry_run_writes_the_run_directory_and_submits_nothing(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    done = swiftslurm("+cluster=a100x16", f"run_dir={run_dir}", "dry_run=true", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert {p.name for p in run_dir.iterdir()} == {"config.yaml", "plan.json", "plan.sha256", "job.sbatch", "logs"}
    assert json.loads((run_dir / "plan.json").read_text())["topology"]["nodes"] == 2
    assert not (run_dir / "submitit").exists()


def test_unknown_cluster_lists_the_valid_ones_without_traceback(tmp_path: Path) -> None:
    done = swiftslurm("+cluster=a100x99", "dry_run=true", cwd=tmp_path)
    assert done.returncode != 0
    assert "a100x16" in done.stderr and "local-slurm" in done.stderr
    assert "Traceback" not in done.stderr


def test_unknown_model_lists_the_valid_ones(tmp_path: Path) -> None:
    done = swiftslurm("model=qwen3-7b", "dry_run=true", cwd=tmp_path)
    assert done.returncode != 0
    assert "qwen3-8b" in done.stderr and "Traceback" not in done.stderr


def test_validation_error_exits_2_with_one_message_and_no_run_dir(tmp_path: Path) -> None:
    done = swiftslurm("+cluster=a100x16", "swift.lerning_rate=1e-4", "dry_run=true", cwd=tmp_path)
    assert done.returncode == 2
    assert "Did you mean `swift.learning_rate`" in done.stderr
    assert "Traceback" not in done.stderr
    assert not (tmp_path / "runs").exists()


def test_rerun_with_other_training_settings_plans_again_a_run_that_committed_nothing(tmp_path: Path) -> None:
    args = ("+cluster=a100x16", f"run_dir={tmp_path / 'r'}", "dry_run=true")
    assert swiftslurm(*args, cwd=tmp_path).returncode == 0
    done = swiftslurm(*args, "swift.learning_rate=5e-5", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "different settings (--learning_rate 0.001 → 5e-05) that committed no checkpoint" in done.stderr
    assert "planned again in place" in done.stderr and (tmp_path / "r" / "replaced").is_dir()


def test_every_recipe_plans(tmp_path: Path) -> None:
    for recipe in sorted((REPO / "conf" / "recipe").glob("*.yaml")):
        done = swiftslurm(f"+recipe={recipe.stem}", "dry_run=true", f"run_dir={tmp_path / recipe.stem}", cwd=tmp_path)
        assert done.returncode == 0, f"{recipe.stem}: {done.stderr}"


def test_each_sweep_point_gets_its_own_run_dir_named_after_what_varies(tmp_path: Path) -> None:
    done = swiftslurm("-m", "+cluster=a100x16", "swift.learning_rate=1e-4,2e-4", "dry_run=true", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    names = sorted(p.name for p in (tmp_path / "runs").iterdir() if p.name != "sweeps")
    assert names == ["tiny-sft-ddp-a100x16-learning_rate=0.0001", "tiny-sft-ddp-a100x16-learning_rate=0.0002"]


def test_operations_are_subcommands_of_the_main_command(tmp_path: Path) -> None:
    planned = swiftslurm("+cluster=a100x16", "dry_run=true", f"run_dir={tmp_path / 'run'}", cwd=tmp_path)
    assert planned.returncode == 0, planned.stderr
    status = swiftslurm("status", str(tmp_path / "run"), "--json", "--no-slurm", cwd=tmp_path)
    assert status.returncode == 0, status.stderr
    [run] = json.loads(status.stdout)["runs"]
    assert (run["state"], run["job_id"], run["attempts"]) == ("planned", None, 0)  # a dry run: never submitted
    resumed = swiftslurm("cancel", str(tmp_path / "nothing-here"), cwd=tmp_path)
    assert resumed.returncode == 2 and "holds no run" in resumed.stderr
