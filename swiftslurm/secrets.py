"""Secrets never enter a run directory: the config is refused before anything is written, argv is redacted in logs.

A run directory (plan.json, config.yaml, job.sbatch, node logs) is read by people and by tools and is often on a
shared filesystem, so a credential written there is a credential leaked. Credentials reach the nodes by the
environment instead: SLURM passes the submitting shell's environment on (`sbatch --export=ALL`, its default), and
boto3, wandb, swanlab and the hubs read their own variables there.

Pure functions (only `re`): the login side checks the composed config, the node side redacts the trainer's argv.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

# Names whose value is a credential: WANDB_API_KEY, HF_TOKEN, AWS_SECRET_ACCESS_KEY, hub_token, swanlab_secret, ...
# A token only as the last word: `max_new_tokens`, `moe_token_dispatcher_type` and TOKENIZERS_PARALLELISM are not.
SECRET_NAME = re.compile(
    r"(API_?KEY|ACCESS_KEY|PRIVATE_KEY|SECRET|PASSWORD|PASSWD|CREDENTIAL|(^|_)TOKEN$)", re.IGNORECASE
)
# ...unless it names where a credential is kept: AWS_SHARED_CREDENTIALS_FILE, HF_TOKEN_PATH.
NOT_SECRET_NAME = re.compile(r"_(FILE|PATH|DIR|HOME)$", re.IGNORECASE)
# `scheme://user:password@host` or `scheme://token@host`: credentials inside a URL.
URL_CREDENTIALS = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*://)[^/\s@]+@")
# `export NAME=value` (or `NAME=value`) in a shell line of cluster.setup.
SHELL_ASSIGNMENT = re.compile(r"(?:^|[\s;&|])(?:export\s+)?([A-Za-z_][A-Za-z0-9_]*)=\S")
REDACTED = "***"

_ENV_HINT = (
    "HINT: export it in the shell you submit from (SLURM passes that environment on to every node) or use the "
    "service's credential file; never put it in the config."
)
_STORAGE_HINT = (
    "HINT: remove the credentials from the URL; the store's come from boto3's chain (AWS_ACCESS_KEY_ID and "
    "AWS_SECRET_ACCESS_KEY exported in the submitting shell, AWS_PROFILE, or an instance role)."
)


def is_secret_name(name: str) -> bool:
    return bool(SECRET_NAME.search(name)) and not NOT_SECRET_NAME.search(name)


def _is_path(value: Any) -> bool:
    """A file holding the credential (GOOGLE_APPLICATION_CREDENTIALS=/path/key.json) is fine to name."""
    return isinstance(value, str) and value.startswith(("/", "~/"))


def _walk(value: Any, path: str) -> Iterator[tuple[str, Any]]:
    """(dotted path, leaf value) for every leaf of nested mappings and lists."""
    if isinstance(value, Mapping):
        for key, item in value.items():
            yield from _walk(item, f"{path}.{key}" if path else str(key))
    elif isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            yield from _walk(item, f"{path}[{i}]")
    else:
        yield path, value


def find_secret(config: Mapping[str, Any]) -> str | None:
    """The first place in ``config`` (a plain nested mapping) that holds a credential, as a one-line message
    naming the field and the fix; None when there is none. The value itself is never part of the message."""
    for path, value in _walk(config, ""):
        name = re.split(r"[.\[]", path.rsplit(".", 1)[-1])[0]
        if is_secret_name(name) and value not in (None, "") and not _is_path(value):
            return f"{path} is a credential: plan.json and config.yaml would hold it in clear text. {_ENV_HINT}"
        if not isinstance(value, str):
            continue
        if URL_CREDENTIALS.search(value):
            hint = _STORAGE_HINT if path.startswith("storage.") else _ENV_HINT
            return f"{path} holds a URL with credentials (user:password@ or token@). {hint}"
        assigned = [m.group(1) for m in SHELL_ASSIGNMENT.finditer(value) if is_secret_name(m.group(1))]
        if path.startswith("cluster.setup") and assigned:
            return f"{path} sets {assigned[0]}: job.sbatch and plan.json would hold it in clear text. {_ENV_HINT}"
    return None


def redact_argv(argv: Sequence[str]) -> list[str]:
    """``argv`` fit for a log: the values of credential options (`--hub_token X`, `--swanlab_secret=X`) and any
    credentials inside URLs become ***. Everything else is kept as it is."""
    redacted: list[str] = []
    secret_values = False  # inside the values of a credential option, up to the next option
    for arg in argv:
        if arg.startswith("--"):
            name, eq, _ = arg[2:].partition("=")
            secret_values = is_secret_name(name)
            redacted.append(f"--{name}={REDACTED}" if eq and secret_values else URL_CREDENTIALS.sub(_keep_scheme, arg))
        elif secret_values:
            redacted.append(REDACTED)
        else:
            redacted.append(URL_CREDENTIALS.sub(_keep_scheme, arg))
    return redacted


def _keep_scheme(match: re.Match[str]) -> str:
    return f"{match.group(1)}{REDACTED}@"
