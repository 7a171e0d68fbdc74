"""Where a run's checkpoints live in object storage: the plan's `storage` section, without credentials.

Pure data (no boto3): the login side validates and plans it; swiftslurm.storage.store acts on it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

from swiftslurm.errors import SwiftSlurmError, one_of

BACKGROUND_PRIORITIES = ("idle", "normal")  # of uploads during training: swiftslurm.storage.priority


class StorageError(SwiftSlurmError):
    """The object store refused or failed an operation; the message says what to change."""


@dataclass(frozen=True)
class StorageSpec:
    """Where a run's checkpoints live remotely and how they travel. Holds no credentials (see the module doc)."""

    bucket: str
    prefix: str  # the run's remote folder, e.g. "runs/<run_name>"; "" is the bucket's root
    endpoint_url: str | None = None  # None: AWS S3; else an S3-compatible endpoint, e.g. "http://10.0.0.5:8333"
    region: str | None = None  # None: boto3's default (AWS_REGION, the profile)
    addressing_style: str = "auto"  # "auto" | "path" | "virtual"; most self-hosted stores want "path"
    keep: int = 0  # newest K committed checkpoints kept remotely; 0 keeps all; the newest is never deleted
    part_size_mb: int = 16  # multipart part size, MiB: 8-16 MiB parts survive a proxy resetting 20% of requests
    max_attempts: int = 10  # attempts per request, the first included (boto3 retries)
    retry_mode: str = "standard"  # boto3 retry mode: "standard" | "adaptive" (adds client-side rate limiting)
    max_concurrency: int = 8  # parts and files in flight at once
    wait_at_exit_s: float = 300.0  # how long the end of an attempt waits for pending uploads, s
    background_priority: str = "idle"  # uploads during training: "idle" (CPU and disk time training leaves) | "normal"
    timeout_s: float = 60.0  # connect and read timeout of one request, s: a stalled request is retried after it

    def __post_init__(self) -> None:
        if not self.bucket:
            raise StorageError("storage.bucket is empty. HINT: set `storage.bucket=<bucket name>`.")
        choices = {
            "addressing_style": ("auto", "path", "virtual"),
            "retry_mode": ("standard", "adaptive"),
            "background_priority": BACKGROUND_PRIORITIES,
        }
        for name, valid in choices.items():
            if getattr(self, name) not in valid:
                raise StorageError(f"storage.{name}={getattr(self, name)!r} is not valid. {one_of(valid)}")
        if self.part_size_mb < 5:
            raise StorageError(f"storage.part_size_mb={self.part_size_mb}: S3 parts are at least 5 MiB; use 8-16.")
        for name in ("keep", "max_attempts", "max_concurrency"):
            if getattr(self, name) < (0 if name == "keep" else 1):
                raise StorageError(f"storage.{name}={getattr(self, name)} is out of range.")

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> StorageSpec:
        """From plan.json's `storage` section. Keys this version does not know are ignored (a newer plan)."""
        known = {f.name for f in fields(cls)}
        missing = {"bucket", "prefix"} - {name for name, value in data.items() if value is not None}
        if missing:
            raise StorageError(f"storage is missing {', '.join(sorted(missing))}. HINT: set storage.bucket/prefix.")
        return cls(**{k: v for k, v in data.items() if k in known})

    @property
    def root(self) -> str:
        """The prefix as a key folder: '' or 'runs/x/'."""
        stripped = self.prefix.strip("/")
        return f"{stripped}/" if stripped else ""

    @property
    def url(self) -> str:
        where = f" at {self.endpoint_url}" if self.endpoint_url else ""
        return f"s3://{self.bucket}/{self.root}{where}"
