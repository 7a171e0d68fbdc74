"""container=...: which image the nodes run in, and which paths it must see (the plan's ContainerSpec).

Every path the run hands to the wrapper, to ms-swift or to SLURM's commands is mounted at the same path inside
the container: the run dir (checkpoints, records, the resume point), the model and data, the Python running the
wrapper (``container.python: host``), the caches ms-swift writes, the storage credentials, SLURM's configuration
and munge's socket (the wrapper requeues with scontrol). A path the container would not see is refused here,
with the mount to add, rather than found missing on the nodes hours later.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from swiftslurm.errors import ConfigError
from swiftslurm.plan import CONTAINER_RUNTIMES, ContainerSpec, Mount
from swiftslurm.planning.config import ContainerConfig

RUNTIMES = ("none", *CONTAINER_RUNTIMES)
# Variables the storage client reads from the environment (boto3's chain); passed when the node has them.
STORAGE_ENV = (
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "AWS_PROFILE",
    "AWS_DEFAULT_REGION",
    "AWS_REGION",
    "AWS_CA_BUNDLE",
    "AWS_SHARED_CREDENTIALS_FILE",
    "AWS_CONFIG_FILE",
)
# Where ms-swift, Hugging Face and torch cache downloads and compiled kernels when these are set.
CACHE_ENV = ("MODELSCOPE_CACHE", "HF_HOME", "HF_DATASETS_CACHE", "TRANSFORMERS_CACHE", "TORCH_HOME", "TRITON_CACHE_DIR")
MUNGE_SOCKET_DIRS = ("/run/munge", "/var/run/munge")
ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")  # what container.env may hold


@dataclass(frozen=True)
class Need:
    """A path the run uses on the nodes, and why."""

    path: str
    why: str
    read_only: bool = True


@dataclass(frozen=True)
class RunPaths:
    """What of the plan the container must see, gathered by make_plan."""

    run_dir: str
    python: str  # the planning Python (cluster.python or this interpreter)
    data: tuple[tuple[str, str], ...]  # (path, why): the absolute paths ms-swift is given (model, data, plugins)
    tiny_cache: str | None
    uses_storage: bool
    gpus: bool
    package_dir: str  # the folder that holds the swiftslurm package planning the run (ms-swift's plugin is in it)


def container_spec(
    cfg: ContainerConfig, paths: RunPaths, env: Mapping[str, str], scheduler: str
) -> ContainerSpec | None:
    """The plan's ContainerSpec, None for `container=none`; ConfigError naming the fix for what cannot run."""
    check_runtime(cfg.runtime)
    if cfg.runtime == "none":
        return None
    where = f"container={cfg.runtime}"
    if scheduler != "slurm":
        raise ConfigError(
            f"{where} runs the job's steps in an image through SLURM, and cluster.scheduler=local runs here, in this "
            "machine's own environment. HINT: add +cluster=NAME (a SLURM cluster), or leave container out."
        )
    if not cfg.image:
        raise ConfigError(f"{where} needs an image. HINT: add container.image=... ({IMAGE_EXAMPLES[cfg.runtime]}).")
    image, base_config = _image(cfg.runtime, cfg.image)
    python_from = "host" if cfg.python == "host" else "image"
    if python_from == "image" and not cfg.python.startswith("/"):
        raise ConfigError(
            f"container.python={cfg.python!r} is neither `host` nor an absolute path. HINT: container.python=host "
            "mounts this Python and its environment; or give the interpreter inside the image, e.g. "
            "container.python=/usr/bin/python3."
        )
    given = tuple(parse_mount(text) for text in cfg.mounts)
    needs = needed_paths(cfg.runtime, paths, python_from, env)
    mounts = _derive(given, needs) if cfg.derive_mounts else _check_covered(given, needs)
    _check_writable(mounts, needs)
    _check_system_folders(mounts)
    names = [*cfg.env, *(name for name in STORAGE_ENV if paths.uses_storage and name in env)]
    # The cache mounts are at the host's values; pyxis lets an image's own HF_HOME & co win unless passed by name.
    names += [name for name in CACHE_ENV if env.get(name, "").startswith("/")]
    for name in cfg.env:
        if not ENV_NAME.match(str(name)):
            raise ConfigError(
                f"container.env holds {name!r}, not a variable name. HINT: e.g. container.env=[WANDB_API_KEY]."
            )
    return ContainerSpec(
        runtime=cfg.runtime,
        image=image,
        python_from=python_from,
        mounts=mounts,
        env_names=tuple(dict.fromkeys(names)),
        name=cfg.name,
        writable=cfg.writable,
        gpus=paths.gpus,
        base_config=base_config,
    )


IMAGE_EXAMPLES = {
    # Hydra reads `#` only inside quotes, and the shell eats one pair: the form a user types is quoted twice
    "pyxis": (
        "an image reference, quoted for Hydra: 'container.image=\"nvcr.io#nvidia/pytorch:24.10-py3\"', or a .sqsh file"
    ),
    "apptainer": "a .sif file or a sandbox directory",
    "oci": "an OCI bundle directory (config.json + rootfs/) or a root filesystem directory",
}


def check_runtime(runtime: str) -> None:
    if runtime not in RUNTIMES:
        from swiftslurm.errors import did_you_mean, one_of

        raise ConfigError(
            f"container.runtime={runtime!r} is not known.{did_you_mean(runtime, RUNTIMES)} {one_of(RUNTIMES)}"
        )


def _image(runtime: str, image: str) -> tuple[str, str | None]:
    """(the image as the runtime takes it, the OCI bundle's config.json or None); refuses a file that is not there."""
    if runtime == "pyxis":
        if image.startswith("/") and not Path(image).is_file():
            raise ConfigError(
                f"container.image={image} does not exist. HINT: give the .sqsh file's path, or a reference."
            )
        return image, None
    path = Path(image)
    if not path.is_absolute() or not path.exists():
        raise ConfigError(
            f"container.image={image} is not an existing absolute path. HINT: give {IMAGE_EXAMPLES[runtime]}, on a "
            "filesystem the nodes share."
        )
    if runtime == "apptainer":
        return image, None
    if not path.is_dir():
        raise ConfigError(
            f"container.image={image} is a file; container=oci takes a directory. HINT: {IMAGE_EXAMPLES['oci']}."
        )
    config = path / "config.json"
    if not config.is_file():
        if not (path / "usr").is_dir():
            raise ConfigError(
                f"container.image={image} holds neither config.json nor a root filesystem (no usr/). "
                f"HINT: give {IMAGE_EXAMPLES['oci']}."
            )
        return image, None
    try:
        root = json.loads(config.read_text())["root"]["path"]
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise ConfigError(
            f"{config} has no readable root.path ({type(err).__name__}). HINT: fix the bundle, or give its root "
            "filesystem directory as container.image."
        ) from err
    rootfs = Path(root) if str(root).startswith("/") else path / str(root)
    if not rootfs.is_dir():
        raise ConfigError(f"{config} names root filesystem {rootfs}, which is not a directory. HINT: fix root.path.")
    return str(rootfs), str(config)


def parse_mount(text: str) -> Mount:
    """`SRC:DST` or `SRC:DST:ro` (or `:rw`), both absolute; the source must exist."""
    parts = str(text).split(":")
    mode = parts.pop() if len(parts) == 3 and parts[2] in ("ro", "rw") else "rw"
    fix = (
        "HINT: give each as SRC:DST or SRC:DST:ro, absolute paths without ':' or ',', "
        "e.g. container.mounts=['/data:/data:ro']."
    )
    if len(parts) != 2 or not all(p.startswith("/") for p in parts) or any("," in p for p in parts):
        raise ConfigError(f"container.mounts holds {text!r}, which is not a mount. {fix}")
    source, target = (str(PurePosixPath(p)) for p in parts)
    if not Path(source).exists():
        raise ConfigError(
            f"container.mounts: {source} does not exist on this machine. HINT: mount a path the nodes share, or "
            "leave it out."
        )
    return Mount(source, target, mode == "ro", "container.mounts")


def needed_paths(runtime: str, paths: RunPaths, python_from: str, env: Mapping[str, str]) -> list[Need]:
    """Every path the run uses inside the container, in the order a refusal names them."""
    needs = [Need(paths.run_dir, "the run dir", read_only=False)]
    needs += [Need(path, why) for path, why in paths.data]
    if paths.tiny_cache:
        needs.append(Need(paths.tiny_cache, "the tiny model and data swiftslurm builds", read_only=False))
    if python_from == "host":
        needs += _python_paths(paths.python)
    # ms-swift loads swiftslurm's plugin by its path, so the planning side's copy is there in both cases
    needs.append(Need(paths.package_dir, "swiftslurm's code (ms-swift loads its plugin by path)"))
    home_cache = Path(env.get("HOME", "/nonexistent")) / ".cache"
    if home_cache.is_dir():
        needs.append(Need(str(home_cache), "ms-swift's and Hugging Face's caches", read_only=False))
    needs += [
        Need(env[name], f"the cache ${name}", read_only=False)
        for name in CACHE_ENV
        if env.get(name, "").startswith("/")
    ]
    if paths.uses_storage:
        aws = Path(env.get("HOME", "/nonexistent")) / ".aws"
        files = [env.get("AWS_SHARED_CREDENTIALS_FILE"), env.get("AWS_CONFIG_FILE")]
        needs += [Need(str(aws), "storage credentials")] if aws.is_dir() else []
        needs += [Need(f, "storage credentials") for f in files if f and f.startswith("/")]
    needs += _slurm_paths(env)
    if runtime == "oci":  # pyxis (enroot) and apptainer bring these in themselves
        needs += [Need(p, "the other nodes' names") for p in ("/etc/hosts", "/etc/resolv.conf") if Path(p).exists()]
        needs.append(Need("/dev/shm", "shared memory between the ranks", read_only=False))
    return [*needs, *_link_targets(needs)]


def _link_targets(needs: list[Need]) -> list[Need]:
    """Where a needed path leads through symlinks (a venv or home that is a link): inside the container the link
    is followed too, so its target must be there as well."""
    linked = []
    for need in needs:
        real = str(Path(need.path).resolve())
        if real != need.path and Path(need.path).exists():
            linked.append(Need(real, f"{need.why} (where {need.path} links to)", need.read_only))
    return linked


def _python_paths(python: str) -> list[Need]:
    """The planning Python's environment: the venv (or prefix) it runs in, and the interpreter a venv links to."""
    exe = Path(python)
    prefix = exe.parent.parent
    base = exe.resolve().parent.parent
    needs = [Need(str(prefix), "container.python=host: its environment")]
    if base != prefix:
        needs.append(Need(str(base), "container.python=host: the interpreter its environment links to"))
    return needs


def _slurm_paths(env: Mapping[str, str]) -> list[Need]:
    """scontrol inside the container (requeue, host lists) reads slurm.conf and talks to munged."""
    conf = Path(env.get("SLURM_CONF") or "/etc/slurm/slurm.conf")
    needs = []
    if conf.exists():
        needs.append(Need(str(conf.parent), "SLURM's configuration (scontrol requeues from inside)"))
        if conf.is_symlink() and conf.resolve().parent != conf.parent:
            needs.append(Need(str(conf.resolve().parent), "SLURM's configuration (slurm.conf links there)"))
    socket_dir = next((d for d in MUNGE_SOCKET_DIRS if Path(d).is_dir()), None)
    if socket_dir:
        needs.append(Need(socket_dir, "munge's socket (scontrol authenticates through it)", read_only=False))
    return needs


def mount_order(mount: Mount) -> tuple[str, ...]:
    """The order mounts are made in: a folder before anything in it (its parts are a prefix of theirs); otherwise
    by name, so the order does not depend on how deep each path lies."""
    return PurePosixPath(mount.target).parts


def _covering(mounts: tuple[Mount, ...] | list[Mount], path: str) -> Mount | None:
    """The innermost mount whose target holds ``path``."""
    holders = [m for m in mounts if PurePosixPath(path).is_relative_to(m.target)]
    return max(holders, key=lambda m: len(m.target)) if holders else None


def _derive(given: tuple[Mount, ...], needs: list[Need]) -> tuple[Mount, ...]:
    """The user's mounts, then one for each needed path no mount shows at the same path (a writable path under a
    read-only mount of ours gets its own); parents before children, as the runtimes mount them in order."""
    mounts = list(given)
    for need in sorted(needs, key=lambda n: (n.path.count("/"), n.path)):
        holder = _covering(mounts, need.path)
        moved = holder is not None and holder.source != holder.target  # the user's mount shows other files there
        if holder is None or moved or (holder.read_only and not need.read_only and holder.why != "container.mounts"):
            mounts.append(Mount(need.path, need.path, need.read_only, need.why))
    return tuple(sorted(mounts, key=mount_order))


def _check_covered(given: tuple[Mount, ...], needs: list[Need]) -> tuple[Mount, ...]:
    """container.derive_mounts=false: each needed path must be under one of the user's mounts, at the same path
    inside and out: plan.json, the checkpoints' manifests, the resume point and `status` on the login node all
    name paths as the nodes do."""
    for need in needs:
        holder = _covering(given, need.path)
        add = f"HINT: add container.mounts+=['{need.path}:{need.path}{':ro' if need.read_only else ''}']"
        if holder is None:
            raise ConfigError(
                f"{need.path} ({need.why}) would not be seen inside the container: no container.mounts entry holds "
                f"it. {add}, or set container.derive_mounts=true."
            )
        if holder.source != holder.target:
            raise ConfigError(
                f"container.mounts maps {holder.source} to {holder.target}, so {need.path} ({need.why}) would be "
                f"another path inside the container than outside. {add}, or set container.derive_mounts=true."
            )
    return tuple(sorted(given, key=mount_order))


# The image's own system folders: a mount there replaces the image's libraries and commands with the host's.
SYSTEM_FOLDERS = ("/", "/usr", "/lib", "/lib64", "/bin", "/sbin", "/etc", "/var", "/opt")


def _check_system_folders(mounts: tuple[Mount, ...]) -> None:
    """A venv made from the host's /usr/bin/python3 links there: mounting the host's /usr hides the image's."""
    for mount in mounts:
        if mount.target in SYSTEM_FOLDERS:
            raise ConfigError(
                f"{mount.source} ({mount.why}) would be mounted over the image's own {mount.target}, hiding its "
                "libraries and commands. HINT: plan with a Python installed outside /usr (conda, uv or pyenv, on a "
                "filesystem the nodes share), or run the image's: container.python=/usr/bin/python3."
            )


def _check_writable(mounts: tuple[Mount, ...], needs: list[Need]) -> None:
    """A path the run writes is not under a read-only mount of the user's."""
    for mount in mounts:
        if mount.read_only and not all(n.read_only for n in needs if _covering(mounts, n.path) is mount):
            writable = next(n for n in needs if _covering(mounts, n.path) is mount and not n.read_only)
            raise ConfigError(
                f"container.mounts mounts {mount.source} read-only, and {writable.path} ({writable.why}) is written "
                f"to. HINT: drop ':ro' from '{mount.spec}', or mount {writable.path} on its own."
            )
