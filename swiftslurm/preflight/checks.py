"""The pre-launch checklist as values: one `Check` per fact, one `NodeReport` per node, one `Report` per run.

Everything here is pure (no clock, files or sockets): `preflight/gather.py` gathers the facts on each node and
calls these to judge them, so every message and threshold is tested with plain tables.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from swiftslurm.plan import Mount

NET_HINT = (
    "HINT: open TCP from every node of the allocation to the master port range (cluster.master_port_base + "
    "0..19999) on the first node, and check that NCCL_SOCKET_IFNAME/GLOO_SOCKET_IFNAME (cluster.nccl.socket_ifname) "
    "names the interface the nodes share."
)
SHARED_FS_HINT = (
    "HINT: put run_dir on a filesystem every node mounts at the same path (not /tmp or a node-local disk), "
    "and check that it is mounted on that node."
)


@dataclass(frozen=True)
class Check:
    """One item of the checklist, as seen from one host."""

    name: str
    ok: bool
    detail: str
    hint: str = ""
    consequence: bool = False  # failed only because an earlier check did: never named as the cause
    # The host that made the check when it is not the row's node: node 0 checks each peer's token and check-in,
    # and files those checks under the peer (the node at fault when they fail); the table shows who checked.
    by: str = ""

    @property
    def message(self) -> str:
        return f"{self.detail} {self.hint}".strip()


@dataclass(frozen=True)
class NodeReport:
    node: int
    host: str
    checks: tuple[Check, ...]
    topology: str = ""  # `nvidia-smi topo -m` on GPU nodes: which GPUs talk over NVLink, PCIe, sockets

    @property
    def ok(self) -> bool:
        return all(c.ok for c in self.checks)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> NodeReport:
        checks = tuple(Check(**c) for c in data["checks"])
        return cls(int(data["node"]), str(data["host"]), checks, str(data.get("topology", "")))


@dataclass(frozen=True)
class Report:
    """The whole allocation's verdict, assembled by node 0."""

    attempt: str
    nodes: tuple[NodeReport, ...]
    extra: dict[str, Any] = field(default_factory=dict)  # facts for report.json: master address, port, ...

    @property
    def ok(self) -> bool:
        return all(n.ok for n in self.nodes)

    def failures(self) -> list[tuple[NodeReport, Check]]:
        return [(n, c) for n in self.nodes for c in n.checks if not c.ok]

    def first_failure(self) -> str | None:
        """'node2: <what failed> HINT: ...', the reason a stopped run gives; None when all passed."""
        failed = self.failures()
        if not failed:
            return None
        causes = [(n, c) for n, c in failed if not c.consequence]
        node, check = (causes or failed)[0]
        return f"{node.host}: {check.message}"

    def to_dict(self) -> dict[str, Any]:
        return {"attempt": self.attempt, "ok": self.ok, "nodes": [n.to_dict() for n in self.nodes], **self.extra}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Report:
        """report.json back (to_dict's inverse; `ok` is derived)."""
        nodes = tuple(NodeReport.from_dict(n) for n in data["nodes"])
        extra = {k: v for k, v in data.items() if k not in ("attempt", "ok", "nodes")}
        return cls(str(data["attempt"]), nodes, extra)


# ---------------------------------------------------------------- judging single facts


def port_free(host: str, port: int, error: str | None) -> Check:
    if error is None:
        return Check("master port free", True, f"{host}:{port} bound")
    return Check(
        "master port free",
        False,
        f"cannot bind the master port {host}:{port} ({error}).",
        "HINT: another job or a leftover process holds it (`ss -ltnp` on that node); set "
        "cluster.master_port_base to a free range.",
    )


def port_reachable(addr: str, port: int, error: str | None, waited_s: float) -> Check:
    if error is None:
        return Check("master port reachable", True, f"connected to {addr}:{port}")
    return Check(
        "master port reachable",
        False,
        f"cannot reach {addr}:{port} ({error}; tried for {waited_s:.0f} s).",
        NET_HINT,
    )


def peer_missing(peer: str, master: str, port: int, waited_s: float, reported: bool) -> Check:
    """Node 0's view of a node that never connected; a consequence when that node's own report says why."""
    return Check(
        "master port reachable",
        False,
        f"{peer} did not check in at {master}:{port} within {waited_s:.0f} s.",
        ""
        if reported
        else "HINT: look at that node's output in the job log (it may not have started, or cannot "
        "see the run dir and reach the port either).",
        consequence=reported,
    )


def run_dir_writable(path: str, error: str | None) -> Check:
    if error is None:
        return Check("run dir writable", True, f"wrote, synced and read back {path}")
    return Check(
        "run dir writable",
        False,
        f"cannot write {path} ({error}).",
        "HINT: check permissions and quota of run_dir on that node, or pick another run_dir.",
    )


def plan_readable(path: str, error: str | None) -> Check:
    if error is None:
        return Check("run dir visible", True, f"read {path}")
    return Check(
        "run dir visible", False, f"cannot read {path} ({error}): the run dir is not visible here.", SHARED_FS_HINT
    )


def token_visible(reader: str, writer: str, path: str, seen: bool, waited_s: float) -> Check:
    """Whether `reader` sees the token `writer` wrote into the run dir."""
    if seen:
        return Check("run dir visible", True, f"{reader} sees {writer}'s {path}")
    return Check(
        "run dir visible",
        False,
        f"{reader} cannot see {path}, written by {writer}, after {waited_s:.0f} s: the run dir is not shared "
        "between these nodes.",
        SHARED_FS_HINT,
    )


def local_path(path: str, exists: bool) -> Check:
    if exists:
        return Check("model/dataset path", True, f"{path} exists")
    return Check(
        "model/dataset path",
        False,
        f"{path} does not exist on this node.",
        "HINT: put models and datasets on a filesystem every node mounts at the same path, or copy them to "
        "each node first (cluster.setup).",
    )


def store_reachable(url: str, error: str | None) -> Check:
    """The object store answers this node (storage=s3): every node uploads or restores."""
    if error is None:
        return Check("object store", True, f"{url} answers")
    return Check(
        "object store",
        False,
        f"{url} cannot be reached from this node: {error}.",
        "HINT: set storage.endpoint_url to an address every node reaches (not 127.0.0.1 or localhost: each "
        "node's own loopback); docs/storage.md.",
    )


def free_disk(path: str, free_bytes: int, need_gb: float) -> Check:
    free_gb = free_bytes / 1e9
    detail = f"{free_gb:.1f} GB free in {path}, {need_gb:.1f} GB needed"
    if free_gb >= need_gb:
        return Check("free disk", True, detail)
    return Check(
        "free disk",
        False,
        f"{detail} for the next checkpoint.",
        "HINT: free space there, set keep_checkpoints=N so older checkpoints are deleted, move run_dir, or set "
        "preflight_min_free_gb if the estimate is too high.",
    )


def gpus(planned: int, seen: int | None, visible: str | None, error: str | None = None) -> Check:
    """`seen`: torch.cuda.device_count() on the node (None when torch could not be asked)."""
    if planned == 0:
        return Check("GPUs", True, "no GPUs planned (CPU training)")
    if seen is None:
        return Check(
            "GPUs", False, f"cannot count GPUs ({error}).", "HINT: install a CUDA build of torch on the nodes."
        )
    if seen >= planned:
        return Check("GPUs", True, f"{seen} visible, {planned} planned (CUDA_VISIBLE_DEVICES={visible})")
    return Check(
        "GPUs",
        False,
        f"{seen} GPU(s) visible, {planned} planned (CUDA_VISIBLE_DEVICES={visible}).",
        "HINT: request them (cluster.gpus_per_node sets --gpus-per-node) and check `nvidia-smi` on that node, "
        "or plan with cluster.gpus_per_node=" + str(seen) + ".",
    )


def distributed(backend: str, world: int, result: Sequence[float] | None, error: str | None) -> Check:
    """The all-reduce of [rank + 1, 1] over all nodes must be [world (world + 1) / 2, world]."""
    name = f"torch.distributed ({backend}) all-reduce"
    expected = [world * (world + 1) / 2, float(world)]
    if error is not None:
        return Check(name, False, f"failed over {world} node(s): {error}", NET_HINT)
    if result is None or list(result) != expected:
        return Check(name, False, f"wrong sum over {world} node(s): {result}, expected {expected}.", NET_HINT)
    return Check(name, True, f"{world} node(s), sum {expected} correct")


# ---------------------------------------------------------------- the container (plan.container set)


def container_started(runtime: str, image: str, os_name: str | None) -> Check:
    """Made inside the container, so that it is made at all says the container started; the root filesystem's
    OS name says it is the image's."""
    return Check("container", True, f"{runtime} {image}: running {os_name or '(no /etc/os-release)'}")


def package(distribution: str, planned: str | None, found: str | None, python: str, python_from: str) -> Check:
    """``distribution`` as installed for the container's Python against the version the run was planned with."""
    name = f"{distribution} in the container"
    if found is not None and planned in (None, found):
        return Check(name, True, f"{distribution} {found} for {python}" + ("" if planned else " (none planned)"))
    wanted = f"{distribution}=={planned}" if planned else distribution
    if python_from == "host":
        fix = (
            f"HINT: plan the run with that Python ({python} -m swiftslurm ...), or install {wanted} into it; if it "
            "has it outside, the container does not see its environment (see the dry run's mounts)."
        )
    else:
        fix = f"HINT: install {wanted} in the image, or set container.python=host (the planning Python, mounted)."
    if found is None:
        return Check(name, False, f"{distribution} is not installed for {python} inside the container.", fix)
    return Check(
        name, False, f"{distribution} {found} is installed for {python} inside the container, planned: {planned}.", fix
    )


def entry_point(path: str, runnable: bool) -> Check:
    """The `swift`/`megatron` command the ranks start (plan.executable)."""
    if runnable:
        return Check("ms-swift command", True, f"{path} is executable")
    return Check(
        "ms-swift command",
        False,
        f"{path} is not an executable file inside the container.",
        "HINT: install ms-swift next to the container's Python (its `swift` command goes beside it), or set "
        "container.python to the interpreter that has it.",
    )


def mounts(results: Sequence[tuple[Mount, str | None]]) -> list[Check]:
    """One row when the container sees every mount as planned; else one row per mount it does not."""
    failed = [(m, why) for m, why in results if why is not None]
    if not failed:
        rw = sum(not m.read_only for m, _ in results)
        return [Check("container mounts", True, f"{len(results)} seen, {rw} of them writable")]
    return [_mount_failure(m, why) for m, why in failed if why is not None]


def _mount_failure(mount: Mount, why: str) -> Check:
    detail = f"{mount.target} {why} inside the container; it is mounted for {mount.why}."
    if why == "is mounted read-only":
        hint = f"HINT: mount it writable: container.mounts+=['{mount.source}:{mount.target}'] (no ':ro')."
    else:
        hint = (
            f"HINT: add container.mounts+=['{mount.spec}'] and check that {mount.source} exists on that node "
            "(the runtime mounts what it finds)."
        )
    return Check("container mounts", False, detail, hint)


def slurm_client(node: str, client: str | None, cluster: str | None, error: str | None) -> Check:
    """`scontrol` inside the container: the wrapper requeues the job with it. ``cluster``: the version of
    ``node``'s slurmd as slurmctld reports it; the releases (22.05 of 22.05.8) must be the same."""
    name = "scontrol in the container"
    fix = (
        "HINT: install SLURM's client{} in the image (the wrapper requeues the job with scontrol from inside), "
        "with slurm.conf and munge's socket mounted (derived unless container.derive_mounts=false)."
    )
    if error is not None or client is None:
        return Check(name, False, f"scontrol does not work inside the container: {error}.", fix.format(""))
    if not cluster:
        return Check(name, True, f"scontrol {client} runs (slurmctld did not report {node}'s version)")
    if _release(client) != _release(cluster):
        detail = f"scontrol inside the container is SLURM {client}, {node}'s slurmd is {cluster}."
        return Check(name, False, detail, fix.format(f" of release {_release(cluster)}"))
    return Check(name, True, f"scontrol {client} asks slurmctld; {node}'s slurmd is {cluster}")


def _release(version: str) -> str:
    return ".".join(version.split(".")[:2])


def skipped(name: str, why: str) -> Check:
    return Check(name, False, f"not run: {why}.", consequence=True)


# ---------------------------------------------------------------- the whole report


def missing_node(node: int, host: str, checks: Iterable[Check]) -> NodeReport:
    """A node that sent nothing: what node 0 could establish about it."""
    return NodeReport(node, host, tuple(checks))


def assemble(attempt: str, reports: Iterable[NodeReport], extra: dict[str, Any] | None = None) -> Report:
    return Report(attempt, tuple(sorted(reports, key=lambda r: r.node)), extra or {})


def render_table(report: Report) -> str:
    """A readable table: one line per check, under the host that made it, failures with their fix; a verdict
    line last (it names the node at fault)."""
    rows = [
        (c.by or n.host, c.name, "ok" if c.ok else "FAILED", c.detail if c.ok else c.message)
        for n in report.nodes
        for c in n.checks
    ]
    widths = [max([len(h), *(len(r[i]) for r in rows)]) for i, h in enumerate(("host", "check", "result"))]
    lines = [f"{'host':{widths[0]}}  {'check':{widths[1]}}  {'result':{widths[2]}}  detail"]
    lines += [f"{h:{widths[0]}}  {c:{widths[1]}}  {r:{widths[2]}}  {d}" for h, c, r, d in rows]
    return "\n".join([*lines, verdict(report)])


def verdict(report: Report) -> str:
    """One line: passed on how many nodes, or the first failure; node 0 also puts it into its node log."""
    failed = report.failures()
    if not failed:
        return f"preflight passed on {len(report.nodes)} node(s)"
    return f"preflight FAILED ({len(failed)} check(s)): {report.first_failure()}"
