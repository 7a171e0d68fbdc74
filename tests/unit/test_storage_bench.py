"""The pure parts of bench/storage.py --training's inside view: which steps ran during an upload, and what they cost."""

from __future__ import annotations

import sys

import pytest

from tests.conftest import REPO

sys.path.insert(0, str(REPO / "bench"))

import storage as bench  # bench/storage.py: bench/ is not a package

W = bench.WARM_UP_STEPS


def test_steps_overlapping_an_upload_are_told_apart_and_warm_up_steps_left_out() -> None:
    # Steps of 1 s back to back: step N runs [N, N + 1). Uploads: inside step W+2, and across W+4 .. W+5.
    steps = [(n, float(n), float(n + 1)) for n in range(1, W + 8)]
    uploads = [(W + 2.25, W + 2.5), (W + 4.5, W + 5.5)]
    during, clear = bench.steps_by_uploads(steps, uploads)
    assert len(during) == 3 and len(clear) == 7 - 3  # W+2, W+4, W+5 overlap; W+1, W+3, W+6, W+7 do not
    touching = [(W + 1.0, W + 1.0)]  # ends where step W+1 begins: no time in common
    assert bench.steps_by_uploads(steps, touching) == ([], [1.0] * 7)


def run(during: list[float], clear: list[float], sync: str = "on") -> bench.TrainingRun:
    return bench.TrainingRun(sync, 0, 1.0, 1, 1.0, 1, 1, 1.0, 0.0, 0.0, during, clear)


def test_inside_view_compares_medians_within_each_run_and_prices_the_slower_steps() -> None:
    runs = [run([1.2, 1.2], [1.0] * 8), run([1.0], [1.0] * 9), run([], [1.0] * 10, sync="off")]
    inside = bench.inside_view(runs)
    assert inside["runs"] == 2 and inside["steps_during_uploads"] == 3 and inside["steps"] == 20
    assert inside["ratio_during_clear_per_run"] == pytest.approx([1.2, 1.0])
    # Run 1: 0.4 s added to 10 s of stepping that would have been without uploads: +4%.
    assert inside["added_to_stepping_per_run"] == pytest.approx([0.04, 0.0])
    assert bench.inside_view([run([], [1.0] * 10)]) == {}  # no step ran during an upload: nothing to compare
