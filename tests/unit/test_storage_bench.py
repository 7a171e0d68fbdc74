"""The pure parts of bench/storage.py --training's inside view: which steps ran during an upload, and what they cost."""

from __future__ import annotations

import sys
from pathlib import Path

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


def sample(direction: str, client: str, repeat: int, seconds: float, sync_s: float = 0.0) -> bench.Sample:
    return bench.Sample("seaweedfs", direction, client, repeat, seconds, 10**9, 1.0, 1.0, seconds, sync_s)


def test_awscrt_comparison_pairs_each_repeat_and_counts_restores_until_on_disk() -> None:
    # Upload: swiftslurm 1 GB in 2, 4, 5 s (500, 250, 200 MB/s); awscrt in 4, 4, 4 s (250). Restores: both 1 s,
    # but awscrt's bytes reached the disk only 1 s later (a sync after it): durable 500 against 1000 MB/s.
    samples = [sample("upload", "swiftslurm", r, s) for r, s in enumerate([2.0, 4.0, 5.0])]
    samples += [sample("upload", "awscrt", r, 4.0) for r in range(3)]
    samples += [sample("restore", "swiftslurm", r, 1.0) for r in range(3)]
    samples += [sample("restore", "awscrt", r, 1.0, sync_s=1.0) for r in range(3)]
    samples += [sample("upload", "s5cmd", 0, 1.0)]  # other clients do not take part
    upload, restore = bench.against_awscrt(samples)
    assert (upload["direction"], upload["rate"]) == ("upload", "mb_s")
    assert upload["swiftslurm_mb_s"] == pytest.approx([200, 250, 500])
    assert upload["ratio_of_medians"] == pytest.approx(1.0)
    assert upload["pair_ratios"]["each"] == pytest.approx([2.0, 1.0, 0.8])
    assert [upload["pair_ratios"][k] for k in ("min", "median", "max")] == pytest.approx([0.8, 1.0, 2.0])
    assert restore["rate"] == "durable_mb_s" and restore["ratio_of_medians"] == pytest.approx(2.0)
    assert "| 2.00 | 2.00 / 2.00 / 2.00 |" in bench.comparison_table([upload, restore])
    assert bench.against_awscrt([s for s in samples if s.client != "awscrt"]) == []


def test_only_the_awscrt_client_has_awscrt_on_its_path(tmp_path: Path) -> None:
    crt_lib = tmp_path / "crt"
    (crt_lib / "awscrt").mkdir(parents=True)
    setting = bench.Setting(crt_lib, crt_lib, crt_lib, {"PYTHONPATH": str(crt_lib), "HOME": "/h"}, (), crt_lib)
    assert "PYTHONPATH" not in bench.env_for("swiftslurm", setting)  # botocore would sign with the CRT
    assert bench.env_for("awscrt", setting)["PYTHONPATH"] == str(crt_lib)
    with pytest.raises(RuntimeError, match=r"install_clients\.sh"):
        bench.env_for("awscrt", bench.Setting(crt_lib, crt_lib, crt_lib, {}, (), crt_lib / "missing"))
