"""One family of errors a user can act on, and the one way a command prints them.

Every message names the value, the conflict and the fix (`... HINT: <fix>` at its end). Library code raises
these; only the entry points (`python -m swiftslurm`, its subcommands, `python -m swiftslurm.node`) print them,
with `report`, as one line `swiftslurm: error: <message>` without a traceback, and exit with the error's
status: 2 for a refusal. Anything else that escapes is a bug in swiftslurm, and keeps its traceback.
"""

from __future__ import annotations

import difflib
import sys
from collections.abc import Iterable
from typing import TextIO

USER_ERROR = 2  # exit status of a refusal: something the command was given must change
PREFIX = "swiftslurm: error: "


class SwiftSlurmError(Exception):
    """Base class: a problem the user can fix. ``str(err)`` is the whole message."""

    exit_status = USER_ERROR


class RunFailed(SwiftSlurmError):
    """A run the command waited for did not finish (its own output said why): exit status 1, not 2, since
    nothing the command was given is wrong."""

    exit_status = 1


def format_error(err: BaseException | str) -> str:
    """The line a command prints for ``err``: `swiftslurm: error: <message>`, the message's HINT at its end."""
    message = str(err).strip()
    return PREFIX + (message or type(err).__name__)


def report(err: BaseException | str, stream: TextIO | None = None) -> int:
    """Print ``format_error(err)`` on stderr in one write and return the exit status for it.

    One write: print() writes the text and its newline separately (stderr to a pipe is write-through), and
    `srun --unbuffered` forwards each write as it comes, so srun's own "srun: error: ..." could land between
    them, glued to this line."""
    out = sys.stderr if stream is None else stream
    out.write(format_error(err) + "\n")
    out.flush()
    return err.exit_status if isinstance(err, SwiftSlurmError) else USER_ERROR


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


class CommitFailed(SwiftSlurmError):
    """A training rank could not commit the checkpoint it saved last (hooks.Committer): raised when training
    ends, so the trainer exits non-zero instead of ending as if its result were committed."""

    exit_status = 1


class UnreadableJson(SwiftSlurmError):
    """A JSON file of a run dir that a caller cannot do without is missing, cut short, or not a JSON object."""


def did_you_mean(name: str, valid: Iterable[str]) -> str:
    """' Did you mean `x`?' for the closest valid name, or '' when nothing is close."""
    valid = list(valid)
    same_letters = [v for v in valid if v.lower() == name.lower()]
    close = same_letters or difflib.get_close_matches(name, valid, n=1, cutoff=0.6)
    return f" Did you mean `{close[0]}`?" if close else ""


def one_of(valid: Iterable[str]) -> str:
    """'Valid values are: a, b, c.' with the names sorted, for messages that list choices."""
    return "Valid values are: " + ", ".join(sorted(valid)) + "."


class StorageError(SwiftSlurmError):
    """The object store refused or failed an operation; the message says what to change."""
