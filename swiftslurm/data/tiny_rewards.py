"""GRPO reward for the tiny arithmetic prompts (`dataset=[tiny-grpo]`): an ms-swift plugin file.

Pass it with `swift.external_plugins=[<this file>]` and `swift.reward_funcs=[swiftslurm_arithmetic]`;
`python -m swiftslurm.tiny` prints its path (`swiftslurm.tiny.REWARD_PLUGIN`). ms-swift's own `accuracy`
reward needs `math_verify`, which is not installed, and a random tiny model never produces `format`'s
`<think>...<answer>` shape: every completion would get the same reward, every advantage would be zero, and
nothing would train.

A completion that contains the right number scores 1. Others get partial credit for the solution's
characters they contain, so even a random model's completions differ in reward and GRPO has a gradient.
Pure Python, no network, deterministic.
"""

from __future__ import annotations

import re
from collections import Counter
from typing import Any

from swift.rewards import ORM, orms

NUMBER = re.compile(r"-?\d+")


def arithmetic_reward(completion: str, solution: str) -> float:
    """1.0 if `solution` is one of the numbers in `completion`, else half the share of its characters found."""
    if solution in NUMBER.findall(completion):
        return 1.0
    found = Counter(completion) & Counter(solution)
    return 0.5 * sum(found.values()) / len(solution)


class ArithmeticAccuracy(ORM):
    def __call__(self, completions: list[str], solution: list[str], **kwargs: Any) -> list[float]:
        return [arithmetic_reward(c, s) for c, s in zip(completions, solution, strict=True)]


orms["swiftslurm_arithmetic"] = ArithmeticAccuracy
