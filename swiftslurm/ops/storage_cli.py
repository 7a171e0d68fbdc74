"""`python -m swiftslurm.ops.storage_cli list|download|upload|prune`: a run's checkpoints in the object store.

Where they are comes from flags (`--bucket B --prefix P [--endpoint-url U] [--region R]`) or from a run
directory (`--run-dir DIR`: the `storage` section of its plan.json); flags given win. Credentials come from
boto3's standard chain, as on the nodes. Only committed checkpoints (with a remote manifest) are listed.

Every command first checks the store within CheckpointStore.quick's bound and says so before it starts; a
download or upload then says its size and the retries each request gets, and its bytes so far every REPEAT_S
(on stderr; the results go to stdout).

    python -m swiftslurm.ops.storage_cli list --run-dir runs/my-run
    python -m swiftslurm.ops.storage_cli download latest --output-dir out --bucket b --prefix runs/my-run
    python -m swiftslurm.ops.storage_cli upload --run-dir runs/my-run
    python -m swiftslurm.ops.storage_cli prune --keep 2 --run-dir runs/my-run
"""

from __future__ import annotations

import argparse
import logging
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from swiftslurm.ckpt.checkpoint import newest_committed
from swiftslurm.errors import StorageError, SwiftSlurmError, report
from swiftslurm.ops.waiting import Narrator
from swiftslurm.plan import PlanGlance, StorageSpec
from swiftslurm.rundir.beat import GiB, every
from swiftslurm.rundir.layout import output_dir, plan_file
from swiftslurm.storage.store import CheckpointStore, MiB, checking, newest_remote_step, tries
from swiftslurm.storage.sync import record_uploaded

TICK_S = 1.0  # how often a transfer's bytes are looked at; the narrator says them every REPEAT_S


class Progress:
    """A long transfer, said while it lasts (store.TransferReport): its size and the retries each request gets
    when it starts, then the bytes so far every REPEAT_S ('still ...' while none move). Thread-safe: the
    transfer's threads report their bytes while the ticker says them."""

    def __init__(self, narrate: Narrator, spec: StorageSpec) -> None:
        self.narrate, self.spec = narrate, spec
        self._lock = threading.Lock()
        self._what, self._bytes, self._total = "", 0, 0

    def started(self, what: str, total: int) -> None:
        with self._lock:
            self._what, self._bytes, self._total = what, 0, total
            opening = f"{what}: {_size(total, total)} (each request {tries(self.spec)})..."
            self.narrate.begin(opening, self._now())

    def moved(self, count: int) -> None:
        with self._lock:
            self._bytes += count

    def tick(self) -> None:
        """Hand the progress to the narrator, which says it when REPEAT_S has passed (nothing before a start)."""
        with self._lock:
            if self._what:
                self.narrate(self._now())

    def _now(self) -> str:
        """'downloading checkpoint-20 from s3://b/p/ (1.2 of 3.4 GiB, 35%)'."""
        done = f"{100 * self._bytes / self._total:.0f}%" if self._total else "100%"
        return f"{self._what} ({_size(self._bytes, self._total, of=True)}, {done})"

    @contextmanager
    def said(self) -> Iterator[Progress]:
        """Tick every TICK_S from a daemon thread while the block runs."""
        with every(TICK_S, self.tick, "swiftslurm-progress"):
            yield self


def _size(count: int, total: int, of: bool = False) -> str:
    """'48.3 MiB', or with ``of`` '12.0 of 48.3 MiB': in GiB from a total of 1 GiB on."""
    unit, name = (GiB, "GiB") if total >= GiB else (MiB, "MiB")
    return f"{count / unit:.1f} of {total / unit:.1f} {name}" if of else f"{count / unit:.1f} {name}"


def _plan_storage(run_dir: Path) -> dict[str, Any]:
    path = plan_file(run_dir)
    if not path.is_file():
        raise StorageError(f"{path} does not exist. HINT: pass the run directory that holds plan.json.")
    storage = PlanGlance.read_required(run_dir).storage
    if not storage or storage.get("kind") == "none":
        raise StorageError(
            f"{path} has no `storage` section (the run was planned without object storage). "
            "HINT: pass --bucket and --prefix."
        )
    return dict(storage)


def spec_from_args(args: argparse.Namespace) -> StorageSpec:
    """The plan's storage section (with --run-dir), overridden by the flags that were given."""
    base = _plan_storage(Path(args.run_dir)) if args.run_dir else {}
    flags = {name: getattr(args, name) for name in ("bucket", "prefix", "endpoint_url", "region")}
    merged = base | {name: value for name, value in flags.items() if value is not None}
    if "bucket" not in merged or "prefix" not in merged:
        raise StorageError("say where the checkpoints are: --bucket B --prefix P, or --run-dir DIR.")
    return StorageSpec.from_dict(merged)


def reachable(spec: StorageSpec, narrate: Narrator) -> None:
    """The first contact, within CheckpointStore.quick's bound and said before it starts: a store that is down
    is reported in seconds, not after the spec's own retries (storage.max_attempts tries of storage.timeout_s)."""
    quick = CheckpointStore.quick(spec)
    narrate.say(checking(quick.spec))
    quick.check_access()


def cmd_list(store: CheckpointStore, args: argparse.Namespace, progress: Progress) -> int:
    steps = store.committed_steps()
    print(f"{store.spec.url}: {len(steps)} committed checkpoint(s)")
    if steps:
        print(f"{'step':>10} {'files':>6} {'size':>12}  committed (UTC)")
    for step in steps:
        manifest = store.manifest(step) or {"files": []}
        size = sum(entry["size"] for entry in manifest["files"])
        when = manifest.get("committed_at")
        stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(when)) if isinstance(when, (int, float)) else "?"
        print(f"{step:>10} {len(manifest['files']):>6} {size / MiB:>8.1f} MiB  {stamp}")
    return 0


def cmd_download(store: CheckpointStore, args: argparse.Namespace, progress: Progress) -> int:
    step = newest_remote_step(store) if args.step == "latest" else int(args.step)
    if step is None:
        raise StorageError(f"no committed checkpoint in {store.spec.url}.")
    print(store.download(step, Path(args.output_dir), progress))
    return 0


def cmd_upload(store: CheckpointStore, args: argparse.Namespace, progress: Progress) -> int:
    """The newest committed local checkpoint into the store (nothing is sent if it is there already): what a run
    that finished before its last upload did needs. With --run-dir, sync.json says so afterwards."""
    run_dir = Path(args.run_dir) if args.run_dir else None
    folder = Path(args.output_dir) if args.output_dir else output_dir(run_dir) if run_dir else None
    if folder is None:
        raise StorageError("say which checkpoints to upload: --run-dir DIR, or --output-dir DIR with the flags.")
    newest, rejected = newest_committed(folder)
    if newest is None:
        found = f" ({'; '.join(rejected)})" if rejected else ""
        raise StorageError(f"no committed checkpoint in {folder}{found}: nothing to upload.")
    result = store.upload(newest, progress)
    print(f"{newest.name} is in {store.spec.url}" + (" (it was already)" if result.already_remote else ""))
    if run_dir is not None:
        record_uploaded(run_dir, result.step)
    return 0


def cmd_prune(store: CheckpointStore, args: argparse.Namespace, progress: Progress) -> int:
    deleted = store.prune(args.keep)
    print(f"deleted {len(deleted)} checkpoint(s) from {store.spec.url}: {', '.join(map(str, deleted)) or 'none'}")
    return 0


def _step(text: str) -> str:
    if text != "latest" and not text.isdigit():
        raise argparse.ArgumentTypeError(f"{text!r} is not a step number or `latest`")
    return text


def _positive(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: keep at least 1 (the newest is never deleted)")
    return int(text)


def parser() -> argparse.ArgumentParser:
    where = argparse.ArgumentParser(add_help=False)
    where.add_argument("--run-dir", help="run directory whose plan.json has a `storage` section")
    where.add_argument("--bucket")
    where.add_argument("--prefix", help="the run's remote folder, e.g. runs/<run_name>")
    where.add_argument("--endpoint-url", help="S3-compatible endpoint; omit for AWS S3")
    where.add_argument("--region")
    top = argparse.ArgumentParser(prog="python -m swiftslurm.ops.storage_cli", description=__doc__.split("\n\n")[0])
    commands = top.add_subparsers(dest="command", required=True)
    commands.add_parser("list", parents=[where], help="committed checkpoints").set_defaults(run=cmd_list)
    download = commands.add_parser("download", parents=[where], help="fetch and verify one checkpoint")
    download.add_argument("step", type=_step, help="step number, or `latest`")
    download.add_argument("--output-dir", required=True, help="where checkpoint-N is created")
    download.set_defaults(run=cmd_download)
    upload = commands.add_parser("upload", parents=[where], help="the newest committed local checkpoint")
    upload.add_argument("--output-dir", help="where its checkpoint-N folders are (default: the run dir's output)")
    upload.set_defaults(run=cmd_upload)
    prune = commands.add_parser("prune", parents=[where], help="delete all but the newest K")
    prune.add_argument("--keep", type=_positive, required=True)
    prune.set_defaults(run=cmd_prune)
    return top


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")  # the transfer summaries
    narrate = Narrator(out=sys.stderr)
    try:
        spec = spec_from_args(args)
        reachable(spec, narrate)
        with Progress(narrate, spec).said() as progress:
            return int(args.run(CheckpointStore(spec), args, progress))
    except SwiftSlurmError as err:
        return report(err)


if __name__ == "__main__":
    sys.exit(main())
