"""Where am I? The SLURM environment as a frozen value, and the variables ms-swift reads derived from it.

``SlurmEnv.from_environ`` reads a Mapping and never writes ``os.environ``; ``rank_env`` is a pure
function of (SlurmEnv, plan). Outside SLURM (submitit's local executor, or a plain shell) the node is
node 0 of 1.

Host lists live here too: SLURM's grammar for them (``hostlist_problem``, checked at plan time), their expansion
by python-hostlist (``expand_hostlist``) and by SLURM itself (``slurm_hostnames``, which the node uses: node i is
``hosts[i]`` for blame and preflight, and only SLURM's expansion has SLURM's order).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace

from swiftslurm import slurm
from swiftslurm.engines.registry import engine_for
from swiftslurm.errors import NodeError, SlurmError
from swiftslurm.plan import PORT_SPAN, BatchPlan, JobPlan

log = logging.getLogger(__name__)

HostExpander = Callable[[str], list[str]]

# `<job id>@<when its batch script started>`, exported once per run of the job by the batch script
# (render.job_run_lines): the job run's nonce (rundir/lease.py), the same on every node without asking SLURM.
JOB_RUN_ENV = "SWIFTSLURM_JOB_RUN"


def expand_hostlist(text: str) -> list[str]:
    """'gpu-a[001-003,010],gpu-b7' -> ['gpu-a001', 'gpu-a002', 'gpu-a003', 'gpu-a010', 'gpu-b7'], by python-hostlist,
    duplicates kept as SLURM keeps them. With three or more bracket groups its order differs from SLURM's
    (`slurm_hostnames` has SLURM's), and it takes some lists SLURM refuses (`hostlist_problem` names them)."""
    import hostlist  # python-hostlist: SLURM's syntax, including several bracket groups and padding

    try:
        return list(hostlist.expand_hostlist(text, allow_duplicates=True))
    except hostlist.BadHostlist as err:
        raise NodeError(f"SLURM_JOB_NODELIST={text!r} is not a host list ({err}).") from err


def slurm_hostnames(nodelist: str) -> list[str]:
    """The hosts of a list as SLURM expands it (`scontrol show hostnames`, swiftslurm.slurm.hostnames); where
    scontrol is missing or fails, python-hostlist's expansion, saying so in the node's log."""
    try:
        return slurm.hostnames(nodelist)
    except SlurmError as err:
        hosts = expand_hostlist(nodelist)
        log.warning(f"[swiftslurm] hosts of {nodelist} expanded by python-hostlist, not by SLURM: {err.said or err}")
        return hosts


def task_variables_by_host(env: Mapping[str, str], host: str, expand: HostExpander = expand_hostlist) -> dict[str, str]:
    """The per-task variables of this step's task on ``host``, found from the step's node list ({} outside a
    step). SLURM 22.05 writes an OCI container's environment before it sets each task's own, so inside
    `srun --container` SLURM_PROCID, SLURM_NODEID and SLURM_LOCALID are missing, or are the batch script's (0 on
    every node, exported to srun), and every node would take itself for task 0. swiftslurm's steps run one task
    per node: a task's rank is its node's place in the step's node list, found by ``host`` (the container keeps
    the node's host name). NodeError when that cannot be known."""
    if "SLURM_STEP_ID" not in env:
        return {}
    nodelist = env.get("SLURM_STEP_NODELIST") or env.get("SLURM_JOB_NODELIST", "")
    hosts = expand(nodelist)
    tasks, nodes = env.get("SLURM_STEP_NUM_TASKS", "?"), env.get("SLURM_STEP_NUM_NODES", str(len(hosts)))
    short = host.split(".")[0]
    if tasks != nodes or short not in hosts:
        raise NodeError(
            f"this container task's rank cannot be known (SLURM 22.05 leaves SLURM_PROCID out of a container): {tasks} "
            f"task(s) on {nodes} node(s), host {short!r} {'in' if short in hosts else 'not in'} {nodelist!r}. HINT: "
            "run one task per node with the container keeping the node's host name (job.sbatch does), or SLURM 23.02+."
        )
    node = hosts.index(short)
    return {"SLURM_PROCID": str(node), "SLURM_NODEID": str(node), "SLURM_LOCALID": "0"}


# --- SLURM's host-list grammar (as SLURM 22.05's scontrol and sbatch read it) --------------------------------------

MAX_RANGE_HOSTS = 65536  # the most hosts SLURM takes in one bracketed range ("Too many hosts in range")
HOSTLIST_FORM = "host names separated by commas, with numbers and LO-HI ranges in brackets"
_RANGE = re.compile(r"(\d+)(?:-(\d+))?")


def hostlist_problem(text: str) -> str | None:
    """Why SLURM refuses this host list, or None when it takes it. Stricter than SLURM in two ways, both lists
    SLURM misreads rather than refuses: an unclosed bracket (`node[1-3` is the host `node]` to scontrol) and a
    range without an end (`node[1-]`)."""
    if not text.strip():
        return "it names no host"
    if any(c.isspace() for c in text):
        return "it has a space (SLURM separates hosts with commas only; a space splits the #SBATCH option)"
    if (problem := _bracket_problem(text)) is not None:
        return problem
    for name in _names(text):
        if (problem := _name_problem(name)) is not None:
            return problem
    return None


def _bracket_problem(text: str) -> str | None:
    depth = 0
    for c in text:
        if c == "[" and depth:
            return "its brackets nest"
        if c == "]" and not depth:
            return "a `]` closes no `[`"
        depth += {"[": 1, "]": -1}.get(c, 0)
    return "a `[` is never closed" if depth else None


def _names(text: str) -> list[str]:
    """The comma-separated entries of a list whose brackets balance (commas inside brackets separate numbers)."""
    return [name for name in re.split(r",(?![^\[]*\])", text) if name]


def _name_problem(name: str) -> str | None:
    if "]" in name and not name.endswith("]"):
        after = name[name.rindex("]") + 1 :]
        return f"`{name}` has text after its last bracket group (`{after}`), which SLURM refuses"
    for group in re.findall(r"\[([^\]]*)\]", name):
        for item in group.split(","):
            if (problem := _range_problem(item)) is not None:
                return f"`{name}`: {problem}"
    return None


def _range_problem(item: str) -> str | None:
    match = _RANGE.fullmatch(item)
    if not match:
        return f"`{item}` is not a number or a LO-HI range" if item else "a bracket group has an empty entry"
    low, high = int(match[1]), int(match[2] or match[1])
    if low > high:
        return f"the range {item} runs backwards"
    if high - low + 1 > MAX_RANGE_HOSTS:
        return f"the range {item} has more than {MAX_RANGE_HOSTS} hosts"
    return None


def repaired_hostlist(text: str) -> str | None:
    """A host list SLURM takes that most likely means what ``text`` meant (spaces made commas, an unclosed
    bracket closed, empty entries dropped, backward ranges turned round, text after the last bracket group
    spelled out host by host), or None when these repairs do not give one."""
    fixed = re.sub(r"[\s,]+", ",", text.strip()).strip(",")
    if fixed.count("[") == fixed.count("]") + 1 and fixed.rfind("[") > fixed.rfind("]"):
        fixed += "]"
    fixed = re.sub(r"\[([^\[\]]*)\]", lambda group: f"[{_repaired_group(group[1])}]", fixed)
    if _bracket_problem(fixed) is None:
        fixed = ",".join(_spelled_out(name) for name in _names(fixed))
    return fixed if fixed and hostlist_problem(fixed) is None else None


def _repaired_group(group: str) -> str:
    return ",".join(_turned_round(item) for item in group.split(",") if item)


def _turned_round(item: str) -> str:
    match = _RANGE.fullmatch(item)
    return f"{match[2]}-{match[1]}" if match and match[2] and int(match[1]) > int(match[2]) else item


def _spelled_out(name: str) -> str:
    """`node[1-2]-ib` -> `node1-ib,node2-ib` (SLURM refuses text after the last group); other names unchanged."""
    if "]" not in name or name.endswith("]") or _bracket_problem(name):
        return name
    try:
        hosts = expand_hostlist(name)
    except NodeError:
        return name
    return ",".join(hosts) if len(hosts) <= 16 else name


@dataclass(frozen=True)
class SlurmEnv:
    """The parts of the SLURM task environment swiftslurm uses."""

    job_id: str | None
    hosts: tuple[str, ...]
    node_id: int
    num_nodes: int
    proc_id: int
    num_tasks: int
    restart_count: int = 0
    # SLURM_JOB_END_TIME: the job's end as SLURM projected it at the start (seconds since the epoch; a preemption
    # later moves the real one earlier, which only `scontrol show job` says); None: not set.
    end_time: float | None = None
    # JOB_RUN_ENV: this run of the job, named by its batch script; None: not set (a hand-written script).
    job_run: str | None = None

    @property
    def in_slurm(self) -> bool:
        return bool(self.hosts)

    @classmethod
    def from_environ(cls, env: Mapping[str, str], expand: HostExpander = expand_hostlist) -> SlurmEnv:
        """Where this task runs, read from ``env`` alone. ``expand`` turns SLURM_JOB_NODELIST into hosts: the
        node's entry points pass ``slurm_hostnames`` (SLURM's own order); the default, python-hostlist, starts no
        process, for the dry run's example allocation and for tests."""
        if "SLURM_JOB_ID" not in env or "SLURM_PROCID" not in env:
            return cls.local(env)
        nodelist = env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST", "")
        hosts = tuple(expand(nodelist)) if nodelist else ()
        return cls(
            job_id=env["SLURM_JOB_ID"],
            hosts=hosts,
            node_id=int(env.get("SLURM_NODEID", "0")),
            num_nodes=int(env.get("SLURM_JOB_NUM_NODES") or env.get("SLURM_NNODES") or len(hosts)),
            proc_id=int(env["SLURM_PROCID"]),
            num_tasks=int(env.get("SLURM_NTASKS", "1")),
            restart_count=int(env.get("SLURM_RESTART_COUNT", "0")),
            end_time=_epoch(env.get("SLURM_JOB_END_TIME")),
            job_run=_job_run(env.get(JOB_RUN_ENV), env["SLURM_JOB_ID"]),
        )

    @classmethod
    def local(cls, env: Mapping[str, str]) -> SlurmEnv:
        """Not under srun: a single node. submitit's local executor names the job by its PID."""
        return cls(job_id=env.get("SUBMITIT_LOCAL_JOB_ID"), hosts=(), node_id=0, num_nodes=1, proc_id=0, num_tasks=1)


def _job_run(value: str | None, job_id: str) -> str | None:
    """JOB_RUN_ENV when it names this job (a variable exported into another job's environment, e.g. by an
    sbatch run from inside a job, names that job: not ours); else None."""
    return value if value and value.startswith(f"{job_id}@") else None


def _epoch(value: str | None) -> float | None:
    """A UNIX timestamp SLURM exported; None when unset, 0 (no end) or not a number."""
    try:
        seconds = float(value or 0)
    except ValueError:
        return None
    return seconds if seconds > 0 else None


def configured_exclusions(plan: JobPlan) -> list[str]:
    """The hosts the cluster config excludes (`cluster.exclude`), expanded."""
    return expand_hostlist(plan.slurm.exclude) if plan.slurm and plan.slurm.exclude else []


def master_port(job_id: str | None, base: int) -> int:
    """Derived from the job id so two jobs sharing a node (or a requeue) do not collide or drift."""
    number = int("".join(c for c in (job_id or "0") if c.isdigit()) or 0)
    return base + number % PORT_SPAN


def may_shrink(plan: JobPlan) -> bool:
    """Whether the run may resume on fewer nodes than planned (`resilience.min_nodes`, opt-in)."""
    least = plan.resilience.min_nodes
    return least is not None and least < plan.topology.nodes


def least_nodes(plan: JobPlan) -> int:
    """The fewest nodes an attempt may run on: `resilience.min_nodes` when the run may shrink, else the plan's."""
    least = plan.resilience.min_nodes
    return least if least is not None and may_shrink(plan) else plan.topology.nodes


@dataclass(frozen=True)
class AttemptShape:
    """The size of one attempt, computed once from where it runs and the plan (AttemptShape.of).

    Args:
        nodes: the nodes it trains on: SLURM's allocation when the run may shrink, else the planned count
            (which `check_allocation` makes the allocation's).
        ranks: its training ranks, over those nodes.
        batch: the planned global batch over its data-parallel ranks, with the gradient accumulation that
            keeps it (the plan refused global batches this does not divide).
        may_shrink: whether the run may resume on another node count than planned (`resilience.min_nodes`).
    """

    nodes: int
    ranks: int
    batch: BatchPlan
    may_shrink: bool

    @classmethod
    def of(cls, where: SlurmEnv, plan: JobPlan) -> AttemptShape:
        shrinks = may_shrink(plan)
        nodes = where.num_nodes if shrinks and where.in_slurm else plan.topology.nodes
        return cls(nodes, nodes * plan.topology.procs_per_node, plan.batch_on(nodes), shrinks)

    @property
    def reshard_ranks(self) -> int | None:
        """The ranks to load the resume point at when it may have been written by another number of them (the
        run may shrink, and grow back), for the engine's prepare_reshard/resume_args_at; None when every
        attempt has the planned ranks, so checkpoints load as they are (the default)."""
        return self.ranks if self.may_shrink else None


def check_allocation(where: SlurmEnv, plan: JobPlan) -> None:
    """The allocation must be the one planned: one task per node, the planned node count and spares (or, when
    the run may shrink, between `resilience.min_nodes` and the planned count)."""
    if may_shrink(plan):
        _check_shrunk_allocation(where, plan)
    elif where.num_nodes != plan.allocation_nodes:
        spares = f" + {plan.resilience.spare_nodes} spare(s)" if plan.resilience.spare_nodes else ""
        raise NodeError(
            f"The job has {where.num_nodes} node(s) but plan.json was made for {plan.topology.nodes}{spares}. "
            f"HINT: submit with --nodes={plan.allocation_nodes}, or re-plan with cluster.nodes={where.num_nodes}"
            f"{' and resilience.spare_nodes=0' if spares else ''}."
        )
    if where.num_tasks != where.num_nodes:
        raise NodeError(
            f"The job runs {where.num_tasks} task(s) on {where.num_nodes} node(s); swiftslurm needs exactly one "
            "per node (it starts each node's ranks itself). HINT: srun/sbatch with --ntasks-per-node=1."
        )


def _check_shrunk_allocation(where: SlurmEnv, plan: JobPlan) -> None:
    least, planned = least_nodes(plan), plan.topology.nodes
    if least <= where.num_nodes <= planned:
        return
    raise NodeError(
        f"The job has {where.num_nodes} node(s) but plan.json allows {least} to {planned} "
        f"(resilience.min_nodes={least}, cluster.nodes={planned}). HINT: `scontrol update JobId={where.job_id} "
        f"NumNodes={planned}` while it is pending, or re-plan with cluster.nodes={where.num_nodes}."
    )


# --- the roster: which of the allocation's hosts train, in node-rank order -------------------------------------


def first_roster(where: SlurmEnv, plan: JobPlan) -> tuple[str, ...]:
    """The training hosts of the allocation's first attempt, in node-rank order: the first ones SLURM lists (its
    node 0, the batch host, leads and always trains), as many as the attempt trains on; the rest are spares
    (`resilience.spare_nodes`). Every node computes the same from SLURM's order; later rosters are node 0's
    word (outcome.py)."""
    trained = AttemptShape.of(where, plan).nodes if may_shrink(plan) else plan.topology.nodes
    return where.hosts[:trained]


def own_host(where: SlurmEnv) -> str:
    """This node's name as SLURM lists it (the allocation's, not the roster's: SLURM's node id names it)."""
    return where.hosts[where.node_id]


def on_roster(allocation: SlurmEnv, roster: tuple[str, ...]) -> SlurmEnv | None:
    """This node as one attempt's training nodes see it: the roster as its hosts, its place there as its node
    id (so node results, logs, NODE_RANK and MASTER_ADDR follow the roster), one task per roster host. None:
    this node is not on the roster (a spare, or a node taken out). Outside SLURM, the node as it is."""
    if not allocation.in_slurm or roster == allocation.hosts:
        return allocation
    host = own_host(allocation)
    if host not in roster:
        return None
    rank = roster.index(host)
    return replace(allocation, hosts=roster, node_id=rank, proc_id=rank, num_nodes=len(roster), num_tasks=len(roster))


def rank_env(where: SlurmEnv, plan: JobPlan) -> dict[str, str]:
    """The variables `swift`/`megatron` read to start torchrun on this node (none for one process)."""
    topo, nodes = plan.topology, AttemptShape.of(where, plan).nodes
    one_process = nodes == 1 and topo.procs_per_node == 1
    if one_process and not engine_for(plan.launcher).needs_torchrun_for_one_process(plan.swift_argv):
        return {}  # a single process: ms-swift runs without torchrun
    env = {"NPROC_PER_NODE": str(topo.procs_per_node)}
    if nodes > 1 or where.in_slurm:
        env |= {
            "NNODES": str(nodes),
            "NODE_RANK": str(where.node_id),
            "MASTER_ADDR": where.hosts[0] if where.hosts else "127.0.0.1",
        }
    env["MASTER_PORT"] = str(master_port(where.job_id, plan.master_port_base))
    return env
