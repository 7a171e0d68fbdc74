"""rundir/jsonio: whole-or-absent writes, dict-or-None reads, required reads that name the file, JSONL lines."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from swiftslurm.errors import UnreadableJson
from swiftslurm.plan import BatchPlan, PlanGlance
from swiftslurm.rundir.jsonio import (
    append_jsonl,
    peek_json,
    read_json,
    read_json_required,
    read_jsonl,
    write_json_atomic,
    write_text_atomic,
)
from swiftslurm.rundir.records import CONCLUDED_KEYS, AttemptRecord, append_attempt, read_attempts


@pytest.mark.parametrize(
    ("text", "expected"),
    [(None, None), ('{"a": 1', None), ("[1, 2]", None), ("", None), ('{"a": 1}', {"a": 1})],
    ids=["missing", "torn", "not-an-object", "empty", "whole"],
)
def test_read_json_is_a_dict_or_none(tmp_path: Path, text: str | None, expected: dict[str, int] | None) -> None:
    path = tmp_path / "f.json"
    if text is not None:
        path.write_text(text)
    assert read_json(path) == expected
    assert peek_json(path) == expected


def test_peek_json_is_none_where_read_json_raises(tmp_path: Path) -> None:
    """A folder in the file's place (an unreadable file): a poll sees nothing yet, a plain read says so."""
    (tmp_path / "f.json").mkdir()
    assert peek_json(tmp_path / "f.json") is None
    with pytest.raises(IsADirectoryError):
        read_json(tmp_path / "f.json")


def test_a_required_file_that_is_missing_or_torn_names_the_file_and_the_fix(tmp_path: Path) -> None:
    path = tmp_path / "plan.json"
    with pytest.raises(UnreadableJson, match=rf"{re.escape(str(path))} cannot be read.*HINT: re-plan"):
        read_json_required(path, "re-plan")
    path.write_text('{"run_name": ')
    with pytest.raises(UnreadableJson, match=rf"{re.escape(str(path))} is not a whole JSON object.*HINT: re-plan"):
        read_json_required(path, "re-plan")
    path.write_text('{"run_name": "r"}')
    assert read_json_required(path, "re-plan") == {"run_name": "r"}


def test_an_atomic_write_leaves_no_temp_file_and_replaces_the_old_one(tmp_path: Path) -> None:
    path = tmp_path / "status.json"
    write_json_atomic(path, {"state": "running"})
    write_json_atomic(path, {"state": "finished"}, durable=False)
    write_text_atomic(tmp_path / "x.txt", "text")
    assert json.loads(path.read_text()) == {"state": "finished"}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["status.json", "x.txt"]


def test_a_failed_atomic_write_keeps_the_old_file_and_no_temp_file(tmp_path: Path) -> None:
    path = tmp_path / "status.json"
    write_json_atomic(path, {"state": "running"})
    with pytest.raises(TypeError):
        write_json_atomic(path, {"state": object()})
    assert read_json(path) == {"state": "running"}
    assert [p.name for p in tmp_path.iterdir()] == ["status.json"]


def test_jsonl_lines_append_and_a_torn_or_foreign_line_is_skipped(tmp_path: Path) -> None:
    path = tmp_path / "a.jsonl"
    assert read_jsonl(path) == []
    append_jsonl(path, [{"n": 1}, {"n": 2}])
    append_jsonl(path, [])
    with path.open("a") as out:
        out.write('[3]\n{"n": 4}\n{"n": 5, "to')
    assert read_jsonl(path) == [{"n": 1}, {"n": 2}, {"n": 4}]


def test_attempt_rows_of_earlier_versions_still_read(tmp_path: Path) -> None:
    """A row from before phases and node counts were recorded, and one with a key this version does not know."""
    rows = [
        {"attempt": "7", "job_id": "7", "reason": "preempted", "decision": "requeue", "signals": [["SIGUSR2", 5.0]]},
        {"attempt": "7.r1", "reason": "finished", "decision": "done", "progressed": True, "gpu_hours": 3.5},
    ]
    (tmp_path / "attempts.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    old, newer = read_attempts(tmp_path)
    assert (old.attempt, old.reason, old.signals, old.phases, old.nodes, old.progressed) == (
        "7",
        "preempted",
        (("SIGUSR2", 5.0),),
        None,
        None,
        None,
    )
    assert newer.progressed and newer.extra == {"gpu_hours": 3.5}
    hand_written = AttemptRecord.from_dict({"attempt": 8, "hosts": None, "progressed": None, "end": None})
    assert (hand_written.attempt, hand_written.hosts, hand_written.progressed) == ("8", (), None)
    assert newer.as_dict()["gpu_hours"] == 3.5  # kept if the row is written again


def test_a_concluded_attempts_row_shows_every_fact_and_the_node_counts_only_of_a_run_that_may_shrink(
    tmp_path: Path,
) -> None:
    append_attempt(tmp_path, AttemptRecord("7", "7", hosts=("a",), reason="finished", keep_keys=CONCLUDED_KEYS))
    append_attempt(tmp_path, AttemptRecord("7.r1", "7", reason="finished", nodes=2, keep_keys=CONCLUDED_KEYS))
    fixed, shrinking = (json.loads(line) for line in (tmp_path / "attempts.jsonl").read_text().splitlines())
    assert fixed["hosts"] == ["a"] and fixed["failed_host"] is None and fixed["rejected"] == []
    assert set(fixed) == set(CONCLUDED_KEYS) and list(fixed) == sorted(fixed)
    assert set(shrinking) == {*CONCLUDED_KEYS, "nodes"}


def test_a_row_holds_the_facts_it_has_and_one_read_back_is_written_with_the_keys_it_had(tmp_path: Path) -> None:
    append_attempt(tmp_path, AttemptRecord("5", "5", start=1.0, progressed=False, reason="infra"))
    row = '{"attempt": "6", "end": null, "hosts": [], "start": 2.0, "unknown": 1}'
    with (tmp_path / "attempts.jsonl").open("a") as out:
        out.write(row + "\n")
    sparse, old = read_attempts(tmp_path)
    assert sparse.as_dict() == {"attempt": "5", "job_id": "5", "progressed": False, "reason": "infra", "start": 1.0}
    assert json.loads(json.dumps(old.as_dict())) == json.loads(row)


def test_the_plan_glance_reads_what_a_plan_has_and_refuses_only_when_asked_to(tmp_path: Path) -> None:
    assert PlanGlance.read(tmp_path) == PlanGlance()  # no plan.json: nothing to show
    (tmp_path / "plan.json").write_text('{"version": 1, "run_name": ')
    assert PlanGlance.read(tmp_path) == PlanGlance()
    with pytest.raises(UnreadableJson, match=r"plan\.json is not a whole JSON object"):
        PlanGlance.read_required(tmp_path)
    batch = {"micro": 2, "grad_accum": 4, "data_parallel": 3}
    (tmp_path / "plan.json").write_text(json.dumps({"version": 0, "run_name": "old", "batch": batch}))
    glance = PlanGlance.read(tmp_path)
    assert (glance.run_name, glance.batch, glance.devices_per_node()) == ("old", BatchPlan(2, 4, 3), (1, "CPU process"))
    assert glance.batch is not None and glance.batch.global_ == 24
    (tmp_path / "plan.json").write_text(json.dumps({"batch": {"micro": 2}, "topology": {"gpus_per_node": 8}}))
    assert (PlanGlance.read(tmp_path).batch, PlanGlance.read(tmp_path).devices_per_node()) == (None, (8, "GPU"))
