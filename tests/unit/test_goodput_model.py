"""bench/goodput_model.py: the projection of the committed-training share under scheduled faults."""

from __future__ import annotations

import pytest

from bench.goodput_model import Costs, Settings, best_save_every, crash_cost, preemption_cost, project, relaunch_budget

COSTS = Costs(startup_s=10, restore_s=1, load_s=20, requeue_s=2, crash_restart_s=5, stop_save_s=3, save_s=1, finish_s=4)
HOUR = 3600.0


def test_the_categories_fill_the_horizon_exactly() -> None:
    settings = Settings(save_every_s=99, preempt_every_s=1800, crash_every_s=3600)
    projection = project(COSTS, settings, HOUR)
    assert sum(projection.spent_s.values()) == pytest.approx(HOUR)
    # 2 preemptions (stop save, requeue, relaunch) and 1 crash in place (half an interval lost, no start-up).
    assert projection.spent_s["startup"] == pytest.approx(2 * 10)
    assert projection.spent_s["lost"] == pytest.approx(99 / 2)
    assert projection.spent_s["restart"] == pytest.approx(2 * 2 + 5)
    left = HOUR - 2 * (3 + 2 + 31) - (49.5 + 5 + 1 + 20) - 4
    assert projection.spent_s["committed"] == pytest.approx(left * 99 / 100)
    assert projection.share == pytest.approx(left * 0.99 / HOUR)


def test_without_faults_only_the_saves_cost() -> None:
    settings = Settings(save_every_s=9, preempt_every_s=float("inf"), crash_every_s=float("inf"))
    no_once = Costs(**{**vars(COSTS), "finish_s": 0.0})
    assert project(no_once, settings, HOUR).share == pytest.approx(0.9)


def test_a_crash_restarted_in_place_skips_the_new_job_runs_start_up() -> None:
    in_place = Settings(save_every_s=100, preempt_every_s=1800, crash_every_s=3600)
    requeued = Settings(save_every_s=100, preempt_every_s=1800, crash_every_s=3600, restart_in_place=False)
    assert "startup" not in crash_cost(COSTS, in_place)
    assert crash_cost(COSTS, requeued)["startup"] == 10
    assert sum(crash_cost(COSTS, requeued).values()) - sum(crash_cost(COSTS, in_place).values()) == 10 + 2
    assert project(COSTS, in_place, HOUR).share > project(COSTS, requeued, HOUR).share


def test_a_warning_shorter_than_the_stop_save_loses_half_a_save_interval() -> None:
    warned = Settings(save_every_s=100, preempt_every_s=1800, crash_every_s=3600)
    short = Settings(save_every_s=100, preempt_every_s=1800, crash_every_s=3600, warned=False, lead_s=1)
    assert preemption_cost(COSTS, warned)["save"] == 3 and "lost" not in preemption_cost(COSTS, warned)
    assert preemption_cost(COSTS, short)["lost"] == 50 + 1
    assert project(COSTS, short, HOUR).share < project(COSTS, warned, HOUR).share


def test_the_best_save_interval_balances_saves_against_lost_training() -> None:
    settings = Settings(save_every_s=1, preempt_every_s=1800, crash_every_s=3600)
    best = best_save_every(COSTS, settings, HOUR, [5.0, 20.0, 85.0, 300.0, 1200.0])
    assert best == 85.0  # Young's interval: sqrt(2 × save 1 s × crash every 3600 s) = 85 s


def test_the_relaunch_budget_is_where_the_share_meets_the_target() -> None:
    settings = Settings(save_every_s=85, preempt_every_s=1800, crash_every_s=3600)
    budget = relaunch_budget(COSTS, settings, HOUR, 0.95)
    startup_part = 10 / 30
    at = Costs(**{**vars(COSTS), "startup_s": budget * startup_part, "load_s": budget * (1 - startup_part)})
    assert project(at, settings, HOUR).share == pytest.approx(0.95)
    assert relaunch_budget(COSTS, settings, HOUR, 0.9999) < 0  # the saves alone cost more than that
