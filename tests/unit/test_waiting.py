"""What `wait=true` says while it waits (swiftslurm/ops/waiting.py): each kind of wait named from the run dir
as the wrapper writes it (queue, start, restore with its bytes, model load, steps, saves, uploads), and the
narrator saying a new wait at once and an unchanged one again every REPEAT_S, never staying silent."""

from __future__ import annotations

import io
import json
from dataclasses import replace
from pathlib import Path

from swiftslurm.ops.runs import RunFacts
from swiftslurm.ops.waiting import REPEAT_S, Narrator, QueueSpot, waiting_for
from swiftslurm.rundir.records import write_status

FACTS = RunFacts(
    run_dir="",
    run_name="r",
    state="running",
    why="",
    job_id="7",
    slurm_state="RUNNING",
    attempts=0,
    attempt_reasons=(),
    committed_step=None,
    max_steps=None,
    loss=None,
    samples_per_s=None,
    goodput=None,
    storage=None,
)


def test_each_phase_of_an_attempt_is_named_with_its_progress(tmp_path: Path) -> None:
    here = tmp_path / "logs" / "7"
    here.mkdir(parents=True)
    queued = replace(FACTS, state="pending")
    assert waiting_for(tmp_path, queued) == "in the queue"
    spot = QueueSpot("Resources", 2, 3)
    assert waiting_for(tmp_path, queued, spot) == "in the queue (SLURM: Resources, 2 of 3 pending in its partition)"
    assert waiting_for(tmp_path, replace(FACTS, state="requeued"), QueueSpot("BeginTime")) == (
        "requeued, waiting to start again (SLURM: BeginTime)"
    )
    assert waiting_for(tmp_path, FACTS).startswith("starting on the nodes")  # no status.json yet
    write_status(tmp_path, "running", job_id="7", attempt="7", phase="agree_on_resume")
    assert waiting_for(tmp_path, FACTS) == "choosing the resume point"
    beat = {"doing": "downloading checkpoint-40 from s3://b/p/", "bytes": 3 << 30, "total": 12 << 30, "updated": 1.0}
    (here / "leader.json").write_text(json.dumps(beat))
    assert waiting_for(tmp_path, FACTS) == "restoring: downloading checkpoint-40 from s3://b/p/ (3.0 of 12.0 GiB)"
    write_status(tmp_path, "running", job_id="7", attempt="7", phase="train")
    assert waiting_for(tmp_path, FACTS) == "loading the model and data (no training step yet)"
    (here / "progress.json").write_text(json.dumps({"step": 26, "max_steps": 40, "phase": "step", "t": 2.0}))
    assert waiting_for(tmp_path, FACTS) == "training: step 26 of 40"
    (here / "progress.json").write_text(json.dumps({"step": 30, "max_steps": 40, "phase": "save", "t": 3.0}))
    assert waiting_for(tmp_path, FACTS) == "saving a checkpoint after step 30 of 40"
    write_status(tmp_path, "running", job_id="7", attempt="7", phase="finish_uploads")
    uploading = replace(FACTS, storage={"pending": [30, 40]})
    assert waiting_for(tmp_path, uploading) == "uploading: 2 checkpoint(s) still to upload"
    ended = replace(uploading, state="finished")  # the run's end is written before its last uploads
    assert waiting_for(tmp_path, ended) == "uploading: 2 checkpoint(s) still to upload"
    write_status(tmp_path, "finished", job_id="7", attempt="7", phase="done")
    assert waiting_for(tmp_path, ended) == "finished; waiting for the job to end"
    assert waiting_for(tmp_path, queued, QueueSpot("None", 1, 1)) == "in the queue (1 of 1 pending in its partition)"


def test_a_new_wait_is_said_at_once_and_an_unchanged_one_again_every_repeat_s() -> None:
    now = [0.0]
    out = io.StringIO()
    say = Narrator(out=out, clock=lambda: now[0])

    def lines() -> list[str]:
        return [line.split("  ", 1)[1] for line in out.getvalue().splitlines()]

    say("in the queue")
    now[0] = 5.0
    say("in the queue")  # unchanged, not yet REPEAT_S: silent
    say("loading the model and data (no training step yet)")  # a new kind: at once
    now[0] = 5.0 + REPEAT_S
    say("loading the model and data (no training step yet)")
    say("training: step 1 of 40")
    now[0] = 6.0 + REPEAT_S
    say("training: step 2 of 40")  # the same kind, new figures: held until REPEAT_S has passed
    now[0] = 5.0 + 3 * REPEAT_S
    say("training: step 9 of 40")
    assert lines() == [
        "in the queue",
        "loading the model and data (no training step yet)",
        f"still loading the model and data (no training step yet) ({REPEAT_S:.0f} s)",
        "training: step 1 of 40",
        "training: step 9 of 40",
    ]
