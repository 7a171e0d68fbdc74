"""container=oci for real: SLURM's own `srun --container` (oci.conf runs runc, scripts/slurm-local.sh) on the local
cluster, in an image built from Debian's packages (scripts/oci-image.sh).

The wrapper and the ranks of both nodes are seen from outside to run with the image as their root, the wrapper as
PID 1 of its own PID namespace; a preemption saves, commits and requeues; the requeued job's wrapper and ranks run
in a new container; the final adapter is byte for byte the one of the same run never stopped and never in a
container (the session's `uninterrupted`). pyxis and apptainer cannot be installed here: their renderings are
golden-tested (tests/unit/test_container_render.py).
"""

from __future__ import annotations

import fcntl
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

from swiftslurm.rundir.layout import PREFLIGHT_REPORT, preflight_dir
from swiftslurm.submit.preflight import read_report
from swiftslurm.testing.cli import swiftslurm
from swiftslurm.testing.cluster import (
    attempts,
    current_step,
    preempt_at_steps,
    status,
    submit,
    wait_for_run_end,
    wait_until,
)
from tests.cluster.conftest import ADAPTER, LONG, shared_dir

pytestmark = [pytest.mark.slurm, pytest.mark.slow]
REPO = Path(__file__).resolve().parents[2]
IMAGE_MARK = "etc/swiftslurm-image"  # scripts/oci-image.sh writes its recipe's hash there
GATE_PLUGIN = Path(__file__).resolve().parent / "gate_plugin.py"
GATE_FILE = "gate.open"  # gate_plugin.GATE_FILE (importing it would import ms-swift here)
HELD_STEP = 100  # the requeued attempt waits here, in its container, until the test has looked at it
LOGGED_BEFORE_HELD = HELD_STEP - 5  # ms-swift logs every 5 steps; step 100's line comes after the hold
PREEMPT_STEP = 30


@pytest.fixture(scope="session")
def oci_image(slurm_cluster: None, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The image's bundle (rootfs/ + config.json), built once per machine; one builder at a time."""
    lock_dir = shared_dir(tmp_path_factory) or tmp_path_factory.getbasetemp()
    with open(lock_dir / "oci-image.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        built = subprocess.run(
            ["bash", str(REPO / "scripts" / "oci-image.sh")], capture_output=True, text=True, timeout=900
        )
    assert built.returncode == 0, built.stderr[-3000:]
    return Path(built.stdout.strip().splitlines()[-1])


@dataclass(frozen=True)
class Seen:
    """A process of the run as seen from the host."""

    pid: int
    role: str  # "wrapper" | "rank"
    image: str  # what /etc/swiftslurm-image holds in its root ("" on the host's root)
    pid_in_namespace: int  # its PID in its innermost PID namespace
    started: float  # UNIX time


def processes_of(run_dir: Path) -> list[Seen]:
    """The run's wrappers (submitit's runner) and training ranks (torchrun's children running ms-swift's sft)."""
    seen = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().decode(errors="replace").split("\0")
            role = _role(argv, run_dir)
            if role is None:
                continue
            mark = entry / "root" / IMAGE_MARK
            image = mark.read_text().strip() if mark.is_file() else ""
            nspid = next(line for line in (entry / "status").read_text().splitlines() if line.startswith("NSpid:"))
            seen.append(Seen(int(entry.name), role, image, int(nspid.split()[-1]), _start_time(entry)))
        except (FileNotFoundError, ProcessLookupError, StopIteration):
            continue  # ended while looked at
    return seen


def _role(argv: list[str], run_dir: Path) -> str | None:
    """Python processes only: srun's and torchrun's command lines name the same script and run dir."""
    if not Path(argv[0]).name.startswith("python") or str(run_dir) not in " ".join(argv):
        return None
    if argv[1:3] == ["-u", "-m"] and argv[3] == "submitit.core._submit":
        return "wrapper"
    if argv[1:2] == ["-u"] and argv[2].endswith("swift/cli/sft.py"):
        return "rank"
    return None


def _start_time(proc: Path) -> float:
    ticks = int((proc / "stat").read_text().rsplit(")", 1)[1].split()[19])
    boot = next(
        float(line.split()[1]) for line in Path("/proc/stat").read_text().splitlines() if line.startswith("btime")
    )
    return boot + ticks / os.sysconf("SC_CLK_TCK")


def both_nodes_inside(run_dir: Path) -> list[Seen] | None:
    """The run's processes once both nodes' wrapper and rank are up; None before."""
    seen = processes_of(run_dir)
    roles = [s.role for s in seen]
    return seen if roles.count("wrapper") == 2 and roles.count("rank") == 2 else None


def test_a_preempted_run_in_oci_containers_resumes_in_new_ones_and_ends_identical(
    tmp_path: Path, oci_image: Path, uninterrupted: bytes
) -> None:
    run_dir = tmp_path / "run"
    gate = (f"swift.external_plugins=[{GATE_PLUGIN}]", "swift.callbacks=[gate]")
    held = f"+cluster.env.SWIFTSLURM_TEST_GATE_STEP={HELD_STEP}"
    job = submit(run_dir, "container=oci", f"container.image={oci_image}", "preflight=true", *LONG, *gate, held)
    image = (oci_image / "rootfs" / IMAGE_MARK).read_text().strip()

    preempt_at_steps(run_dir, job, [PREEMPT_STEP])
    first = attempts(run_dir)[0]
    assert (first["reason"], first["decision"]) == ("preempted", "requeue"), first
    assert first["committed_step"] >= PREEMPT_STEP

    # The requeued job holds at HELD_STEP, past its resume point: its processes are looked at while they run.
    wait_until(lambda: current_step(run_dir) >= LOGGED_BEFORE_HELD, 300, f"the requeued attempt near step {HELD_STEP}")
    seen = wait_until(lambda: both_nodes_inside(run_dir), 60, "both nodes' wrapper and rank")
    assert {s.image for s in seen} == {image}, seen  # every one of them has the image as its root
    wrappers = [s for s in seen if s.role == "wrapper"]
    assert [w.pid_in_namespace for w in wrappers] == [1, 1], wrappers  # each the first process of its container
    assert all(s.started > first["end"] for s in seen), (first["end"], seen)  # new containers, after the first
    (run_dir / GATE_FILE).touch()

    assert wait_for_run_end(run_dir, job) == "COMPLETED"
    last = attempts(run_dir)[-1]
    assert last["job_id"] == first["job_id"] and last["resumed_from"].endswith(f"checkpoint-{first['committed_step']}")
    assert status(run_dir)["state"] == "finished"
    assert (run_dir / ADAPTER).read_bytes() == uninterrupted
    assert_preflight_checked_the_container(run_dir)


CONTAINER_CHECKS = {
    "container",
    "swiftslurm in the container",
    "ms-swift in the container",
    "container mounts",
    "scontrol in the container",
}


def assert_preflight_checked_the_container(run_dir: Path) -> None:
    """preflight=true ran its container rows inside the container on both nodes, and they passed."""
    reports = sorted(preflight_dir(run_dir).glob(f"*/{PREFLIGHT_REPORT}"))
    assert reports, "no preflight report"
    for path in reports:
        report = read_report(path)
        assert report is not None and report.ok, (path, report and report.first_failure())
        for node in report.nodes:
            names = {c.name for c in node.checks}
            assert names >= CONTAINER_CHECKS, (node.host, sorted(names))


def test_a_path_the_container_would_not_see_is_refused_at_plan_time(tmp_path: Path, oci_image: Path) -> None:
    run_dir = tmp_path / "run"
    data = tmp_path / "data"
    data.mkdir()
    done = swiftslurm(
        "+cluster=local-slurm",
        f"run_dir={run_dir}",
        "container=oci",
        f"container.image={oci_image}",
        "container.derive_mounts=false",
        f"container.mounts=[{data}:{data}:ro]",
        cwd=tmp_path,
    )
    assert done.returncode == 2, done.stdout + done.stderr
    said = done.stderr.strip().splitlines()
    assert len(said) == 1 and f"container.mounts+=['{run_dir}:{run_dir}']" in said[0], said
    assert not run_dir.exists()  # nothing written, so nothing submitted
