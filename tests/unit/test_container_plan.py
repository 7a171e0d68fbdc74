"""container=...: what the plan mounts and refuses (planning/container.py), the OCI bundle swiftslurm writes
(container.py), and the per-task variables a container's task gets back (slurm_env.task_variables_by_host).
The real run is tests/cluster/test_containers.py."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from swiftslurm import container
from swiftslurm.errors import ConfigError, NodeError
from swiftslurm.plan import JobPlan, Mount
from swiftslurm.planning.make import PlanContext, make_plan
from swiftslurm.slurm_env import task_variables_by_host
from tests.conftest import compose_config

CLUSTER = ("+cluster=a100x8",)


@pytest.fixture
def image(tmp_path: Path) -> Path:
    """A small root filesystem: folders, files and a usrmerge symlink, as Debian's are."""
    root = tmp_path / "image"
    for folder in ("usr/bin", "etc/apt", "root", "tmp", "proc", "run"):
        (root / folder).mkdir(parents=True)
    (root / "etc" / "passwd").write_text("root:x:0:0::/root:/bin/sh\n")
    (root / "etc" / "swiftslurm-image").write_text("test\n")
    (root / "bin").symlink_to("usr/bin")
    return root


def plan(tmp_path: Path, *overrides: str, python: str = sys.executable) -> JobPlan:
    home = tmp_path / "home"
    (home / ".cache").mkdir(parents=True, exist_ok=True)
    env = {"HOME": str(home), "SWIFTSLURM_CACHE": str(tmp_path / "cache")}
    ctx = PlanContext(cwd=tmp_path, python=python, env=env)
    return make_plan(compose_config(*CLUSTER, f"run_dir={tmp_path / 'run'}", *overrides), ctx)


def mounts_of(p: JobPlan) -> dict[str, Mount]:
    assert p.container is not None
    return {m.target: m for m in p.container.mounts}


def test_no_container_plans_none(tmp_path: Path) -> None:
    assert plan(tmp_path).container is None


def test_every_path_the_run_uses_is_mounted_at_the_same_path(tmp_path: Path, image: Path) -> None:
    p = plan(tmp_path, "container=oci", f"container.image={image}")
    mounts = mounts_of(p)
    run = mounts[str(tmp_path / "run")]
    assert (run.source, run.read_only) == (run.target, False)
    assert all(m.source == m.target for m in mounts.values())
    assert mounts[str(tmp_path / "home" / ".cache")].read_only is False  # ms-swift writes its caches
    assert str(Path(sys.prefix)) in mounts or any(str(Path(sys.prefix)).startswith(t + "/") for t in mounts)
    assert "/dev/shm" in mounts and "/etc/hosts" in mounts  # oci only: pyxis and apptainer bring their own
    targets = [m.target for m in p.container.mounts]  # type: ignore[union-attr]
    parents_first = [(i, j) for i, t in enumerate(targets) for j, u in enumerate(targets) if u.startswith(t + "/")]
    assert all(i < j for i, j in parents_first)  # a folder is mounted before what is in it


def test_pyxis_and_apptainer_get_no_hosts_or_shm_mounts(tmp_path: Path, image: Path) -> None:
    sif = tmp_path / "swift.sif"
    sif.write_text("")
    for choice in ("container=pyxis", "container=apptainer"):
        p = plan(tmp_path, choice, f"container.image={sif}")
        assert "/etc/hosts" not in mounts_of(p) and "/dev/shm" not in mounts_of(p)


def test_a_container_on_the_local_scheduler_is_refused(tmp_path: Path, image: Path) -> None:
    cfg = compose_config(f"run_dir={tmp_path / 'run'}", "container=oci", f"container.image={image}")
    with pytest.raises(ConfigError, match=r"cluster.scheduler=local .* HINT: add \+cluster=NAME"):
        make_plan(cfg, PlanContext(cwd=tmp_path))


@pytest.mark.parametrize(
    ("override", "said"),
    [
        ("container.image=relative/dir", "is not an existing absolute path"),
        ("container.python=python3", "neither `host` nor an absolute path"),
        ("container.mounts=['/tmp:/tmp:xx']", "is not a mount"),
        ("container.mounts=['{tmp}/nowhere:/data']", "does not exist on this machine"),
        ("container.env=['1BAD']", "not a variable name"),
        ("container.runtime=ocy", "Did you mean `oci`"),
    ],
)
def test_what_cannot_run_is_refused_naming_the_setting(tmp_path: Path, image: Path, override: str, said: str) -> None:
    with pytest.raises(ConfigError, match=said) as err:
        plan(tmp_path, "container=oci", f"container.image={image}", override.replace("{tmp}", str(tmp_path)))
    assert "container." in str(err.value)


def test_an_oci_image_without_a_root_filesystem_is_refused(tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ConfigError, match=r"neither config\.json nor a root filesystem"):
        plan(tmp_path, "container=oci", f"container.image={empty}")


def test_an_oci_bundle_is_read_through_its_config(tmp_path: Path, image: Path) -> None:
    bundle = tmp_path / "bundle"
    bundle.mkdir()
    (bundle / "rootfs").symlink_to(image)
    (bundle / "config.json").write_text(
        json.dumps({"root": {"path": "rootfs"}, "hooks": {"prestart": [{"path": "/x"}]}})
    )
    p = plan(tmp_path, "container=oci", f"container.image={bundle}")
    assert p.container is not None
    assert (p.container.image, p.container.base_config) == (str(bundle / "rootfs"), str(bundle / "config.json"))


def test_without_derived_mounts_a_path_not_mounted_is_refused_with_the_mount_to_add(
    tmp_path: Path, image: Path
) -> None:
    run = tmp_path / "run"
    with pytest.raises(ConfigError) as err:
        plan(tmp_path, "container=oci", f"container.image={image}", "container.derive_mounts=false")
    assert f"container.mounts+=['{run}:{run}']" in str(err.value) and "the run dir" in str(err.value)


def test_a_mount_that_shows_other_files_at_a_needed_path_gets_the_path_mounted_over_it(
    tmp_path: Path, image: Path
) -> None:
    run = str(tmp_path / "run")
    p = plan(tmp_path, "container=oci", f"container.image={image}", f"container.mounts=['{image}:{tmp_path}']")
    targets = [m.target for m in p.container.mounts]  # type: ignore[union-attr]
    assert targets.index(run) > targets.index(str(tmp_path)) and mounts_of(p)[run].source == run


def test_without_derived_mounts_a_mount_that_moves_a_needed_path_is_refused(tmp_path: Path, image: Path) -> None:
    run = tmp_path / "run"
    with pytest.raises(ConfigError, match="another path inside the container") as err:
        plan(
            tmp_path,
            "container=oci",
            f"container.image={image}",
            "container.derive_mounts=false",
            f"container.mounts=['{image}:{tmp_path}']",
        )
    assert f"container.mounts+=['{run}:{run}']" in str(err.value)


def test_a_read_only_mount_over_the_run_dir_is_refused(tmp_path: Path, image: Path) -> None:
    (tmp_path / "run").mkdir()
    with pytest.raises(ConfigError, match="read-only") as err:
        plan(tmp_path, "container=oci", f"container.image={image}", f"container.mounts=['{tmp_path}:{tmp_path}:ro']")
    assert "the run dir" in str(err.value)


def test_a_python_environment_behind_a_symlink_mounts_where_it_leads(tmp_path: Path, image: Path) -> None:
    real = tmp_path / "real-venv"
    (real / "bin").mkdir(parents=True)
    (real / "bin" / "python").symlink_to(sys.executable)
    linked = tmp_path / "elsewhere" / "venv"
    linked.parent.mkdir()
    linked.symlink_to(real)
    p = plan(tmp_path, "container=oci", f"container.image={image}", python=str(linked / "bin" / "python"))
    mounts = mounts_of(p)
    assert str(linked) in mounts and str(real) in mounts, sorted(mounts)


def test_the_image_python_makes_the_image_run_the_wrapper_and_ms_swift(tmp_path: Path, image: Path) -> None:
    p = plan(tmp_path, "container=oci", f"container.image={image}", "container.python=/usr/bin/python3")
    assert p.container is not None and p.container.python_from == "image"
    assert (p.python, p.executable) == ("/usr/bin/python3", "/usr/bin/swift")
    assert not any("container.python=host" in m.why for m in p.container.mounts)


def test_the_oci_root_is_the_image_bound_read_only_around_the_mount_points(tmp_path: Path, image: Path) -> None:
    rootfs = tmp_path / "rootfs"
    binds = container.oci_root_layout(image, rootfs, ["/etc/slurm", "/tmp/run", "/root/.cache", "/dev/shm"])
    bound = {b["destination"]: b for b in binds}
    assert bound["/usr"]["source"] == str(image / "usr") and "ro" in bound["/usr"]["options"]
    assert bound["/etc/passwd"]["source"] == str(image / "etc" / "passwd")  # a file beside a mount point
    assert "/etc" not in bound and "/tmp" not in bound  # folders on the way to mount points are the run's own
    assert "/proc" not in bound  # the runtime mounts it
    assert os.readlink(rootfs / "bin") == "usr/bin"
    assert (rootfs / "etc" / "passwd").is_file() and not (rootfs / "etc" / "passwd").read_text()
    assert not (image / "etc" / "slurm").exists()  # the image is never written to


def test_the_oci_bundle_keeps_the_nodes_network_and_host_name(tmp_path: Path, image: Path) -> None:
    p = plan(tmp_path, "container=oci", f"container.image={image}")
    base = {"hostname": "c", "linux": {"namespaces": [{"type": "network"}, {"type": "uts"}]}, "hooks": {"x": 1}}
    config = container.oci_bundle_config(p, base, [])
    assert config["linux"]["namespaces"] == [{"type": "mount"}, {"type": "pid"}]
    assert "hostname" not in config and config["hooks"] == {"x": 1}  # the image's GPU hooks stay
    assert config["process"]["cwd"] == p.run_dir and config["root"] == {"path": "rootfs", "readonly": False}


def test_write_oci_bundle_writes_config_and_rootfs_in_the_run_dir(tmp_path: Path, image: Path) -> None:
    p = plan(tmp_path, "container=oci", f"container.image={image}")
    bundle = container.write_oci_bundle(p)
    assert bundle == tmp_path / "run" / "container"
    config = json.loads((bundle / "config.json").read_text())
    assert {m["destination"] for m in config["mounts"]} >= {p.run_dir, "/usr", "/proc"}
    assert (bundle / "rootfs" / p.run_dir.lstrip("/")).parent.is_dir()  # runc makes the mount point itself


STEP = {
    "SLURM_JOB_ID": "7",
    "SLURM_STEP_ID": "0",
    "SLURM_STEP_NODELIST": "node[1-3]",
    "SLURM_STEP_NUM_NODES": "3",
    "SLURM_STEP_NUM_TASKS": "3",
    "SLURM_PROCID": "0",  # the batch script's, which srun passed on: wrong on every node but the first
    "SLURM_NODEID": "0",
}


def test_a_container_task_gets_its_rank_from_its_place_in_the_node_list() -> None:
    assert task_variables_by_host(STEP, "node3") == {"SLURM_PROCID": "2", "SLURM_NODEID": "2", "SLURM_LOCALID": "0"}
    assert task_variables_by_host(STEP, "node1.cluster.local")["SLURM_PROCID"] == "0"
    assert task_variables_by_host({"SLURM_JOB_ID": "7"}, "node3") == {}  # the batch script: not a step


@pytest.mark.parametrize(
    ("changes", "host"),
    [({}, "login1"), ({"SLURM_STEP_NUM_TASKS": "6"}, "node2")],
)
def test_a_rank_that_cannot_be_known_is_an_error_not_a_guess(changes: dict[str, str], host: str) -> None:
    with pytest.raises(NodeError, match="HINT"):
        task_variables_by_host({**STEP, **changes}, host)
