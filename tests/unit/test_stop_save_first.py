"""At the stop step the stop checkpoint is saved first, with both plugins. Both trainers evaluate before they save,
so an evaluation due at that step would spend the time SLURM left for the save; with `save_strategy=best` the
HF Trainer even lets the evaluation's verdict replace `should_save`, and a worse metric dropped the stop save.

The plugins are imported with ms-swift's callback modules stubbed (Megatron-SWIFT's cannot be imported without
megatron-core) and the stop vote faked; each trainer's order of events at a step's end is replayed as the
versions swiftslurm pins run it (transformers 5.19 `Trainer._maybe_log_save_evaluate`, ms-swift 4.6
`BaseMegatronTrainer.run_train_step` with its `default_flow` callback, which runs after ours)."""

from __future__ import annotations

import importlib
import sys
import types
from collections.abc import Callable, Iterator
from types import SimpleNamespace
from typing import Any

import pytest

from swiftslurm.engines import hooks

STOP_AT = 4  # the step every rank agreed to stop at; an evaluation is due at it (every 2 steps)


class AgreedStop:
    """StopRequest without signal handlers or a vote: every rank agreed to stop at STOP_AT."""

    def __init__(self) -> None:
        self.stopping = False
        self.vote = SimpleNamespace(join=lambda: None)

    def should_stop_now(self, step: int) -> bool:
        if step == STOP_AT and not self.stopping:
            self.stopping = True
            return True
        return False

    def finish(self, print_cost: bool) -> None:
        pass


class TrainerCallback:  # swift.callbacks.TrainerCallback, as ms-swift 4.6 defines it
    def __init__(self, args: Any, trainer: Any) -> None:
        self.args, self.trainer = args, trainer


class MegatronCallback:  # swift.megatron.callbacks.base.MegatronCallback, as ms-swift 4.6 defines it
    def __init__(self, trainer: Any) -> None:
        self.trainer, self.args, self.state = trainer, trainer.args, trainer.state


@pytest.fixture
def plugin(monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[[str], types.ModuleType]]:
    stubs = {
        "swift": types.ModuleType("swift"),
        "swift.callbacks": types.ModuleType("swift.callbacks"),
        "swift.megatron": types.ModuleType("swift.megatron"),
        "swift.megatron.callbacks": types.ModuleType("swift.megatron.callbacks"),
        "swift.megatron.callbacks.base": types.ModuleType("swift.megatron.callbacks.base"),
    }
    stubs["swift.callbacks"].TrainerCallback, stubs["swift.callbacks"].callbacks_map = TrainerCallback, {}  # type: ignore[attr-defined]
    stubs["swift.megatron.callbacks"].megatron_callbacks_map = {}  # type: ignore[attr-defined]
    stubs["swift.megatron.callbacks.base"].MegatronCallback = MegatronCallback  # type: ignore[attr-defined]
    for name, module in stubs.items():
        monkeypatch.setitem(sys.modules, name, module)
    monkeypatch.delenv(hooks.STACKS_ENV, raising=False)
    monkeypatch.setattr(hooks, "StopRequest", AgreedStop)
    imported: list[str] = []

    def load(name: str) -> types.ModuleType:
        full = f"swiftslurm.engines.{name}"
        sys.modules.pop(full, None)
        imported.append(full)
        return importlib.import_module(full)

    yield load
    for full in imported:
        sys.modules.pop(full, None)


# --- swift sft|pt|rlhf: the HF Trainer ------------------------------------------------------------------------


def hf_control() -> SimpleNamespace:
    return SimpleNamespace(should_save=False, should_evaluate=False, should_training_stop=False, should_log=False)


def hf_step_end(stop: Any, args: Any, state: Any, control: Any, new_best: bool) -> list[str]:
    """The end of an optimizer step: the flow callback's on_step_end (evaluate every eval_steps; save_strategy=best
    sets no save), ours, then _maybe_log_save_evaluate: evaluate if asked, under save_strategy=best its verdict
    replaces should_save; save if asked, then on_save."""
    done = []
    control.should_evaluate = state.global_step % args.eval_steps == 0
    stop.on_step_end(args, state, control)
    if control.should_evaluate:
        done.append("eval")
        if args.save_strategy == "best":
            control.should_save = new_best
    if control.should_save:
        done.append("save")
        stop.on_save(args, state, control)
    return done


def test_hf_the_stop_step_saves_before_any_evaluation_and_best_cannot_drop_it(plugin) -> None:  # type: ignore[no-untyped-def]
    swift_plugin = plugin("swift_plugin")
    args = SimpleNamespace(eval_steps=2, save_strategy="best", eval_strategy="steps")
    stop, control = swift_plugin.StopCallback(args, trainer=None), hf_control()
    state = SimpleNamespace(global_step=STOP_AT, max_steps=100, is_world_process_zero=True)
    done = hf_step_end(stop, args, state, control, new_best=False)  # the evaluation would not be a new best
    assert done == ["save"] and control.should_training_stop


def test_hf_the_epoch_end_after_the_stop_saves_and_evaluates_no_more(plugin) -> None:  # type: ignore[no-untyped-def]
    """The Trainer ends the epoch it stopped in with on_epoch_end and one more _maybe_log_save_evaluate, where
    epoch strategies save and evaluate: a second save of the stop step would rewrite the committed checkpoint."""
    swift_plugin = plugin("swift_plugin")
    args = SimpleNamespace(eval_steps=10**6, save_strategy="epoch", eval_strategy="epoch")  # none due at steps
    stop, control = swift_plugin.StopCallback(args, trainer=None), hf_control()
    state = SimpleNamespace(global_step=STOP_AT, max_steps=100, is_world_process_zero=True)
    assert hf_step_end(stop, args, state, control, new_best=True) == ["save"]
    control.should_save = control.should_evaluate = True  # DefaultFlowCallback.on_epoch_end, epoch strategies
    stop.on_epoch_end(args, state, control)
    assert not control.should_save and not control.should_evaluate


# --- megatron sft|pt: Megatron-SWIFT --------------------------------------------------------------------------


def default_flow_step_end(args: Any, state: Any) -> None:
    """ms-swift 4.6's DefaultFlowCallback.on_step_end (swift/megatron/callbacks/default_flow.py), its flags."""
    if args.eval_steps and state.iteration % args.eval_steps == 0 and args.eval_iters > 0:
        state.should_eval = True
    if args.save_steps and state.iteration % args.save_steps == 0:
        state.should_save = True
    if state.iteration >= args.train_iters:
        if args.eval_iters > 0:
            state.should_eval = True
        state.should_save = True


def megatron_step_end(stop: Any, args: Any, state: Any) -> list[str]:
    """run_train_step after `state.iteration += 1`: on_step_end (ours, then default_flow), evaluate if asked,
    then save if asked and on_save."""
    done = []
    stop.on_step_end()
    default_flow_step_end(args, state)
    if state.should_eval:
        state.should_eval = False
        done.append("eval")
    if state.should_save:
        state.should_save = False
        done.append("save")
        stop.on_save(output_dir=f"/out/checkpoint-{state.iteration}")
    return done


def test_megatron_the_stop_iteration_saves_without_evaluating_first(plugin) -> None:  # type: ignore[no-untyped-def]
    megatron_plugin = plugin("megatron_plugin")
    args = SimpleNamespace(eval_steps=2, eval_iters=5, save_steps=100, train_iters=100)
    state = SimpleNamespace(iteration=STOP_AT, should_save=False, should_eval=False)
    stop = megatron_plugin.MegatronStopCallback(SimpleNamespace(args=args, state=state))
    assert megatron_step_end(stop, args, state) == ["save"]
    assert args.train_iters == STOP_AT  # the loop ends after the save
    assert args.eval_iters == 5  # the planned evaluations are back once it is saved


def test_megatron_iterations_before_the_stop_evaluate_as_planned(plugin) -> None:  # type: ignore[no-untyped-def]
    megatron_plugin = plugin("megatron_plugin")
    args = SimpleNamespace(eval_steps=2, eval_iters=5, save_steps=2, train_iters=100)
    state = SimpleNamespace(iteration=STOP_AT - 2, should_save=False, should_eval=False)
    stop = megatron_plugin.MegatronStopCallback(SimpleNamespace(args=args, state=state))
    assert megatron_step_end(stop, args, state) == ["eval", "save"]
