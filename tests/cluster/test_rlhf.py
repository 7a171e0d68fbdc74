"""DPO and GRPO (`swift rlhf`) survive preemption: real 2-node jobs on the local SLURM cluster, real ms-swift.

For each algorithm one run is never stopped and one gets SLURM's USR2 mid-run: it must save the step it is at,
commit it, be requeued as the same job, resume from exactly that checkpoint and end with the very adapter
bytes of the uninterrupted run. For GRPO that holds because the rollouts are reproducible across the resume:
they are sampled with torch's global RNG, whose per-rank state the checkpoint saves (`rng_state_{rank}.pth`)
and the Trainer restores on resume (docs/resilience.md, "DPO and GRPO").
"""

from __future__ import annotations

from pathlib import Path

import pytest

from swiftslurm import tiny
from swiftslurm.ckpt.checkpoint import is_committed
from swiftslurm.testing.cli import swiftslurm
from swiftslurm.testing.cluster import attempts, preempt_at_steps, status, submit, wait_for_job

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

LAST_STEP = {"dpo": 60, "grpo": 100}
PREEMPT_AT = 20  # well before the first periodic save, so the commit is the stop signal's own
PLANS = {
    "dpo": ("task=dpo", "dataset=[tiny-dpo]", f"swift.max_steps={LAST_STEP['dpo']}", "swift.save_steps=30"),
    # Rollouts by Hugging Face generate on the CPU (no vLLM): 4 completions of 16 tokens per step (2 per rank),
    # rewarded by swiftslurm's plugin (ms-swift's `accuracy` needs math_verify, `format` never pays here).
    "grpo": (
        "task=grpo",
        "task.vllm_mode=null",
        "dataset=[tiny-grpo]",
        "micro_batch_size=2",
        "swift.num_generations=4",
        "swift.max_completion_length=16",
        f"swift.reward_funcs=[{tiny.REWARD_NAME}]",
        f"swift.external_plugins=[{tiny.REWARD_PLUGIN}]",
        f"swift.max_steps={LAST_STEP['grpo']}",
        "swift.save_steps=50",
    ),
}


def adapter(run_dir: Path, step: int) -> bytes:
    return (run_dir / "output" / f"checkpoint-{step}" / "adapter_model.safetensors").read_bytes()


@pytest.fixture(scope="module", params=sorted(PLANS))
def uninterrupted_rlhf(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, slurm_cluster: None
) -> tuple[str, bytes]:
    """(algorithm, final adapter bytes) of a run of PLANS[algorithm] that is never stopped."""
    algorithm = request.param
    run_dir = tmp_path_factory.mktemp(f"uninterrupted-{algorithm}") / "run"
    done = swiftslurm("+cluster=local-slurm", "wait=true", f"run_dir={run_dir}", *PLANS[algorithm], cwd=run_dir.parent)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    return algorithm, adapter(run_dir, LAST_STEP[algorithm])


def test_rlhf_preempted_mid_run_resumes_and_ends_identical(
    tmp_path: Path, uninterrupted_rlhf: tuple[str, bytes]
) -> None:
    algorithm, expected = uninterrupted_rlhf
    run_dir = tmp_path / "run"
    job = submit(run_dir, *PLANS[algorithm])
    preempt_at_steps(run_dir, job, [PREEMPT_AT])
    assert wait_for_job(job) == "COMPLETED"

    first, last = attempts(run_dir)[0], attempts(run_dir)[-1]
    assert (first["reason"], first["decision"]) == ("preempted", "requeue"), first
    assert PREEMPT_AT <= first["committed_step"] == first["last_step"] < LAST_STEP[algorithm]  # saved where it was
    saved = run_dir / "output" / f"checkpoint-{first['committed_step']}"
    assert is_committed(saved)
    assert last["resumed_from"] == str(saved) and last["resume_step"] == first["committed_step"]
    assert last["job_id"] == first["job_id"] and last["reason"] == "finished"  # the same job, requeued
    assert status(run_dir)["state"] == "finished"
    final = adapter(run_dir, LAST_STEP[algorithm])
    assert final != adapter(run_dir, first["committed_step"])  # training after the resume moved the adapter
    assert final == expected
