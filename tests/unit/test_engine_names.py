"""What differs between engines is asked of the adapter (swiftslurm/engines/): no module outside it compares a
launcher or `strategy.engine` value with a literal name (`== "megatron"`, `in ("swift", ...)`, `match`).

The scan reads swiftslurm/ as source (ast): a comparison whose either side is a string literal naming an engine,
or a collection of literals holding one. Data that names engines (memory.MODEL_STATES keyed by `strategy.engine`)
is not a comparison and is not flagged.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

from swiftslurm.engines.registry import ENGINES, STRATEGY_ENGINES
from swiftslurm.planning import memory
from tests.conftest import plan_for

PACKAGE = Path(__file__).resolve().parents[2] / "swiftslurm"
ADAPTERS = PACKAGE / "engines"
ENGINE_NAMES = frozenset(ENGINES) | frozenset(STRATEGY_ENGINES)  # swift, megatron, ddp, deepspeed, fsdp


def _names_in(node: ast.AST) -> set[str]:
    """The engine names a comparison operand spells as literals: "x", ("x", "y"), {"x"}, ["x"]."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return {node.value} & ENGINE_NAMES
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return {name for element in node.elts for name in _names_in(element)}
    return set()


def _engine_comparisons(tree: ast.AST) -> Iterator[tuple[int, str]]:
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            for operand in (node.left, *node.comparators):
                yield from ((node.lineno, name) for name in sorted(_names_in(operand)))
        elif isinstance(node, ast.match_case) and isinstance(node.pattern, ast.MatchValue):
            yield from ((node.pattern.lineno, name) for name in sorted(_names_in(node.pattern.value)))


def engine_name_comparisons(source: str) -> list[tuple[int, str]]:
    return list(_engine_comparisons(ast.parse(source)))


def test_no_module_outside_the_adapters_compares_an_engine_name() -> None:
    found = [
        f"{path.relative_to(PACKAGE.parent)}:{line}: compares with {name!r}"
        for path in sorted(PACKAGE.rglob("*.py"))
        if ADAPTERS not in path.parents
        for line, name in engine_name_comparisons(path.read_text())
    ]
    assert not found, "ask the engine adapter (swiftslurm/engines/) instead:\n" + "\n".join(found)


def test_the_scan_finds_the_spellings_of_a_comparison() -> None:
    source = "\n".join(
        [
            'if cfg.task.launcher == "megatron": pass',
            'if "swift" != launcher: pass',
            'if engine in ("ddp", "deepspeed"): pass',
            'if engine not in {"fsdp"}: pass',
            'match launcher:\n    case "megatron": pass',
            'if model.id == "tiny" or preset in ("zero3", "zero3_offload"): pass',  # not engine names
        ]
    )
    assert engine_name_comparisons(source) == [
        (1, "megatron"),
        (2, "swift"),
        (3, "ddp"),
        (3, "deepspeed"),
        (4, "fsdp"),
        (6, "megatron"),
    ]


def test_every_engine_an_adapter_runs_has_a_memory_model() -> None:
    assert set(STRATEGY_ENGINES) == set(memory.MODEL_STATES) == set(memory.SHARDS_STATES)


def test_a_config_that_still_names_task_launcher_is_told_that_strategy_engine_picks_the_program() -> None:
    from swiftslurm.cli.mistakes import unknown_key_message

    message = unknown_key_message("task.launcher")
    assert "strategy.engine" in message and "HINT: drop task.launcher" in message and "\n" not in message


def test_a_generic_task_runs_the_program_of_the_strategy_engine_as_the_megatron_task_does() -> None:
    megatron = ("+cluster=h100x8", "model=qwen3-8b", "dataset=[AI-ModelScope/alpaca-gpt4-data-en]", "strategy=megatron")
    generic = plan_for(*megatron, "task=sft", "run_name=r")
    named = plan_for(*megatron, "task=megatron_sft", "run_name=r")
    assert (generic.launcher, generic.executable) == ("megatron", "/opt/venv/bin/megatron")
    assert generic == named
