"""ms-swift plugin for tests: `oom` makes global rank OOM_RANK (node 1 on the local cluster) fail at the end of
step OOM_STEP with the error a CUDA out-of-memory raises, in every attempt: the last pipeline stage running out
of GPU memory, on CPU ranks. Node 0's trainer then fails or is ended by its wrapper for node 1's sake.
"""

from __future__ import annotations

import os
from typing import Any

import torch
from swift.callbacks import TrainerCallback, callbacks_map

OOM_STEP = 3
OOM_RANK = "1"


class OomCallback(TrainerCallback):
    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        if state.global_step == OOM_STEP and os.environ.get("RANK") == OOM_RANK:
            raise torch.OutOfMemoryError(
                "CUDA out of memory. Tried to allocate 2.00 GiB (raised by tests/cluster/oom_plugin.py)"
            )
        return control


callbacks_map["oom"] = OomCallback
