"""What preflight checks of the container (`plan.container` set), gathered where the wrapper runs: inside it.

- the container started, and its root filesystem is the image's (its OS name from /etc/os-release);
- swiftslurm and ms-swift are installed for the running Python at the versions the run was planned with
  (plan.versions), and ms-swift's command (plan.executable) is executable;
- every mount of plan.container.mounts is there: its target exists, is a mount point, can be read, and is not
  mounted read-only when the run writes to it;
- `scontrol` runs, reaches slurmctld, and is of this node's slurmd's release: the wrapper requeues with it.

Nothing here writes: the Python's prefix may be mounted read-only, and the run dir's writes are checked already.
checks.py judges the facts; the functions here only gather them, each from a root or table a test can replace.
"""

from __future__ import annotations

import importlib.util
import os
import re
import sys
from pathlib import Path

from swiftslurm import slurm as slurm_cli
from swiftslurm.errors import SlurmError
from swiftslurm.plan import PLANNED_WITH, ContainerSpec, JobPlan, Mount, installed_versions
from swiftslurm.preflight import checks as pc

MODULES = {"swiftslurm": "swiftslurm", "ms-swift": "swift"}  # distribution -> the module the run imports
MOUNT_TABLE = Path("/proc/self/mountinfo")


def container_checks(plan: JobPlan, node: str, root: Path = Path("/")) -> list[pc.Check]:
    """The container's rows of this node's report (none without a container). ``node``: SLURM's name of it."""
    spec = plan.container
    if spec is None:
        return []
    checks = [pc.container_started(spec.runtime, spec.image, os_name(root / "etc/os-release"))]
    found = installed_versions()
    for name in PLANNED_WITH:
        version = found.get(name) if importlib.util.find_spec(MODULES[name]) is not None else None
        checks.append(pc.package(name, plan.planned_version(name), version, sys.executable, spec.python_from))
    checks.append(pc.entry_point(plan.executable, os.access(plan.executable, os.X_OK)))
    checks += pc.mounts(mount_problems(spec, mount_points(MOUNT_TABLE)))
    checks.append(scontrol_check(node))
    return checks


def os_name(os_release: Path) -> str | None:
    """PRETTY_NAME of an os-release file ("Debian GNU/Linux 12 (bookworm)"); None when there is none."""
    try:
        lines = os_release.read_text().splitlines()
    except (OSError, UnicodeDecodeError):
        return None
    values = dict(line.split("=", 1) for line in lines if "=" in line)
    name = values.get("PRETTY_NAME") or values.get("NAME")
    return name.strip().strip("\"'") if name else None


def mount_points(table: Path) -> set[str] | None:
    """Every mount point this process sees (mountinfo's fifth field, octal escapes undone); None: unreadable."""
    try:
        rows = table.read_text().splitlines()
    except OSError:
        return None
    return {_unescape(row.split()[4]) for row in rows if len(row.split()) > 4}


def _unescape(field: str) -> str:
    # mountinfo writes space, tab, newline and backslash in a path as \040, \011, \012 and \134
    return re.sub(r"\\([0-7]{3})", lambda octal: chr(int(octal.group(1), 8)), field)


def mount_problems(spec: ContainerSpec, points: set[str] | None) -> list[tuple[Mount, str | None]]:
    """Each mount with what is wrong with it inside the container (None: nothing)."""
    return [(m, mount_problem(m, points)) for m in spec.mounts]


def mount_problem(mount: Mount, points: set[str] | None) -> str | None:
    """``points``: the mount points seen (None: unknown, not checked). Reads only: a writable mount is judged by
    the mount's read-only flag, not by writing into it (munge's socket folder is not the user's to write)."""
    target = Path(mount.target)
    if not target.exists():
        return "does not exist"
    if points is not None and not {mount.target, os.path.realpath(target)} & points:
        return "is not mounted (not in /proc/self/mountinfo: what is there is the image's own)"
    try:
        if target.is_dir():
            os.listdir(target)
        elif not os.access(target, os.R_OK):
            return "cannot be read"
    except OSError as err:
        return f"cannot be read ({err.strerror or err})"
    if not mount.read_only and os.statvfs(target).f_flag & os.ST_RDONLY:
        return "is mounted read-only"
    return None


def scontrol_check(node: str) -> pc.Check:
    """scontrol's own version, and the version slurmctld reports of this node's slurmd."""
    try:
        client = slurm_cli.client_version()
        cluster = slurm_cli.node_version(node)
    except SlurmError as err:
        return pc.slurm_client(node, None, None, err.said or str(err))
    return pc.slurm_client(node, client, cluster, None)
