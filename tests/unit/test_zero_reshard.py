"""A ZeRO checkpoint resumed at another data-parallel size through DeepSpeed's universal form: the decision,
the folder beside the committed checkpoint, the config and arguments, and what the conversion leaves behind.

The converter here is a stand-in that writes what `ds_to_universal` writes (its output folder and
`latest_universal` beside it); test_zero_reshard_real.py runs the real one on a real checkpoint."""

from __future__ import annotations

import json
import os
import re
import subprocess
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

import pytest

from swiftslurm.ckpt import checkpoint as ck
from swiftslurm.ckpt.checkpoint import ResumePoint
from swiftslurm.engines import zero_reshard as zr
from swiftslurm.engines.base import argv_value
from swiftslurm.engines.hf import HfTrainerEngine
from swiftslurm.engines.megatron import MegatronEngine
from swiftslurm.errors import NodeError
from swiftslurm.node import attempt as attempt_mod
from swiftslurm.node import resume, watch
from swiftslurm.plan import JobPlan
from swiftslurm.rundir.beat import read_leader_beat as read_beat
from swiftslurm.rundir.layout import LEADER_BEAT, RESUME
from swiftslurm.slurm_env import AttemptShape, SlurmEnv, may_shrink
from tests.conftest import plan_for

ZERO2 = {"zero_optimization": {"stage": 2}, "train_batch_size": "auto"}


def zero_checkpoint(output: Path, step: int, ranks: int, stage3: bool = False, commit: bool = True) -> Path:
    """The layout HF Trainer + DeepSpeed write (file contents are not read by the code under test)."""
    folder = output / f"checkpoint-{step}"
    tag = folder / f"global_step{step}"
    tag.mkdir(parents=True)
    (folder / "latest").write_text(f"global_step{step}")
    (folder / "trainer_state.json").write_text(json.dumps({"global_step": step}))
    (folder / "model.safetensors").write_bytes(bytes(64))
    (tag / "mp_rank_00_model_states.pt").write_bytes(bytes(8))
    for rank in range(ranks):
        (folder / f"rng_state_{rank}.pth").write_bytes(bytes(8))
        (tag / f"zero_pp_rank_{rank}_mp_rank_00_optim_states.pt").write_bytes(bytes(16))
        if stage3:
            (tag / f"zero_pp_rank_{rank}_mp_rank_00_model_states.pt").write_bytes(bytes(16))
    if commit:
        ck.commit(folder, world_size=ranks, swift_version="4.6.0")
    return folder


class FakeConverter:
    """Answers the two commands convert() runs: where ms-swift's presets are, and ds_to_universal."""

    def __init__(self, presets: Path, fail: bool = False) -> None:
        self.presets, self.fail, self.calls = presets, fail, []  # type: list[list[str]]

    def __call__(self, argv: Sequence[str]) -> subprocess.CompletedProcess[str]:
        self.calls.append(list(argv))
        if argv[1] == "-c":
            return subprocess.CompletedProcess(argv, 0, stdout=f"{self.presets.parent}\n", stderr="")
        if self.fail:
            raise NodeError("converter failed")
        out = Path(argv[argv.index("--output_folder") + 1])
        (out / "zero" / "lm_head.weight").mkdir(parents=True)
        (out / "zero" / "lm_head.weight" / "fp32.pt").write_bytes(bytes(8))
        (out.parent / "latest_universal").write_text(out.name)
        return subprocess.CompletedProcess(argv, 0, stdout="*** Done!\n", stderr="")


@pytest.fixture
def presets(tmp_path: Path) -> Path:
    folder = tmp_path / "swift" / "config"
    folder.mkdir(parents=True)
    (folder / "zero2.json").write_text(json.dumps(ZERO2))
    return folder


@pytest.mark.parametrize(
    ("shards", "data_parallel", "needed"),
    [
        (0, 1, False),  # no ZeRO state (DDP, LoRA without DeepSpeed, FSDP): loads anywhere
        (2, 2, False),  # the size that wrote it: DeepSpeed loads its own shards
        (2, 1, True),  # fewer ranks
        (3, 2, True),
        (2, 4, True),  # more ranks (a run that grows back)
    ],
)
def test_universal_form_only_when_the_shard_count_differs(shards: int, data_parallel: int, needed: bool) -> None:
    assert zr.needs_universal(shards, data_parallel) is needed


def test_the_shard_count_is_read_from_the_files_deepspeed_loads(tmp_path: Path) -> None:
    ckpt = zero_checkpoint(tmp_path, 6, ranks=2)
    assert (zr.zero_tag(ckpt), zr.zero_shards(ckpt), zr.is_zero3(ckpt)) == ("global_step6", 2, False)
    assert zr.is_zero3(zero_checkpoint(tmp_path, 8, ranks=2, stage3=True))
    plain = tmp_path / "checkpoint-4"
    plain.mkdir()
    (plain / "model.safetensors").write_bytes(bytes(4))
    assert (zr.zero_tag(plain), zr.zero_shards(plain)) == (None, 0)


def test_the_universal_config_adds_load_universal_and_keeps_the_rest() -> None:
    planned = {**ZERO2, "checkpoint": {"tag_validation": "Warn"}}
    config = zr.universal_config(planned)
    assert config["checkpoint"] == {"tag_validation": "Warn", "load_universal": True}
    assert config["zero_optimization"] == ZERO2["zero_optimization"]
    assert "load_universal" not in planned["checkpoint"]  # the plan's own value is left alone


def test_planned_config_reads_what_msswift_reads(tmp_path: Path, presets: Path) -> None:
    assert zr.planned_config("zero2", presets) == ZERO2  # a preset name
    path = tmp_path / "mine.json"
    path.write_text(json.dumps({"zero_optimization": {"stage": 1}}))
    assert zr.planned_config(str(path), None) == {"zero_optimization": {"stage": 1}}  # a file
    assert zr.planned_config('{"zero_optimization": {"stage": 2}}', None)["zero_optimization"]["stage"] == 2


def test_resume_arguments_point_at_the_companion_folder_and_its_config() -> None:
    args = zr.universal_resume_args(Path("/r/output/checkpoint-6"))
    assert args == (
        "--resume_from_checkpoint",
        "/r/output/checkpoint-6-universal",
        "--deepspeed",
        "/r/output/checkpoint-6-universal/ds_config.json",
    )


def test_conversion_writes_beside_the_committed_checkpoint_and_leaves_it_valid(tmp_path: Path, presets: Path) -> None:
    ckpt = zero_checkpoint(tmp_path / "output", 6, ranks=2)
    before = sorted(p.relative_to(ckpt) for p in ckpt.rglob("*"))
    run = FakeConverter(presets)
    folder = zr.convert(ckpt, "zero2", "/venv/bin/python", run)
    assert folder == tmp_path / "output" / "checkpoint-6-universal"
    assert sorted(p.relative_to(ckpt) for p in ckpt.rglob("*")) == before
    assert ck.problems(ckpt, deep=True) == []  # the manifest still verifies
    assert (folder / "latest_universal").read_text() == "global_step6_universal"
    assert json.loads((folder / zr.UNIVERSAL_CONFIG).read_text())["checkpoint"] == {"load_universal": True}
    # The Trainer's files come from the checkpoint (step, data position, RNG of each saved rank); the ZeRO
    # state, DeepSpeed's `latest` and the commit manifest do not.
    links = sorted(p.name for p in folder.iterdir() if p.is_symlink())
    assert links == ["model.safetensors", "rng_state_0.pth", "rng_state_1.pth", "trainer_state.json"]
    assert os.readlink(folder / "trainer_state.json") == "../checkpoint-6/trainer_state.json"
    assert json.loads((folder / "trainer_state.json").read_text()) == {"global_step": 6}
    converter = next(call for call in run.calls if "--input_folder" in call)
    assert converter[1:3] == ["-m", "deepspeed.checkpoint.ds_to_universal"] and "--inject_missing_state" in converter
    # It is no checkpoint of its own: resume still picks checkpoint-6.
    assert ck.newest_committed(tmp_path / "output")[0] == ckpt


def test_a_whole_universal_form_is_reused_and_a_half_one_is_rebuilt(tmp_path: Path, presets: Path) -> None:
    ckpt = zero_checkpoint(tmp_path / "output", 6, ranks=2)
    zr.convert(ckpt, "zero2", "py", FakeConverter(presets))
    again = FakeConverter(presets)
    zr.convert(ckpt, "zero2", "py", again)
    assert again.calls == []
    half = tmp_path / "output" / ".checkpoint-8-universal.building-x1"  # a conversion killed midway
    ckpt8 = zero_checkpoint(tmp_path / "output", 8, ranks=2)
    (half / "global_step8_universal").mkdir(parents=True)
    zr.convert(ckpt8, "zero2", "py", FakeConverter(presets))
    assert not half.exists() and (tmp_path / "output" / "checkpoint-8-universal" / "latest_universal").is_file()


def test_a_failed_conversion_leaves_no_folder_that_looks_whole(tmp_path: Path, presets: Path) -> None:
    ckpt = zero_checkpoint(tmp_path / "output", 6, ranks=2)
    with pytest.raises(NodeError):
        zr.convert(ckpt, "zero2", "py", FakeConverter(presets, fail=True))
    assert sorted(p.name for p in ckpt.parent.iterdir()) == ["checkpoint-6"]  # no half-built folder either
    zr.convert(ckpt, "zero2", "py", FakeConverter(presets))  # the next attempt builds it from scratch
    assert sorted(p.name for p in ckpt.parent.iterdir()) == ["checkpoint-6", "checkpoint-6-universal"]


def test_a_checkpoint_without_zero_state_is_refused_with_the_reason(tmp_path: Path, presets: Path) -> None:
    plain = tmp_path / "checkpoint-4"
    plain.mkdir()
    with pytest.raises(NodeError, match="no DeepSpeed ZeRO state"):
        zr.convert(plain, "zero2", "py", FakeConverter(presets))


def test_the_universal_form_is_quarantined_and_pruned_with_its_checkpoint(tmp_path: Path, presets: Path) -> None:
    output = tmp_path / "output"
    for step in (6, 8):
        zr.convert(zero_checkpoint(output, step, ranks=2), "zero2", "py", FakeConverter(presets))
    zr.convert(zero_checkpoint(output, 10, ranks=2, commit=False), "zero2", "py", FakeConverter(presets))
    ck.prepare_resume(output, tag="a2", move=True)  # checkpoint-10 was never committed
    assert (output / ck.QUARANTINE / "checkpoint-10-universal.a2").is_dir()
    ck.prune_committed(output, keep=1)
    assert sorted(os.listdir(output)) == ["checkpoint-8", "checkpoint-8-universal", ck.QUARANTINE]


def test_the_hf_adapter_resumes_through_the_universal_form_only_when_the_size_differs(
    tmp_path: Path, presets: Path
) -> None:
    engine = HfTrainerEngine()
    ckpt = zero_checkpoint(tmp_path / "output", 6, ranks=2)
    zero2 = ("--deepspeed", "zero2", "--tuner_type", "full")
    plain = ("--resume_from_checkpoint", str(ckpt))
    assert engine.resume_args_at(ckpt, zero2, data_parallel=2) == plain  # the size that wrote it
    assert engine.resume_args_at(ckpt, ("--tuner_type", "full"), data_parallel=1) == plain  # no DeepSpeed
    # Nothing to convert at the size that wrote it: no process is started, no folder appears.
    engine.prepare_reshard(ckpt, zero2, data_parallel=2, python="/no/such/python")
    assert sorted(p.name for p in ckpt.parent.iterdir()) == ["checkpoint-6"]  # no half-built folder either
    zr.convert(ckpt, "zero2", "py", FakeConverter(presets))
    assert engine.resume_args_at(ckpt, zero2, data_parallel=1) == zr.universal_resume_args(ckpt)


def test_the_megatron_adapter_does_not_reshard(tmp_path: Path) -> None:
    ckpt = tmp_path / "checkpoint-6"
    args = MegatronEngine().resume_args_at(ckpt, ("--tuner_type", "full"), data_parallel=1)
    assert args == MegatronEngine().resume_args(ckpt, ("--tuner_type", "full"))


# --- the wiring: plan-time refusal, the leader's resume choice, the trainer's arguments, a whole attempt ----------

THREE_ZERO2 = ("+cluster=local-slurm", "cluster.nodes=3", "global_batch_size=6", "resilience.min_nodes=2")


def shrinking_plan(run_dir: Path, *overrides: str) -> JobPlan:
    plan = plan_for(*THREE_ZERO2, "strategy=zero2", f"run_dir={run_dir}", *overrides)
    assert may_shrink(plan) and argv_value(plan.swift_argv, "deepspeed") == "zero2"
    return replace(plan, tiny_cache=None)  # nothing to build: no trainer runs here


def leader_of(nodes: int) -> SlurmEnv:
    """Node 0 of a job requeued once onto ``nodes`` nodes (one rank each on local-slurm)."""
    env = {
        "SLURM_JOB_ID": "4242",
        "SLURM_JOB_NODELIST": f"n[1-{nodes}]",
        "SLURM_JOB_NUM_NODES": str(nodes),
        "SLURM_NODEID": "0",
        "SLURM_PROCID": "0",
        "SLURM_NTASKS": str(nodes),
        "SLURM_RESTART_COUNT": "1",
    }
    return SlurmEnv.from_environ(env)


@pytest.fixture
def converter(presets: Path, monkeypatch: pytest.MonkeyPatch) -> FakeConverter:
    """The stand-in for the training Python's ds_to_universal (test_zero_reshard_real.py runs the real one)."""
    fake = FakeConverter(presets)
    monkeypatch.setattr(zr, "_run", fake)
    return fake


def test_a_zero_1_or_2_run_may_shrink() -> None:
    assert plan_for(*THREE_ZERO2, "strategy=zero2").resilience.min_nodes == 2
    assert [HfTrainerEngine().reshard_refusal({"deepspeed": f"zero{stage}"}) for stage in (0, 1, 2)] == [None] * 3


@pytest.mark.parametrize(
    ("deepspeed", "why"),
    [
        ("zero3", r"ZeRO-3 \(stage 3\)"),
        ("zero3_offload", r"ZeRO-3"),
        ("zero2_offload", r"offload"),
        ('{"zero_optimization": {"stage": 3}}', r"ZeRO-3"),
        ('{"zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu"}}}', r"offload"),
        ("/no/such/ds.json", r"stage cannot be read"),
    ],
)
def test_zero_3_and_offload_are_still_refused_with_the_reason(deepspeed: str, why: str) -> None:
    refusal = HfTrainerEngine().reshard_refusal({"deepspeed": deepspeed})
    assert refusal is not None and re.search(why, refusal) and "HINT: use strategy=zero2" in refusal, refusal


def test_a_json_config_of_stage_2_without_offload_may_shrink(tmp_path: Path) -> None:
    path = tmp_path / "ds.json"
    path.write_text(json.dumps({**ZERO2, "zero_optimization": {"stage": 2, "offload_optimizer": {"device": "none"}}}))
    engine = HfTrainerEngine()
    assert engine.reshard_refusal({"deepspeed": str(path)}) is None
    assert engine.reshard_refusal({"deepspeed": json.dumps(ZERO2)}) is None


def test_the_leader_converts_the_resume_point_for_this_attempts_ranks_before_publishing_it(
    tmp_path: Path, converter: FakeConverter
) -> None:
    plan = shrinking_plan(tmp_path / "run")
    ckpt = zero_checkpoint(plan.output_dir, 6, ranks=3)
    attempt = tmp_path / "run" / "logs" / "4242.r1"
    point = resume.agree_on_resume(plan, attempt, leader=True, ranks=2)
    assert point.checkpoint == ckpt and zr.is_whole(ckpt)
    assert json.loads((attempt / RESUME).read_text())["checkpoint"] == str(ckpt)
    beat = read_beat(attempt / LEADER_BEAT)
    assert beat is not None and beat["doing"] == "making checkpoint-6 loadable at 2 ranks"
    # Every node then resumes from the universal form, which loads at 2 ranks.
    assert watch.resume_args(plan, AttemptShape.of(leader_of(2), plan), point) == zr.universal_resume_args(ckpt)


def test_by_default_nothing_is_converted_and_the_resume_arguments_are_unchanged(
    tmp_path: Path, converter: FakeConverter
) -> None:
    plan = plan_for("+cluster=local-slurm", "strategy=zero2", f"run_dir={tmp_path / 'run'}")  # min_nodes unset
    ckpt = zero_checkpoint(plan.output_dir, 6, ranks=3)  # even at a shard count the plan would not write
    assert AttemptShape.of(leader_of(2), plan).reshard_ranks is None
    point = resume.agree_on_resume(plan, tmp_path / "run" / "logs" / "1", leader=True, ranks=None)
    assert converter.calls == [] and not zr.universal_companion(ckpt).exists()
    assert watch.resume_args(plan, AttemptShape.of(leader_of(2), plan), point) == (
        "--resume_from_checkpoint",
        str(ckpt),
    )


def test_at_the_size_that_wrote_it_the_checkpoint_resumes_as_it_is(tmp_path: Path, converter: FakeConverter) -> None:
    plan = shrinking_plan(tmp_path / "run")
    ckpt = zero_checkpoint(plan.output_dir, 6, ranks=3)
    point = resume.agree_on_resume(plan, tmp_path / "run" / "logs" / "1", leader=True, ranks=3)
    assert [c for c in converter.calls if "-c" not in c] == [] and not zr.universal_companion(ckpt).exists()
    assert watch.resume_args(plan, AttemptShape.of(leader_of(3), plan), point) == (
        "--resume_from_checkpoint",
        str(ckpt),
    )


def test_a_failed_conversion_is_published_so_the_other_nodes_stop_waiting(tmp_path: Path, presets: Path) -> None:
    plan = shrinking_plan(tmp_path / "run")
    zero_checkpoint(plan.output_dir, 6, ranks=3)
    attempt = tmp_path / "run" / "logs" / "1"
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(zr, "_run", FakeConverter(presets, fail=True))
        with pytest.raises(NodeError, match="converter failed"):
            resume.agree_on_resume(plan, attempt, leader=True, ranks=2)
    assert json.loads((attempt / RESUME).read_text())["error"] == "converter failed"
    with pytest.raises(NodeError, match="node 0 could not prepare the resume point: converter failed"):
        resume.agree_on_resume(plan, attempt, leader=False)


def test_a_conversion_that_cannot_read_its_config_is_published_as_a_resume_failure(
    tmp_path: Path, converter: FakeConverter
) -> None:
    plan = shrinking_plan(tmp_path / "run")
    ckpt = zero_checkpoint(plan.output_dir, 6, ranks=3)
    (converter.presets / "zero2.json").unlink()  # ms-swift's preset is not where its package says
    attempt = tmp_path / "run" / "logs" / "1"
    with pytest.raises(NodeError, match=r"universal form failed: .*zero2.json.*HINT"):
        resume.agree_on_resume(plan, attempt, leader=True, ranks=2)
    assert "zero2.json" in json.loads((attempt / RESUME).read_text())["error"]  # the other nodes stop waiting
    assert sorted(p.name for p in ckpt.parent.iterdir()) == ["checkpoint-6"]


def test_a_stop_signal_during_the_conversion_starts_no_trainer(tmp_path: Path, converter: FakeConverter) -> None:
    plan = shrinking_plan(tmp_path / "run")
    ckpt = zero_checkpoint(plan.output_dir, 6, ranks=3)
    signalled = lambda: zr.is_whole(ckpt)  # noqa: E731  (the signal comes while the converter runs)
    with pytest.raises(resume.Interrupted, match="converted"):
        resume.agree_on_resume(plan, tmp_path / "run" / "logs" / "1", leader=True, stopped=signalled, ranks=2)
    assert zr.is_whole(ckpt)  # kept: the next attempt reuses it


def test_a_node_never_resumes_from_a_missing_or_half_built_universal_form(tmp_path: Path) -> None:
    plan = shrinking_plan(tmp_path / "run")
    ckpt = zero_checkpoint(plan.output_dir, 6, ranks=3)
    point = ResumePoint(ckpt, 6)
    with pytest.raises(NodeError, match=r"universal form .*checkpoint-6-universal is missing or incomplete"):
        watch.resume_args(plan, AttemptShape.of(leader_of(2), plan), point)
    (zr.universal_companion(ckpt) / "global_step6_universal").mkdir(parents=True)  # not renamed by convert()
    with pytest.raises(NodeError, match="missing or incomplete"):
        watch.resume_args(plan, AttemptShape.of(leader_of(2), plan), point)


def test_a_requeued_attempt_on_fewer_nodes_trains_from_the_converted_checkpoint(
    tmp_path: Path, converter: FakeConverter, monkeypatch: pytest.MonkeyPatch
) -> None:
    run_dir = tmp_path / "run"
    plan = shrinking_plan(run_dir)
    ckpt = zero_checkpoint(plan.output_dir, 6, ranks=3)  # written by the first attempt on 3 nodes
    trained: list[tuple[str, ...]] = []

    def fake_train(plan: JobPlan, where: SlurmEnv, run_dir: Path, attempt_id: str, point: ResumePoint, *_: object):  # type: ignore[no-untyped-def]
        trained.append(watch.resume_args(plan, AttemptShape.of(where, plan), point))
        raise RuntimeError("the trainer would start here")

    monkeypatch.setattr(attempt_mod, "train", fake_train)
    with pytest.raises(RuntimeError, match="the trainer would start here"):
        attempt_mod.run(run_dir, plan, leader_of(2))
    assert trained == [zr.universal_resume_args(ckpt)]
    assert zr.is_whole(ckpt) and ck.problems(ckpt) == []  # the committed checkpoint is untouched


def test_the_universal_form_is_never_uploaded(tmp_path: Path, presets: Path) -> None:
    ckpt = zero_checkpoint(tmp_path / "output", 6, ranks=2)
    zr.convert(ckpt, "zero2", "py", FakeConverter(presets))
    assert [path for _, path in ck.checkpoint_dirs(tmp_path / "output")] == [ckpt]  # what NodeSync uploads
