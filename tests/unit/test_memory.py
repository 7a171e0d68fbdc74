"""The memory planner (swiftslurm/planning/memory.py, memory_plan.py): hand-computed cases, DeepSpeed's own estimate of
the model states, the refusal of a plan that cannot fit, the narrow-fit warning and `swiftslurm advise`."""

from __future__ import annotations

from pathlib import Path

import pytest

from swiftslurm import tiny
from swiftslurm.errors import ConfigError
from swiftslurm.planning import memory, memory_plan
from swiftslurm.planning.memory import GIB, ModelShape, Setup
from tests.conftest import compose_config, plan_for

QWEN3_1_6B = ModelShape.from_config(tiny.PRESETS["qwen3-1.6b"].model_config | {"vocab_size": 813})


REPO = Path(__file__).resolve().parents[2]


def test_parameter_count_of_the_1_6b_preset_by_hand() -> None:
    layer = 2048 * (2 * 2048 + 2 * 1024) + 3 * 2048 * 6144 + 2 * 2048  # q,k,v,o + gate,up,down + two norms
    assert QWEN3_1_6B.params() == 32 * layer + 813 * 2048 + 2048  # tied embedding, final norm


@pytest.mark.parametrize(
    "model", ["qwen2.5-7b-instruct", "qwen2.5-72b-instruct", "qwen3-8b", "qwen3-32b", "qwen3-30b-a3b"]
)
def test_shipped_shapes_give_the_conf_parameter_counts(model: str) -> None:
    cfg = compose_config(f"model={model}")
    shape = memory_plan.shape_of(cfg)
    assert shape is not None and shape.params() / 1e9 == pytest.approx(cfg.model.params_b, rel=0.03)


def test_ddp_full_fine_tune_keeps_bf16_weights_grads_and_adam_moments() -> None:
    p = QWEN3_1_6B.params()
    weights, grads, optim, _ = memory.model_states(QWEN3_1_6B, Setup(engine="ddp", full=True))
    assert (weights, grads, optim) == (2 * p, 2 * p, 4 * p)


def test_activations_by_hand_with_and_without_checkpointing() -> None:
    tokens, s = 4 * 512, ModelShape(hidden=64, intermediate=128, layers=2, heads=4, kv_heads=2, head_dim=16, vocab=100)
    per_layer = (16 * 64 + 8 * 128 + 10 * (64 + 32) + 12 * 64) * tokens  # LoRA
    logits = tokens * 100 * 10
    plain = Setup(engine="ddp", micro_batch=4, max_length=512, gradient_checkpointing=False)
    assert memory.activations(s, plain) == 2 * per_layer + logits
    checkpointed = Setup(engine="ddp", micro_batch=4, max_length=512)
    assert memory.activations(s, checkpointed) == 2 * 2 * 64 * tokens + 1.5 * per_layer + logits


DATA = "dataset=[AI-ModelScope/alpaca-gpt4-data-en]"  # a real model needs its dataset named


def test_a_plan_that_cannot_fit_is_refused_naming_what_fits() -> None:
    with pytest.raises(ConfigError, match="cannot fit") as refused:
        plan_for("+cluster=a100x8", "model=qwen2.5-72b-instruct", DATA, "strategy=zero2", "strategy.tuner_type=full")
    assert "HINT: use strategy=zero3_offload" in str(refused.value)


def test_a_narrow_fit_warns_and_a_roomy_one_does_not() -> None:
    overrides = ("+cluster=a100x8", "model=qwen3-8b", DATA, "strategy=zero3", "strategy.tuner_type=full")
    cfg = compose_config(*overrides)
    need = memory_plan.plan_estimate(cfg, memory_plan.shape_of(cfg)).gib()  # type: ignore[arg-type]
    assert memory_plan.narrow_fit_warning(cfg) is None
    narrow = compose_config(*overrides, f"cluster.gpu_memory_gib={need / 0.95:.1f}")
    plan_for(*overrides, f"cluster.gpu_memory_gib={need / 0.95:.1f}")  # fits: planned
    assert "fits narrowly" in (memory_plan.narrow_fit_warning(narrow) or "")


def test_cpu_plans_and_unknown_models_are_not_checked() -> None:
    assert memory_plan.memory_line(compose_config()).startswith("memory   (CPU training")
    plan_for("+cluster=a100x8", "model.id=org/unknown-model", DATA)  # no shape: no refusal
    assert "no estimate" in memory_plan.memory_line(compose_config("+cluster=a100x8", "model.id=org/unknown"))


def test_estimate_is_within_twelve_percent_of_the_h200_measurements() -> None:
    """The calibration of docs/memory.md, recomputed: torch's peak allocated vs. the estimate less overhead, for
    every strategy whose model states dominate (fitted runs and the held-out one)."""
    import json
    import re

    cases = {
        "ddp": {"full": True},
        "lora": {},
        "zero2": {"engine": "deepspeed", "deepspeed": "zero2", "full": True},
        "zero3": {"engine": "deepspeed", "deepspeed": "zero3", "full": True},
        "fsdp2": {"engine": "fsdp", "full": True},
    }
    checked = 0
    for path in sorted((REPO / "bench" / "results").glob("gpu-memory-qwen3-*.json")):
        report = json.loads(path.read_text())
        shape = ModelShape.from_config(report["model_config"])
        for r in (r for r in report["results"] if r["case"] in cases and r["ok"]):
            rank = re.search(r"--lora_rank (\d+)", r["swift_argv"])
            setup = Setup(
                **({"engine": "ddp"} | cases[r["case"]]),
                lora_rank=int(rank.group(1)) if rank else 8,
                micro_batch=r["micro_batch"],
                max_length=r["max_length"],
            )
            est = memory.estimate(shape, setup)
            assert (est.total - est.overhead) / GIB == pytest.approx(r["allocated_gib"], rel=0.12), (path.name, r)
            checked += 1
    assert checked >= 25


@pytest.mark.parametrize("args", [[], ["+cluster=local-slurm", "model=qwen3-8b"]], ids=["default", "cpu slurm"])
def test_advise_on_a_cpu_plan_says_there_is_nothing_to_advise(
    args: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    """It said `0 GPU(s) of ? GiB` and `fits` for every strategy: there is no GPU memory to compare."""
    from swiftslurm.ops import advise

    assert advise.main(args) == 0
    [line] = capsys.readouterr().out.splitlines()
    assert line.startswith("nothing to advise:") and "gpus_per_node=0" in line, line
