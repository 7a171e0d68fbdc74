"""Preflight in a container (issue 28, item 4): the versions a plan records, and each check of the image made
inside it (started, swiftslurm and ms-swift at the planned versions, the mounts, scontrol), judged on fakes:
mounts on tmp folders, a mount table and an os-release written by the test, a scripted scontrol."""

from __future__ import annotations

import json
import os
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import pytest

from swiftslurm import slurm
from swiftslurm.plan import ContainerSpec, JobPlan, Mount
from swiftslurm.planning.make import PlanContext, make_plan
from swiftslurm.preflight import checks as pc
from swiftslurm.preflight import image
from swiftslurm.submit import preflight as login_preflight
from tests.conftest import FIXED_CACHE, FIXED_PYTHON, compose_config, plan_for

PLANNED = {"swiftslurm": "0.1.0", "ms-swift": "4.6.0"}


def container_plan(image_dir: Path, versions: dict[str, str] | None = None) -> JobPlan:
    (image_dir / "usr").mkdir(parents=True, exist_ok=True)  # a root filesystem, as container=oci takes it
    cfg = compose_config("+cluster=local-slurm", "container=oci", f"container.image={image_dir}")
    ctx = PlanContext(cwd=Path("/home/user/project"), python=FIXED_PYTHON, env={"SWIFTSLURM_CACHE": FIXED_CACHE})
    return make_plan(cfg, replace(ctx, versions=PLANNED if versions is None else versions))


# ---------------------------------------------------------------- what the plan records


def test_a_container_plan_records_the_versions_it_was_planned_with(tmp_path: Path) -> None:
    plan = container_plan(tmp_path / "image")
    assert plan.versions == (("ms-swift", "4.6.0"), ("swiftslurm", "0.1.0"))
    assert plan.planned_version("ms-swift") == "4.6.0" and plan.planned_version("torch") is None
    assert JobPlan.from_json(plan.to_json()) == plan


def test_versions_are_read_from_the_planning_python_without_importing_ms_swift(tmp_path: Path) -> None:
    (tmp_path / "image" / "usr").mkdir(parents=True)
    plan = plan_for("+cluster=local-slurm", "container=oci", f"container.image={tmp_path / 'image'}")
    from importlib import metadata

    assert plan.planned_version("swiftslurm") == metadata.version("swiftslurm")


def test_swiftslurm_without_metadata_is_the_running_codes_version(monkeypatch: pytest.MonkeyPatch) -> None:
    """Run from a source folder on PYTHONPATH, swiftslurm has no installed metadata; ms-swift then is missing."""
    from importlib import metadata

    import swiftslurm
    from swiftslurm.plan import installed_versions

    def nothing_installed(name: str) -> str:
        raise metadata.PackageNotFoundError(name)

    monkeypatch.setattr(metadata, "version", nothing_installed)
    assert installed_versions() == {"swiftslurm": swiftslurm.__version__}


def test_a_plan_without_a_container_records_no_versions() -> None:
    plan = plan_for("+cluster=local-slurm")
    assert plan.versions == () and "versions" in json.loads(plan.to_json())


def test_versions_do_not_change_the_identity_a_checkpoint_resumes_under(tmp_path: Path) -> None:
    """An upgrade of ms-swift or swiftslurm between two submissions must not refuse the resume."""
    before = container_plan(tmp_path / "image")
    after = container_plan(tmp_path / "image", {"swiftslurm": "0.2.0", "ms-swift": "4.7.0"})
    assert before.versions != after.versions and before.identity() == after.identity()
    assert "versions" not in before.identity_facts()


def test_a_plan_json_written_before_versions_existed_still_loads(tmp_path: Path) -> None:
    data = json.loads(container_plan(tmp_path / "image").to_json())
    del data["versions"]
    assert JobPlan.from_json(json.dumps(data)).versions == ()


# ---------------------------------------------------------------- swiftslurm and ms-swift in the container


@pytest.mark.parametrize(
    ("planned", "found", "ok", "text"),
    [
        ("4.6.0", "4.6.0", True, "ms-swift 4.6.0 for /usr/bin/python3"),
        (None, "4.6.0", True, "ms-swift 4.6.0 for /usr/bin/python3 (none planned)"),
        (
            "4.6.0",
            "4.5.1",
            False,
            "ms-swift 4.5.1 is installed for /usr/bin/python3 inside the container, planned: 4.6.0.",
        ),
        ("4.6.0", None, False, "ms-swift is not installed for /usr/bin/python3 inside the container."),
    ],
)
def test_ms_swift_in_the_image_against_the_planned_version(
    planned: str | None, found: str | None, ok: bool, text: str
) -> None:
    check = pc.package("ms-swift", planned, found, "/usr/bin/python3", "image")
    assert check.ok is ok and check.detail == text
    if not ok:
        wanted = "ms-swift==4.6.0" if planned else "ms-swift"
        assert (
            check.hint
            == f"HINT: install {wanted} in the image, or set container.python=host (the planning Python, mounted)."
        )


def test_a_mounted_host_python_with_another_swiftslurm_says_to_plan_with_it() -> None:
    check = pc.package("swiftslurm", "0.1.0", "0.2.0", "/opt/venv/bin/python", "host")
    assert not check.ok and "swiftslurm 0.2.0" in check.detail and "planned: 0.1.0" in check.detail
    assert check.hint.startswith("HINT: plan the run with that Python (/opt/venv/bin/python -m swiftslurm ...)")
    assert "install swiftslurm==0.1.0 into it" in check.hint


def test_ms_swift_command_must_be_executable_in_the_container() -> None:
    assert pc.entry_point("/opt/venv/bin/swift", True).ok
    failed = pc.entry_point("/opt/venv/bin/swift", False)
    assert not failed.ok and failed.message.startswith("/opt/venv/bin/swift is not an executable file inside")
    assert "container.python" in failed.hint


# ---------------------------------------------------------------- the mounts


def mount(tmp_path: Path, name: str, read_only: bool = True) -> Mount:
    return Mount(str(tmp_path / name), str(tmp_path / name), read_only, "the run dir")


def test_a_mount_target_that_is_missing_or_not_mounted_names_the_mount_to_add(tmp_path: Path) -> None:
    (tmp_path / "seen").mkdir()
    (tmp_path / "image_folder").mkdir()
    missing, unmounted, seen = (mount(tmp_path, n) for n in ("gone", "image_folder", "seen"))
    points = {seen.target}
    assert image.mount_problem(missing, points) == "does not exist"
    assert image.mount_problem(unmounted, points).startswith("is not mounted")  # type: ignore[union-attr]
    assert image.mount_problem(seen, points) is None
    assert image.mount_problem(unmounted, None) is None  # no mount table: only what can be seen is judged
    rows = pc.mounts([(missing, "does not exist"), (seen, None)])
    assert len(rows) == 1 and not rows[0].ok
    assert rows[0].message == (
        f"{missing.target} does not exist inside the container; it is mounted for the run dir. HINT: add "
        f"container.mounts+=['{missing.source}:{missing.target}:ro'] and check that {missing.source} exists on "
        "that node (the runtime mounts what it finds)."
    )


def test_an_unreadable_mount_fails(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "data").mkdir()

    def denied(path: object) -> list[str]:
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(image.os, "listdir", denied)  # root (the lead's container) reads everything
    assert image.mount_problem(mount(tmp_path, "data"), None) == "cannot be read (Permission denied)"


def test_a_writable_mount_mounted_read_only_says_to_drop_ro(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "run").mkdir()
    writable, read_only = mount(tmp_path, "run", read_only=False), mount(tmp_path, "run")
    assert image.mount_problem(writable, None) is None
    monkeypatch.setattr(image.os, "statvfs", lambda path: SimpleNamespace(f_flag=os.ST_RDONLY))
    assert image.mount_problem(read_only, None) is None  # planned read-only: nothing is written there
    assert image.mount_problem(writable, None) == "is mounted read-only"
    (row,) = pc.mounts([(writable, "is mounted read-only")])
    assert row.hint == f"HINT: mount it writable: container.mounts+=['{writable.source}:{writable.target}'] (no ':ro')."


def test_every_mount_seen_is_one_row() -> None:
    mounts = [(Mount("/a", "/a", True, "x"), None), (Mount("/b", "/b", False, "y"), None)]
    (row,) = pc.mounts(mounts)
    assert row.ok and row.detail == "2 seen, 1 of them writable"


def test_mount_points_are_read_with_mountinfo_escapes_undone(tmp_path: Path) -> None:
    table = tmp_path / "mountinfo"
    table.write_text(
        "22 1 0:21 / / rw,relatime - overlay overlay rw\n"
        "23 22 259:1 /runs/a\\040b /runs/a\\040b rw,relatime - ext4 /dev/vda1 rw\n"
    )
    assert image.mount_points(table) == {"/", "/runs/a b"}
    assert image.mount_points(tmp_path / "absent") is None


# ---------------------------------------------------------------- the container started, and the whole list


def test_the_os_of_the_root_filesystem_is_the_container_rows_detail(tmp_path: Path) -> None:
    release = tmp_path / "os-release"
    release.write_text('PRETTY_NAME="Debian GNU/Linux 12 (bookworm)"\nNAME="Debian GNU/Linux"\n')
    assert image.os_name(release) == "Debian GNU/Linux 12 (bookworm)"
    assert image.os_name(tmp_path / "absent") is None
    check = pc.container_started("oci", "/images/swift/rootfs", None)
    assert check.ok and check.detail == "oci /images/swift/rootfs: running (no /etc/os-release)"


@pytest.fixture
def scontrol(monkeypatch: pytest.MonkeyPatch) -> list[slurm.Answer | Exception]:
    """scontrol's answers in turn: `--version` first, then `show node`."""
    answers: list[slurm.Answer | Exception] = []

    def runner(argv: object, timeout_s: float) -> slurm.Answer:
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    monkeypatch.setattr(slurm, "runner", runner)
    monkeypatch.setattr(slurm, "sleep", lambda s: None)
    return answers


def test_the_containers_scontrol_matches_the_nodes_slurm_release(scontrol: list[slurm.Answer | Exception]) -> None:
    node = "NodeName=n1 Arch=x86_64 CoresPerSocket=1 Version=22.05.8 State=ALLOCATED"
    scontrol += [slurm.Answer(0, "slurm-wlm 22.05.2\n"), slurm.Answer(0, node)]
    check = image.scontrol_check("n1")
    assert check.ok and check.detail == "scontrol 22.05.2 asks slurmctld; n1's slurmd is 22.05.8"
    scontrol += [slurm.Answer(0, "slurm 23.11.4\n"), slurm.Answer(0, node)]
    check = image.scontrol_check("n1")
    assert not check.ok and check.detail == "scontrol inside the container is SLURM 23.11.4, n1's slurmd is 22.05.8."
    assert check.hint.startswith("HINT: install SLURM's client of release 22.05 in the image")


def test_an_image_without_scontrol_fails_with_the_fix(scontrol: list[slurm.Answer | Exception]) -> None:
    scontrol.append(FileNotFoundError(2, "No such file or directory", "scontrol"))
    check = image.scontrol_check("n1")
    assert not check.ok and check.detail.startswith("scontrol does not work inside the container: ")
    assert "No such file or directory" in check.detail
    assert "install SLURM's client in the image" in check.hint and "munge" in check.hint


def test_scontrol_that_cannot_reach_slurmctld_fails(scontrol: list[slurm.Answer | Exception]) -> None:
    auth = slurm.Answer(1, stderr="slurm_load_node error: Protocol authentication error")
    scontrol += [slurm.Answer(0, "slurm 22.05.8"), auth]
    check = image.scontrol_check("n1")
    assert not check.ok and "Protocol authentication error" in check.detail


def test_a_plan_without_a_container_has_no_container_rows(tmp_path: Path) -> None:
    assert image.container_checks(plan_for("+cluster=local-slurm"), "n1", tmp_path) == []


def test_the_container_rows_of_a_node_report(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, scontrol: list[slurm.Answer | Exception]
) -> None:
    root = tmp_path / "root"
    (root / "etc").mkdir(parents=True)
    (root / "etc" / "os-release").write_text("PRETTY_NAME=Debian GNU/Linux 12 (bookworm)\n")
    (tmp_path / "run").mkdir()
    swift = tmp_path / "swift"
    swift.write_text("#!/bin/sh\n")
    swift.chmod(0o755)
    spec = ContainerSpec("oci", "/images/swift", "image", (mount(tmp_path, "run", read_only=False),))
    plan = replace(container_plan(tmp_path / "image"), container=spec, executable=str(swift))
    table = tmp_path / "mountinfo"
    table.write_text(f"23 22 259:1 /run {tmp_path / 'run'} rw - ext4 /dev/vda1 rw\n")
    monkeypatch.setattr(image, "MOUNT_TABLE", table)
    monkeypatch.setattr(image, "installed_versions", lambda: {"swiftslurm": "0.1.0", "ms-swift": "4.5.1"})
    scontrol += [slurm.Answer(0, "slurm 22.05.8"), slurm.Answer(0, "NodeName=n1 Version=22.05.8")]
    rows = image.container_checks(plan, "n1", root)
    assert [(c.name, c.ok) for c in rows] == [
        ("container", True),
        ("swiftslurm in the container", True),
        ("ms-swift in the container", False),  # 4.5.1 there, 4.6.0 planned
        ("ms-swift command", True),
        ("container mounts", True),
        ("scontrol in the container", True),
    ]
    assert rows[0].detail == "oci /images/swift: running Debian GNU/Linux 12 (bookworm)"


def test_the_checks_only_job_runs_in_the_runs_container(tmp_path: Path) -> None:
    plan = container_plan(tmp_path / "image")
    script = login_preflight.render_preflight_sbatch(plan, 60.0)
    bundle = f"{plan.run_dir}/container"
    assert f"--unbuffered --container={bundle} {FIXED_PYTHON} -m swiftslurm.node.task_env {FIXED_PYTHON}" in script
    assert f"-m swiftslurm.preflight.gather {plan.run_dir} --port-base" in script
