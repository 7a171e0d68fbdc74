"""Resume on fewer nodes (`resilience.min_nodes`, opt-in): the node count a requeue asks for (pure), the ranks
and gradient accumulation of an attempt on fewer nodes, the plan-time refusals, and the leader's requeue with
SLURM faked at its one seam (slurm_cli.run). The run on the real cluster is tests/cluster/test_shrink.py."""

from __future__ import annotations

from pathlib import Path

from tests.conftest import plan_for
from tests.unit.test_shrink import THREE, shrink_plan


def test_a_shrinkable_job_script_starts_one_task_per_node_of_the_allocation(tmp_path: Path) -> None:
    """sbatch stores SLURM_NTASKS at submission; after a requeue on fewer nodes it still says 3, and srun then
    asks for 3 tasks on 2 nodes (seen on SLURM 22.05: "More processors requested than permitted"). Both job
    scripts (job.sbatch and submitit's) set it from the allocation before srun; a plan that cannot shrink
    keeps its script as it was."""
    import subprocess

    from swiftslurm.render import render_sbatch, task_count_lines
    from swiftslurm.submit.jobs import executor_parameters

    plan = shrink_plan(tmp_path)
    lines = task_count_lines(plan)
    script = render_sbatch(plan)
    assert lines and script.index(lines[-1]) < script.index("\nsrun ")
    assert executor_parameters(plan)["slurm_setup"][-len(lines) :] == lines
    assert task_count_lines(plan_for(*THREE)) == []
    assert "SLURM_NTASKS" not in render_sbatch(plan_for(*THREE))
    shell = "\n".join([*lines, 'echo "$SLURM_NTASKS $SLURM_NPROCS"'])
    stale = {"PATH": "/usr/bin:/bin", "SLURM_JOB_NUM_NODES": "2", "SLURM_NTASKS": "3", "SLURM_NPROCS": "3"}
    assert subprocess.run(["bash", "-c", shell], env=stale, capture_output=True, text=True).stdout == "2 2\n"
