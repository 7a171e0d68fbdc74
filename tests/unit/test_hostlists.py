"""Host lists as SLURM expands them (issue 27, item 8): the node takes `scontrol show hostnames`' answer (faked at
the SLURM seam, slurm.runner) and falls back to python-hostlist, saying so; the plan refuses host lists SLURM
refuses (cluster.exclude, cluster.sbatch.nodelist), each with a fix that is itself accepted.

AWKWARD holds what SLURM 22.05.8's `scontrol show hostnames` printed for each list on the local cluster;
tests/cluster/test_hostlists.py checks these answers against the real SLURM."""

from __future__ import annotations

import logging
import re
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import hostlist
import pytest

from swiftslurm import slurm
from swiftslurm.node import supervise
from swiftslurm.preflight import gather
from swiftslurm.slurm_env import SlurmEnv, expand_hostlist, hostlist_problem, repaired_hostlist, slurm_hostnames
from tests.unit import test_bad_inputs as corpus


def _hosts(text: str) -> list[str]:
    return text.split()


# (host list, SLURM's expansion, how python-hostlist as swiftslurm called it before (duplicates dropped) differs:
# "" where it agrees). Node i of a job is SLURM's i-th host: a different order blames the wrong host.
AWKWARD: list[tuple[str, list[str], str]] = [
    ("node1,node3", _hosts("node1 node3"), ""),
    ("node[01-03,7]", _hosts("node01 node02 node03 node7"), ""),
    ("n[001-010]", [f"n{i:03d}" for i in range(1, 11)], ""),
    ("node[9-11]", _hosts("node9 node10 node11"), ""),
    ("node[001-3]", _hosts("node001 node002 node003"), ""),
    ("node[1-03]", _hosts("node1 node2 node3"), ""),
    ("node[3,1,2]", _hosts("node3 node1 node2"), ""),
    ("node2,node1", _hosts("node2 node1"), ""),
    ("gpu-a[1-2]-b[3-4]", _hosts("gpu-a1-b3 gpu-a1-b4 gpu-a2-b3 gpu-a2-b4"), ""),
    ("rack1-node[1-2]", _hosts("rack1-node1 rack1-node2"), ""),
    ("node[1-2]-[3-4]", _hosts("node1-3 node1-4 node2-3 node2-4"), ""),
    ("node1,,node2", _hosts("node1 node2"), ""),
    ("a[1-2]b[3-4]c[5-6]", _hosts("a1b3c5 a1b3c6 a2b3c5 a2b3c6 a1b4c5 a1b4c6 a2b4c5 a2b4c6"), "order"),
    (
        "n[1-2]m[1-2]o[1-2]p[1-2]",
        _hosts(
            "n1m1o1p1 n1m1o1p2 n2m1o1p1 n2m1o1p2 n1m2o1p1 n1m2o1p2 n2m2o1p1 n2m2o1p2 "
            "n1m1o2p1 n1m1o2p2 n2m1o2p1 n2m1o2p2 n1m2o2p1 n1m2o2p2 n2m2o2p1 n2m2o2p2"
        ),
        "order",
    ),
    ("node[1-3,2]", _hosts("node1 node2 node3 node2"), "duplicates"),
    ("node1,node1", _hosts("node1 node1"), "duplicates"),
    ("n[1-3],n2", _hosts("n1 n2 n3 n2"), "duplicates"),
    ("node[1-2,2-3]", _hosts("node1 node2 node2 node3"), "duplicates"),
    ("node1 node2", _hosts("node1 node2"), "spaces"),
    ("node1, node2", _hosts("node1 node2"), "spaces"),
]
# What the fallback (python-hostlist with duplicates kept) still gets wrong: the order of three or more bracket
# groups, and spaces (SLURM_JOB_NODELIST never has one).
FALLBACK_DIFFERS = ("order", "spaces")


def srun_env(nodelist: str, node: int = 0) -> dict[str, str]:
    nodes = str(len(dict.fromkeys(s for s in nodelist.split(",") if s)))  # not read by the expansion
    return {"SLURM_JOB_ID": "77", "SLURM_JOB_NODELIST": nodelist, "SLURM_JOB_NUM_NODES": nodes,
            "SLURM_NODEID": str(node), "SLURM_PROCID": str(node), "SLURM_NTASKS": nodes}  # fmt: skip


class FakeScontrol:
    """`scontrol show hostnames` answering as SLURM 22.05.8 did (AWKWARD), or with ``answer``; the calls kept."""

    def __init__(self, answer: slurm.Answer | Exception | None = None) -> None:
        self.answer = answer
        self.calls: list[tuple[list[str], float]] = []

    def __call__(self, argv: Sequence[str], timeout_s: float) -> slurm.Answer:
        self.calls.append((list(argv), timeout_s))
        if isinstance(self.answer, Exception):
            raise self.answer
        if self.answer is not None:
            return self.answer
        assert list(argv[:3]) == ["scontrol", "show", "hostnames"], argv
        known = {text: hosts for text, hosts, _ in AWKWARD}
        return slurm.Answer(0, "".join(f"{host}\n" for host in known[argv[3]]))


@pytest.fixture
def scontrol(monkeypatch: pytest.MonkeyPatch) -> FakeScontrol:
    fake = FakeScontrol()
    monkeypatch.setattr(slurm, "runner", fake)
    return fake


@pytest.fixture
def node_log(caplog: pytest.LogCaptureFixture) -> Iterator[pytest.LogCaptureFixture]:
    """The warnings slurm_env logs (caught here directly: the node's wrapper stops the "swiftslurm" logger's
    propagation once it has run in this process)."""
    logger = logging.getLogger("swiftslurm.slurm_env")
    logger.addHandler(caplog.handler)
    try:
        yield caplog
    finally:
        logger.removeHandler(caplog.handler)


# --- the node: SLURM's expansion, python-hostlist as the fallback ----------------------------------------------------


@pytest.mark.parametrize(("nodelist", "expected", "differs"), AWKWARD, ids=[row[0] for row in AWKWARD])
def test_the_node_takes_slurms_order_and_duplicates(
    nodelist: str, expected: list[str], differs: str, scontrol: FakeScontrol
) -> None:
    where = SlurmEnv.from_environ(srun_env(nodelist), slurm_hostnames)
    assert where.hosts == tuple(expected)
    [(argv, timeout_s)] = scontrol.calls  # asked once, briefly: the node has a fallback
    assert argv == ["scontrol", "show", "hostnames", nodelist] and timeout_s <= 10
    assert (hostlist.expand_hostlist(nodelist) != expected) == bool(differs), "the recorded difference is stale"
    assert (expand_hostlist(nodelist) != expected) == (differs in FALLBACK_DIFFERS)


class Reached(Exception):
    """Raised where a test has seen what it came for."""


def test_the_wrapper_and_preflight_number_the_nodes_in_slurms_order(
    scontrol: FakeScontrol, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Node i is SLURM's i-th host in the wrapper (blame, MASTER_ADDR) and in preflight: python-hostlist orders
    three bracket groups otherwise, so node 2 of a[1-2]b[3-4]c[5-6] is a2b3c5 to SLURM, a1b4c5 to it."""
    nodelist = "a[1-2]b[3-4]c[5-6]"
    for key, value in srun_env(nodelist, node=2).items():
        monkeypatch.setenv(key, value)
    seen: list[SlurmEnv] = []

    def capture(where: SlurmEnv, *args: Any, **kwargs: Any) -> None:
        seen.append(where)
        raise Reached

    monkeypatch.setattr(supervise, "_log_to_stdout", lambda: None)
    monkeypatch.setattr(supervise, "load_plan", lambda run_dir: None)
    monkeypatch.setattr(supervise.attempt, "run", lambda run_dir, plan, where, signals: capture(where))
    monkeypatch.setattr(gather, "context", lambda run_dir, where, *rest: capture(where))
    with pytest.raises(Reached):
        supervise.run_node(str(tmp_path), signals=supervise.SignalLog())
    with pytest.raises(Reached):
        gather.main([str(tmp_path)])
    for where in seen:
        assert where.hosts[where.node_id] == "a2b3c5"
        assert where.hosts[0] == "a1b3c5"


@pytest.mark.parametrize(
    "answer",
    [
        slurm.Answer(0, "", "scontrol: error: _parse_single_range: Invalid range: `5-3'\nInvalid hostlist: x"),
        slurm.Answer(1, "", "scontrol: fatal: Could not establish a configuration source"),
        TimeoutError("scontrol did not answer within 10 s"),
        PermissionError(13, "Permission denied", "scontrol"),
    ],
    ids=["refused-exit-0", "fails", "hangs", "not-executable"],
)
def test_when_scontrol_fails_the_node_falls_back_to_python_hostlist_and_says_so(
    answer: slurm.Answer | Exception, monkeypatch: pytest.MonkeyPatch, node_log: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(slurm, "runner", FakeScontrol(answer))
    assert slurm_hostnames("node[1-3,2]") == ["node1", "node2", "node3", "node2"]
    assert "python-hostlist, not by SLURM" in node_log.text


def test_without_scontrol_the_node_falls_back_and_says_so(node_log: pytest.LogCaptureFixture) -> None:
    """The unit tier's default runner: no SLURM command on PATH (tests/unit/conftest.py)."""
    where = SlurmEnv.from_environ(srun_env("gpu[07-08]"), slurm_hostnames)
    assert where.hosts == ("gpu07", "gpu08")
    assert "hosts of gpu[07-08] expanded by python-hostlist" in node_log.text and "'scontrol'" in node_log.text


def test_from_environ_starts_no_process_by_default(scontrol: FakeScontrol) -> None:
    """The dry run's example allocation and the tests build SlurmEnv from a Mapping alone."""
    assert SlurmEnv.from_environ(srun_env("a[1-2]b[3-4]c[5-6]")).hosts[2] == "a1b4c5"  # python-hostlist's order
    assert scontrol.calls == []


# --- the plan: SLURM's grammar, without SLURM -------------------------------------------------------------------------


# (host list, why SLURM refuses it): tests/cluster/test_hostlists.py shows SLURM 22.05 refusing or misreading each.
REFUSED: list[tuple[str, str]] = [
    ("node[5-3]", "runs backwards"),
    ("n[10-8]", "runs backwards"),
    ("node[1-3", "never closed"),
    ("node1-3]", "closes no"),
    ("node[1-2]]", "closes no"),
    ("node[[1-2]]", "nest"),
    ("node 1", "space"),
    ("node1, node2", "space"),
    (" node1", "space"),
    ("node[ 1-3]", "space"),  # SLURM reads this as node01..node03
    ("node[]", "empty entry"),
    ("node[,1]", "empty entry"),
    ("node[1,,2]", "empty entry"),
    ("node[1-]", "`1-` is not a number"),  # SLURM reads this as node1
    ("node[-3]", "`-3` is not a number"),
    ("node[1--3]", "not a number"),
    ("node[a-c]", "not a number"),
    ("node[1-3:2]", "not a number"),
    ("node[0x1-3]", "not a number"),
    ("node[1-2]x", "after its last bracket group (`x`)"),
    ("node[1-2].ib", "after its last bracket group"),
    ("a.b[1-2].c", "after its last bracket group"),
    ("x[1-2]y[1-2]z", "after its last bracket group"),
    ("n[0-65536]", "more than 65536"),
    ("", "names no host"),
]


@pytest.mark.parametrize(("text", "problem"), REFUSED)
def test_slurm_refuses_these_host_lists(text: str, problem: str) -> None:
    assert problem in (hostlist_problem(text) or "")


# Unusual host lists SLURM takes (the awkward ones without spaces, and more).
TAKEN = [*(row[0] for row in AWKWARD if row[2] != "spaces"), "[1-3]", "node,", ",node", "n[1-65536]", "n[007]",
         "node[1-1]", "node[1-2]x[1-2]", "host-1.cluster.local"]  # fmt: skip


@pytest.mark.parametrize("text", TAKEN)
def test_slurm_takes_these_host_lists(text: str) -> None:
    assert hostlist_problem(text) is None


@pytest.mark.parametrize(
    ("text", "fix"),
    [
        ("node[5-3]", "node[3-5]"),
        ("n[010-008],m1", "n[008-010],m1"),
        ("node[1-3", "node[1-3]"),
        ("node1 node2", "node1,node2"),
        ("node1, node2", "node1,node2"),
        ("node[ 1-3]", "node[1-3]"),
        ("node[1,,2]", "node[1,2]"),
        ("node[1-2].ib", "node1.ib,node2.ib"),
        ("node[1-3]-ib,node9", "node1-ib,node2-ib,node3-ib,node9"),
        ("node[]", None),
        ("node[1-]", None),
        ("node1-3]", None),
        ("node[[1-2]]", None),
        ("n[1-100]-ib", None),  # too many hosts to spell out
    ],
)
def test_a_repair_is_offered_only_where_slurm_takes_it(text: str, fix: str | None) -> None:
    assert repaired_hostlist(text) == fix
    assert fix is None or hostlist_problem(fix) is None


HOST_LIST_CASES = [case for case in corpus.CORPUS["refused"] if case["category"] == "27.8 host list"]
_SUGGESTED = re.compile(r"'(cluster\.[\w.]+=\"[^\"]*\")'")


@pytest.mark.parametrize("case", HOST_LIST_CASES, ids=corpus.case_id)
def test_the_fix_a_refused_host_list_names_is_itself_accepted(
    case: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("SWIFTSLURM_RUNS", str(tmp_path / "runs"))
    argv = corpus.prepare(case, tmp_path, monkeypatch)
    code, output = corpus.run_in_process(argv, capsys, monkeypatch)
    assert code == 2, output
    suggested = _SUGGESTED.findall(output.split("HINT:", 1)[1])
    assert suggested, f"the hint names no override to paste:\n{output}"
    field = suggested[0].split("=", 1)[0]
    fixed = [suggested[0] if arg.startswith(f"{field}=") else arg for arg in argv]
    code, output = corpus.run_in_process(fixed, capsys, monkeypatch)
    assert code == 0, output
