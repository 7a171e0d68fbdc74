"""The resolved plan: every fact a run needs, computed once, validated, frozen.

``make_plan(config)`` (swiftslurm/planning/make.py) is the only place where the composed configuration is
interpreted. Its result, ``JobPlan``, is written to ``plan.json`` in the run directory and is the only thing the
node side reads (``JobPlan.load_checked``: only the plan.json whose SHA-256 was recorded when the run dir was prepared).
Nothing here imports Hydra, torch or ms-swift: both sides read it, and the node side never loads the planner.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields, is_dataclass
from pathlib import Path
from typing import Any

from swiftslurm.engines.registry import engine_for
from swiftslurm.errors import ConfigError, NodeError, StorageError, one_of
from swiftslurm.rundir import layout as rundir
from swiftslurm.rundir.jsonio import read_json, read_json_required

PLAN_VERSION = 2  # 2: the package regroup (plugin paths under swiftslurm/engines/)
IDENTITY_CHARS = 16  # hex digits of a plan's identity: enough to tell runs apart, short enough to read
PORT_SPAN = 20000  # master ports are base + job id mod PORT_SPAN
# DeepSpeed's ZeRO stages do not train over gloo (CPU) without it; a no-op where CUDA exists.


@dataclass(frozen=True)
class Topology:
    """How many processes run where. The world size is derived, never stated."""

    nodes: int
    procs_per_node: int
    gpus_per_node: int

    @property
    def world_size(self) -> int:
        return self.nodes * self.procs_per_node


@dataclass(frozen=True)
class Parallelism:
    """Model-parallel degrees (Megatron); all 1 for DDP, DeepSpeed and FSDP."""

    tp: int = 1
    pp: int = 1
    cp: int = 1
    ep: int = 1
    sequence_parallel: bool = False

    @property
    def model_parallel(self) -> int:
        return self.tp * self.pp * self.cp


@dataclass(frozen=True)
class BatchPlan:
    """global = micro × gradient accumulation × data-parallel size, all in samples."""

    micro: int
    grad_accum: int
    data_parallel: int

    @property
    def global_(self) -> int:
        return self.micro * self.grad_accum * self.data_parallel

    def over(self, data_parallel: int) -> BatchPlan:
        """The same global batch over ``data_parallel`` ranks (a run resumed on fewer nodes): the micro batch
        stays, gradient accumulation takes up the difference (validate.check_shrink refused sizes that do not
        divide it)."""
        if data_parallel == self.data_parallel:
            return self
        return BatchPlan(self.micro, self.global_ // (self.micro * data_parallel), data_parallel)


@dataclass(frozen=True)
class SlurmSpec:
    """What is asked of SLURM. Rendered as #SBATCH lines and as submitit parameters."""

    job_name: str
    time_min: int
    time: str
    signal: str  # "USR2@120": USR2 (NCCL may catch USR1), that many seconds before the limit
    partition: str | None = None
    account: str | None = None
    qos: str | None = None
    constraint: str | None = None
    exclude: str | None = None
    cpus_per_task: int | None = None
    mem_gb: int | None = None
    gpus: str | None = None  # "--gpus-per-node" value: "8" or "a100:8"
    extra: tuple[tuple[str, str], ...] = ()


# resilience.straggler_action: "report" names a straggler (status, node 0's log); "exclude" also leaves its host
# out of the next requeue, as a failed host's (node/stragglers.py, node/decide.py exclusions); "swap" stops the
# attempt at a checkpoint and restarts it in place with a spare in the straggler's place (node/swap.py).
STRAGGLER_REPORT, STRAGGLER_EXCLUDE, STRAGGLER_SWAP = "report", "exclude", "swap"
STRAGGLER_ACTIONS = (STRAGGLER_REPORT, STRAGGLER_EXCLUDE, STRAGGLER_SWAP)


@dataclass(frozen=True)
class Resilience:
    """Budgets and watchdog limits the node side applies after each attempt (see ResilienceConfig)."""

    max_attempts: int = 50
    max_timeouts: int = 20
    max_unknown_stops: int = 5
    max_consecutive_failures: int = 3
    max_stops_without_progress: int = 10
    backoff_base_s: float = 30.0
    backoff_max_s: float = 600.0
    exclude_host_s: float = 21600.0
    max_restarts: int = 5
    startup_timeout_s: float = 3600.0
    hang_timeout_s: float = 1800.0
    pause_timeout_s: float = 7200.0
    hang_window_factor: float = 5.0
    hang_window_floor_s: float = 300.0
    user_error_window_s: float = 300.0
    signal_lead_s: int = 120
    # Fewest nodes an attempt may run on (resilience.min_nodes); None: the planned count, never fewer.
    min_nodes: int | None = None
    # Nodes allocated beyond the training nodes, standing by for a lost one (resilience.spare_nodes).
    spare_nodes: int = 0
    straggler_ratio: float = 1.2  # slow: this many times the other nodes' median forward time (node/stragglers.py)
    straggler_s: float = 300.0  # named once slow this long
    straggler_action: str = "report"  # or "exclude": its host is left out of the next requeue; or "swap" (spares)


@dataclass(frozen=True)
class PreflightSpec:
    """The pre-launch checks (preflight/gather.py): a job's first step with `preflight=true`, or on their own
    with `python -m swiftslurm.submit.preflight RUN_DIR`."""

    enabled: bool = False
    timeout_s: float = 60.0
    min_free_gb: float = 1.0  # free disk needed in the output dir
    local_paths: tuple[str, ...] = ()  # the model and dataset paths every node must see


CONTAINER_RUNTIMES = ("pyxis", "apptainer", "oci")
# The distributions a run records its versions of (JobPlan.versions) and preflight finds in the container.
PLANNED_WITH = ("swiftslurm", "ms-swift")


def installed_versions(distributions: tuple[str, ...] = PLANNED_WITH) -> dict[str, str]:
    """The version of each distribution installed for this Python (left out when not installed). Read from the
    installed metadata: importing ms-swift takes seconds and pulls in torch. swiftslurm run from a source folder
    on PYTHONPATH has no metadata: then the running code's own version."""
    from importlib import metadata

    import swiftslurm

    found = {"swiftslurm": swiftslurm.__version__} if "swiftslurm" in distributions else {}
    for name in distributions:
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return found


@dataclass(frozen=True)
class Mount:
    """One path the container sees: ``source`` on the node at ``target`` inside; ``why`` names what needs it."""

    source: str
    target: str
    read_only: bool
    why: str

    @property
    def spec(self) -> str:
        """`SRC:DST[:ro]`, the form pyxis, apptainer and container.mounts share."""
        return f"{self.source}:{self.target}" + (":ro" if self.read_only else "")


@dataclass(frozen=True)
class ContainerSpec:
    """The image each node's wrapper and ranks run in (planning/container.py derives it; swiftslurm/container.py
    renders it per runtime)."""

    runtime: str  # one of CONTAINER_RUNTIMES
    image: str  # pyxis: reference or .sqsh; apptainer: .sif or sandbox; oci: the image's root filesystem
    python_from: str  # "host": the planning Python, mounted; "image": the image's own
    mounts: tuple[Mount, ...] = ()
    env_names: tuple[str, ...] = ()  # passed from the node's environment into the container
    name: str | None = None  # pyxis --container-name
    writable: bool = False
    gpus: bool = False  # apptainer --nv; the OCI bundle's GPU hooks are the site's (docs/containers.md)
    base_config: str | None = None  # oci: the user's bundle's config.json the run's bundle starts from

    def __post_init__(self) -> None:
        # plan.json gives the mounts back as dicts
        mounts = tuple(m if isinstance(m, Mount) else Mount(**m) for m in self.mounts)
        object.__setattr__(self, "mounts", mounts)


@dataclass(frozen=True)
class JobPlan:
    """The contract between the login side and every node. Serialised as plan.json."""

    run_name: str
    run_dir: str
    scheduler: str  # "local" | "slurm"
    topology: Topology
    parallel: Parallelism
    batch: BatchPlan
    launcher: str  # "swift" | "megatron"
    command: str  # "sft" | "pt" | "rlhf"
    executable: str  # absolute path of the `swift` / `megatron` entry point on the nodes
    python: str
    swift_argv: tuple[str, ...]  # the ms-swift arguments after `swift sft`, exactly as passed
    env: tuple[tuple[str, str], ...]  # exported on every node before ms-swift starts
    setup: tuple[str, ...] = ()
    master_port_base: int = 10000
    slurm: SlurmSpec | None = None
    model_id: str = ""
    tiny_cache: str | None = None  # where swiftslurm.tiny builds the local model/dataset this run uses
    keep_checkpoints: int = 0  # committed checkpoints kept; 0 = all
    resilience: Resilience = field(default_factory=Resilience)
    storage: StorageSpec | None = None  # where committed checkpoints are uploaded; never credentials
    preflight: PreflightSpec = field(default_factory=PreflightSpec)
    container: ContainerSpec | None = None  # None: the nodes' own environment
    # (distribution, version) of swiftslurm and ms-swift as installed for the Python that planned the run;
    # recorded with a container only (preflight checks the image against them). Not part of the identity: an
    # upgrade of either does not stop a run from resuming its checkpoints.
    versions: tuple[tuple[str, str], ...] = ()
    version: int = PLAN_VERSION

    @property
    def output_dir(self) -> Path:
        return rundir.output_dir(self.run_dir)

    def planned_version(self, distribution: str) -> str | None:
        """The version of ``distribution`` the run was planned with; None when not recorded."""
        return dict(self.versions).get(distribution)

    @property
    def allocation_nodes(self) -> int:
        """The nodes the job asks SLURM for: the training nodes and the spares (`resilience.spare_nodes`)."""
        return self.topology.nodes + self.resilience.spare_nodes

    def batch_on(self, nodes: int) -> BatchPlan:
        """The batch of an attempt on ``nodes`` nodes (fewer than planned: `resilience.min_nodes`)."""
        return self.batch.over(nodes * self.topology.procs_per_node // self.parallel.model_parallel)

    def identity_facts(self) -> dict[str, Any]:
        """What determines the training result, so what a checkpoint can be resumed under. Left out: how it
        is run (time limit, partition, storage, resilience budgets, environment) and where (the run dir, and
        the output dir inside it, which would make every run dir a different identity)."""
        return {
            "launcher": self.launcher,
            "command": self.command,
            "swift_argv": engine_for(self.launcher).result_argv(self.swift_argv),
            "topology": asdict(self.topology),
            "parallel": asdict(self.parallel),
            "batch": asdict(self.batch),
        }

    def identity_changes(self, earlier: dict[str, Any]) -> list[str]:
        """How this plan's identity facts differ from ``earlier`` (another plan's ``identity_facts``), one
        `what: was → now` each; ms-swift's arguments flag by flag, so a refusal can name the setting."""
        changes: list[str] = []
        for name, now in self.identity_facts().items():
            was = earlier.get(name)
            if was == now:
                continue
            if name == "swift_argv" and isinstance(was, list):
                changes += _argv_changes(was, now)
            elif isinstance(was, dict) and isinstance(now, dict):
                keys = [*was, *(k for k in now if k not in was)]
                changes += [f"{name}.{k}: {was.get(k)} → {now.get(k)}" for k in keys if was.get(k) != now.get(k)]
            else:
                changes.append(f"{name}: {was} → {now}")
        return changes

    def identity(self) -> str:
        """The plan's identity: a digest of ``identity_facts``, carried by every checkpoint's manifest."""
        facts = json.dumps(self.identity_facts(), sort_keys=True)
        return hashlib.sha256(facts.encode()).hexdigest()[:IDENTITY_CHARS]

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2) + "\n"

    @classmethod
    def from_json(cls, text: str, any_version: bool = False) -> JobPlan:
        """``any_version``: also a plan of another version, read for what it shares with this one (the login
        side compares its identity before planning the run dir again); never to run it."""
        data = json.loads(text)
        if data.get("version") != PLAN_VERSION and not any_version:
            raise ConfigError(
                f"plan.json has version {data.get('version')}, this swiftslurm reads {PLAN_VERSION}. "
                "HINT: re-plan the run with this swiftslurm version (same run_dir continues it)."
            )
        return _from_dict(cls, data)

    @classmethod
    def load(cls, path: Path, any_version: bool = False) -> JobPlan:
        return cls.from_json(path.read_text(), any_version)

    @classmethod
    def load_checked(cls, run_dir: Path) -> JobPlan:
        """plan.json exactly as it was when the run dir was prepared (its SHA-256 is in plan.sha256): a plan
        edited by hand, half-written or replaced since must not start a run. Reads the file once."""
        path, digest_path = rundir.plan_file(run_dir), rundir.plan_digest_file(run_dir)
        text = path.read_text()
        if not digest_path.is_file():
            raise NodeError(
                f"{digest_path} does not exist, so {path} cannot be checked. HINT: prepare the run dir with this "
                f"swiftslurm (`python -m swiftslurm ... dry_run=true run_dir={run_dir}`), then submit it."
            )
        recorded, actual = digest_path.read_text().strip(), plan_digest(text)
        if actual != recorded:
            raise NodeError(
                f"{path} changed since the run dir was prepared (SHA-256 {actual[:12]}, recorded {recorded[:12]}). "
                f"HINT: never edit plan.json; re-plan with `python -m swiftslurm ... run_dir={run_dir}`."
            )
        return cls.from_json(text)


@dataclass(frozen=True)
class PlanGlance:
    """What the login side shows of a run from its plan.json (status, plots, the storage CLI), read from
    whatever plan is there: one of another version, or one written by hand with only some sections, still shows
    what it has. Nothing runs from a glance: a run is started from ``JobPlan.load_checked`` only."""

    run_name: str | None = None
    batch: BatchPlan | None = None  # None: the plan has no whole batch section
    gpus_per_node: int = 0
    procs_per_node: int = 1
    storage: dict[str, Any] | None = None  # plan.json's storage section as written (None: none)

    @classmethod
    def read(cls, run_dir: Path) -> PlanGlance:
        """The glance at ``run_dir``'s plan.json; an empty one when it is missing or cut short."""
        return cls.from_dict(read_json(rundir.plan_file(run_dir)) or {})

    @classmethod
    def read_required(cls, run_dir: Path) -> PlanGlance:
        """The glance at ``run_dir``'s plan.json; UnreadableJson naming the file when it is missing or cut short."""
        hint = "pass the run directory that holds plan.json (re-plan it if the file was damaged)."
        return cls.from_dict(read_json_required(rundir.plan_file(run_dir), hint))

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> PlanGlance:
        section = data.get("topology")
        topology: Mapping[str, Any] = section if isinstance(section, dict) else {}
        storage = data.get("storage")
        return cls(
            run_name=str(data["run_name"]) if data.get("run_name") is not None else None,
            batch=_batch_of(data.get("batch")),
            gpus_per_node=int(topology.get("gpus_per_node") or 0),
            procs_per_node=int(topology.get("procs_per_node") or 1),
            storage=dict(storage) if isinstance(storage, dict) else None,
        )

    def devices_per_node(self) -> tuple[int, str]:
        """What each node holds for the run: its GPUs, or (a CPU plan) its training processes."""
        return (self.gpus_per_node, "GPU") if self.gpus_per_node else (self.procs_per_node, "CPU process")


def _batch_of(section: Any) -> BatchPlan | None:
    try:
        return BatchPlan(int(section["micro"]), int(section["grad_accum"]), int(section["data_parallel"]))
    except (KeyError, TypeError, ValueError):
        return None


def plan_digest(text: str) -> str:
    """The SHA-256 of plan.json's text, as recorded in plan.sha256."""
    return hashlib.sha256(text.encode()).hexdigest()


def _from_dict(cls: Any, data: dict[str, Any]) -> Any:
    """Rebuild nested frozen dataclasses (and tuples of pairs) from ``asdict`` output."""
    kwargs = {}
    for f in fields(cls):
        if f.name not in data:
            continue
        value = data[f.name]
        sub = _dataclass_type(f.type)
        if sub is not None and isinstance(value, dict):
            value = _from_dict(sub, value)
        elif isinstance(value, list):
            value = tuple(tuple(v) if isinstance(v, list) else v for v in value)
        kwargs[f.name] = value
    return cls(**kwargs)


def _dataclass_type(annotation: Any) -> type | None:
    name = str(annotation).split("|")[0].strip()
    candidate = globals().get(name)
    return candidate if isinstance(candidate, type) and is_dataclass(candidate) else None


BACKGROUND_PRIORITIES = ("idle", "normal")  # of uploads during training: swiftslurm.storage.priority


@dataclass(frozen=True)
class StorageSpec:
    """Where a run's checkpoints live remotely and how they travel. Holds no credentials (see the module doc)."""

    bucket: str
    prefix: str  # the run's remote folder, e.g. "runs/<run_name>"; "" is the bucket's root
    endpoint_url: str | None = None  # None: AWS S3; else an S3-compatible endpoint, e.g. "http://10.0.0.5:8333"
    region: str | None = None  # None: boto3's default (AWS_REGION, the profile)
    addressing_style: str = "auto"  # "auto" | "path" | "virtual"; most self-hosted stores want "path"
    keep: int = 0  # newest K committed checkpoints kept remotely; 0 keeps all; the newest is never deleted
    part_size_mb: int = 16  # multipart part size, MiB: 8-16 MiB parts survive a proxy resetting 20% of requests
    max_attempts: int = 10  # attempts per request, the first included (boto3 retries)
    retry_mode: str = "standard"  # boto3 retry mode: "standard" | "adaptive" (adds client-side rate limiting)
    max_concurrency: int = 8  # parts and files in flight at once
    wait_at_exit_s: float = 300.0  # how long the end of an attempt waits for pending uploads, s
    background_priority: str = "idle"  # uploads during training: "idle" (CPU and disk time training leaves) | "normal"
    timeout_s: float = 60.0  # connect and read timeout of one request, s: a stalled request is retried after it

    def __post_init__(self) -> None:
        if not self.bucket:
            raise StorageError("storage.bucket is empty. HINT: set `storage.bucket=<bucket name>`.")
        choices = {
            "addressing_style": ("auto", "path", "virtual"),
            "retry_mode": ("standard", "adaptive"),
            "background_priority": BACKGROUND_PRIORITIES,
        }
        for name, valid in choices.items():
            if getattr(self, name) not in valid:
                raise StorageError(f"storage.{name}={getattr(self, name)!r} is not valid. {one_of(valid)}")
        if self.part_size_mb < 5:
            raise StorageError(f"storage.part_size_mb={self.part_size_mb}: S3 parts are at least 5 MiB; use 8-16.")
        for name in ("keep", "max_attempts", "max_concurrency"):
            if getattr(self, name) < (0 if name == "keep" else 1):
                raise StorageError(f"storage.{name}={getattr(self, name)} is out of range.")

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> StorageSpec:
        """From plan.json's `storage` section. Keys this version does not know are ignored (a newer plan)."""
        known = {f.name for f in fields(cls)}
        missing = {"bucket", "prefix"} - {name for name, value in data.items() if value is not None}
        if missing:
            raise StorageError(f"storage is missing {', '.join(sorted(missing))}. HINT: set storage.bucket/prefix.")
        return cls(**{k: v for k, v in data.items() if k in known})

    @property
    def root(self) -> str:
        """The prefix as a key folder: '' or 'runs/x/'."""
        stripped = self.prefix.strip("/")
        return f"{stripped}/" if stripped else ""

    @property
    def url(self) -> str:
        where = f" at {self.endpoint_url}" if self.endpoint_url else ""
        return f"s3://{self.bucket}/{self.root}{where}"


def _argv_changes(was: list[list[str]], now: list[list[str]]) -> list[str]:
    """`--flag old values → new values` for each ms-swift argument group (`result_argv`) that differs."""
    old = {group[0]: group[1:] for group in was}
    new = {group[0]: group[1:] for group in now}

    def words(values: list[str] | None) -> str:
        return "(not set)" if values is None else " ".join(values)

    changed = [flag for flag in [*old, *(f for f in new if f not in old)] if old.get(flag) != new.get(flag)]
    return [f"{flag} {words(old.get(flag))} → {words(new.get(flag))}" for flag in changed]
