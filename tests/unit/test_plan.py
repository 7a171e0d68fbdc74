"""Planning: topology and batch arithmetic computed once, validation messages that name the fix."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from swiftslurm.errors import ConfigError
from swiftslurm.plan import JobPlan
from swiftslurm.planning.validate import parse_slurm_time
from tests.conftest import plan_for


def argv_value(plan: JobPlan, name: str) -> str | None:
    argv = list(plan.swift_argv)
    return argv[argv.index(f"--{name}") + 1] if f"--{name}" in argv else None


def test_a100x16_zero3_is_two_nodes_of_eight_gpus_world_sixteen() -> None:
    plan = plan_for(
        "+cluster=a100x16", "model=qwen3-8b", "dataset=[AI-ModelScope/alpaca-gpt4-data-en]", "strategy=zero3"
    )
    assert (plan.topology.nodes, plan.topology.procs_per_node, plan.topology.world_size) == (2, 8, 16)
    assert plan.batch.data_parallel == 16
    assert argv_value(plan, "deepspeed") == "zero3"
    assert argv_value(plan, "model") == "Qwen/Qwen3-8B"
    assert plan.slurm is not None and plan.slurm.gpus == "a100:8"


def test_global_batch_sets_gradient_accumulation() -> None:
    plan = plan_for("+cluster=a100x16", "micro_batch_size=2", "global_batch_size=256")
    assert (plan.batch.micro, plan.batch.grad_accum, plan.batch.global_) == (2, 8, 256)
    assert argv_value(plan, "gradient_accumulation_steps") == "8"
    assert argv_value(plan, "per_device_train_batch_size") == "2"


def test_megatron_batch_is_micro_and_global_over_data_parallel_ranks() -> None:
    plan = plan_for(
        "+cluster=h100x8",
        "model=qwen3-8b",
        "dataset=[AI-ModelScope/alpaca-gpt4-data-en]",
        "strategy=megatron",
        "task=megatron_sft",
        "strategy.tp=4",
        "strategy.pp=2",
        "global_batch_size=16",
    )
    assert plan.batch.data_parallel == 1
    assert argv_value(plan, "global_batch_size") == "16"
    assert argv_value(plan, "tensor_model_parallel_size") == "4"
    assert plan.executable.endswith("/megatron")


def test_cpu_runs_pass_use_cpu_so_ranks_really_train_together() -> None:
    plan = plan_for("+cluster=local-slurm")
    assert argv_value(plan, "use_cpu") == "true"
    assert plan.topology.world_size == 2


def test_user_swift_arguments_win_over_group_defaults() -> None:
    plan = plan_for("swift.max_steps=7", "swift.learning_rate=3e-4")
    assert argv_value(plan, "max_steps") == "7"
    assert argv_value(plan, "learning_rate") == "0.0003"


def test_list_arguments_become_several_values() -> None:
    plan = plan_for("dataset=[/data/a.jsonl,/data/b.jsonl]")
    argv = list(plan.swift_argv)
    i = argv.index("--dataset")
    assert argv[i + 1 : i + 3] == ["/data/a.jsonl", "/data/b.jsonl"]


def test_run_dir_defaults_to_runs_slash_run_name_under_cwd() -> None:
    plan = plan_for("+cluster=a100x16", cwd=Path("/proj"))
    assert plan.run_dir == "/proj/runs/tiny-sft-ddp-a100x16"
    assert plan_for("run_dir=/scratch/r1").run_dir == "/scratch/r1"


def test_plan_round_trips_through_json() -> None:
    plan = plan_for(
        "+cluster=a100x16",
        "model=qwen3-8b",
        "dataset=[AI-ModelScope/alpaca-gpt4-data-en]",
        "strategy=zero3",
        "global_batch_size=64",
    )
    assert JobPlan.from_json(plan.to_json()) == plan


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["+cluster=a100x8", "strategy=megatron", "task=megatron_sft", "strategy.tp=3"], "does not divide"),
        (["+cluster=a100x16", "global_batch_size=20"], "HINT: set global_batch_size=16 or 32"),
        (["+cluster=local-slurm", "dataset=[data/train.jsonl]"], "relative path on a 2-node run"),
        (["+cluster=a100x16", "model.id=./models/qwen"], "relative path"),
        (["swift.lerning_rate=1e-4"], "Did you mean `swift.learning_rate`"),
        (["swift.output_dir=/x"], "managed by swiftslurm"),
        (["+cluster=a100x8", "strategy=megatron", "task=grpo"], "needs a Megatron task"),
        (["+cluster=a100x8", "strategy=zero3", "task=megatron_sft"], "needs strategy=megatron"),
        (["+cluster=a100x8", "strategy=megatron", "task=megatron_sft", "task.vllm_mode=colocate"], "vllm_mode"),
        (["+cluster=a100x16", "cluster.partition=null"], "cluster.partition=NAME"),
        (["+cluster=a100x16", "cluster.time=4h"], "not a SLURM time limit"),
        (["+cluster=a100x16", "cluster.time=0"], "is zero"),
        (["strategy=qlora"], "need GPUs"),
        (["+cluster=a100x8", "strategy=zero3", "strategy.tp=2"], "needs Megatron"),
        (
            ["+cluster=a100x8", "strategy=megatron", "task=megatron_sft", "strategy.ep=2"],
            "not a mixture-of-experts",
        ),
        (
            ["+cluster=a100x8", "strategy=megatron", "task=megatron_sft", "strategy.sequence_parallel=true"],
            "tp=1",
        ),
        (
            [
                "+cluster=a100x8",
                "model=qwen3-30b-a3b",
                "dataset=[AI-ModelScope/alpaca-gpt4-data-en]",
                "strategy=megatron",
                "task=megatron_sft",
                "strategy.tp=4",
                "strategy.ep=4",
            ],
            "tp × ep = 16",
        ),
        (["+cluster=a100x8", "task=grpo", "task.vllm_mode=server"], "vllm_server_host"),
        (["strategy.engine=horovod"], "Valid values are: ddp, deepspeed, fsdp, megatron"),
        (["cluster.nodes=2"], "local executor runs on this machine only"),
        (["run_name=a/b"], "single path component"),
        (["storage=s3"], "storage.bucket=NAME"),
        (["storage=s3", "storage.bucket=ckpt", "storage.addressing_style=dns"], "Valid values are: auto, path"),
        (["+cluster=local-slurm", "cluster.signal_lead_s=5000"], "signal_lead_s"),
        (["+cluster.env.AWS_SECRET_ACCESS_KEY=x"], "never put it in the config"),
        (["storage=s3", "storage.bucket=ckpt", "storage.keep=-1"], "storage.keep=-1"),
    ],
)
def test_bad_input_is_refused_with_a_message_that_names_the_fix(overrides: list[str], message: str) -> None:
    with pytest.raises(ConfigError) as err:
        plan_for(*overrides)
    assert message in str(err.value)


@pytest.mark.parametrize(
    ("text", "minutes"),
    [("30", 30), ("30:30", 31), ("4:00:00", 240), ("1-0", 1440), ("1-12:30", 2190), ("2-00:00:01", 2881)],
)
def test_slurm_time_formats(text: str, minutes: int) -> None:
    assert parse_slurm_time(text) == minutes


def test_storage_prefix_follows_the_run_name_so_a_new_run_dir_finds_the_checkpoints(tmp_path: Path) -> None:
    a = plan_for("storage=s3", "storage.bucket=ckpt", "run_name=exp1", f"run_dir={tmp_path / 'a'}")
    b = plan_for("storage=s3", "storage.bucket=ckpt", "run_name=exp1", f"run_dir={tmp_path / 'b'}")
    assert a.storage is not None and a.storage == b.storage
    assert (a.storage.bucket, a.storage.prefix) == ("ckpt", "swiftslurm/exp1")
    assert plan_for("storage=s3", "storage.bucket=ckpt", "storage.prefix=team/x").storage.prefix == "team/x"  # type: ignore[union-attr]
    assert plan_for().storage is None


def test_plan_json_round_trips_the_storage_spec_and_holds_no_credentials(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "s3cr3t-in-the-environment")
    plan = plan_for("storage=s3", "storage.bucket=ckpt", "storage.endpoint_url=http://s3:8333", "storage.keep=3")
    assert JobPlan.from_json(plan.to_json()) == plan
    assert "s3cr3t-in-the-environment" not in plan.to_json()


def test_a_plan_json_written_before_the_unknown_stop_and_exclusion_budgets_still_reads() -> None:
    plan = plan_for("+cluster=a100x16")
    data = json.loads(plan.to_json())
    del data["resilience"]["max_unknown_stops"], data["resilience"]["exclude_host_s"]
    old = JobPlan.from_json(json.dumps(data))
    assert (old.resilience.max_unknown_stops, old.resilience.exclude_host_s) == (5, 21600.0)


def test_a_run_dir_planned_by_the_previous_layout_is_planned_again_in_place_with_the_same_identity(
    tmp_path: Path,
) -> None:
    """plan.json version 1 named the plugin under swiftslurm/node/engines/: the node refuses it, and the hint
    (plan again, the same run_dir continues the run) must hold, checkpoints and all."""
    from swiftslurm.launch import check_same_run

    plan = plan_for(f"run_dir={tmp_path / 'run'}")
    data = json.loads(plan.to_json())
    data["version"] = 1
    data["swift_argv"] = [w.replace("swiftslurm/engines/", "swiftslurm/node/engines/") for w in data["swift_argv"]]
    old = tmp_path / "plan.json"
    old.write_text(json.dumps(data))
    with pytest.raises(ConfigError, match=r"version 1.*HINT: re-plan the run"):
        JobPlan.load(old)
    check_same_run(plan, old)  # planning again in place is not refused
    assert JobPlan.load(old, any_version=True).identity() == plan.identity()
