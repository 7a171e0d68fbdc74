"""What the command line prints: the plan, the per-node environment table, the final result."""

from __future__ import annotations

from pathlib import Path

from swiftslurm import container
from swiftslurm.ckpt.checkpoint import disk_policy, newest_checkpoint
from swiftslurm.engines.registry import engine_for
from swiftslurm.plan import STRAGGLER_SWAP, JobPlan
from swiftslurm.render import display_command, render_sbatch, swift_command
from swiftslurm.rundir.layout import PREFLIGHT_REPORT, SBATCH, preflight_dir
from swiftslurm.rundir.metrics import read_metrics
from swiftslurm.rundir.reserve import RESERVE_BYTES
from swiftslurm.slurm_env import SlurmEnv, first_roster, on_roster, rank_env
from swiftslurm.submit.preflight import read_report

EXAMPLE_JOB_ID = "12345"


def describe_plan(plan: JobPlan) -> str:
    topo, batch, par = plan.topology, plan.batch, plan.parallel
    devices = f"{topo.gpus_per_node} GPUs" if topo.gpus_per_node else f"{topo.procs_per_node} CPU process(es)"
    lines = [
        f"run         {plan.run_name}",
        f"run dir     {plan.run_dir}",
        f"command     {plan.launcher} {plan.command}  (model {plan.model_id})",
        f"topology    {topo.nodes} node(s) × {devices} = world size {topo.world_size}  [{plan.scheduler}]",
        f"parallel    tp {par.tp} × pp {par.pp} × cp {par.cp} (ep {par.ep}, sequence parallel "
        f"{'on' if par.sequence_parallel else 'off'}) → data parallel {batch.data_parallel}",
        f"batch       global {batch.global_} = micro {batch.micro} × grad accum {batch.grad_accum} "
        f"× data parallel {batch.data_parallel} (samples per optimizer step)",
        *_disk_lines(plan),
    ]
    if plan.slurm:
        spec = plan.slurm
        limit = f"{spec.time_min} min" if spec.time_min else "no limit"
        lines.append(
            f"slurm       partition {spec.partition}, time {spec.time} ({limit}), "
            f"signal {spec.signal}, gpus/node {spec.gpus or 0}"
        )
    if (spares := spares_line(plan)) is not None:
        lines.append(spares)
    return "\n".join(lines)


def spares_line(plan: JobPlan) -> str | None:
    """The plan's spares (`resilience.spare_nodes`) and what they cost: allocated for the whole job run, idle
    until a training node is lost (None: no spares)."""
    spares, topo = plan.resilience.spare_nodes, plan.topology
    if not spares:
        return None
    unit, per_node = ("GPU", topo.gpus_per_node) if topo.gpus_per_node else ("CPU process", topo.procs_per_node)
    time_min = plan.slurm.time_min if plan.slurm else 0
    cost = (
        f"{spares * per_node * time_min / 60:.1f} {unit}-hours per job run at the time limit"
        if time_min
        else f"{spares * per_node} {unit}(s) for as long as the job runs (no time limit)"
    )
    share = spares / plan.allocation_nodes
    return (
        f"spares      {spares} node(s) beside the {topo.nodes} training: the job asks for {plan.allocation_nodes} "
        f"(sbatch/srun --no-kill); idle until a training node is lost{_or_slow(plan)}, then one takes its place in "
        f"the same job; cost: {cost}, {share:.0%} of the allocation (docs/resilience.md)"
    )


def _or_slow(plan: JobPlan) -> str:
    """With `straggler_action=swap`: when else a spare takes a training node's place."""
    res = plan.resilience
    if res.straggler_action != STRAGGLER_SWAP:
        return ""
    return (
        f" or one is a straggler ({res.straggler_ratio}× slower for {res.straggler_s:.0f} s: stopped at a checkpoint)"
    )


def _disk_lines(plan: JobPlan) -> list[str]:
    """What is deleted from the output dir and when; what a full disk does."""
    rules = [
        *disk_policy(plan.keep_checkpoints, plan.storage is not None),
        "a save that does not fit is disk_full: retried after the back-off, counted like a failure;",
        f"each node holds {RESERVE_BYTES >> 20} MiB back while training, so that its records still fit",
    ]
    return [("disk" if i == 0 else "").ljust(12) + rule for i, rule in enumerate(rules)]


def describe_engine(plan: JobPlan) -> str:
    rows = engine_for(plan.launcher).describe()
    width = max(len(key) for key, _ in rows)
    return "\n".join(f"{key.ljust(width)}  {value}" for key, value in rows)


def example_node_envs(plan: JobPlan) -> list[tuple[SlurmEnv, dict[str, str]]]:
    """What each node's wrapper will export, for an example allocation (the same code runs on nodes)."""
    if plan.scheduler == "local":
        where = SlurmEnv.local({})
        return [(where, rank_env(where, plan))]
    n = plan.allocation_nodes  # the training nodes, then the spares
    nodelist = f"node[001-{n:03d}]" if n > 1 else "node001"
    rows = []
    for node in range(n):
        srun_env = {
            "SLURM_JOB_ID": EXAMPLE_JOB_ID,
            "SLURM_JOB_NODELIST": nodelist,
            "SLURM_JOB_NUM_NODES": str(n),
            "SLURM_NODEID": str(node),
            "SLURM_PROCID": str(node),
            "SLURM_NTASKS": str(n),
        }
        where = SlurmEnv.from_environ(srun_env)
        placed = on_roster(where, first_roster(where, plan))
        rows.append((where, rank_env(placed, plan) if placed is not None else {}))  # a spare starts no trainer
    return rows


def node_env_table(plan: JobPlan) -> str:
    keys = ["NNODES", "NODE_RANK", "MASTER_ADDR", "MASTER_PORT", "NPROC_PER_NODE"]
    rows = [["node", "host", *keys]]
    for where, env in example_node_envs(plan):
        host = where.hosts[where.node_id] if where.hosts else "(this machine)"
        rows.append([str(where.node_id), host, *(env.get(k, "-") for k in keys)])
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    table = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip() for row in rows]
    static = " ".join(f"{k}={v}" for k, v in plan.env)
    return "\n".join([*table, f"every node also exports: {static}"])


def dry_run_report(plan: JobPlan) -> str:
    sections = [("plan", describe_plan(plan))]
    if plan.slurm:
        sections.append((SBATCH, render_sbatch(plan).rstrip()))
    if plan.container:
        sections.append((f"container ({plan.container.runtime})", container.describe(plan.container, plan)))
    where = (
        f"example allocation: SLURM_JOB_ID={EXAMPLE_JOB_ID}, hosts node001..; MASTER_PORT = "
        f"{plan.master_port_base} + job id mod 20000"
        if plan.slurm
        else "this machine"
    )
    sections.append((f"per-node environment ({where}; '-' = not set)", node_env_table(plan)))
    sections.append(("engine (how swiftslurm drives it)", describe_engine(plan)))
    sections.append(("ms-swift command (every node)", display_command(swift_command(plan))))
    return "\n\n".join(f"== {title} ==\n{body}" for title, body in sections)


def result_summary(plan: JobPlan, state: str, why: str, attempts: int) -> str:
    """What `wait=true` prints at the end: the run's state as `status` tells it, the loss, the last checkpoint."""
    loss = read_metrics(Path(plan.run_dir)).loss  # the last loss ms-swift logged
    checkpoint = newest_checkpoint(plan.output_dir)
    return "\n".join(
        [
            f"state            {state}" + (f": {why}" if why else "") + f" ({attempts} attempt(s))",
            *([f"preflight        {preflight_verdict(Path(plan.run_dir))}"] if plan.preflight.enabled else []),
            f"run dir          {plan.run_dir}",
            f"final loss       {loss:.4f}" if loss is not None else "final loss       (none logged)",
            f"last checkpoint  {checkpoint or '(none)'}",
        ]
    )


def preflight_verdict(run_dir: Path) -> str:
    """The newest preflight report's verdict in a line (`preflight=true`: each attempt's checks, node 0's report)."""
    reports = sorted(preflight_dir(run_dir).glob(f"*/{PREFLIGHT_REPORT}"), key=lambda f: f.stat().st_mtime)
    report = read_report(reports[-1]) if reports else None
    if report is None:
        return "no report (the job ended before its checks did)"
    failed = report.failures()
    if not failed:
        return f"passed on {len(report.nodes)} node(s) ({reports[-1]})"
    node, check = failed[0]
    return f"FAILED {len(failed)} check(s), first: {node.host} {check.name}: {check.detail} ({reports[-1]})"
