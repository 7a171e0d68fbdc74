"""Which node is a straggler: each node's own pace against the other nodes' (pure; no clock, no files).

Each node's local rank 0 publishes its pace (rundir/pace.py): the median forward seconds per training step of
its recent steps, on its own clock. Node 0's wrapper reads them every few seconds and feeds them here. A node is
slow while its pace is at least ``ratio`` times the median of the other nodes' (the others', not all nodes':
with two nodes the median of all would sit halfway to the slow one, and 1.5× would read as 1.2×). It is named a
straggler once it has stayed slow for ``sustain_s`` by the leader's clock, judged only on new evidence (a pace
of a step newer than the last one judged): a save or an evaluation holds no training forward and changes
nothing, and one slow step is one sample of a node's median. A named node is no longer named once it has been
judged at pace for ``sustain_s`` too: one noisy reading neither names a node nor clears one.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from swiftslurm.rundir.pace import Pace


@dataclass(frozen=True)
class StragglerLimits:
    """resilience.straggler_ratio and resilience.straggler_s."""

    ratio: float  # slow: at least this many times the other nodes' median pace
    sustain_s: float  # named once slow for this many seconds


@dataclass(frozen=True)
class Straggler:
    """A node named slow: how much slower than the others, since when (the leader's clock) and which step."""

    node: int
    host: str
    ratio: float  # its pace over the other nodes' median, as last judged
    since: float  # when the leader first saw it slow, without a judgement at pace since
    since_step: int  # its newest step then
    step: int  # its newest step judged

    def line(self) -> str:
        since = time.strftime("%H:%M:%S UTC", time.gmtime(self.since))  # a given time, formatted: no clock read
        return (
            f"node {self.node} ({self.host}) is a straggler: its training forwards take {self.ratio:.2f}× the "
            f"other nodes' median, since step {self.since_step} ({since})"
        )

    def as_dict(self) -> dict[str, Any]:
        return {
            "node": self.node,
            "host": self.host,
            "ratio": round(self.ratio, 3),
            "since": round(self.since, 3),
            "since_step": self.since_step,
            "step": self.step,
        }


def peer_median(node: int, paces: Mapping[int, Pace]) -> float | None:
    """The median pace of the nodes other than ``node`` (None when there are none)."""
    others = [pace.forward_s for other, pace in paces.items() if other != node]
    return statistics.median(others) if others else None


@dataclass
class StragglerWatch:
    """The leader's judgement over one trainer run. ``observe`` each time the nodes' paces are read."""

    limits: StragglerLimits
    hosts: Sequence[str]  # by node
    judged_step: dict[int, int] = field(default_factory=dict)  # node -> the newest step of it judged
    slow: dict[int, Straggler] = field(default_factory=dict)  # node not named yet -> since when it is slow
    named: dict[int, Straggler] = field(default_factory=dict)  # node -> its report, while it stands
    at_pace: dict[int, float] = field(default_factory=dict)  # named node -> since when it is read at pace

    def observe(self, paces: Mapping[int, Pace], now: float) -> list[str]:
        """Judge every node with new evidence; the lines for the log: nodes named, and nodes back at pace."""
        lines = []
        for node, pace in sorted(paces.items()):
            if pace.step <= self.judged_step.get(node, -1) or (median := peer_median(node, paces)) is None:
                continue
            self.judged_step[node] = pace.step
            if (line := self.judge(node, pace, pace.forward_s / median, now)) is not None:
                lines.append(line)
        return lines

    def judge(self, node: int, pace: Pace, ratio: float, now: float) -> str | None:
        if ratio < self.limits.ratio:
            return self.at_pace_reading(node, pace, ratio, now)
        self.at_pace.pop(node, None)
        if node in self.named:  # still slow: its report stays, with the newest ratio and step
            self.named[node] = replace(self.named[node], ratio=ratio, step=pace.step)
            return None
        host = self.hosts[node] if node < len(self.hosts) else f"node{node}"
        before = self.slow.get(node)
        since, since_step = (before.since, before.since_step) if before else (now, pace.step)
        self.slow[node] = Straggler(node, host, ratio, since, since_step, pace.step)
        if now - since < self.limits.sustain_s:
            return None
        self.named[node] = self.slow.pop(node)
        return self.named[node].line()

    def at_pace_reading(self, node: int, pace: Pace, ratio: float, now: float) -> str | None:
        """A reading below the ratio: the window to name the node starts over; a named node stays named until it
        has been at pace for ``sustain_s`` too (one noisy reading neither names nor clears)."""
        self.slow.pop(node, None)
        if node not in self.named or now - self.at_pace.setdefault(node, now) < self.limits.sustain_s:
            return None
        gone, _ = self.named.pop(node), self.at_pace.pop(node)
        return f"node {node} ({gone.host}) is at pace again ({ratio:.2f}× the others) at step {pace.step}"

    def stragglers(self) -> list[Straggler]:
        """The nodes named now, by node."""
        return [self.named[node] for node in sorted(self.named)]
