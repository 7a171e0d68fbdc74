"""The pure parts of bench/storage.py: --training's inside view (which steps ran during an upload, and what they
cost), and how the swiftslurm client's process is started."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench import storage as bench

W = bench.WARM_UP_STEPS


def test_steps_overlapping_an_upload_are_told_apart_and_warm_up_steps_left_out() -> None:
    # Steps of 1 s back to back: step N runs [N, N + 1). Uploads: inside step W+2, and across W+4 .. W+5.
    steps = [(n, float(n), float(n + 1)) for n in range(1, W + 8)]
    uploads = [(W + 2.25, W + 2.5), (W + 4.5, W + 5.5)]
    during, clear = bench.steps_by_uploads(steps, uploads)
    assert len(during) == 3 and len(clear) == 7 - 3  # W+2, W+4, W+5 overlap; W+1, W+3, W+6, W+7 do not
    touching = [(W + 1.0, W + 1.0)]  # ends where step W+1 begins: no time in common
    assert bench.steps_by_uploads(steps, touching) == ([], [1.0] * 7)


def steps_of(seconds: list[float]) -> list[tuple[int, float, float]]:
    """Steps back to back after `WARM_UP_STEPS` warm-up steps of 1 s, each taking its ``seconds``."""
    steps, at = [], 0.0
    for step, took in enumerate([1.0] * W + seconds, start=1):
        steps.append((step, at, at + took))
        at += took
    return steps


def run(sync: str, repeat: int, seconds: list[float], uploads: list[tuple[float, float]]) -> bench.TrainingRun:
    return bench.TrainingRun(sync, repeat, 1.0, 1, 1.0, 1, 1, 1.0, 0.0, 0.0, steps_of(seconds), uploads)


def test_inside_view_compares_steps_during_uploads_with_clear_ones_and_controls_with_the_off_runs() -> None:
    # Sync on: steps W+1, W+2 of 1.2 s ran during the upload, eight of 1 s did not: 0.4 s added to 10 s.
    upload = [(W + 0.1, W + 2.3)]
    on = run("on", 0, [1.2, 1.2] + [1.0] * 8, upload)
    off = run("off", 0, [1.0] * 10, [])  # split by the on run's upload: no difference, as it must be
    inside = bench.inside_view([on, off])
    assert inside["sync_on"]["steps_during_uploads"] == 2 and inside["sync_on"]["steps"] == 10
    assert inside["sync_on"]["ratio_during_clear_per_run"] == pytest.approx([1.2])
    assert inside["sync_on"]["added_to_stepping_per_run"] == pytest.approx([0.04])
    assert inside["control"]["steps_during_uploads"] == 3  # the 1 s steps W+1..W+3 overlap that time span
    assert inside["control"]["ratio_during_clear_per_run"] == pytest.approx([1.0])
    assert inside["control"]["added_to_stepping_per_run"] == pytest.approx([0.0])
    assert bench.inside_view([run("on", 0, [1.0] * 10, [])]) == {}  # no step ran during an upload


def test_the_swiftslurm_client_runs_this_module_as_deployed(tmp_path: Path) -> None:
    setting = bench.Setting(tmp_path, tmp_path, tmp_path, {"PYTHONPATH": str(tmp_path), "HOME": "/h"}, ())
    assert "PYTHONPATH" not in bench.env_for(setting)
    argv = bench.client_argv("swiftslurm", "upload", "http://s3", "p", tmp_path, setting)
    assert argv[1:4] == ["-m", "bench.storage", "--as-client"]
