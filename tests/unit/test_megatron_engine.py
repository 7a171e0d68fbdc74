"""The Megatron adapter against what `megatron sft` really wrote on an H200 (tests/data/megatron/, captured by
tests/gpu/gpu_megatron.py on 2026-12-01: a full fine-tune signalled at iteration 5, saved and committed at 6,
requeued, resumed at 7, finished at 30). CI has no GPU: these keep the adapter true to that output."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from swiftslurm.ckpt import checkpoint as ck
from swiftslurm.engines.megatron import MegatronEngine
from swiftslurm.engines.registry import engine_for
from swiftslurm.errors import ConfigError
from tests.conftest import plan_for

DATA = Path(__file__).resolve().parents[1] / "data" / "megatron"
ENGINE = MegatronEngine()
MEGATRON = (
    "+cluster=h200x2",
    "model=qwen3-8b",
    "dataset=[AI-ModelScope/alpaca-gpt4-data-en]",
    "task=megatron_sft",
    "strategy=megatron",
)


def layout(kind: str) -> list[tuple[str, str]]:
    """The real checkpoint-30 listing of a full or LoRA run: (relative path, size or 'dir')."""
    rows, section = [], None
    for line in (DATA / "checkpoint-layouts.txt").read_text().splitlines():
        if line.startswith("["):
            section = line.strip("[]")
        elif section == kind and not line.startswith("#"):
            path, size = line.split("\t")
            rows.append((path, size))
    return rows


def rebuild(output: Path, kind: str, step: int = 30) -> Path:
    """The checkpoint's files by name (small stand-in contents; the manifest is left out)."""
    for path, size in layout(kind):
        target = output / path.replace("checkpoint-30", f"checkpoint-{step}").replace(
            "iter_0000030", f"iter_{step:07d}"
        )
        if size == "dir":
            target.mkdir(parents=True, exist_ok=True)
        elif target.name != ck.MANIFEST:
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(str(step) if target.name == "latest_checkpointed_iteration.txt" else path)
    return output / f"checkpoint-{step}"


def test_the_real_manifest_records_the_planned_last_iteration_and_the_engine() -> None:
    manifest = json.loads((DATA / "manifest-full-30.json").read_text())
    paths = {f["path"] for f in manifest["files"]}
    assert (manifest["step"], manifest["last_step"], manifest["engine"]) == (30, 30, "megatron")
    assert {"iter_0000030/__0_0.distcp", "latest_checkpointed_iteration.txt", "model.safetensors"} <= paths
    assert {p for p, s in layout("full") if s != "dir"} - {f"checkpoint-30/{p}" for p in paths} == {
        "checkpoint-30/swiftslurm_manifest.json"
    }  # every file Megatron wrote is covered by the manifest


@pytest.mark.parametrize("kind", ["full", "lora"])
def test_a_run_is_complete_once_its_last_iteration_is_committed(tmp_path: Path, kind: str) -> None:
    output = tmp_path / "output"
    ck.commit(rebuild(output, kind, step=20), 1, "4.6.0", last_step=30, engine="megatron")
    assert not ENGINE.reached_last_step(output)
    assert not ck.prepare_resume(output, tag="t", move=False).complete
    ck.commit(rebuild(output, kind, step=30), 1, "4.6.0", last_step=30, engine="megatron")
    assert ENGINE.reached_last_step(output)
    assert ck.prepare_resume(output, tag="t", move=False).complete


def test_an_uncommitted_last_iteration_is_not_complete(tmp_path: Path) -> None:
    output = tmp_path / "output"
    ck.commit(rebuild(output, "full", step=20), 1, "4.6.0", last_step=30, engine="megatron")
    rebuild(output, "full", step=30)  # written, killed before the manifest
    assert not ENGINE.reached_last_step(output)
    point = ck.prepare_resume(output, tag="t", move=True)
    assert point.step == 20 and not point.complete and point.quarantined


def test_lora_merged_copies_go_with_their_checkpoint(tmp_path: Path) -> None:
    output = tmp_path / "output"
    for step in (10, 20):
        ck.commit(rebuild(output, "lora", step=step), 1, "4.6.0", last_step=30, engine="megatron")
    assert [s for s, _ in ck.checkpoint_dirs(output)] == [10, 20]  # `checkpoint-N-merged` is no checkpoint
    rebuild(output, "lora", step=30)  # uncommitted, with its merged copy
    ck.prepare_resume(output, tag="a1", move=True)
    assert not (output / "checkpoint-30-merged").exists()
    assert (output / ck.QUARANTINE / "checkpoint-30-merged.a1").is_dir()
    ck.prune_committed(output, keep=1)
    assert sorted(os.listdir(output)) == ["checkpoint-20", "checkpoint-20-merged", ck.QUARANTINE]


@pytest.mark.parametrize(("tuner", "flag"), [("full", "--mcore_model"), ("lora", "--mcore_adapter")])
def test_resume_names_the_checkpoint_megatron_loads_and_keeps_its_state(tuner: str, flag: str) -> None:
    # Megatron reads latest_checkpointed_iteration.txt inside the folder; finetune=false restores the iteration,
    # optimizer, scheduler and RNG (seen on H200: resumed at 7 after a commit of 6, the same losses).
    plan = plan_for(*MEGATRON, f"strategy.tuner_type={tuner}")
    args = ENGINE.resume_args(Path("/r/output/checkpoint-6"), plan.swift_argv)
    assert args == (flag, "/r/output/checkpoint-6", "--finetune", "false")


def test_a_megatron_plan_gets_the_adapters_arguments() -> None:
    plan = plan_for(*MEGATRON)
    argv = list(plan.swift_argv)
    assert engine_for(plan.launcher) is not None and plan.launcher == "megatron"
    assert argv[argv.index("--add_version") + 1] == "false"
    assert argv[argv.index("--callbacks") + 1 : argv.index("--callbacks") + 3] == list(ENGINE.callbacks)
    assert argv[argv.index("--external_plugins") + 1] == str(ENGINE.plugin)
    assert argv[argv.index("--output_dir") + 1] == str(plan.output_dir)


def test_a_model_group_default_that_crashes_megatron_is_refused_with_how_to_drop_it() -> None:
    with pytest.raises(ConfigError, match=r"~model.swift.report_to"):
        plan_for("+cluster=h200x2", "task=megatron_sft", "strategy=megatron")  # model=tiny sets report_to=none


@pytest.mark.parametrize(
    ("override", "named"),
    [
        ("swift.async_save=true", "async_save"),
        ("swift.no_save_optim=true", "no_save_optim"),
        ("swift.no_save_rng=true", "no_save_rng"),
        ("swift.no_load_optim=true", "no_load_optim"),
        ("swift.no_load_rng=true", "no_load_rng"),
        ("swift.streaming=true", "streaming"),
        ("swift.report_to=[none]", "report_to"),
        ("swift.finetune=false", "finetune"),
        ("swift.add_version=true", "add_version"),
    ],
)
def test_megatron_settings_that_break_resume_are_refused_at_plan_time(override: str, named: str) -> None:
    with pytest.raises(ConfigError, match=named) as err:
        plan_for(*MEGATRON, override)
    assert "HINT" in str(err.value)


def test_vllm_rollouts_with_megatron_are_refused_by_the_adapter() -> None:
    with pytest.raises(ConfigError, match="vLLM rollouts with Megatron"):
        plan_for(*MEGATRON, "task.command=rlhf", "task.rlhf_type=grpo", "task.vllm_mode=colocate")


def test_the_real_run_was_saved_at_the_signal_and_resumed_from_that_commit() -> None:
    first, second = (json.loads(line) for line in (DATA / "attempts.jsonl").read_text().splitlines())
    assert (first["reason"], first["committed_step"], first["last_step"]) == ("preempted", 6, 6)
    assert (second["resume_step"], second["reason"], second["committed_step"]) == (6, "finished", 30)
    log = (DATA / "node0-attempt1.log").read_text()
    assert "stop signal: saving step 6 and stopping" in log and "committed checkpoint-6" in log
