"""tests/gpu/gpu_megatron.py's overhead bench: the arms' commands and the per-iteration pace it reads back."""

from __future__ import annotations

import pytest

from tests.gpu.gpu_megatron import ENGINE, WARM_ITERATIONS, arm_argv, iteration_durations, pair_ratios, side_by_side


def progress_row(iteration: int, last: int, pace: float) -> dict[str, object]:
    return {"loss": 1.0, "iteration": f"{iteration}/{last}", "train_speed(s/it)": pace}


def test_iteration_durations_undo_the_running_mean():
    # iteration 1 took 10 s (warm-up), then 0.5, 0.5, 1.0
    elapsed = [10.0, 10.5, 11.0, 12.0]
    rows = [progress_row(k, 4, t / k) for k, t in enumerate(elapsed, start=1)]
    assert iteration_durations(rows) == [(2, pytest.approx(0.5)), (3, pytest.approx(0.5)), (4, pytest.approx(1.0))]


def test_iteration_durations_start_again_where_iterations_go_back():
    # a trainer run from 1 to 6, then one resumed from checkpoint 4: its pace counts from its own train begin;
    # an evaluation's row has no pace
    first = [progress_row(k, 10, 1.0) for k in range(1, 7)]
    resumed = [progress_row(5, 10, 8.0), progress_row(6, 10, 4.25), progress_row(7, 10, 3.0)]
    assert [d for _, d in iteration_durations([*first, {"eval_loss": 2.0}, *resumed])] == pytest.approx([0.5, 0.5])


def test_arms_differ_in_swiftslurm_parts_only():
    plugin = str(ENGINE.plugin)
    plan = ["megatron", "sft", "--lr", "1e-4", "--callbacks", *ENGINE.callbacks]
    plan += ["--external_plugins", "/b/timer.py", plugin, "--train_iters", "40"]
    assert arm_argv(plan, "callbacks") == plan
    direct = arm_argv(plan, "direct")
    assert direct == ["megatron", "sft", "--lr", "1e-4", "--external_plugins", "/b/timer.py", "--train_iters", "40"]
    assert arm_argv(plan, "plugin") == [*direct[:5], plugin, *direct[5:]]
    no_timer = ["megatron", "sft", "--callbacks", *ENGINE.callbacks, "--external_plugins", plugin]
    assert arm_argv(no_timer, "plugin") == ["megatron", "sft", "--external_plugins", plugin]


def test_pair_ratios_compare_within_each_pair():
    rows = [
        {"pair": -1, "arm": "warmup", "it_per_s": 1.0, "steady_it_per_s": 1.0},
        {"pair": 0, "arm": "swiftslurm", "it_per_s": 1.8, "steady_it_per_s": 2.0},
        {"pair": 0, "arm": "direct", "it_per_s": 2.0, "steady_it_per_s": 2.0},
        {"pair": 0, "arm": "plugin", "it_per_s": 5.0, "steady_it_per_s": 5.0},
        {"pair": 1, "arm": "direct", "it_per_s": 1.0, "steady_it_per_s": None},
        {"pair": 1, "arm": "swiftslurm", "it_per_s": 1.0, "steady_it_per_s": 1.0},
    ]
    summary = pair_ratios(rows)
    assert summary["it_per_s"]["ratios"] == [0.9, 1.0]
    assert summary["steady_it_per_s"]["ratios"] == [1.0]


def test_side_by_side_compares_only_the_seconds_both_arms_trained():
    # direct starts training at t=100 and runs alone at 0.2 s an iteration until swiftslurm's first steps;
    # from t=110 both share the GPU: direct 0.5 s, swiftslurm 0.55 s an iteration; direct ends first
    direct = {k: 100 + 0.2 * k for k in range(1, 51)}  # 1..50 alone, to t=110
    direct |= {k: 110 + 0.5 * (k - 50) for k in range(51, 121)}  # to t=145
    wrapped = {k: 110 + 0.55 * k for k in range(1, 101)}  # t=110.55 .. 165, alone after 145
    pair = [
        {"pair": 0, "arm": "swiftslurm", "call_times": {"ends": {str(k): t for k, t in wrapped.items()}}},
        {"pair": 0, "arm": "direct", "call_times": {"ends": {str(k): t for k, t in direct.items()}}},
    ]
    side_by_side(pair)
    assert pair[0]["overlap_it_per_s"] == pytest.approx(1 / 0.55, abs=1e-4)  # not its faster solo tail
    assert pair[1]["overlap_it_per_s"] == pytest.approx(1 / 0.5, abs=1e-4)  # not its 0.2 s solo start
    lo = wrapped[1 + WARM_ITERATIONS]
    assert pair[0]["overlap_s"] == pytest.approx(direct[119] - lo, abs=0.1)
    assert pair_ratios(pair)["overlap_it_per_s"]["ratios"] == [round(0.5 / 0.55, 4)]
    side_by_side(none := [{"call_times": None}, {"call_times": {"ends": {}}}])  # a failed arm: no figure
    assert "overlap_it_per_s" not in none[0] and "overlap_it_per_s" not in none[1]


def test_phase_paces_compare_blocks_of_one_run(monkeypatch):
    import importlib
    import sys
    import types

    from tests.gpu.gpu_megatron import phase_paces

    # the plugin patches Megatron-SWIFT's trainer at import (megatron-core is on the GPU machines only)
    trainer_module = types.ModuleType("swift.megatron.trainers.base")
    trainer_module.BaseMegatronTrainer = type("BaseMegatronTrainer", (), {})  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "swift.megatron.trainers.base", trainer_module)
    monkeypatch.delitem(sys.modules, "tests.gpu.megatron_call_timer", raising=False)
    phase_of = importlib.import_module("tests.gpu.megatron_call_timer").phase_of

    phases = {k: phase_of(k, block=3) for k in range(1, 33)}
    assert [phases[k] for k in range(1, 22)] == [0] * 8 + [0, 0, 0, 1, 1, 1, 2, 2, 2, 3, 3, 3, 0]
    # phase 1 iterations take 10 % longer; the first of each block (the switch) is left out
    durations = [
        (k, 0.3 * (1.1 if phases[k] == 1 else 1.0) + (5.0 if phases[k] != phases.get(k - 1) else 0.0))
        for k in range(2, 33)
    ]
    paces = phase_paces(durations, phases)
    assert paces["all on"]["median_s"] == pytest.approx(0.3)
    assert paces["wrapper stopped"]["pace_vs_all_on"] == pytest.approx(1 / 1.1, abs=1e-4)
    assert paces["both"]["pace_vs_all_on"] == pytest.approx(1.0)
    assert paces["wrapper stopped"]["iterations"] == 4  # blocks at 12-14 and 24-26, first ones left out
