"""The pure parts of the GPU runs (swiftslurm/testing/gpu.py): srun's environment, the plain `swift sft` command,
throughput from ms-swift's log; and the GPU-sized assets preset of swiftslurm.tiny."""

from __future__ import annotations

import pytest

from swiftslurm import tiny
from swiftslurm.engines.hf import HfTrainerEngine
from swiftslurm.engines.stop_vote import vote_cost_line
from swiftslurm.node.watch import wrapper_cost_line
from swiftslurm.render import swift_command
from swiftslurm.slurm_env import SlurmEnv, check_allocation, rank_env
from swiftslurm.testing import gpu as gpu_common
from tests.conftest import plan_for

MODEL = ("model=qwen3-0.5b-random", "model.id=/assets/model", "dataset=[/assets/data/train.jsonl]")


def test_emulated_one_node_two_gpu_job_gives_torchrun_two_local_ranks() -> None:
    plan = plan_for("+cluster=h200x2", *MODEL, "strategy=zero3")
    env = gpu_common.srun_env(job_id=7001, nodelist="gpu-n0", hosts=["gpu-n0"], node_id=0, gpus=[0, 1])
    where = SlurmEnv.from_environ(env)
    check_allocation(where, plan)
    assert env["CUDA_VISIBLE_DEVICES"] == "0,1" and env["SLURM_GPUS_ON_NODE"] == "2"
    assert rank_env(where, plan) == {
        "NPROC_PER_NODE": "2",
        "NNODES": "1",
        "NODE_RANK": "0",
        "MASTER_ADDR": "gpu-n0",
        "MASTER_PORT": str(10000 + 7001),
    }


@pytest.mark.parametrize("node", [0, 1])
def test_emulated_two_node_job_gives_each_node_its_rank_and_one_gpu(node: int) -> None:
    plan = plan_for("+cluster=h200x2", "cluster.nodes=2", "cluster.gpus_per_node=1", *MODEL, "strategy=fsdp2")
    hosts = ["gpu-n0", "gpu-n1"]
    env = gpu_common.srun_env(job_id=42, nodelist="gpu-n[0-1]", hosts=hosts, node_id=node, gpus=[node])
    where = SlurmEnv.from_environ(env)
    check_allocation(where, plan)
    assert (where.node_id, where.proc_id, where.hosts) == (node, node, ("gpu-n0", "gpu-n1"))
    assert env["CUDA_VISIBLE_DEVICES"] == str(node) and env["SLURMD_NODENAME"] == hosts[node]
    assert env["SLURM_TASKS_PER_NODE"] == "1(x2)"
    ranks = rank_env(where, plan)
    assert (ranks["NPROC_PER_NODE"], ranks["NNODES"], ranks["NODE_RANK"]) == ("1", "2", str(node))
    assert ranks["MASTER_ADDR"] == "gpu-n0"


def test_restart_count_is_set_only_after_a_requeue() -> None:
    first = gpu_common.srun_env(job_id=1, nodelist="a", hosts=["a"], node_id=0, gpus=[0])
    again = gpu_common.srun_env(job_id=1, nodelist="a", hosts=["a"], node_id=0, gpus=[0], restart_count=2)
    assert "SLURM_RESTART_COUNT" not in first
    assert SlurmEnv.from_environ(again).restart_count == 2


def test_plain_command_drops_only_what_swiftslurm_adds() -> None:
    plan = plan_for("+cluster=h200x2", *MODEL, "strategy=ddp", "swift.callbacks=[mine]")
    argv = swift_command(plan)
    engine = HfTrainerEngine()
    plugin = str(engine.plugin)
    plain = gpu_common.plain_swift_argv(argv, engine)
    assert "swiftslurm_commit" not in plain and "swiftslurm_stop" not in plain and plugin not in plain
    assert plain[plain.index("--callbacks") + 1] == "mine"
    assert "--external_plugins" not in plain
    added = (*engine.callbacks, plugin, "--external_plugins")
    kept = [t for t in argv if t not in added]
    assert plain == kept


def test_replace_arg_swaps_one_value() -> None:
    assert gpu_common.replace_arg(["swift", "sft", "--output_dir", "/a", "--x", "1"], "output_dir", "/b") == [
        "swift",
        "sft",
        "--output_dir",
        "/b",
        "--x",
        "1",
    ]


def step(n: int, speed: float, tokens: int | None = None, total: int = 100) -> dict:
    entry = {"loss": 1.0, "global_step/max_steps": f"{n}/{total}", "train_speed(s/it)": speed}
    if tokens is not None:
        entry["num_input_tokens_seen"] = tokens
    return entry


def test_window_throughput_uses_microsecond_elapsed_from_train_speed() -> None:
    # elapsed = speed × step: 10 -> 2.0 s, 50 -> 6.0 s; 40 steps of 16 samples in 4 s.
    entries = [step(5, 0.3, 500), step(10, 0.2, 1000), step(50, 0.12, 9000)]
    entries.append({"train_runtime": 7.0, "train_samples_per_second": 1.0, "global_step/max_steps": "50/100"})
    tp = gpu_common.window_throughput(entries, global_batch=16, from_step=10)
    assert (tp.first_step, tp.last_step) == (10, 50)
    assert tp.seconds == pytest.approx(4.0)
    assert tp.samples_per_s == pytest.approx(40 * 16 / 4.0)
    assert tp.tokens_per_s == pytest.approx(8000 / 4.0)


def test_window_throughput_of_a_resumed_run_counts_from_the_resume_step() -> None:
    entries = [step(25, 0.5), step(30, 0.4)]  # resumed at 20: 2.5 s at 25, 4.0 s at 30
    tp = gpu_common.window_throughput(entries, global_batch=2, from_step=0, start_step=20)
    assert tp.seconds == pytest.approx(1.5) and tp.tokens_per_s is None


def test_window_throughput_needs_two_logged_steps() -> None:
    with pytest.raises(ValueError, match="two logged steps"):
        gpu_common.window_throughput([step(5, 0.1)], global_batch=1, from_step=0)


def test_peak_memory_and_summary_are_read_from_the_log() -> None:
    entries = [{**step(1, 1.0), "memory(GiB)": 3.5}, {**step(2, 1.0), "memory(GiB)": 4.25}]
    summary = {"train_runtime": 2.0, "global_step/max_steps": "2/2"}
    assert gpu_common.peak_memory_gib(entries) == 4.25
    assert gpu_common.final_summary([*entries, summary]) == summary
    assert gpu_common.step_entries([*entries, summary]) == entries


def test_spread_is_min_median_max() -> None:
    assert gpu_common.spread([1.02, 0.98, 1.0]) == {"min": 0.98, "median": 1.0, "max": 1.02, "n": 3}


def test_gpu_preset_chats_have_the_configured_number_of_turns() -> None:
    low, high = tiny.PRESETS["qwen3-0.5b"].turns or (0, 0)
    for chat in tiny.make_conversations(50, tiny.SEED, (low, high)):
        users = [m for m in chat["messages"] if m["role"] == "user"]
        assert low <= len(users) <= high


def test_tiny_preset_keeps_the_original_assets() -> None:
    spec = tiny.PRESETS["tiny"]
    assert (spec.version, spec.model_config, spec.dtype, spec.turns) == ("tiny-v1", tiny.MODEL_CONFIG, "float32", None)
    assert tiny.default_cache_dir({"SWIFTSLURM_CACHE": "/c"}) == tiny.default_cache_dir(
        {"SWIFTSLURM_CACHE": "/c"}, "tiny"
    )
    assert tiny.default_cache_dir({"SWIFTSLURM_CACHE": "/c"}, "qwen3-0.5b").name == "qwen3-0.5b-v1"
    with pytest.raises(ValueError, match="unknown preset"):
        tiny.default_cache_dir({}, "huge")


def test_direct_costs_are_read_from_the_lines_swiftslurm_logs() -> None:
    trainer_log = f"Train: 100%|...| 60/60 {vote_cost_line(60, 0.0012, 0.00009)}\n"
    costs = gpu_common.direct_costs(trainer_log, wrapper_cost_line(0.4, 81.6))
    assert costs == {
        "vote_steps": 60,
        "vote_us_mean": 20,
        "vote_us_max": 90,
        "wrapper_cpu_s": 0.4,
        "wrapper_wall_s": 82,
    }
    assert gpu_common.direct_costs("no such lines") == {}


def test_commits_are_found_after_a_progress_bar_on_the_same_line() -> None:
    bar = "Train:  60%|██████    | 18/30 [00:24<00:07]"
    text = f"{bar}[swiftslurm] committed checkpoint-10\n[swiftslurm] committed checkpoint-20\n"
    assert gpu_common.committed_steps(text) == [10, 20]
