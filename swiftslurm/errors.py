"""One family of errors a user can act on. Every message names the value, the conflict and the fix.

The command line prints these without a traceback and exits with status 2; anything else that escapes
is a bug in swiftslurm, and keeps its traceback.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable


class SwiftSlurmError(Exception):
    """Base class: a problem the user can fix. ``str(err)`` is the whole message."""


class ConfigError(SwiftSlurmError):
    """The composed configuration is invalid (found before anything is submitted)."""


class SubmitError(SwiftSlurmError):
    """SLURM (or the local executor) refused the job, or the cluster does not match the plan."""


class SlurmError(SubmitError):
    """A SLURM command failed (swiftslurm/slurm.py): ``argv`` is the command, ``said`` what SLURM answered,
    ``tries`` how often it was asked."""

    def __init__(self, message: str, argv: tuple[str, ...] = (), said: str = "", tries: int = 1) -> None:
        super().__init__(message)
        self.argv, self.said, self.tries = argv, said, tries


class JobGone(SlurmError):
    """SLURM's controller does not know the job: it ended and was purged, or it never existed (job ids restart
    on a wiped cluster)."""


class SlurmUnavailable(SlurmError):
    """SLURM's controller did not answer (or answered that it was busy) on every try of the retry policy."""


class NodeError(SwiftSlurmError):
    """The on-node wrapper cannot run: the allocation or run directory does not match the plan."""


def did_you_mean(name: str, valid: Iterable[str]) -> str:
    """' Did you mean `x`?' for the closest valid name, or '' when nothing is close."""
    close = difflib.get_close_matches(name, list(valid), n=1, cutoff=0.6)
    return f" Did you mean `{close[0]}`?" if close else ""


def one_of(valid: Iterable[str]) -> str:
    """'Valid values are: a, b, c.' with the names sorted, for messages that list choices."""
    return "Valid values are: " + ", ".join(sorted(valid)) + "."


class StorageError(SwiftSlurmError):
    """The object store refused or failed an operation; the message says what to change."""
