"""ms-swift plugin for tests: `gate` holds training at step GATE_STEP until the test opens the gate.

A test about two jobs in one run dir needs the first still training when the second starts, on any machine:
the first waits at this step (its checkpoint of step 10 committed) until the test creates RUN_DIR/GATE_FILE.
Bounded: after GATE_MAX_S it goes on by itself. SWIFTSLURM_TEST_GATE_STEP (`+cluster.env.SWIFTSLURM_TEST_GATE_STEP=N`)
holds at another step: a test that needs a resumed attempt still running holds it past its resume point.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from swift.callbacks import TrainerCallback, callbacks_map

GATE_STEP = int(os.environ.get("SWIFTSLURM_TEST_GATE_STEP", "15"))
GATE_FILE = "gate.open"
GATE_MAX_S = 900.0


class GateCallback(TrainerCallback):
    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        if state.global_step == GATE_STEP:
            gate = Path(os.environ["SWIFTSLURM_RUN_DIR"]) / GATE_FILE
            print(f"[gate] holding at step {GATE_STEP} until {gate} exists", flush=True)
            deadline = time.monotonic() + GATE_MAX_S
            while not gate.exists() and time.monotonic() < deadline:
                time.sleep(0.2)
        return control


callbacks_map["gate"] = GateCallback
