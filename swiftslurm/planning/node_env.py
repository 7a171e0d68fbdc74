"""The environment every node exports before ms-swift starts (plan.env), and what `cluster.env` may add to it.

A variable swiftslurm derives itself (the rank variables the node side computes from SLURM, the NCCL settings of
`cluster.nccl`) is refused in `cluster.env`, naming the setting that controls it: the node would replace it, or
it would contradict that setting. Names NCCL or PyTorch do not read (the field guides' `NCCL_TIMEOUT`), and the
deprecated spellings of PyTorch's variables, are refused or warned of here, where the user can still fix them.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from typing import TYPE_CHECKING

from swiftslurm.errors import ConfigError, did_you_mean

if TYPE_CHECKING:
    from swiftslurm.planning.config import Config

# What the node side sets on every node (slurm_env.rank_env; SLURM's binding for the GPUs), and the setting behind it.
RANK_VARIABLES = {
    "NPROC_PER_NODE": "cluster.gpus_per_node (cluster.cpu_procs_per_node on CPUs)",
    "NNODES": "cluster.nodes",
    "NODE_RANK": "SLURM (each node's SLURM_NODEID)",
    "MASTER_ADDR": "SLURM (the job's first host)",
    "MASTER_PORT": "cluster.master_port_base",
    "WORLD_SIZE": "cluster.nodes × cluster.gpus_per_node",
    "RANK": "torchrun",
    "LOCAL_RANK": "torchrun",
    "LOCAL_WORLD_SIZE": "torchrun",
    "CUDA_VISIBLE_DEVICES": "cluster.gpus_per_node (SLURM binds the allocated GPUs)",
}
# What plan.env carries from cluster.nccl.
NCCL_SETTINGS = {
    "NCCL_IB_DISABLE": "cluster.nccl.ib",
    "NCCL_DEBUG": "cluster.nccl.debug",
    "NCCL_SOCKET_IFNAME": "cluster.nccl.socket_ifname",
    "GLOO_SOCKET_IFNAME": "cluster.nccl.socket_ifname",
    "TORCH_NCCL_ASYNC_ERROR_HANDLING": "cluster.nccl.async_error_handling",
    # PyTorch's old name: it reads the new one, which swiftslurm sets, first.
    "NCCL_ASYNC_ERROR_HANDLING": "cluster.nccl.async_error_handling",
}
# Names that look like NCCL's but that neither NCCL nor PyTorch reads, and what does what the guides meant.
NOT_READ = {
    "NCCL_TIMEOUT": "the collective timeout is PyTorch's: cluster.nccl.timeout_s",
    "NCCL_SOCKET_TIMEOUT": "the collective timeout is PyTorch's: cluster.nccl.timeout_s",
}
# PyTorch's deprecated spellings (it still reads them, with a warning, unless the new one is set).
TORCH_RENAMED = {
    "NCCL_BLOCKING_WAIT": "TORCH_NCCL_BLOCKING_WAIT",
    "NCCL_DESYNC_DEBUG": "TORCH_NCCL_DESYNC_DEBUG",
    "NCCL_ENABLE_TIMING": "TORCH_NCCL_ENABLE_TIMING",
    "NCCL_TRACE_BUFFER_SIZE": "TORCH_NCCL_TRACE_BUFFER_SIZE",
}
# NCCL's documented variables (NCCL 2.2x user guide, "Environment Variables"); another NCCL_* name is warned of.
NCCL_VARIABLES = frozenset(
    """
    NCCL_SOCKET_IFNAME NCCL_SOCKET_FAMILY NCCL_SOCKET_RETRY_CNT NCCL_SOCKET_RETRY_SLEEP_MSEC NCCL_SOCKET_NTHREADS
    NCCL_NSOCKS_PERTHREAD NCCL_CROSS_NIC NCCL_IB_HCA NCCL_IB_TIMEOUT NCCL_IB_RETRY_CNT NCCL_IB_GID_INDEX
    NCCL_IB_ADDR_FAMILY NCCL_IB_ADDR_RANGE NCCL_IB_ROCE_VERSION_NUM NCCL_IB_SL NCCL_IB_TC NCCL_IB_FIFO_TC
    NCCL_IB_RETURN_ASYNC_EVENTS NCCL_OOB_NET_ENABLE NCCL_OOB_NET_IFNAME NCCL_UID_STAGGER_THRESHOLD
    NCCL_UID_STAGGER_RATE NCCL_NET NCCL_NET_PLUGIN NCCL_TUNER_PLUGIN NCCL_PROFILER_PLUGIN NCCL_IGNORE_CPU_AFFINITY
    NCCL_CONF_FILE NCCL_DEBUG NCCL_DEBUG_FILE NCCL_DEBUG_SUBSYS NCCL_DEBUG_TIMESTAMP_FORMAT NCCL_COLLNET_ENABLE
    NCCL_COLLNET_NODE_THRESHOLD NCCL_CONNECT_ROUND_MAX_PEERS NCCL_TOPO_FILE NCCL_TOPO_DUMP_FILE NCCL_SET_THREAD_NAME
    NCCL_P2P_DISABLE NCCL_P2P_LEVEL NCCL_P2P_DIRECT_DISABLE NCCL_P2P_READ_ENABLE NCCL_P2P_NET_CHUNKSIZE
    NCCL_P2P_PCI_CHUNKSIZE NCCL_P2P_NVL_CHUNKSIZE NCCL_P2P_LL_THRESHOLD NCCL_SHM_DISABLE NCCL_SHM_USE_CUDA_MEMCPY
    NCCL_SHM_MEMCPY_MODE NCCL_SHM_LOCALITY NCCL_BUFFSIZE NCCL_NTHREADS NCCL_MAX_NCHANNELS NCCL_MIN_NCHANNELS
    NCCL_MAX_NRINGS NCCL_MIN_NRINGS NCCL_MAX_CTAS NCCL_MIN_CTAS NCCL_CGA_CLUSTER_SIZE NCCL_CHECKS_DISABLE
    NCCL_CHECK_POINTERS NCCL_LAUNCH_MODE NCCL_IB_DISABLE NCCL_IB_AR_THRESHOLD NCCL_IB_QPS_PER_CONNECTION
    NCCL_IB_SPLIT_DATA_ON_QPS NCCL_IB_CUDA_SUPPORT NCCL_IB_PCI_RELAXED_ORDERING NCCL_IB_ADAPTIVE_ROUTING
    NCCL_IB_ECE_ENABLE NCCL_IB_MERGE_NICS NCCL_IB_MERGE_VFS NCCL_IB_USE_INLINE NCCL_IB_PKEY NCCL_MEM_SYNC_DOMAIN
    NCCL_NET_GDR_LEVEL NCCL_NET_GDR_READ NCCL_NET_GDR_C2C NCCL_NET_DISABLE_INTRA NCCL_NET_FORCE_FLUSH
    NCCL_NET_SHARED_BUFFERS NCCL_NET_SHARED_COMMS NCCL_NET_OVERHEAD NCCL_SINGLE_RING_THRESHOLD NCCL_LL_THRESHOLD
    NCCL_TREE_THRESHOLD NCCL_ALGO NCCL_PROTO NCCL_IGNORE_DISABLED_P2P NCCL_GRAPH_REGISTER NCCL_LOCAL_REGISTER
    NCCL_LEGACY_CUDA_REGISTER NCCL_SET_STACK_SIZE NCCL_GRAPH_MIXING_SUPPORT NCCL_DMABUF_ENABLE NCCL_P2P_USE_CUDA_MEMCPY
    NCCL_CUMEM_ENABLE NCCL_CUMEM_HOST_ENABLE NCCL_NVLS_ENABLE NCCL_NVLS_CHUNKSIZE NCCL_NVB_DISABLE NCCL_PXN_DISABLE
    NCCL_P2P_PXN_LEVEL NCCL_RUNTIME_CONNECT NCCL_MNNVL_ENABLE NCCL_RAS_ENABLE NCCL_RAS_ADDR NCCL_RAS_TIMEOUT_FACTOR
    NCCL_HOSTID NCCL_COMM_ID NCCL_WORK_FIFO_DEPTH NCCL_WORK_FIFO_BYTES NCCL_NCHANNELS_PER_NET_PEER
    NCCL_ALLOC_P2P_NET_LL_BUFFERS NCCL_COMM_BLOCKING NCCL_CTA_POLICY NCCL_NVLSTREE_MAX_CHUNKSIZE NCCL_IB_FIFO_TC
    NCCL_WIN_ENABLE NCCL_COLLNET_TREE NCCL_NVLS_NCHANNELS NCCL_NET_MERGE_LEVEL NCCL_IB_TIMEOUT
    """.split()  # noqa: SIM905 (a list literal of 130 names would not read)
)


# What NCCL reads in NCCL_DEBUG and NCCL_DEBUG_SUBSYS (src/debug.cc; any case). An unknown level or subsystem
# is ignored without a word: the run would log nothing, or not what was asked.
NCCL_DEBUG_LEVELS = ("VERSION", "WARN", "INFO", "ABORT", "TRACE")
NCCL_DEBUG_SUBSYSTEMS = (
    *("INIT", "COLL", "P2P", "SHM", "NET", "GRAPH", "TUNING", "ENV", "ALLOC", "ALLOC_HOST", "CALL", "PROXY"),
    *("NVLS", "BOOTSTRAP", "REG", "PROFILE", "RAS", "DESTROY", "ALL"),
)


def check_nccl_debug(level: str, env: Mapping[str, object]) -> None:
    """cluster.nccl.debug must be a level NCCL reads; cluster.env.NCCL_DEBUG_SUBSYS a list of its subsystems."""
    if str(level).upper() not in NCCL_DEBUG_LEVELS:
        close = difflib.get_close_matches(str(level).upper(), NCCL_DEBUG_LEVELS, n=1, cutoff=0.6)
        fix = f"cluster.nccl.debug={close[0]}" if close else "cluster.nccl.debug=INFO for details, WARN for errors only"
        raise ConfigError(
            f"cluster.nccl.debug={level!r} is not a level NCCL reads (it would log nothing; it reads "
            f"{', '.join(NCCL_DEBUG_LEVELS)}). HINT: {fix}."
        )
    if "NCCL_DEBUG_SUBSYS" not in env:
        return
    given = str(env["NCCL_DEBUG_SUBSYS"])
    invert = "^" if given.startswith("^") else ""
    names = given.removeprefix("^").split(",")
    unknown = [n for n in names if n.strip().upper() not in NCCL_DEBUG_SUBSYSTEMS]
    if not unknown:
        return
    kept = [_closest_subsystem(n) for n in names]
    fixed = invert + ",".join(dict.fromkeys(k for k in kept if k))
    fix = f"'cluster.env.NCCL_DEBUG_SUBSYS=\"{fixed}\"'" if fixed.strip("^") else "remove cluster.env.NCCL_DEBUG_SUBSYS"
    raise ConfigError(
        f"cluster.env.NCCL_DEBUG_SUBSYS={given!r}: {', '.join(map(repr, unknown))} is not a subsystem NCCL reads "
        f"(comma-separated, ^ first to exclude; e.g. INIT,NET,COLL). HINT: {fix}."
    )


def _closest_subsystem(name: str) -> str | None:
    word = name.strip().upper()
    if word in NCCL_DEBUG_SUBSYSTEMS:
        return word
    close = difflib.get_close_matches(word, NCCL_DEBUG_SUBSYSTEMS, n=1, cutoff=0.6)
    return close[0] if close else None


def node_env(cfg: Config) -> dict[str, str]:
    """plan.env: the NCCL settings, the tiny model's offline switches and `cluster.env` (checked first)."""
    check_env(cfg.cluster.env)
    check_nccl_debug(cfg.cluster.nccl.debug, cfg.cluster.env)
    nccl = cfg.cluster.nccl
    env = {
        "NCCL_IB_DISABLE": "0" if nccl.ib else "1",
        "NCCL_DEBUG": nccl.debug,
        "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1" if nccl.async_error_handling else "0",
        "PYTHONUNBUFFERED": "1",
    }
    if nccl.socket_ifname:
        env |= {"NCCL_SOCKET_IFNAME": nccl.socket_ifname, "GLOO_SOCKET_IFNAME": nccl.socket_ifname}
    if cfg.model.id == "tiny":
        # The tiny model is local: never let transformers or ModelScope reach for a hub.
        env |= {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    env |= {k: str(v) for k, v in cfg.cluster.env.items()}
    return env


def check_env(env: Mapping[str, object]) -> None:
    """Refuse a `cluster.env` variable swiftslurm sets itself, or one that nothing reads."""
    for name in map(str, env):
        if name in RANK_VARIABLES:
            raise ConfigError(
                f"cluster.env.{name}: the node side sets {name} on every node from {RANK_VARIABLES[name]}, so "
                f"this value would be replaced. HINT: remove cluster.env.{name}; ranks come from SLURM."
            )
        if name in NCCL_SETTINGS:
            raise ConfigError(
                f"cluster.env.{name} contradicts {NCCL_SETTINGS[name]}, which sets it. HINT: remove "
                f"cluster.env.{name} and set {NCCL_SETTINGS[name]} instead."
            )
        if name.startswith("SLURM_"):
            raise ConfigError(
                f"cluster.env.{name}: SLURM sets its own SLURM_* variables in the job. HINT: remove it; "
                "ask for resources with the cluster.* settings or cluster.sbatch."
            )
        if name in NOT_READ:
            raise ConfigError(
                f"cluster.env.{name} is not a variable NCCL or PyTorch reads; {NOT_READ[name]}. "
                f"HINT: remove cluster.env.{name}."
            )
        if name in TORCH_RENAMED and TORCH_RENAMED[name] in env:
            raise ConfigError(
                f"cluster.env.{name} is PyTorch's old name of {TORCH_RENAMED[name]}, also set: PyTorch reads "
                f"the new one only. HINT: remove cluster.env.{name}."
            )


def env_warnings(env: Mapping[str, object]) -> list[str]:
    """One line per `cluster.env` name that may be intended but is probably a mistake."""
    warnings = []
    for name in map(str, env):
        if name in TORCH_RENAMED:
            warnings.append(
                f"warning: cluster.env.{name} is PyTorch's deprecated name. HINT: write "
                f"cluster.env.{TORCH_RENAMED[name]} instead."
            )
        elif name.startswith("NCCL_") and name not in NCCL_VARIABLES and name not in NCCL_SETTINGS:
            close = did_you_mean(name, sorted(NCCL_VARIABLES)).strip() or "HINT: check the name in NCCL's docs."
            warnings.append(f"warning: cluster.env.{name} is not one of NCCL's documented variables. {close}")
    return warnings
