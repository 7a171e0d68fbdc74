"""The soak's caching shared filesystem (swiftslurm.testing.cachefs via testing.cluster.caching_views) does what
it stands for, on the local cluster's nodes: a file one node creates is missing from another node's listing
until that node's cached listing expires, while the node that wrote it, and the host, see it at once."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from swiftslurm.testing.cluster import caching_views, node_names, on_node, wait_until

pytestmark = [pytest.mark.slurm]
TTL_S = 4.0


def listing(node: str, folder: Path) -> list[str]:
    done = on_node(node, "ls", "-1", str(folder), stdout=subprocess.PIPE)
    out, _ = done.communicate(timeout=30)
    return out.decode().split()


def test_another_nodes_listing_is_stale_until_its_cache_expires(tmp_path: Path, slurm_cluster: None) -> None:
    backing, first, second = tmp_path / "backing", *node_names()[:2]
    backing.mkdir()
    with caching_views(backing, tmp_path / "view", TTL_S) as view:
        assert listing(second, view) == []  # the second node has read the (empty) listing: now cached
        assert on_node(first, "touch", str(view / "shard-1")).wait(timeout=30) == 0
        assert listing(first, view) == ["shard-1"]  # the writer sees its own change
        assert (backing / "shard-1").is_file() and (view / "shard-1").is_file()  # so do the store and the host
        assert listing(second, view) == []  # the other node does not, yet
        wait_until(lambda: listing(second, view) == ["shard-1"], 10 * TTL_S, "the listing to expire", poll_s=0.5)
