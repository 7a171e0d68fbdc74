"""The real Hugging Face Trainer on the CPU, with swiftslurm's real stop callback (swift_plugin.py): at the stop
step the stop checkpoint is saved, though an evaluation is due at that step and `save_strategy=best` would let
its verdict (a worse loss) drop the save. tests/unit/test_stop_save_first.py covers Megatron-SWIFT's order,
which needs megatron-core to run for real."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("swift.callbacks")

from swiftslurm.signals import RANK_STOP_SIGNALS  # noqa: E402

STOP_AT = 4  # every rank agreed to stop here; evaluations every 2 steps, so one is due at it
MAX_STEPS = 8


class ScriptedLoss(torch.nn.Module):  # type: ignore[misc]
    """Trains a weight; each evaluation's loss is worse than the one before (1.0, then 2.0, ...)."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(1))
        self.evaluations = 0

    def forward(self, x: Any, labels: Any = None) -> dict[str, Any]:
        if self.training:
            return {"loss": (self.weight * x).pow(2).mean()}
        self.evaluations += 1
        return {"loss": torch.tensor(float(self.evaluations)) + 0 * self.weight.sum()}


@pytest.fixture
def stop_handlers_restored() -> Iterator[None]:
    """StopCallback installs the rank's stop handler in this process: put pytest's back afterwards."""
    previous = {sig: signal.getsignal(sig) for sig in RANK_STOP_SIGNALS}
    yield
    for sig, handler in previous.items():
        signal.signal(sig, handler)


def test_the_stop_step_is_saved_though_an_evaluation_due_there_would_drop_it(
    tmp_path: Path, stop_handlers_restored: None
) -> None:
    from swiftslurm.engines.swift_plugin import StopCallback

    class SignalAt(transformers.TrainerCallback):  # type: ignore[misc]
        """The stop signal reaches the rank during step STOP_AT (no torch.distributed: it alone decides)."""

        def __init__(self, stop: StopCallback) -> None:
            self.stop = stop

        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
            self.stop._stop.requested = self.stop._stop.requested or state.global_step == STOP_AT
            return control

    args = transformers.TrainingArguments(
        output_dir=str(tmp_path),
        max_steps=MAX_STEPS,
        per_device_train_batch_size=1,
        per_device_eval_batch_size=1,
        eval_strategy="steps",
        eval_steps=2,
        save_strategy="best",
        metric_for_best_model="eval_loss",
        greater_is_better=False,
        logging_steps=1,
        report_to=[],
        use_cpu=True,
        disable_tqdm=True,
    )
    samples = [{"x": torch.tensor([1.0]), "labels": torch.tensor([0.0])} for _ in range(16)]
    model = ScriptedLoss()
    trainer = transformers.Trainer(model=model, args=args, train_dataset=samples, eval_dataset=samples[:1])
    stop = StopCallback(args, trainer)
    trainer.add_callback(SignalAt(stop))
    trainer.add_callback(stop)
    trainer.train()
    assert (tmp_path / f"checkpoint-{STOP_AT}").is_dir(), sorted(p.name for p in tmp_path.iterdir())
    assert trainer.state.global_step == STOP_AT  # it stopped after that save
    assert model.evaluations == 1  # step 2's; none at the stop step
