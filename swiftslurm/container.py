"""Each container runtime's differences, rendered from the plan's ContainerSpec (pure: nothing runs here).

What starts the wrapper on every node is `srun [srun_args] <python_argv> -m swiftslurm.node RUN_DIR` in
job.sbatch, and the same pieces become submitit's `slurm_srun_args` and `python`:

- pyxis: `srun --container-image=IMAGE --container-mounts=... --container-workdir=RUN_DIR --container-name=NAME`;
  pyxis/enroot create the container on each node for the step (and again for a requeued job's step).
- apptainer: `srun apptainer exec --nv --bind ... --pwd RUN_DIR IMAGE python ...`.
- oci: `srun --container=RUN_DIR/container`: SLURM (oci.conf) runs the bundle swiftslurm wrote there
  (``oci_bundle_config``); the wrapper starts through ``swiftslurm.node.task_env``, which puts back the
  per-task variables SLURM 22.05 leaves out of a container's environment.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path, PurePosixPath
from typing import Any

from swiftslurm.plan import ContainerSpec, JobPlan
from swiftslurm.rundir import layout as rundir

TASK_ENV_ENTRY = ("-m", "swiftslurm.node.task_env")  # oci: restores SLURM_PROCID & co, then execs the rest
# The OCI namespaces the run's bundle keeps: its own mounts and processes. The nodes' network (ranks reach
# each other and srun by the node's addresses), host name (SLURM knows the node by it), IPC and users stay.
OCI_NAMESPACES = ("mount", "pid")


def srun_args(plan: JobPlan) -> list[str]:
    """The srun options that put the step in the container."""
    spec = plan.container
    if spec is None or spec.runtime == "apptainer":
        return []
    if spec.runtime == "oci":
        return [f"--container={rundir.container_bundle(plan.run_dir)}"]
    args = [
        f"--container-image={spec.image}",
        f"--container-mounts={','.join(m.spec for m in spec.mounts)}",
        f"--container-workdir={plan.run_dir}",
        f"--container-name={spec.name or plan.run_name}",
        "--no-container-mount-home",  # the home the run needs is mounted by name; the rest stays out
        "--container-writable" if spec.writable else "--container-readonly",
    ]
    if spec.env_names:
        args.append(f"--container-env={','.join(spec.env_names)}")
    return args


def python_argv(plan: JobPlan) -> list[str]:
    """What runs the wrapper's Python on a node: the interpreter, behind the runtime's own command if it has one."""
    spec = plan.container
    if spec is None or spec.runtime == "pyxis":
        return [plan.python]
    if spec.runtime == "oci":
        return [plan.python, *TASK_ENV_ENTRY, plan.python]
    binds = ",".join(m.spec for m in spec.mounts)
    gpus = ["--nv"] if spec.gpus else []
    return ["apptainer", "exec", *gpus, "--bind", binds, "--pwd", plan.run_dir, spec.image, plan.python]


def oci_bundle_config(plan: JobPlan, base: dict[str, Any] | None, image_binds: list[dict[str, Any]]) -> dict[str, Any]:
    """config.json of the bundle SLURM runs (RUN_DIR/container/). SLURM 22.05 always takes the bundle's own
    rootfs/ as the root, so that is swiftslurm's (``oci_root_layout``) and the image comes in as read-only
    binds (``image_binds``), the run's mounts after them. ``base``: the image bundle's config.json (its process
    environment, hooks and capabilities are kept), None for runc's defaults."""
    spec = plan.container
    assert spec is not None and spec.runtime == "oci"
    config = copy.deepcopy(base) if base is not None else default_oci_config()
    config["root"] = {"path": "rootfs", "readonly": False}
    config.pop("hostname", None)
    process = config.setdefault("process", {})
    process["terminal"] = False
    process["cwd"] = plan.run_dir
    linux = config.setdefault("linux", {})
    linux["namespaces"] = [{"type": kind} for kind in OCI_NAMESPACES]
    run_mounts = [_bind(m.source, m.target, m.read_only) for m in spec.mounts]
    targets = {m.target for m in spec.mounts}
    kept = [m for m in config.get("mounts", []) if m.get("destination") not in targets]
    config["mounts"] = [*image_binds, *kept, *run_mounts]
    return config


def _bind(source: str, target: str, read_only: bool) -> dict[str, Any]:
    return {"destination": target, "type": "bind", "source": source, "options": ["rbind", "ro" if read_only else "rw"]}


RUNTIME_PROVIDED = ("/proc", "/dev", "/sys")  # mounted by the runtime itself (config.json's own mounts)


def oci_root_layout(image: Path, rootfs: Path, targets: list[str]) -> list[dict[str, Any]]:
    """Lay out the run's root filesystem ``rootfs`` and return the binds that bring the image into it. The
    image's root stays read-only and untouched, yet the run's mounts need mount points in it (the run dir, the
    host's Python: folders the image does not have). So every folder on the way to a mount target is a folder
    of ``rootfs``; everything else there is the image's own entry, bound read-only (a symlink copied as one)."""
    targets = [t for t in targets if not any(PurePosixPath(t).is_relative_to(p) for p in RUNTIME_PROVIDED)]
    spine = {str(PurePosixPath(t).parents[i]) for t in targets for i in range(len(PurePosixPath(t).parents))}
    binds: list[dict[str, Any]] = []
    for folder in sorted(spine, key=lambda f: (f.count("/") if f != "/" else 0, f)):
        ours = rootfs / folder.lstrip("/")
        ours.mkdir(parents=True, exist_ok=True)
        theirs = image / folder.lstrip("/")
        if not theirs.is_dir() or theirs.is_symlink():
            continue  # a folder the image lacks (the run dir's): only the mount points go in it
        for entry in sorted(theirs.iterdir()):
            path = str(PurePosixPath(folder) / entry.name)
            if path in spine or path in targets:
                continue
            mine = ours / entry.name
            if entry.is_symlink():
                if not mine.is_symlink():
                    mine.unlink(missing_ok=True)
                    mine.symlink_to(entry.readlink())
            elif path in RUNTIME_PROVIDED:
                mine.mkdir(exist_ok=True)
            elif entry.is_dir() or entry.is_file():
                mine.mkdir(exist_ok=True) if entry.is_dir() else mine.touch(exist_ok=True)
                binds.append(_bind(str(entry), path, read_only=True))
    return binds


def write_oci_bundle(plan: JobPlan) -> Path:
    """Write RUN_DIR/container/{config.json, rootfs/} for `srun --container`."""
    from swiftslurm.rundir.jsonio import write_text_atomic

    spec = plan.container
    assert spec is not None
    base = json.loads(Path(spec.base_config).read_text()) if spec.base_config else None
    bundle = rundir.container_bundle(plan.run_dir)
    rootfs = bundle / "rootfs"
    rootfs.mkdir(parents=True, exist_ok=True)
    binds = oci_root_layout(Path(spec.image), rootfs, [m.target for m in spec.mounts])
    write_text_atomic(bundle / "config.json", json.dumps(oci_bundle_config(plan, base, binds), indent=1) + "\n")
    return bundle


def describe(spec: ContainerSpec, plan: JobPlan) -> str:
    """The dry run's container section: the runtime, the image, whose Python, and every mount with its reason."""
    python = f"{plan.python} ({'the host’s, mounted' if spec.python_from == 'host' else 'the image’s'})"
    lines = [f"runtime     {spec.runtime}", f"image       {spec.image}", f"python      {python}"]
    if spec.runtime == "oci":
        lines.append(f"bundle      {rundir.container_bundle(plan.run_dir)} (written with the run dir)")
    if spec.env_names:
        lines.append(f"env passed  {', '.join(spec.env_names)}")
    lines.append("mounts (same path inside and out unless shown):")
    for m in spec.mounts:
        where = m.source if m.source == m.target else f"{m.source} -> {m.target}"
        lines.append(f"  {where}  [{'ro' if m.read_only else 'rw'}]  {m.why}")
    return "\n".join(lines)


def default_oci_config() -> dict[str, Any]:
    """runc's `spec` defaults, less what oci_bundle_config replaces: a bundle of a bare root filesystem."""
    caps = ["CAP_AUDIT_WRITE", "CAP_KILL", "CAP_NET_BIND_SERVICE"]
    return {
        "ociVersion": "1.0.2",
        "process": {
            "user": {"uid": 0, "gid": 0},
            "args": ["sh"],
            "env": ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"],
            "cwd": "/",
            "capabilities": {k: caps for k in ("bounding", "effective", "permitted")},
            "noNewPrivileges": True,
        },
        "mounts": [
            {"destination": "/proc", "type": "proc", "source": "proc"},
            {
                "destination": "/dev",
                "type": "tmpfs",
                "source": "tmpfs",
                "options": ["nosuid", "strictatime", "mode=755", "size=65536k"],
            },
            {
                "destination": "/dev/pts",
                "type": "devpts",
                "source": "devpts",
                "options": ["nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620", "gid=5"],
            },
            {
                "destination": "/dev/mqueue",
                "type": "mqueue",
                "source": "mqueue",
                "options": ["nosuid", "noexec", "nodev"],
            },
            {"destination": "/sys", "type": "sysfs", "source": "sysfs", "options": ["nosuid", "noexec", "nodev", "ro"]},
        ],
        "linux": {
            "maskedPaths": ["/proc/kcore", "/proc/keys", "/proc/timer_list", "/sys/firmware"],
            "readonlyPaths": ["/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger"],
        },
    }
