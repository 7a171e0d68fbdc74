"""The one owner of every file name in a run directory; the login side and the node side both read it.

    RUN_DIR/
      plan.json          the resolved plan: the contract between the login side and the nodes
      plan.sha256        plan.json's SHA-256, recorded when the run dir is prepared; checked on the node first
      config.yaml        the composed Hydra config, for people
      job.sbatch         `sbatch RUN_DIR/job.sbatch` submits the run by hand
      job.json           the latest submission (job id, scheduler)
      status.json        the leader's view of the run (state, the phase of its attempt), replaced atomically
      attempts.jsonl     one record per attempt, append-only
      attempt_open.json  the attempt in progress, removed once it is recorded; left behind if it died
                         without a record (the next attempt records it as lost)
      lease/<token>.json the leader's lease, one file per generation (the newest is the lease): which job
                         took it, its fencing token; its mtime is the heartbeat (rundir/lease.py)
      lease.json         an older swiftslurm's lease, read for its holder while no generation exists
      cancelled.json     `swiftslurm cancel` was here
      submit_refused.json  the latest submission was refused, and why; removed by the next one that goes through
      sync.json          object storage: what is uploaded, what failed
      uploads.jsonl      a line per upload, by storage/uploader.py (when, how long, how much)
      logs/slurm-%j.out  SLURM's output of a job submitted by hand (`sbatch job.sbatch`): the batch script's
                         and every node's wrapper (stdout and stderr, all nodes in one file)
      logs/<attempt>/    node<N>.log (the trainer's output), node<N>.json (its result), resume.json,
                         leader.json (node 0's heartbeat until resume.json is written), hang.json (the
                         watchdog found the run hung: when, at which step, the window), stacks/rank<R>.txt
                         (rank R's Python stacks, all threads, dumped before a hung trainer is killed),
                         trainer.jsonl (global rank 0's timeline: loop begun, saves, commits, loop ended;
                         rundir/timeline.py), progress.json (global rank 0's heartbeat: the step, and
                         whether it trains, saves or evaluates; rundir/beat.py), outcome.json (node 0's
                         word: restart in place, or end), stop.json (global rank 0: the step every rank
                         agreed to save and stop at), save_deadline.json (node 0: when a trainer still
                         running after a stop signal is killed, and from what: node/deadline.py),
                         pace/node<N>.json (node N's local rank 0: the median forward time of its slowest rank's recent
                         training steps; rundir/pace.py), stragglers.json (node 0: the nodes named slower than
                         the others, by how much, since when; node/stragglers.py), swap.json (node 0: stop at a
                         checkpoint, a straggler is swapped for a spare; node/swap.py), spares/<host>.json (the
                         heartbeat of a spare standing by through the attempt: rundir/beat.py)
      accounting.json    `status`'s cache of SLURM's accounting of the run's jobs (swiftslurm/ops/accounting.py)
      preflight/         job.sbatch, slurm-%j.out, <attempt>/report.json, rank<N>.json, rank<N>.token
      output/            the trainer's output dir: checkpoint-<step>/, quarantine/, logging.jsonl
                         .pruning/ (checkpoints retention is deleting: moved here whole first, so a kill
                         midway leaves nothing half-deleted in place; leftovers go at the next attempt start)
                         .checkpoint-<step>.download-*/ (a restore in progress; a killed one's is stale)
                         checkpoint-<step>-universal/ (a ZeRO checkpoint's form for another number of
                         ranks, derived, never uploaded; .checkpoint-<step>-universal.building-*/ while
                         node 0 builds it; named by ckpt/checkpoint.py, engines/zero_reshard.py)
                         (a checkpoint's manifest is named by ckpt/checkpoint.py, with the commit format)
      reserve/node<N>    disk space node N's wrapper holds while its trainer runs, released for the records
                         when the trainer ends (rundir/reserve.py)
      submitit/          submitit's own files; among them <job>_<task>_log.out and .err (SUBMITIT_OUT,
                         SUBMITIT_ERR): what node <task>'s wrapper printed (restores, uploads, decisions, a crash
                         before any attempt began). A job array's are in its sweep dir's submitit/ (job.json
                         names it), its tasks' job ids `<array>_<index>`.
      replaced/<time>/   the files of an earlier run of this dir, planned with other settings, that committed
                         nothing: set aside when the dir was planned again in place (submit/jobs.py)

The run dir itself is RUN_DIR_MODE (owner and group only), whatever the umask; it holds no secrets.

Only names and paths here (no I/O, no imports beyond pathlib): the node side imports it, and must stay light.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

RUN_DIR_MODE = 0o750
PLAN = "plan.json"
PLAN_DIGEST = "plan.sha256"
CONFIG = "config.yaml"
SBATCH = "job.sbatch"
JOB = "job.json"
STATUS = "status.json"
ATTEMPTS = "attempts.jsonl"
OPEN_ATTEMPT = "attempt_open.json"
CANCELLED = "cancelled.json"
SUBMIT_REFUSED = "submit_refused.json"  # the latest submission was refused (sbatch, the partition, the store)
SYNC_STATE = "sync.json"
UPLOAD_HISTORY = "uploads.jsonl"
LOGS = "logs"
SLURM_LOG = "slurm-%j.out"  # SLURM fills in the job id
RESUME = "resume.json"  # in logs/<attempt>/: the leader's choice of checkpoint, read by every node
OUTCOME = "outcome.json"  # in logs/<attempt>/: node 0's word on what follows the attempt (restart or end)
TRAINER_TIMELINE = "trainer.jsonl"  # in logs/<attempt>/: global rank 0's events (rundir/timeline.py)
PROGRESS = "progress.json"  # in logs/<attempt>/: global rank 0's heartbeat, each step (rundir/beat.py)
ACCOUNTING = "accounting.json"  # `status`'s cache of sacct's rows for the run's jobs
LEADER_BEAT = "leader.json"  # in logs/<attempt>/: node 0 alive, and what it does, while it chooses (restores)
LEASE_DIR = "lease"  # the leader's lease on the run dir, one file per generation (rundir/lease.py)
LEASE_GENERATION = "{token}.json"  # in lease/: created once, never replaced
LEASE = "lease.json"  # an older swiftslurm's lease (one file, replaced under a POSIX lock)
HANG = "hang.json"  # in logs/<attempt>/: node 0 found the run hung; every node dumps its ranks' stacks
STOP_STEP = "stop.json"  # in logs/<attempt>/: global rank 0's agreed stop step; every node waits for its commit
SAVE_DEADLINE = "save_deadline.json"  # in logs/<attempt>/: node 0's kill time for a trainer after a stop signal
PACE = "pace"  # in logs/<attempt>/: each node's pace, written by its local rank 0 (rundir/pace.py)
PACE_FILE = "node{node}.json"  # in logs/<attempt>/pace/
STRAGGLERS = "stragglers.json"  # in logs/<attempt>/: node 0's named stragglers (node/stragglers.py)
SWAP = "swap.json"  # in logs/<attempt>/: node 0's request that every node stop at a checkpoint (node/swap.py)
SPARE_BEATS = "spares"  # in logs/<attempt>/: each standing-by spare's heartbeat (rundir/beat.py)
SPARE_BEAT_FILE = "{host}.json"  # in logs/<attempt>/spares/: named by the host as SLURM lists it
STACKS = "stacks"  # in logs/<attempt>/: one file per rank, written by the rank itself (faulthandler)
STACK_FILE = "rank{rank}.txt"  # in logs/<attempt>/stacks/
PREFLIGHT = "preflight"
PREFLIGHT_REPORT = "report.json"
OUTPUT = "output"
QUARANTINE = "quarantine"  # in output/: checkpoints set aside (uncommitted, or newer than the resume point)
PRUNING = ".pruning"  # in output/: checkpoints being deleted by retention, each renamed here first
DOWNLOAD_STAGING = ".{checkpoint}.download-"  # in output/: prefix of a restore's temp folder, renamed when whole
METRICS = "logging.jsonl"  # in output/: ms-swift's per-step records (both engines write it)
SUBMITIT = "submitit"
CONTAINER_BUNDLE = "container"  # container=oci: the OCI bundle `srun --container` runs (config.json, rootfs/)
REPLACED = "replaced"  # <UTC time>/: an earlier run planned with other settings that committed nothing
SUBMITIT_OUT = "{job}_{task}_log.out"  # in submitit/: the stdout of task <task> (node <task>'s wrapper) of a job
SUBMITIT_ERR = "{job}_{task}_log.err"  # in submitit/: its stderr
RESERVE = "reserve"  # disk space held for the records while the trainer runs (rundir/reserve.py)
RESERVE_FILE = "node{node}"  # in reserve/
NODE_LOG = "node{node}.log"  # in logs/<attempt>/
NODE_RESULT = "node{node}.json"  # in logs/<attempt>/
_NODE_RESULT_NAME = re.compile(r"node(\d+)\.json")  # NODE_RESULT's names
# in logs/<attempt>/: the phase and error of a node other than 0 whose wrapper raised; srun then ends the whole
# step, node 0 included, often before node 0 records anything, so this is the run's only word on how it ended
WRAPPER_FAILURE = "wrapper_failed{node}.json"
PREFLIGHT_RANK_REPORT = "rank{node}.json"  # in preflight/<attempt>/
PREFLIGHT_TOKEN = "rank{node}.token"  # in preflight/<attempt>/


def plan_file(run_dir: Path) -> Path:
    return run_dir / PLAN


def plan_digest_file(run_dir: Path) -> Path:
    return run_dir / PLAN_DIGEST


def output_dir(run_dir: Path | str) -> Path:
    return Path(run_dir) / OUTPUT


def logs_dir(run_dir: Path | str) -> Path:
    return Path(run_dir) / LOGS


def attempt_dir(run_dir: Path, attempt: str) -> Path:
    return logs_dir(run_dir) / attempt


def node_log(attempt_dir: Path, node: int) -> Path:
    return attempt_dir / NODE_LOG.format(node=node)


def node_logs(attempt_dir: Path) -> list[Path]:
    return sorted(attempt_dir.glob(NODE_LOG.format(node="*")))


def leader_logs(run_dir: Path | str) -> list[Path]:
    """Node 0's log of every attempt, in no particular order."""
    return list(logs_dir(run_dir).glob("*/" + NODE_LOG.format(node=0)))


def trainer_timeline(attempt_dir: Path) -> Path:
    return attempt_dir / TRAINER_TIMELINE


def progress_file(attempt_dir: Path) -> Path:
    return attempt_dir / PROGRESS


def node_result(attempt_dir: Path, node: int) -> Path:
    return attempt_dir / NODE_RESULT.format(node=node)


def nodes_with_results(attempt_dir: Path) -> set[int]:
    """The nodes that wrote a result in ``attempt_dir`` (NODE_RESULT), from one listing of it. Nodes that wait on
    their peers' results look at every poll: a stat of each peer's file was N-1 operations per node per poll on the
    shared run dir, N(N-1) together; one listing is one per node."""
    try:
        names = os.listdir(attempt_dir)
    except FileNotFoundError:
        return set()
    return {int(match[1]) for name in names if (match := _NODE_RESULT_NAME.fullmatch(name))}


def wrapper_failure_file(attempt_dir: Path, node: int) -> Path:
    return attempt_dir / WRAPPER_FAILURE.format(node=node)


def wrapper_failure_files(run_dir: Path) -> list[Path]:
    """Every attempt's wrapper failures of nodes other than 0, in no particular order."""
    return list(logs_dir(run_dir).glob("*/" + WRAPPER_FAILURE.format(node="*")))


def hang_file(attempt_dir: Path) -> Path:
    return attempt_dir / HANG


def stop_step_file(attempt_dir: Path) -> Path:
    return attempt_dir / STOP_STEP


def save_deadline_file(attempt_dir: Path) -> Path:
    return attempt_dir / SAVE_DEADLINE


def pace_dir(attempt_dir: Path) -> Path:
    return attempt_dir / PACE


def pace_file(attempt_dir: Path, node: int) -> Path:
    return pace_dir(attempt_dir) / PACE_FILE.format(node=node)


def stragglers_file(attempt_dir: Path) -> Path:
    return attempt_dir / STRAGGLERS


def swap_file(attempt_dir: Path) -> Path:
    return attempt_dir / SWAP


def spare_beat_file(attempt_dir: Path, host: str) -> Path:
    return attempt_dir / SPARE_BEATS / SPARE_BEAT_FILE.format(host=host)


def stacks_dir(attempt_dir: Path) -> Path:
    return attempt_dir / STACKS


def stack_file(stacks_dir: Path, rank: int) -> Path:
    return stacks_dir / STACK_FILE.format(rank=rank)


def lease_dir(run_dir: Path) -> Path:
    return run_dir / LEASE_DIR


def lease_generation(run_dir: Path, token: int) -> Path:
    return lease_dir(run_dir) / LEASE_GENERATION.format(token=token)


def lease_file(run_dir: Path) -> Path:
    return run_dir / LEASE


def resume_file(run_dir: Path, attempt: str) -> Path:
    return attempt_dir(run_dir, attempt) / RESUME


def outcome_file(run_dir: Path, attempt: str) -> Path:
    return attempt_dir(run_dir, attempt) / OUTCOME


def container_bundle(run_dir: Path | str) -> Path:
    return Path(run_dir) / CONTAINER_BUNDLE


def preflight_dir(run_dir: Path | str) -> Path:
    return Path(run_dir) / PREFLIGHT


def preflight_attempt_dir(run_dir: Path | str, attempt: str) -> Path:
    return preflight_dir(run_dir) / attempt


def preflight_report(run_dir: Path | str, attempt: str) -> Path:
    return preflight_attempt_dir(run_dir, attempt) / PREFLIGHT_REPORT


def preflight_rank_report(attempt_dir: Path, node: int) -> Path:
    return attempt_dir / PREFLIGHT_RANK_REPORT.format(node=node)


def preflight_token(attempt_dir: Path, node: int) -> Path:
    return attempt_dir / PREFLIGHT_TOKEN.format(node=node)


def reserve_file(run_dir: Path, node: int) -> Path:
    return run_dir / RESERVE / RESERVE_FILE.format(node=node)


def slurm_log(folder: Path, job_id: str) -> Path:
    """SLURM_LOG once SLURM has filled in the job id."""
    return folder / SLURM_LOG.replace("%j", job_id)


def submitit_dir(folder: Path) -> Path:
    """submitit's folder in a run dir (its jobs), or in a sweep dir (its job arrays)."""
    return folder / SUBMITIT


def submitit_logs(folder: Path, job_id: str) -> list[tuple[int, str, Path]]:
    """submitit's output files of one job in ``folder``: (task, "out" or "err", path), task by task, stdout
    first. srun starts one task per node, so task N is node N's wrapper. Only this job's: job 12's are not
    those of job 12_3 (task 3 of array 12) or 120."""
    found = []
    for stream, name in (("out", SUBMITIT_OUT), ("err", SUBMITIT_ERR)):
        head, tail = name.format(job=job_id, task="\0").split("\0")
        for path in folder.glob(f"{head}*{tail}"):
            task = path.name[len(head) : -len(tail)]
            if task.isdigit():
                found.append((int(task), stream, path))
    return sorted(found, key=lambda f: (f[0], f[1] == "err"))
