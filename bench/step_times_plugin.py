"""ms-swift plugin for `bench/storage.py --training`: when each training step began and ended (Unix time, rank
0), written to <output_dir>/step_times.json at the end of training.

Set beside <run_dir>/uploads.jsonl (when each upload ran), it compares steps that ran while an upload did
with steps of the same run that did not: a comparison inside one run, free of the run-to-run noise that
swamps on-versus-off runs on a shared machine. A step here is forward, backward and optimizer step, from
`on_step_begin` to `on_step_end`; saving a checkpoint happens after `on_step_end`, so it is not in a step.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from swift.callbacks import TrainerCallback, callbacks_map

STEP_TIMES = "step_times.json"


class StepTimes(TrainerCallback):
    def __init__(self, args: Any, trainer: Any) -> None:
        super().__init__(args, trainer)
        self.steps: list[tuple[int, float, float]] = []  # (global step after it, began, ended)
        self._began = 0.0

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        self._began = time.time()
        return control

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        self.steps.append((state.global_step, self._began, time.time()))
        return control

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        if state.is_world_process_zero:
            (Path(args.output_dir) / STEP_TIMES).write_text(json.dumps(self.steps))
        return control


callbacks_map["bench_step_times"] = StepTimes
