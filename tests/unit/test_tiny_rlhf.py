"""The tiny DPO and GRPO datasets: deterministic, in ms-swift's format, found by their conf names."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from swiftslurm import tiny
from tests.conftest import FIXED_CACHE, plan_for


def test_preference_pairs_are_deterministic_and_in_dpo_format() -> None:
    pairs = tiny.make_preference_pairs(64, tiny.SEED)
    assert pairs == tiny.make_preference_pairs(64, tiny.SEED)
    assert pairs != tiny.make_preference_pairs(64, tiny.SEED + 1)
    for pair in pairs:
        assert set(pair) == {"messages", "rejected_response"}
        user, chosen = pair["messages"]
        assert (user["role"], chosen["role"]) == ("user", "assistant")
        assert pair["rejected_response"] != chosen["content"]  # ms-swift refuses a pair that is not one


def test_grpo_prompts_are_deterministic_and_their_solutions_are_right() -> None:
    prompts = tiny.make_grpo_prompts(64, tiny.SEED)
    assert prompts == tiny.make_grpo_prompts(64, tiny.SEED)
    for prompt in prompts:
        assert set(prompt) == {"messages", "solution"}
        [user] = prompt["messages"]
        assert user["role"] == "user"
        a, op, b = user["content"].removeprefix("What is ").removesuffix("?").split()
        assert prompt["solution"] == str(int(a) + int(b) if op == "+" else int(a) - int(b))


def test_rlhf_datasets_are_added_to_an_existing_cache_without_touching_it(tmp_path: Path) -> None:
    cache = tmp_path / "tiny-v1"
    (cache / "data").mkdir(parents=True)
    (cache / tiny.MANIFEST_FILE).write_text("{}\n")  # a finished build from before the RLHF datasets
    (cache / tiny.DATASET_FILE).write_text("old\n")
    assets = tiny.build_tiny_assets(cache)
    assert (cache / tiny.DATASET_FILE).read_text() == "old\n"
    first = assets.dpo_path.read_bytes(), assets.grpo_path.read_bytes()
    assets.dpo_path.unlink()
    tiny.build_tiny_assets(cache)  # rewritten byte for byte
    assert (assets.dpo_path.read_bytes(), assets.grpo_path.read_bytes()) == first
    rows = [json.loads(line) for line in assets.grpo_path.read_text().splitlines()]
    assert rows == tiny.make_grpo_prompts(tiny.NUM_RLHF_SAMPLES, tiny.SEED)
    assert [p.name for p in (cache / "data").iterdir() if p.name.startswith(".")] == []  # no temporary files left


@pytest.mark.parametrize(("name", "file"), [("tiny-dpo", tiny.DPO_FILE), ("tiny-grpo", tiny.GRPO_FILE)])
def test_conf_names_select_the_built_in_rlhf_datasets(name: str, file: str) -> None:
    plan = plan_for("+cluster=local-slurm", "task=dpo", f"dataset=[{name}]")
    argv = list(plan.swift_argv)
    assert argv[argv.index("--dataset") + 1] == f"{FIXED_CACHE}/{tiny.ASSETS_VERSION}/{file}"
    assert plan.tiny_cache == f"{FIXED_CACHE}/{tiny.ASSETS_VERSION}"


@pytest.mark.parametrize(
    ("completion", "solution", "reward"),
    [("3 + 4 = 7.", "7", 1.0), ("-12", "-12", 1.0), ("17", "7", 0.5), ("x", "7", 0.0), ("1", "-1", 0.25)],
)
def test_arithmetic_reward_pays_the_right_number_and_part_of_its_characters(
    completion: str, solution: str, reward: float
) -> None:
    spec = importlib.util.spec_from_file_location("tiny_rewards", tiny.REWARD_PLUGIN)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.arithmetic_reward(completion, solution) == reward
    assert tiny.REWARD_NAME in importlib.import_module("swift.rewards").orms
