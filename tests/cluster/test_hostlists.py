"""Host lists as the real SLURM expands them (issue 27, item 8): `scontrol show hostnames` on the local cluster
against the answers tests/unit/test_hostlists.py records, swiftslurm's node-side expansion against scontrol, and
the plan's host-list grammar against what SLURM refuses. scontrol only parses: no job is submitted (seconds)."""

from __future__ import annotations

import subprocess

import hostlist
import pytest

from swiftslurm.slurm_env import SlurmEnv, expand_hostlist, hostlist_problem, slurm_hostnames
from tests.unit.test_hostlists import AWKWARD, FALLBACK_DIFFERS, REFUSED, TAKEN, srun_env

pytestmark = [pytest.mark.slurm]

# Lists swiftslurm refuses that SLURM 22.05 does not refuse but reads as something nobody meant (the others of
# REFUSED it refuses: "Invalid hostlist" on stderr, nothing on stdout, exit status 0 all the same).
MISREAD = {
    "node[1-3": ["node]"],
    "node1-3]": ["node1-3]"],
    "node[1-]": ["node1"],
    "node 1": ["node", "1"],
    "node1, node2": ["node1", "node2"],
    " node1": ["node1"],
    "node[ 1-3]": ["node01", "node02", "node03"],
}


def scontrol_hostnames(text: str) -> tuple[list[str], str]:
    """What the real `scontrol show hostnames TEXT` prints (its hosts) and says on stderr, asked directly."""
    done = subprocess.run(["scontrol", "show", "hostnames", text], capture_output=True, text=True, timeout=30)
    assert done.returncode == 0 or not done.stdout, done
    return done.stdout.split(), done.stderr


def test_slurm_expands_the_awkward_lists_as_recorded_and_the_node_takes_its_answer(slurm_cluster: None) -> None:
    """Every list of AWKWARD (spaces, duplicates, three and four bracket groups, padding, descending and
    overlapping ranges): SLURM's answer is the recorded one, the node's expansion is SLURM's, and python-hostlist
    alone differs exactly where the table says (order: 3+ groups; duplicates; spaces)."""
    for nodelist, recorded, differs in AWKWARD:
        hosts, said = scontrol_hostnames(nodelist)
        assert (hosts, said) == (recorded, ""), nodelist
        assert SlurmEnv.from_environ(srun_env(nodelist), slurm_hostnames).hosts == tuple(hosts), nodelist
        assert (hostlist.expand_hostlist(nodelist) != hosts) == bool(differs), nodelist
        assert (expand_hostlist(nodelist) != hosts) == (differs in FALLBACK_DIFFERS), nodelist
    assert {differs for _, _, differs in AWKWARD} == {"", "order", "duplicates", "spaces"}


def test_the_plan_refuses_what_slurm_refuses_or_misreads(slurm_cluster: None) -> None:
    for text, _ in REFUSED:
        hosts, said = scontrol_hostnames(text)
        assert hostlist_problem(text) is not None, text
        if text in MISREAD:
            assert hosts == MISREAD[text], text
        else:
            assert hosts == [] and ("Invalid hostlist" in said or not text), (text, said)


def test_the_plan_takes_what_slurm_takes(slurm_cluster: None) -> None:
    for text in TAKEN:
        hosts, said = scontrol_hostnames(text)
        assert hosts and said == "", (text, said)
        assert hostlist_problem(text) is None, text
