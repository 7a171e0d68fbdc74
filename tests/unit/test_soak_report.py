"""The soak's tables count each broken promise per run, and several campaigns' results files make one table."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

from tests.soak.soak import PROMISES, SeedResult, Trial, load_results, promise_broken, report


def test_each_finding_of_the_judge_names_the_promise_it_breaks() -> None:
    assert promise_broken("called finished without checkpoint-200 committed") == PROMISES[0]
    assert promise_broken("called finished with checkpoint-200 not uploaded") == PROMISES[0]
    assert promise_broken("4.r1 resumed from 20, newest commit 30") == PROMISES[1]
    assert promise_broken("attempts without a record: ['4.i2']") == PROMISES[2]
    assert promise_broken("ended FAILED, status failed at 30") == PROMISES[3]
    assert promise_broken("final weights of checkpoint-200 differ from the uninterrupted run's") == PROMISES[4]


def test_results_files_of_two_campaigns_make_one_table(tmp_path: Path) -> None:
    ok = SeedResult(1, "plain", "7", [Trial(1, "7", "kill", 0), Trial(1, "7.i1", "last-save", 10)])
    bad = SeedResult(2, "storage", "8", [Trial(2, "8", "signal", 0)], ["attempts without a record: ['8']"])
    for name, result in (("a.json", ok), ("b.json", bad)):
        (tmp_path / name).write_text(json.dumps({"args": {}, "seeds": [asdict(result)]}))
    results = [r for name in ("a.json", "b.json") for r in load_results(tmp_path / name)]
    assert results == [ok, bad]
    text = report(results)
    assert "ended without a record 1," in text and "lost committed steps 0," in text
    assert text.endswith("trials 3, seeds 2, divergences 1, corrupt 0")
