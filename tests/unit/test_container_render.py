"""container=pyxis|apptainer|oci rendered for a 2-node GPU plan: job.sbatch, the script submitit writes, and the
dry run's container section, against golden files (tests/data/containers/; SWIFTSLURM_UPDATE_GOLDEN=1 accepts a
change, as tests/unit/test_render.py does). Pyxis and Apptainer are not run anywhere here (neither is packaged for
Debian): these goldens and the flag checks below, against each tool's own option list, are all that tests them.

The plan sees a fake root (tmp_path) instead of this machine: the planning Python, HOME, slurm.conf, munge's
socket dir, the images and the run dir all lie under it, and the root is cut from the text, so the goldens read as
a cluster's paths (/opt/venv, /etc/slurm, /run/munge) on any machine. /etc/hosts and /etc/resolv.conf (oci only)
are this machine's own; a machine without /etc/resolv.conf renders one mount fewer.
"""

from __future__ import annotations

import json
import os
import shlex
from pathlib import Path

import pytest

import swiftslurm
from swiftslurm import container
from swiftslurm.errors import ConfigError
from swiftslurm.plan import JobPlan
from swiftslurm.planning import container as planning_container
from swiftslurm.planning.make import PlanContext, make_plan
from swiftslurm.render import render_sbatch
from swiftslurm.submit.jobs import executor_parameters, make_executor
from tests.conftest import FIXED_CACHE, REPO, compose_config

GOLDEN = REPO / "tests" / "data" / "containers"
UPDATE = os.environ.get("SWIFTSLURM_UPDATE_GOLDEN") == "1"
RUN_DIR = "/scratch/r"
PYXIS_IMAGE = "nvcr.io#nvidia/pytorch:24.10-py3"
CLUSTER = ["+cluster=a100x16", "model=qwen3-8b", "dataset=[AI-ModelScope/alpaca-gpt4-data-en]", "strategy=zero3"]
IMAGES = {
    "pyxis": f"container.image='{PYXIS_IMAGE}'",  # Hydra reads # only quoted
    "apptainer": "container.image={root}/shared/images/ms-swift.sif",
    "oci": "container.image={root}/shared/images/ms-swift",
}

# Every option pyxis adds to srun (NVIDIA/pyxis args.c, spank_opts[]: the same list as the wiki's Usage page).
PYXIS_OPTIONS = {
    "--container-image",
    "--container-mounts",
    "--container-workdir",
    "--container-name",
    "--container-save",
    "--container-mount-home",
    "--no-container-mount-home",
    "--container-remap-root",
    "--no-container-remap-root",
    "--container-entrypoint",
    "--no-container-entrypoint",
    "--container-entrypoint-log",
    "--container-writable",
    "--container-readonly",
    "--container-env",
}
# The `apptainer exec` options swiftslurm uses (apptainer-exec(1): -B/--bind src[:dest[:opts]] with opts ro|rw,
# comma-separated; --nv; --pwd "initial working directory for payload process inside the container").
APPTAINER_EXEC_OPTIONS = {"--nv", "--bind", "--pwd"}


@pytest.fixture
def root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A fake machine: a venv linking to its interpreter (installed outside /usr), a home with caches, SLURM's and
    munge's files, the images."""
    root = tmp_path.resolve()
    folders = ("opt/python/3.11/bin", "opt/venv/bin", "home/user/.cache", "etc/slurm", "run/munge")
    for folder in (*folders, "shared/images/ms-swift/usr"):
        (root / folder).mkdir(parents=True)
    (root / "opt/python/3.11/bin/python3.11").write_text("")
    (root / "opt/venv/bin/python").symlink_to(root / "opt/python/3.11/bin/python3.11")
    (root / "etc/slurm/slurm.conf").write_text("ClusterName=fake\n")
    (root / "shared/images/ms-swift.sif").write_text("")
    monkeypatch.setattr(planning_container, "MUNGE_SOCKET_DIRS", (str(root / "run/munge"),))
    # swiftslurm's code as an editable checkout would have it, outside the venv: mounted on its own
    monkeypatch.setattr(swiftslurm, "__file__", str(root / "home/user/swiftslurm/swiftslurm/__init__.py"))
    return root


def container_plan(root: Path, runtime: str, *more: str) -> JobPlan:
    overrides = [*CLUSTER, f"container={runtime}", IMAGES[runtime].format(root=root), *more]
    env = {
        "SWIFTSLURM_CACHE": FIXED_CACHE,
        "HOME": str(root / "home/user"),
        "HF_HOME": "/shared/cache/hf",
        "SLURM_CONF": str(root / "etc/slurm/slurm.conf"),
    }
    ctx = PlanContext(cwd=root / "home/user", python=str(root / "opt/venv/bin/python"), env=env)
    return make_plan(compose_config(*overrides, f"run_dir={root}{RUN_DIR}", "container.env=[WANDB_API_KEY]"), ctx)


def check_golden(name: str, text: str, root: Path) -> None:
    text = text.replace(str(root), "").replace(str(REPO), "<repo>")
    path = GOLDEN / name
    if UPDATE or not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    assert text == path.read_text(), f"{name} changed; SWIFTSLURM_UPDATE_GOLDEN=1 pytest ... to accept"


def submitit_script(plan: JobPlan, folder: Path) -> str:
    """The batch script submitit would submit for this plan (its own, beside job.sbatch)."""
    executor = make_executor(plan, folder)
    inner = executor._executor  # type: ignore[attr-defined]
    return str(inner._make_submission_file_text(inner._submitit_command_str, "UUID"))


RUNTIMES = ("pyxis", "apptainer", "oci")


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_job_sbatch_matches_golden(runtime: str, root: Path) -> None:
    check_golden(f"{runtime}.sbatch", render_sbatch(container_plan(root, runtime)), root)


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_submitit_script_and_parameters_match_golden(runtime: str, root: Path) -> None:
    plan = container_plan(root, runtime)
    params = {"python": shlex.join(container.python_argv(plan)), **executor_parameters(plan)}
    check_golden(f"{runtime}.submitit.json", json.dumps(params, indent=1, sort_keys=True) + "\n", root)
    check_golden(f"{runtime}.submitit.sbatch", submitit_script(plan, Path(plan.run_dir) / "submitit"), root)


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_dry_run_container_section_matches_golden(runtime: str, root: Path) -> None:
    plan = container_plan(root, runtime)
    assert plan.container is not None
    check_golden(f"{runtime}.dry-run.txt", container.describe(plan.container, plan) + "\n", root)


def srun_line(plan: JobPlan) -> list[str]:
    return shlex.split(render_sbatch(plan).strip().splitlines()[-1])


def test_every_pyxis_flag_rendered_is_one_pyxis_has(root: Path) -> None:
    argv = srun_line(container_plan(root, "pyxis", "container.writable=true", "container.name=keep"))
    flags = {arg.split("=", 1)[0] for arg in argv if arg.startswith("--container") or arg.startswith("--no-container")}
    assert flags <= PYXIS_OPTIONS, flags - PYXIS_OPTIONS
    assert "--container-writable" in argv and "--container-name=keep" in argv


def test_pyxis_gets_one_mount_list_of_same_path_mounts_the_run_dir_first_writable(root: Path) -> None:
    plan = container_plan(root, "pyxis")
    mounts = next(a for a in srun_line(plan) if a.startswith("--container-mounts=")).split("=", 1)[1].split(",")
    for spec in mounts:
        source, target, *flags = spec.split(":")
        assert source == target and flags in ([], ["ro"]), spec  # pyxis's SRC:DST[:FLAGS], flags joined by +
    assert f"{root}{RUN_DIR}:{root}{RUN_DIR}" in mounts


def test_pyxis_passes_the_caches_the_mounts_assume_over_the_image_s_values(root: Path) -> None:
    """pyxis sets host variables after the image's own, which win (args.c, --container-env), unless named there: a
    cache mounted at the host's $HF_HOME is only used when the container's HF_HOME is the host's."""
    argv = srun_line(container_plan(root, "pyxis"))
    names = next(a for a in argv if a.startswith("--container-env=")).split("=", 1)[1].split(",")
    assert "HF_HOME" in names and "WANDB_API_KEY" in names


def test_apptainer_runs_the_wrapper_through_apptainer_exec_with_gpus(root: Path) -> None:
    argv = srun_line(container_plan(root, "apptainer"))
    start = argv.index("apptainer")
    assert argv[start + 1] == "exec"
    image = argv.index(f"{root}/shared/images/ms-swift.sif")
    options = [a for a in argv[start + 2 : image] if a.startswith("-")]
    assert set(options) <= APPTAINER_EXEC_OPTIONS and "--nv" in options
    assert argv[image + 1 : image + 4] == [f"{root}/opt/venv/bin/python", "-m", "swiftslurm.node"]
    assert argv[argv.index("--pwd") + 1] == f"{root}{RUN_DIR}"


def test_oci_hands_srun_the_run_s_own_bundle(root: Path) -> None:
    argv = srun_line(container_plan(root, "oci"))
    assert f"--container={root}{RUN_DIR}/container" in argv
    assert argv[argv.index("--container=" + f"{root}{RUN_DIR}/container") + 1 :][:4] == [
        f"{root}/opt/venv/bin/python",
        "-m",
        "swiftslurm.node.task_env",
        f"{root}/opt/venv/bin/python",
    ]


def test_a_host_python_made_from_the_system_s_is_refused_not_mounted_over_the_image_s_usr(root: Path) -> None:
    """A venv of /usr/bin/python3 links into /usr: the derived mount would hide the image's /usr."""
    (root / "opt/venv/bin/python").unlink()
    (root / "opt/venv/bin/python").symlink_to("/usr/bin/python3")  # this machine's /usr, not the fake root's
    with pytest.raises(ConfigError, match=r"over the image's own .*/usr.*HINT: .*container.python=/usr/bin/python3"):
        container_plan(root, "pyxis")
