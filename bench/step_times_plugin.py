"""ms-swift plugin for `bench/straggler_swap.py`: `step_times` has global rank 0 append each training step's end
(its step and the wall clock) to SWIFTSLURM_BENCH_STEP_TIMES, one JSON line a step, across the attempts of a run
(the trainer's own log says a step's time only in whole seconds, every `logging_steps`)."""

from __future__ import annotations

import json
import os
import time
from typing import Any

from swift.callbacks import TrainerCallback, callbacks_map

STEP_TIMES_ENV = "SWIFTSLURM_BENCH_STEP_TIMES"


class StepTimes(TrainerCallback):
    def __init__(self, args: Any, trainer: Any) -> None:
        super().__init__(args, trainer)
        path = os.environ.get(STEP_TIMES_ENV) if os.environ.get("RANK", "0") == "0" else None
        self.out = open(path, "a", buffering=1) if path else None  # noqa: SIM115  # one line a step, until exit

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        if self.out is not None:
            self.out.write(json.dumps({"step": state.global_step, "t": round(time.time(), 4)}) + "\n")
        return control


callbacks_map["step_times"] = StepTimes
