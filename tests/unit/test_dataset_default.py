"""The built-in tiny data is the tiny model's default only: a real model must name its data."""

from __future__ import annotations

import re
import shlex

import pytest

from swiftslurm import tiny
from swiftslurm.errors import ConfigError
from tests.conftest import FIXED_CACHE, REPO, plan_for


def dataset_arg(*overrides: str) -> list[str]:
    argv = list(plan_for(*overrides).swift_argv)
    start = argv.index("--dataset") + 1
    end = next((i for i in range(start, len(argv)) if argv[i].startswith("--")), len(argv))
    return argv[start:end]


def test_the_tiny_model_trains_on_its_built_in_data_by_default() -> None:
    assert dataset_arg() == [f"{FIXED_CACHE}/{tiny.ASSETS_VERSION}/{tiny.DATASET_FILE}"]


@pytest.mark.parametrize("model", ["qwen3-8b", "qwen2.5-72b-instruct", "qwen3-vl-8b-instruct"])
def test_a_real_model_without_data_is_refused_with_the_setting_that_fixes_it(model: str) -> None:
    with pytest.raises(ConfigError, match=rf"model={model} has no data.*HINT: name it, e.g. dataset=\["):
        plan_for("+cluster=a100x16", f"model={model}", "strategy=zero3")


def test_a_real_model_trains_on_the_data_it_names() -> None:
    named = "dataset=[AI-ModelScope/alpaca-gpt4-data-en]"
    assert dataset_arg("+cluster=a100x16", "model=qwen3-8b", named) == ["AI-ModelScope/alpaca-gpt4-data-en"]


def test_the_readme_headline_command_names_its_data_and_plans() -> None:
    readme = (REPO / "README.md").read_text()
    headline = re.search(r"```bash\n(python -m swiftslurm [^\n]+)\n```", readme)
    assert headline is not None, "README.md lost its headline command"
    data = dataset_arg(*shlex.split(headline.group(1))[3:])
    assert not any(tiny.ASSETS_VERSION in d for d in data), data
