"""Light S3 endpoints for bench/storage.py: ceilings that a real server on 2 cores does not reach.

    python bench/s3_light.py sink --host 127.0.0.1              # accepts uploads, discards the bytes
    python bench/s3_light.py serve --host 127.0.0.1 --root DIR  # serves DIR/<key> as bucket objects

Each prints `listening on http://HOST:PORT` once it accepts connections and runs until killed.

`sink` answers PutObject (a conditional `If-None-Match: *` too), CreateMultipartUpload, UploadPart,
CompleteMultipartUpload, AbortMultipartUpload, HeadObject and ListObjectsV2; it keeps only each key's size,
so a client that lists or heads after uploading (swiftslurm checks the sizes, then publishes the manifest)
sees what it sent. GetObject answers NoSuchKey. `serve` answers GetObject (with Range, via sendfile),
HeadObject and ListObjectsV2 from files on disk, one bucket, any name.

Neither checks signatures or checksums (`x-amz-checksum-*`, `Content-MD5`, the signed payload hash): the
clients compute them as they would for a real store, and the server's share of that work is left out. That
is the point of a ceiling, and why its figures are not those of any real store.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import socketserver
import sys
import threading
import time
import uuid
import zlib
from email.utils import formatdate
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from urllib.parse import parse_qs, unquote, urlsplit
from xml.sax.saxutils import escape

_BUFFER = 1 << 20
_XMLNS = 'xmlns="http://s3.amazonaws.com/doc/2006-03-01/"'
_LAST_MODIFIED = "2026-01-01T00:00:00.000Z"


class Objects:
    """What the endpoint holds: key -> size. The sink fills it from uploads; `serve` reads a folder."""

    def __init__(self, root: Path | None) -> None:
        self.root = root
        self.sizes: dict[str, int] = {}
        self.parts: dict[str, dict[int, int]] = {}  # upload id -> part number -> size
        self.lock = threading.Lock()

    def size(self, key: str) -> int | None:
        if self.root is None:
            with self.lock:
                return self.sizes.get(key)
        path = self.path(key)
        return path.stat().st_size if path is not None and path.is_file() else None

    def path(self, key: str) -> Path | None:
        """The file of a key in `serve` mode, or None for a key that would leave the root."""
        if self.root is None or not key or key.startswith("/") or ".." in key.split("/"):
            return None
        return self.root / key

    def listing(self, prefix: str) -> list[tuple[str, int]]:
        """(key, size) under ``prefix``, sorted as S3 sorts (by UTF-8 bytes; plain ASCII here)."""
        if self.root is None:
            with self.lock:
                return sorted((k, s) for k, s in self.sizes.items() if k.startswith(prefix))
        found = []
        for folder, _, files in os.walk(self.root, followlinks=True):
            for name in files:
                key = os.path.relpath(os.path.join(folder, name), self.root)
                if key.startswith(prefix):
                    found.append((key, os.path.getsize(os.path.join(folder, name))))
        return sorted(found)


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive: clients reuse connections as with a real store
    disable_nagle_algorithm = True  # headers and a small body go out at once, not after a delayed ACK
    server: Server

    def log_message(self, format: str, *args: object) -> None:
        pass

    # -- request parsing ---------------------------------------------------------------------------------

    def _target(self) -> tuple[str, str, dict[str, str]]:
        """(bucket, key, query) of a path-style request."""
        url = urlsplit(self.path)
        bucket, _, key = url.path.lstrip("/").partition("/")
        query = {k: v[0] for k, v in parse_qs(url.query, keep_blank_values=True).items()}
        return unquote(bucket), unquote(key), query

    def _drain(self) -> int:
        """Read and discard the request body; returns the bytes of the object (aws-chunked decoded size)."""
        buffer = self.server.buffers
        if not hasattr(buffer, "view"):
            buffer.view = memoryview(bytearray(_BUFFER))
        view = buffer.view
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            received = self._drain_chunked(view)
        else:
            received = left = int(self.headers.get("Content-Length", 0))
            while left > 0:
                got = self.rfile.readinto(view[: min(left, _BUFFER)])
                if not got:
                    raise ConnectionError("client closed mid-body")
                left -= got
        decoded = self.headers.get("x-amz-decoded-content-length")
        return int(decoded) if decoded is not None else received

    def _drain_chunked(self, view: memoryview) -> int:
        total = 0
        while (size := int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)) > 0:
            left = size
            while left > 0:
                left -= self.rfile.readinto(view[: min(left, _BUFFER)]) or 0
            self.rfile.readline()
            total += size
        while self.rfile.readline() not in (b"\r\n", b"\n", b""):  # trailers
            pass
        return total

    # -- replies -------------------------------------------------------------------------------------------

    def _reply(self, status: int, body: bytes = b"", headers: dict[str, str] | None = None) -> None:
        self.send_response(status)
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        if body:
            self.send_header("Content-Type", "application/xml")
        if "Content-Length" not in (headers or {}):  # a HEAD tells the object's length, with no body
            self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if body and self.command != "HEAD":
            self.wfile.write(body)

    def _xml(self, body: str) -> None:
        self._reply(200, f'<?xml version="1.0" encoding="UTF-8"?>\n{body}'.encode())

    def _error(self, status: int, code: str, message: str) -> None:
        body = f"<Error><Code>{code}</Code><Message>{escape(message)}</Message><RequestId>light</RequestId></Error>"
        self._reply(status, b"" if self.command == "HEAD" else body.encode())

    @staticmethod
    def _etag(key: str, size: int) -> str:
        """A stable made-up ETag (not an MD5: no client here checks one against the bytes)."""
        return f'"{zlib.crc32(f"{key}:{size}".encode()):08x}{size:024x}"'

    # -- operations ----------------------------------------------------------------------------------------

    def do_HEAD(self) -> None:
        _bucket, key, _ = self._target()
        if not key:
            self._reply(200)  # HeadBucket
            return
        size = self.server.objects.size(key)
        if size is None:
            self._error(404, "NoSuchKey", key)
            return
        self._reply(200, headers=self._object_headers(key, size, size))

    def _object_headers(self, key: str, size: int, length: int) -> dict[str, str]:
        return {
            "ETag": self._etag(key, size),
            "Last-Modified": formatdate(0, usegmt=True),
            "Accept-Ranges": "bytes",
            "Content-Type": "application/octet-stream",
            "Content-Length": str(length),
        }

    def do_GET(self) -> None:
        bucket, key, query = self._target()
        if not key:
            if "location" in query:
                self._xml(f"<LocationConstraint {_XMLNS}></LocationConstraint>")
            else:
                self._list(bucket, query)
            return
        path = self.server.objects.path(key)
        if path is None or not path.is_file():
            self._error(404, "NoSuchKey", key)
            return
        self._send_file(key, path)

    def _send_file(self, key: str, path: Path) -> None:
        size = path.stat().st_size
        start, end = 0, size - 1
        ranged = self.headers.get("Range", "").startswith("bytes=")
        if ranged:
            first, _, last = self.headers["Range"][len("bytes=") :].partition("-")
            start = int(first) if first else max(0, size - int(last))
            end = min(int(last), size - 1) if first and last else size - 1
            if start >= size:
                self._error(416, "InvalidRange", self.headers["Range"])
                return
        headers = self._object_headers(key, size, end - start + 1)
        if ranged:
            headers["Content-Range"] = f"bytes {start}-{end}/{size}"
        self.send_response(206 if ranged else 200)
        for name, value in headers.items():
            self.send_header(name, value)
        self.end_headers()
        with open(path, "rb") as f:
            self.connection.sendfile(f, start, end - start + 1)

    def _list(self, bucket: str, query: dict[str, str]) -> None:
        """ListObjectsV2 (and v1's marker), with prefix, delimiter, max-keys and continuation."""
        prefix, delimiter = query.get("prefix", ""), query.get("delimiter", "")
        after = query.get("continuation-token") or query.get("start-after") or query.get("marker") or ""
        limit = int(query.get("max-keys", 1000))
        entries, common = [], []
        for key, size in self.server.objects.listing(prefix):
            if key <= after:
                continue
            if delimiter and delimiter in key[len(prefix) :]:
                folder = prefix + key[len(prefix) :].split(delimiter, 1)[0] + delimiter
                if folder not in common:
                    common.append(folder)
                continue
            entries.append((key, size))
        truncated = len(entries) > limit
        entries = entries[:limit]
        contents = "".join(
            f"<Contents><Key>{escape(k)}</Key><LastModified>{_LAST_MODIFIED}</LastModified>"
            f"<ETag>{escape(self._etag(k, s))}</ETag><Size>{s}</Size><StorageClass>STANDARD</StorageClass></Contents>"
            for k, s in entries
        )
        folders = "".join(f"<CommonPrefixes><Prefix>{escape(p)}</Prefix></CommonPrefixes>" for p in common)
        more = f"<NextContinuationToken>{escape(entries[-1][0])}</NextContinuationToken>" if truncated else ""
        self._xml(
            f"<ListBucketResult {_XMLNS}><Name>{escape(bucket)}</Name><Prefix>{escape(prefix)}</Prefix>"
            f"<KeyCount>{len(entries) + len(common)}</KeyCount><MaxKeys>{limit}</MaxKeys>"
            f"<IsTruncated>{str(truncated).lower()}</IsTruncated>{more}{contents}{folders}</ListBucketResult>"
        )

    def do_PUT(self) -> None:
        _bucket, key, query = self._target()
        objects = self.server.objects
        if objects.root is not None:
            self._drain()
            self._error(405, "MethodNotAllowed", "this endpoint only serves files")
            return
        if "partNumber" in query:
            size = self._drain()
            with objects.lock:
                objects.parts.setdefault(query["uploadId"], {})[int(query["partNumber"])] = size
            self._reply(200, headers={"ETag": self._etag(key, size)})
            return
        if self.headers.get("If-None-Match") == "*" and objects.size(key) is not None:
            self._drain()
            self._error(412, "PreconditionFailed", f"{key} exists")
            return
        size = self._drain()
        with objects.lock:
            objects.sizes[key] = size
        self._reply(200, headers={"ETag": self._etag(key, size)})

    def do_POST(self) -> None:
        bucket, key, query = self._target()
        objects = self.server.objects
        self._drain()
        if "uploads" in query:
            upload_id = uuid.uuid4().hex
            with objects.lock:
                objects.parts[upload_id] = {}
            self._xml(
                f"<InitiateMultipartUploadResult {_XMLNS}><Bucket>{escape(bucket)}</Bucket><Key>{escape(key)}</Key>"
                f"<UploadId>{upload_id}</UploadId></InitiateMultipartUploadResult>"
            )
        elif "uploadId" in query:
            with objects.lock:
                parts = objects.parts.pop(query["uploadId"], {})
                objects.sizes[key] = sum(parts.values())
            self._xml(
                f"<CompleteMultipartUploadResult {_XMLNS}><Bucket>{escape(bucket)}</Bucket><Key>{escape(key)}</Key>"
                f"<ETag>{escape(self._etag(key, sum(parts.values())))}</ETag></CompleteMultipartUploadResult>"
            )
        else:
            self._error(501, "NotImplemented", f"POST {self.path}")

    def do_DELETE(self) -> None:
        _, key, query = self._target()
        with self.server.objects.lock:
            self.server.objects.parts.pop(query.get("uploadId", ""), None)
            self.server.objects.sizes.pop(key, None)
        self._reply(204)


class Server(socketserver.ThreadingMixIn, socketserver.TCPServer):
    """One thread per connection (clients keep a few dozen open). Not http.server.HTTPServer: that looks up
    the host's FQDN when it binds, which may wait on DNS."""

    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 1024  # s5cmd opens many connections at once; the default 5 makes them wait on SYN retries

    def __init__(self, address: tuple[str, int], objects: Objects) -> None:
        super().__init__(address, Handler)
        self.objects = objects
        self.buffers = threading.local()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("mode", choices=("sink", "serve"))
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--root", type=Path, help="serve: the folder whose files are the bucket's objects")
    args = parser.parse_args()
    if args.mode == "serve" and (args.root is None or not args.root.is_dir()):
        parser.error("serve needs --root DIR (an existing folder)")
    server = Server((args.host, args.port), Objects(args.root if args.mode == "serve" else None))
    host, port = server.server_address[:2]
    print(f"listening on http://{host}:{port}", flush=True)
    started = time.monotonic()
    with contextlib.suppress(KeyboardInterrupt):
        server.serve_forever(poll_interval=0.5)
    print(f"stopped after {time.monotonic() - started:.0f} s", file=sys.stderr)


if __name__ == "__main__":
    main()
