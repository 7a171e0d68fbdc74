"""What `status` shows: every state documented, dry-run dirs `planned`, runs sharing a name told apart."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from swiftslurm.node import conclude, decide
from swiftslurm.ops import status
from swiftslurm.ops.runs import STATES, gather
from swiftslurm.rundir import records
from swiftslurm.rundir.records import record_submission

DOCS = Path(__file__).resolve().parents[2] / "docs" / "operations.md"


def write_plan(run_dir: Path, run_name: str) -> None:
    run_dir.mkdir(parents=True)
    (run_dir / "plan.json").write_text(json.dumps({"run_name": run_name}))


def documented_states() -> set[str]:
    """The backquoted words of the **state** bullet of docs/operations.md."""
    bullet = re.search(r"^- \*\*state\*\*:(.*?)(?=^- |\Z)", DOCS.read_text(), re.M | re.S)
    assert bullet is not None, "docs/operations.md lost its **state** bullet"
    return set(re.findall(r"`([a-z-]+)`", bullet.group(1)))


def test_every_state_status_can_show_is_documented_and_no_other() -> None:
    assert documented_states() == set(STATES)


@pytest.mark.parametrize("action", list(decide.Action))
@pytest.mark.parametrize("cancelled", [False, True])
def test_every_state_the_node_side_records_is_one_status_knows(action: decide.Action, cancelled: bool) -> None:
    assert conclude._state(decide.Decision(action, decide.Reason.FINISHED, ""), cancelled) in STATES


def test_a_dry_run_dir_is_planned_with_the_way_to_submit_it(tmp_path: Path) -> None:
    write_plan(tmp_path / "run", "tiny")
    facts = gather(tmp_path / "run")
    assert facts.state == "planned" and "dry_run" in facts.why


def test_runs_sharing_a_name_are_told_apart_by_their_run_dir(tmp_path: Path) -> None:
    for folder in ("a", "b", "c"):
        write_plan(tmp_path / "runs" / folder, "same")
        records.write_status(tmp_path / "runs" / folder, "finished", why="done")
        record_submission(tmp_path / "runs" / folder, "1", "slurm")
    write_plan(tmp_path / "runs" / "d", "other")
    facts, _ = status.collect(tmp_path / "runs", use_slurm=False)
    first_column = [line.split()[0] for line in status.render(facts, None, tmp_path / "runs").splitlines()[1:5]]
    assert first_column == ["a", "b", "c", "other"]


@pytest.mark.parametrize(("pending", "shown"), [([10, 20], True), ([10], False), ([], False)])
def test_a_finished_run_whose_last_checkpoint_waits_for_its_upload_shows_why(
    tmp_path: Path, pending: list[int], shown: bool
) -> None:
    from swiftslurm.ckpt.checkpoint import commit

    run_dir = tmp_path / "run"
    write_plan(run_dir, "tiny")
    for step in (10, 20):
        (folder := run_dir / "output" / f"checkpoint-{step}").mkdir(parents=True)
        (folder / "adapter_model.safetensors").write_bytes(b"weights")
        commit(folder, world_size=1, swift_version="4.6.0", last_step=20)
    records.write_status(run_dir, "finished", why="done, but checkpoint-20, the last, is not uploaded")
    (run_dir / "sync.json").write_text(json.dumps({"remote": [], "pending": pending}))
    facts, _ = status.collect(run_dir, use_slurm=False)
    assert ("tiny: done, but checkpoint-20, the last, is not uploaded" in status.render(facts, None)) is shown
