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


class NodeError(SwiftSlurmError):
    """The on-node wrapper cannot run: the allocation or run directory does not match the plan."""


class UnreadableJson(SwiftSlurmError):
    """A JSON file of a run dir that a caller cannot do without is missing, cut short, or not a JSON object."""


def did_you_mean(name: str, valid: Iterable[str]) -> str:
    """' Did you mean `x`?' for the closest valid name, or '' when nothing is close."""
    close = difflib.get_close_matches(name, list(valid), n=1, cutoff=0.6)
    return f" Did you mean `{close[0]}`?" if close else ""


def one_of(valid: Iterable[str]) -> str:
    """'Valid values are: a, b, c.' with the names sorted, for messages that list choices."""
    return "Valid values are: " + ", ".join(sorted(valid)) + "."


class StorageError(SwiftSlurmError):
    """The object store refused or failed an operation; the message says what to change."""
