"""Checkpoint upload through a hostile network: a real SeaweedFS behind a proxy that resets 20% of requests,
stalls some past the client's timeout and answers bursts of 503 Slow Down, while "training" keeps committing.

What must hold: at every moment sampled, each remote checkpoint that has a manifest is complete; in the end
every checkpoint is uploaded, `drain` reports nothing pending, and a download (through the same proxy)
gives back the same bytes.
"""

from __future__ import annotations

import os
import random
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from swiftslurm.ckpt.checkpoint import MANIFEST, commit, problems, read_manifest
from swiftslurm.plan import StorageSpec
from swiftslurm.rundir.beat import read_leader_beat as read_beat
from swiftslurm.storage.store import CheckpointStore
from swiftslurm.storage.sync import restore
from swiftslurm.storage.uploader import Uploader
from swiftslurm.testing.cluster import wait_until
from swiftslurm.testing.s3 import FaultProxy, Faults, Sampler, SeaweedServer, published_and_incomplete

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("s3_credentials")]

MiB = 1 << 20
BUCKET = "swiftslurm-faults"
STEPS = (100, 200, 300, 400, 500)
SEED = int(os.environ.get("SWIFTSLURM_FAULT_SEED", "7"))  # another seed, another sequence of faults
HOSTILE = Faults(reset_rate=0.2, stall_rate=0.03, stall_s=6.0, error_rate=0.02, error_burst=4, seed=SEED)


@pytest.fixture
def proxy(s3_server: SeaweedServer) -> Iterator[FaultProxy]:
    with FaultProxy(s3_server.endpoint_url, HOSTILE, host=s3_server.host, lifetime_s=300) as running:
        yield running


def write_checkpoint(output_dir: Path, step: int, rng: random.Random) -> Path:
    """checkpoint-N shaped like a small model's: a few 20-40 MiB files and many small ones, committed."""
    folder = output_dir / f"checkpoint-{step}"
    (folder / "global_step").mkdir(parents=True)
    for name in ("model-00001.safetensors", "global_step/optim_states.pt"):
        (folder / name).write_bytes(rng.randbytes(rng.randrange(20 * MiB, 40 * MiB)))
    for i in range(40):
        (folder / f"meta_{i}.json").write_bytes(rng.randbytes(rng.randrange(0, 8192)))
    commit(folder, world_size=1, swift_version="test")
    return folder


def test_uploads_survive_resets_stalls_and_throttling(
    s3_server: SeaweedServer, proxy: FaultProxy, tmp_path: Path
) -> None:
    spec = StorageSpec(
        bucket=BUCKET,
        prefix="runs/hostile",
        endpoint_url=proxy.url,
        region="us-east-1",
        addressing_style="path",
        part_size_mb=8,
        max_attempts=10,
        timeout_s=4,  # a stalled request (6 s) times out and is retried
    )
    store = CheckpointStore(spec)
    sampler = Sampler(s3_server.client(), BUCKET, spec.root)
    sampler.start()
    uploader = Uploader(store)
    rng = random.Random(1)
    started = time.monotonic()
    for step in STEPS:  # "training": commits keep coming while earlier ones upload
        uploader.submit(write_checkpoint(tmp_path / "output", step, rng))
        time.sleep(0.5)
    not_uploaded = uploader.drain(timeout_s=240)
    took = time.monotonic() - started
    sampler.stop.set()
    sampler.join()

    assert not_uploaded == []
    assert store.committed_steps() == list(STEPS)
    assert sampler.violations == []
    assert len(sampler.seen_published) >= len(STEPS) - 1  # it watched them appear (the last may beat it)
    assert published_and_incomplete(s3_server.client(), BUCKET, spec.root) == (
        {store.key(s, MANIFEST) for s in STEPS},
        [],
    )
    assert proxy.injected["reset"] > 10 and proxy.injected["503"] > 0 and proxy.injected["stall"] > 0, proxy.injected
    restored = store.download(STEPS[-1], tmp_path / "restored")
    assert problems(restored, deep=True) == []
    assert read_manifest(restored) == read_manifest(tmp_path / "output" / f"checkpoint-{STEPS[-1]}")
    print(f"\n{len(STEPS)} checkpoints uploaded in {took:.1f} s, faults {dict(proxy.injected)} (seed {SEED})")


RESTORE = """
import sys
from pathlib import Path
from swiftslurm.node.heartbeat import LeaderBeat
from swiftslurm.storage.sync import restore
from swiftslurm.plan import StorageSpec

spec = StorageSpec(bucket=sys.argv[1], prefix=sys.argv[2], endpoint_url=sys.argv[3], region="us-east-1",
                   addressing_style="path", max_attempts=10, timeout_s=4)
with LeaderBeat(Path(sys.argv[5])).running() as beat:  # as node 0 does while it agrees on the resume point
    restore(spec, Path(sys.argv[4]), beat)
"""


def is_ranged_get(head: bytes) -> bool:
    """A download's request for a checkpoint file's bytes (the listing and the manifest are plain GETs)."""
    return head.startswith(b"GET ") and b"\r\nrange:" in head.lower()


def test_a_restore_killed_mid_download_leaves_staging_that_the_next_restore_removes(
    s3_server: SeaweedServer, tmp_path: Path
) -> None:
    """Node 0 killed while it restores (SLURM's kill, an OOM) leaves `.checkpoint-N.download-*`; the next
    attempt's restore deletes it before downloading. The download is held back by the proxy, so the kill lands
    mid-download on any machine."""
    spec = StorageSpec(
        bucket=BUCKET,
        prefix="runs/killed",
        endpoint_url=s3_server.endpoint_url,
        region="us-east-1",
        addressing_style="path",
    )
    uploaded = write_checkpoint(tmp_path / "cluster-a", 100, random.Random(3))
    CheckpointStore(spec).upload(uploaded)
    output, beat = tmp_path / "cluster-b" / "output", tmp_path / "cluster-b" / "leader.json"
    with FaultProxy(s3_server.endpoint_url, Faults(), host=s3_server.host, lifetime_s=300) as proxy:
        proxy.refuse = is_ranged_get
        argv = [sys.executable, "-c", RESTORE, BUCKET, spec.prefix, proxy.url, str(output), str(beat)]
        leader = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            wait_until(
                lambda: "downloading checkpoint-100" in (read_beat(beat) or {}).get("doing", ""), 60, "the download"
            )
            staging = list(output.glob(".checkpoint-100.download-*"))
            assert len(staging) == 1 and leader.poll() is None
        finally:
            leader.kill()
            leader.wait()
    assert staging[0].is_dir()  # what a killed restore leaves

    restored = restore(spec, output)
    assert restored == output / "checkpoint-100" and sorted(p.name for p in output.iterdir()) == ["checkpoint-100"]
    assert problems(restored, deep=True) == []
