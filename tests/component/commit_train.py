"""A real Transformers Trainer (ms-swift's TrainingArguments and flow: the last step is saved, the summary goes to
logging.jsonl) with swiftslurm's commit callback, two steps on the CPU. Run by test_final_commit.py:

    python tests/component/commit_train.py OUTPUT_DIR ok|full-disk

`full-disk`: every commit fails with ENOSPC, as on a full output file system.
"""

from __future__ import annotations

import errno
import sys
from pathlib import Path
from typing import Any

import torch
from swift.trainers import TrainingArguments
from transformers import Trainer

from swiftslurm.ckpt import checkpoint
from swiftslurm.engines.swift_plugin import CommitCallback


def full_disk(*args: Any, **kwargs: Any) -> dict[str, Any]:
    raise OSError(errno.ENOSPC, "No space left on device")


class Tiny(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w = torch.nn.Linear(2, 1)

    def forward(self, x: torch.Tensor, labels: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"loss": ((self.w(x).squeeze(-1) - labels) ** 2).mean()}


def main(output: Path, fault: str) -> None:
    if fault == "full-disk":
        checkpoint.commit = full_disk  # type: ignore[assignment]
    torch.manual_seed(0)
    data = [{"x": torch.randn(2), "labels": torch.tensor(0.0)} for _ in range(8)]
    args = TrainingArguments(
        output_dir=str(output),
        max_steps=2,
        save_steps=2,
        logging_steps=1,
        per_device_train_batch_size=2,
        gradient_accumulation_steps=1,
        gradient_checkpointing=False,
        dataloader_num_workers=0,
        report_to=[],
        use_cpu=True,
    )
    trainer = Trainer(model=Tiny(), args=args, train_dataset=data)
    trainer.add_callback(CommitCallback(args, trainer))
    trainer.train()


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2])
