"""What S3 accepts as a bucket name, an endpoint and a key prefix, checked before anything is submitted.

Pure functions of the configured strings: each returns None when the value is one the store reads as meant, or
one line naming the setting, what is wrong and a fix that itself passes. The planner raises them as ConfigError.
"""

from __future__ import annotations

import ipaddress
import re
from urllib.parse import urlsplit

# AWS's rules for general-purpose buckets (MinIO, Ceph RGW and SeaweedFS enforce the same): 3-63 lowercase
# letters, digits, dots and hyphens, a letter or digit at each end, no `..`, not an IPv4 address.
_BUCKET = re.compile(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")
# Names AWS reserves for its own access points, aliases and directory buckets.
_RESERVED_STARTS = ("xn--", "sthree-", "amzn-s3-demo-")
_RESERVED_ENDS = ("-s3alias", "--ol-s3", ".mrap", "--x-s3", "--table-s3")
EXAMPLE_BUCKET = "my-checkpoints"


def bucket_refusal(bucket: str) -> str | None:
    """Why ``bucket`` cannot be an S3 bucket's name, or None."""
    if "/" in bucket or ":" in bucket:
        name, _, prefix = bucket.split("://", 1)[-1].partition("/")
        fix = f"storage.bucket={name if _bucket_ok(name) else EXAMPLE_BUCKET}"
        fix += f" storage.prefix={prefix.strip('/')}" if prefix.strip("/") else " (a key prefix goes in storage.prefix)"
        return (
            f"storage.bucket={bucket!r} is not a bucket name. HINT: give the name only and the key prefix apart: "
            f"{fix}; the server's URL goes in storage.endpoint_url."
        )
    if _bucket_ok(bucket):
        return None
    guess = re.sub(r"[^a-z0-9.-]+", "-", bucket.lower()).strip(".-")
    guess = re.sub(r"\.{2,}", ".", guess)
    fix = (
        f"storage.bucket={guess}"
        if _bucket_ok(guess)
        else f"the name as the store lists it (`aws s3 ls`), e.g. storage.bucket={EXAMPLE_BUCKET}"
    )
    return (
        f"storage.bucket={bucket!r} is not an S3 bucket name: 3 to 63 lowercase letters, digits, dots and "
        f"hyphens, starting and ending with a letter or digit, not an IP address. HINT: {fix}."
    )


def _bucket_ok(name: str) -> bool:
    if not _BUCKET.match(name) or ".." in name or name.startswith(_RESERVED_STARTS) or name.endswith(_RESERVED_ENDS):
        return False
    try:
        ipaddress.IPv4Address(name)
    except ValueError:
        return True
    return False


_HOST_PORT = re.compile(r"^[A-Za-z0-9][A-Za-z0-9.-]*(:[0-9]{1,5})?(/[A-Za-z0-9._/-]*)?$")


def endpoint_refusal(url: str) -> str | None:
    """Why boto3 could not reach a store at ``url`` (no scheme, no host, a port that cannot exist), or None."""
    field = f"storage.endpoint_url={url!r}"
    if not url.startswith(("http://", "https://")):
        host = url if _HOST_PORT.match(url) else "minio:9000"  # the fix proposed must itself be an endpoint
        return f"{field} has no scheme. HINT: write it as a URL, e.g. storage.endpoint_url=http://{host}."
    if any(c.isspace() for c in url):
        return f"{field} contains a space. HINT: storage.endpoint_url={''.join(url.split())}."
    parts = urlsplit(url)
    if not parts.hostname:
        return f"{field} names no host. HINT: storage.endpoint_url={parts.scheme}://HOST:PORT, e.g. http://s3:8333."
    try:
        port = parts.port
    except ValueError:
        port = 0
    if port == 0:
        given = parts.netloc.rsplit(":", 1)[-1]
        host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
        return (
            f"{field}: {given!r} is not a TCP port (1-65535). HINT: give the port the store listens on, e.g. "
            f"storage.endpoint_url={parts.scheme}://{host}:8333, or none for the scheme's own: "
            f"storage.endpoint_url={parts.scheme}://{host}."
        )
    return None


def prefix_refusal(prefix: str) -> str | None:
    """Why ``prefix`` is not a key prefix as written (S3 keys are plain strings: `..` is not resolved, `//` makes an
    empty folder other tools do not show), or None. One trailing `/` is fine."""
    field = f"storage.prefix={prefix!r}"
    if "://" in prefix:
        bucket, _, rest = prefix.split("://", 1)[1].partition("/")
        return (
            f"{field} is a URL, not a key prefix. HINT: give the bucket and the prefix apart: "
            f"storage.bucket={bucket} storage.prefix={rest.strip('/') or 'PATH'}."
        )
    if any(ord(c) < 32 for c in prefix):
        return f"{field} contains a control character. HINT: choose a prefix of printable characters."
    segments = prefix.removesuffix("/").split("/")
    bad = [s for s in segments if s in ("", ".", "..")]
    if prefix and bad:
        kept = "/".join(s for s in segments if s not in ("", ".", ".."))
        why = "starts with `/`" if prefix.startswith("/") else "has an empty or `.`/`..` part"
        fix = f"storage.prefix={kept}" if kept else "leave storage.prefix out (swiftslurm/RUN_NAME)"
        return f"{field} {why}: S3 keys are plain strings, so it would not name the folder it looks like. HINT: {fix}."
    return None
