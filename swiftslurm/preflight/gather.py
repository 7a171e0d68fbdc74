"""Preflight on the allocation: every node gathers the facts, node 0 judges the whole and writes the report.

    python -m swiftslurm.preflight.gather RUN_DIR [--port-base N] [--timeout S]   (under srun, one task per node)

Order on every node, all bounded by the timeout:
1. node 0 binds the master port (free?) and listens on it; every node writes a token into
   RUN_DIR/preflight/<attempt>/ and reads it back (writable?), checks the plan's local model/dataset paths,
   free disk in the output dir and, on GPU plans, the GPU count (and captures `nvidia-smi topo -m`);
2. the other nodes wait for node 0's token (run dir shared?), connect to node 0's master port (reachable?) and
   send their report over that connection, so node 0 learns what they saw even when they cannot see the run
   dir; node 0 also looks for their tokens;
3. if every node checked in, all of them join a torch.distributed group (gloo on CPU plans, nccl on GPU plans)
   at MASTER_ADDR:MASTER_PORT and all-reduce a small tensor whose sum is checked.
Node 0 writes RUN_DIR/preflight/<attempt>/report.json and prints the table; the others print their own checks.
A node that cannot read plan.json still takes part (port base and timeout come on the command line).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import socket
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from swiftslurm.errors import StorageError, SwiftSlurmError
from swiftslurm.plan import JobPlan, StorageSpec
from swiftslurm.preflight import checks as pc
from swiftslurm.preflight import probe as torch_probe
from swiftslurm.preflight.image import container_checks
from swiftslurm.rundir.jsonio import peek_json, read_json, write_json_atomic
from swiftslurm.rundir.layout import (
    PREFLIGHT_REPORT,
    plan_file,
    preflight_attempt_dir,
    preflight_rank_report,
    preflight_token,
)
from swiftslurm.slurm_env import SlurmEnv, master_port, slurm_hostnames

POLL_S = 0.25
DIST_CHECK = "torch.distributed all-reduce"


@dataclass(frozen=True)
class Context:
    """What this node knows: the plan (None if it cannot read it), where it is, and the time budget."""

    run_dir: Path
    plan: JobPlan | None
    plan_error: str | None
    where: SlurmEnv
    attempt: str
    port_base: int
    timeout_s: float
    host: str

    @property
    def master_addr(self) -> str:
        return self.where.hosts[0] if self.where.hosts else "127.0.0.1"

    @property
    def port(self) -> int:
        return master_port(self.where.job_id, self.port_base)

    @property
    def dir(self) -> Path:
        return preflight_attempt_dir(self.run_dir, self.attempt)

    def token(self, node: int) -> Path:
        return preflight_token(self.dir, node)

    def host_of(self, node: int) -> str:
        return self.where.hosts[node] if node < len(self.where.hosts) else f"node {node}"


def run(ctx: Context) -> pc.Report | pc.NodeReport:
    """Node 0 returns the whole allocation's report; the other nodes return their own."""
    start = time.monotonic()
    if ctx.where.node_id == 0:
        return _leader(ctx, start)
    return _follower(ctx, start)


# ---------------------------------------------------------------- node 0


def _leader(ctx: Context, start: float) -> pc.Report:
    listener, bind_error = _bind(ctx.port)
    checks = [pc.port_free(ctx.host, ctx.port, bind_error), *_local_checks(ctx)]
    peers = range(1, ctx.where.num_nodes)
    deadline = start + ctx.timeout_s
    got: dict[int, tuple[pc.NodeReport, socket.socket]] = _gather(listener, set(peers), deadline) if listener else {}
    if listener is not None:
        listener.close()  # the rendezvous below binds the same port
    # What node 0 sees of a peer's token goes into that peer's report: the fault is named after the node that
    # does not share the run dir (node 0's own view of it is the login node's); the table shows who checked.
    seen = {node: _token_check(ctx, node, ctx.host, ctx.host_of(node), deadline) for node in peers}
    reports = [_peer_report(ctx, node, got, start, seen[node]) for node in peers]
    missing = [ctx.host_of(n) for n in peers if n not in got]
    backend = _backend(ctx.plan)
    for _, conn in got.values():
        _send_line(conn, f"{'skip' if missing or listener is None else 'go'} {backend} {ctx.where.num_nodes}")
    if listener is None:
        checks.append(pc.skipped(DIST_CHECK, f"the master port {ctx.port} is not free"))
    elif missing:
        checks.append(pc.skipped(DIST_CHECK, f"{', '.join(missing)} did not reach the master port"))
    else:
        checks.append(_distributed(ctx, backend, ctx.where.num_nodes))
    for _, conn in got.values():
        conn.close()
    own = pc.NodeReport(0, ctx.host, tuple(checks), _topology(ctx.plan))
    extra = {"master": f"{ctx.master_addr}:{ctx.port}", "backend": backend, "hosts": list(ctx.where.hosts)}
    report = pc.assemble(ctx.attempt, [own, *reports], extra)
    with contextlib.suppress(OSError):  # a run dir node 0 cannot write is in the report already
        write_json_atomic(ctx.dir / PREFLIGHT_REPORT, report.to_dict())
    return report


def _bind(port: int) -> tuple[socket.socket | None, str | None]:
    # SO_REUSEADDR as torch's TCPStore sets it: a port in TIME_WAIT is free, one with a listener is not.
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(("0.0.0.0", port))
        sock.listen(64)
    except OSError as err:
        sock.close()
        return None, _errno_text(err)
    return sock, None


def _gather(
    listener: socket.socket, expected: set[int], deadline: float
) -> dict[int, tuple[pc.NodeReport, socket.socket]]:
    """Accept the other nodes' connections and their reports until all are in or the deadline passes."""
    got: dict[int, tuple[pc.NodeReport, socket.socket]] = {}
    listener.settimeout(POLL_S)
    while expected - set(got) and time.monotonic() < deadline:
        try:
            conn, _ = listener.accept()
        except TimeoutError:
            continue
        conn.settimeout(max(1.0, deadline - time.monotonic()))
        try:
            report = pc.NodeReport.from_dict(json.loads(_read_line(conn)))
        except (OSError, ValueError, KeyError, TypeError):
            conn.close()  # not one of ours (a port scanner, a stray client): keep listening
            continue
        got[report.node] = (report, conn)
    return got


def _peer_report(
    ctx: Context, node: int, got: dict[int, tuple[pc.NodeReport, socket.socket]], start: float, token: pc.Check
) -> pc.NodeReport:
    """A peer's own report (over TCP, or from its file when it could not connect) plus what node 0 saw of it."""
    if node in got:
        own: pc.NodeReport | None = got[node][0]
        seen: tuple[pc.Check, ...] = (token,)
    else:
        own = _read_report_file(preflight_rank_report(ctx.dir, node))
        waited = time.monotonic() - start
        seen = (token, pc.peer_missing(ctx.host_of(node), ctx.master_addr, ctx.port, waited, own is not None))
    seen = tuple(replace(check, by=ctx.host) for check in seen)  # node 0 made these: the table says so
    checks = (*own.checks, *seen) if own else seen
    return pc.NodeReport(node, ctx.host_of(node), checks, own.topology if own else "")


def _read_report_file(path: Path) -> pc.NodeReport | None:
    data = peek_json(path)
    try:
        return pc.NodeReport.from_dict(data) if data is not None else None
    except (ValueError, KeyError, TypeError):
        return None


# ---------------------------------------------------------------- the other nodes


def _follower(ctx: Context, start: float) -> pc.NodeReport:
    checks = _local_checks(ctx)
    # A third of the budget each for seeing node 0's token and for reaching its port, so this report gets to
    # node 0 before it stops gathering.
    checks.append(_token_check(ctx, 0, ctx.host, ctx.host_of(0), start + ctx.timeout_s / 3))
    conn, error = _connect(ctx.master_addr, ctx.port, start + 2 * ctx.timeout_s / 3)
    checks.append(pc.port_reachable(ctx.master_addr, ctx.port, error, time.monotonic() - start))
    report = pc.NodeReport(ctx.where.node_id, ctx.host, tuple(checks), _topology(ctx.plan))
    with contextlib.suppress(OSError):  # node 0 reads it when this node could not connect
        write_json_atomic(preflight_rank_report(ctx.dir, ctx.where.node_id), report.to_dict())
    if conn is None:
        return report
    with conn:
        conn.settimeout(ctx.timeout_s + 10)
        try:
            _send_line(conn, json.dumps(report.to_dict()))
            verdict, backend, world = _read_line(conn).split()
        except (OSError, ValueError):
            return report
        if verdict == "go":
            report = pc.NodeReport(report.node, report.host, (*report.checks, _distributed(ctx, backend, int(world))))
    return report


def _connect(addr: str, port: int, deadline: float) -> tuple[socket.socket | None, str | None]:
    """Retry until the deadline: node 0 may not listen yet. The last error says why it never worked."""
    error = "no attempt"
    while True:
        try:
            return socket.create_connection((addr, port), timeout=max(1.0, min(5.0, deadline - time.monotonic()))), None
        except OSError as err:
            error = _errno_text(err)
        if time.monotonic() >= deadline:
            return None, error
        time.sleep(POLL_S * 4)


# ---------------------------------------------------------------- checks every node runs


def _local_checks(ctx: Context) -> list[pc.Check]:
    plan_path = plan_file(ctx.run_dir)
    checks = [pc.plan_readable(str(plan_path), ctx.plan_error), _write_token(ctx)]
    if ctx.plan is None:
        return checks
    checks += [pc.local_path(p, Path(p).exists()) for p in ctx.plan.preflight.local_paths]
    where = _existing_parent(ctx.plan.output_dir)
    checks.append(pc.free_disk(str(where), shutil.disk_usage(where).free, ctx.plan.preflight.min_free_gb))
    checks.append(_gpu_check(ctx.plan))
    if ctx.plan.storage is not None:
        checks.append(_store_check(ctx.plan.storage))
    return checks + container_checks(ctx.plan, ctx.host_of(ctx.where.node_id))  # none without a container


def _store_check(spec: StorageSpec) -> pc.Check:
    """Ask the object store for one key from this node, within CheckpointStore.quick's bound."""
    from swiftslurm.storage.store import CheckpointStore

    try:
        CheckpointStore.quick(spec).check_access()
    except StorageError as err:
        return pc.store_reachable(spec.url, str(err).splitlines()[0])
    return pc.store_reachable(spec.url, None)


def _write_token(ctx: Context) -> pc.Check:
    """Write, fsync and read back this node's token: the run dir takes writes and returns them."""
    path = ctx.token(ctx.where.node_id)
    token = {"node": ctx.where.node_id, "host": ctx.host, "nonce": uuid.uuid4().hex}
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_json_atomic(path, token)
        back = read_json(path)  # None: what was written did not come back whole
    except (OSError, ValueError) as err:
        return pc.run_dir_writable(str(path), _errno_text(err) if isinstance(err, OSError) else str(err))
    return pc.run_dir_writable(str(path), None if back == token else f"read back {back}, wrote {token}")


def _token_check(ctx: Context, node: int, reader: str, writer: str, deadline: float) -> pc.Check:
    path = ctx.token(node)
    started = time.monotonic()
    while not (seen := _token_of(path, node)) and time.monotonic() < deadline:
        time.sleep(POLL_S)
    return pc.token_visible(reader, writer, str(path), seen, time.monotonic() - started)


def _token_of(path: Path, node: int) -> bool:
    return (peek_json(path) or {}).get("node") == node


def _existing_parent(path: Path) -> Path:
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def _gpu_check(plan: JobPlan) -> pc.Check:
    planned = plan.topology.gpus_per_node
    if planned == 0:
        return pc.gpus(0, None, None)
    facts, error = _probe(["facts"], plan, timeout_s=120)
    seen = facts.get("cuda_devices") if facts else None
    return pc.gpus(planned, seen, os.environ.get("CUDA_VISIBLE_DEVICES"), error)


def _topology(plan: JobPlan | None) -> str:
    if plan is None or plan.topology.gpus_per_node == 0 or shutil.which("nvidia-smi") is None:
        return ""
    done = subprocess.run(["nvidia-smi", "topo", "-m"], capture_output=True, text=True, timeout=60, check=False)
    return done.stdout if done.returncode == 0 else f"nvidia-smi topo -m failed: {done.stderr.strip()}"


def _backend(plan: JobPlan | None) -> str:
    return "nccl" if plan is not None and plan.topology.gpus_per_node > 0 else "gloo"


def _distributed(ctx: Context, backend: str, world: int) -> pc.Check:
    args = ["allreduce", ctx.master_addr, str(ctx.port), str(ctx.where.node_id), str(world), backend]
    out, error = _probe([*args, str(ctx.timeout_s)], ctx.plan, timeout_s=ctx.timeout_s + 60)
    return pc.distributed(backend, world, out.get("result") if out else None, error)


def _probe(args: list[str], plan: JobPlan | None, timeout_s: float) -> tuple[dict[str, Any] | None, str | None]:
    """Run torch_probe in a child with the plan's node environment (NCCL/Gloo interface, ...)."""
    env = {**os.environ, **(dict(plan.env) if plan else {})}
    argv = [sys.executable, "-m", "swiftslurm.preflight.probe", *args]
    try:
        done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=timeout_s, check=False)
    except subprocess.TimeoutExpired:
        return None, f"no answer within {timeout_s:.0f} s"
    out = probe_result(done.stdout)
    if out is None:
        said = (done.stderr.strip() or done.stdout.strip())[-500:]
        return None, f"exit status {done.returncode}, no result: {said}"
    return (None, out["error"]) if "error" in out else (out, None)


def probe_result(stdout: str) -> dict[str, Any] | None:
    """The torch_probe child's result: the last line that carries its mark (NCCL's log may come after it)."""
    for line in reversed(stdout.splitlines()):
        _, mark, rest = line.partition(torch_probe.RESULT_MARK)
        if mark:
            try:
                found = json.loads(rest)
            except ValueError:
                continue
            return found if isinstance(found, dict) else None
    return None


# ---------------------------------------------------------------- small helpers


def _send_line(conn: socket.socket, text: str) -> None:
    with contextlib.suppress(OSError):
        conn.sendall(text.encode() + b"\n")


def _read_line(conn: socket.socket) -> str:
    data = b""
    while not data.endswith(b"\n"):
        chunk = conn.recv(65536)
        if not chunk:
            break
        data += chunk
    return data.decode()


def _errno_text(err: OSError) -> str:
    if isinstance(err, (TimeoutError, socket.timeout)):
        return "connect timeout"
    return err.strerror or str(err)


# ---------------------------------------------------------------- entry point


def context(run_dir: Path, where: SlurmEnv, attempt: str, port_base: int | None, timeout_s: float | None) -> Context:
    """Read the plan if this node can; the command-line values stand in for it when it cannot."""
    plan, plan_error = None, None
    try:
        plan = JobPlan.load_checked(run_dir)
    except (OSError, ValueError, SwiftSlurmError) as err:
        plan_error = _errno_text(err) if isinstance(err, OSError) else str(err)
    base = port_base if port_base is not None else (plan.master_port_base if plan else 10000)
    timeout = timeout_s if timeout_s is not None else (plan.preflight.timeout_s if plan else 60.0)
    return Context(run_dir, plan, plan_error, where, attempt, base, timeout, socket.gethostname())


def show(result: pc.Report | pc.NodeReport) -> str:
    if isinstance(result, pc.Report):
        return pc.render_table(result)
    return pc.render_table(pc.assemble("", [result])).rsplit("\n", 1)[0]  # a peer: its rows, no verdict


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m swiftslurm.preflight.gather", description=__doc__.split("\n")[0])
    parser.add_argument("run_dir")
    parser.add_argument("--port-base", type=int, help="cluster.master_port_base (default: from plan.json)")
    parser.add_argument("--timeout", type=float, help="seconds (default: preflight_timeout_s from plan.json)")
    args = parser.parse_args(argv)
    where = SlurmEnv.from_environ(os.environ, slurm_hostnames)  # SLURM's node order: node i is hosts[i]
    attempt = str(where.job_id) if where.job_id else f"local-{os.getpid()}"
    result = run(context(Path(args.run_dir).resolve(), where, attempt, args.port_base, args.timeout))
    print(show(result), flush=True)
    # Only node 0 fails the task: with --kill-on-bad-exit a failing peer would end node 0 before it reports.
    return 1 if isinstance(result, pc.Report) and not result.ok else 0


if __name__ == "__main__":
    sys.exit(main())
