"""What "finished" means (issue 25, item 1): a committed checkpoint of the run's last step, whatever the trainer
says; ms-swift's end-of-training summary counts only when nothing is ever saved (`save_strategy=no`). A final
commit that fails makes the trainer fail instead of ending as if its result were committed."""

from __future__ import annotations

import errno
import json
from pathlib import Path
from typing import Any

import pytest

from swiftslurm.ckpt import checkpoint as ck
from swiftslurm.engines import hooks
from swiftslurm.engines.hf import HfTrainerEngine
from swiftslurm.engines.hooks import Committer
from swiftslurm.engines.megatron import MegatronEngine
from swiftslurm.errors import CommitFailed
from swiftslurm.rundir.layout import METRICS

SUMMARY = {"train_runtime": 30.2, "train_loss": 6.3, "global_step/max_steps": "40/40"}
STOPPED_EARLY = {"train_runtime": 30.2, "train_loss": 6.3, "global_step/max_steps": "27/40"}  # a graceful stop
NO_SAVES = ("--max_steps", "40", "--save_strategy", "no")


def checkpoint(output: Path, step: int, committed: bool, last_step: int = 40) -> Path:
    folder = output / f"checkpoint-{step}"
    folder.mkdir(parents=True)
    (folder / "adapter_model.safetensors").write_bytes(b"weights")
    if committed:
        ck.commit(folder, world_size=1, swift_version="4.6.0", last_step=last_step)
    return folder


def summary(output: Path, line: dict[str, Any]) -> None:
    output.mkdir(parents=True, exist_ok=True)
    with open(output / METRICS, "a") as log:
        log.write(json.dumps({"loss": 6.4, "global_step/max_steps": line["global_step/max_steps"]}) + "\n")
        log.write(json.dumps(line) + "\n")


@pytest.mark.parametrize(
    ("logged", "checkpoints", "argv", "finished"),
    [
        # The summary comes before on_train_end joins the last commit: a commit that failed, or was killed, leaves
        # the summary and no committed last step.
        (SUMMARY, [], (), False),
        (SUMMARY, [(40, False)], (), False),
        (SUMMARY, [(30, True), (40, False)], (), False),
        (SUMMARY, [(30, True), (40, True)], (), True),
        (None, [(40, True)], (), True),  # killed after the commit, before the summary: nothing is lost
        (None, [(30, True)], (), False),
        # Nothing is ever saved: the summary is all there is.
        (SUMMARY, [], NO_SAVES, True),
        (STOPPED_EARLY, [], NO_SAVES, False),
        (None, [], NO_SAVES, False),
        (SUMMARY, [], ("--save_strategy", "steps"), False),
    ],
    ids=[
        "summary-no-checkpoint",
        "summary-last-uncommitted",
        "summary-older-committed",
        "summary-last-committed",
        "last-committed-no-summary",
        "older-committed-only",
        "no-saves-summary",
        "no-saves-stopped-early",
        "no-saves-nothing",
        "steps-summary-no-checkpoint",
    ],
)
def test_the_hf_trainer_finished_once_its_last_step_is_committed(
    tmp_path: Path,
    logged: dict[str, Any] | None,
    checkpoints: list[tuple[int, bool]],
    argv: tuple[str, ...],
    finished: bool,
) -> None:
    output = tmp_path / "output"
    output.mkdir()
    for step, committed in checkpoints:
        checkpoint(output, step, committed)
    if logged is not None:
        summary(output, logged)
    assert HfTrainerEngine().reached_last_step(output, argv) is finished


@pytest.mark.parametrize(("committed", "finished"), [(False, False), (True, True)])
def test_megatron_finished_once_its_last_iteration_is_committed_whatever_it_logged(
    tmp_path: Path, committed: bool, finished: bool
) -> None:
    output = tmp_path / "output"
    checkpoint(output, 40, committed)
    summary(output, SUMMARY)
    assert MegatronEngine().reached_last_step(output, ("--train_iters", "40")) is finished


def test_each_adapter_says_what_finished_means_in_the_dry_run() -> None:
    assert dict(HfTrainerEngine().describe())["finished"].endswith(
        "with save_strategy=no, ms-swift's end-of-training summary in logging.jsonl"
    )
    assert (
        dict(MegatronEngine().describe())["finished"]
        == "a committed checkpoint of the planned last step (its manifest says so)"
    )


def test_a_final_commit_that_fails_fails_the_trainer(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def full_disk(*args: object, **kwargs: object) -> dict[str, Any]:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(ck, "commit", full_disk)
    committer = Committer(engine="swift")
    last = checkpoint(tmp_path, 40, committed=False)
    committer.after_save(last, last_step=40)
    with pytest.raises(CommitFailed, match="checkpoint-40, failed: OSError\\(28") as failed:
        committer.finish()
    assert isinstance(failed.value.__cause__, OSError) and failed.value.__cause__.errno == errno.ENOSPC
    assert not ck.is_committed(last)


def test_a_commit_that_fails_during_training_is_only_logged(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Resume falls back to an older checkpoint; the trainer fails only if the last one is not committed."""
    real = ck.commit
    full_once = [True]

    def full_disk_once(folder: Path, *args: Any, **kwargs: Any) -> dict[str, Any]:
        if full_once.pop() if full_once else False:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(folder, *args, **kwargs)

    monkeypatch.setattr(ck, "commit", full_disk_once)
    committer = Committer(engine="swift")
    committer.after_save(checkpoint(tmp_path, 20, committed=False), last_step=40)
    committer.after_save(last := checkpoint(tmp_path, 40, committed=False), last_step=40)
    committer.finish()
    assert ck.is_committed(last) and not ck.is_committed(tmp_path / "checkpoint-20")
    assert "[swiftslurm] could not commit checkpoint-20: OSError(28" in capsys.readouterr().out


def test_a_peer_lost_while_the_last_commit_ends_fails_the_trainer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The barrier that ends every rank's commit raises (a peer is gone): whether the checkpoint is committed is
    for the manifest to say, but this rank's trainer must not end as if all went well."""
    import torch.distributed as dist

    def peer_lost(*args: object, **kwargs: object) -> None:
        raise RuntimeError("[../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by peer")

    monkeypatch.setattr(hooks.shared_commit, "hash_together", lambda folder, group: None)
    monkeypatch.setattr(dist, "barrier", peer_lost)
    committer = Committer(engine="swift")
    committer._group = object()  # the commits' own gloo group of a job with several ranks
    committer.after_save(checkpoint(tmp_path, 40, committed=False), last_step=40)
    with pytest.raises(CommitFailed, match="Connection closed by peer"):
        committer.finish()
