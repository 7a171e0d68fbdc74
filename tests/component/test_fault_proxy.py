"""The fault proxy's outage (swiftslurm.testing.s3.FaultProxy.go_down/come_back), which the soak's S3 faults use:
while down, connections are refused by the kernel, as a stopped endpoint refuses them; afterwards the same
address serves again. Real SeaweedFS behind it."""

from __future__ import annotations

import socket

import pytest
from botocore.exceptions import EndpointConnectionError

from swiftslurm.testing.s3 import FaultProxy, Faults, SeaweedServer, s3_client

BUCKET = "proxy-outage"


def test_an_outage_refuses_connections_and_the_same_address_serves_after_it(s3_server: SeaweedServer) -> None:
    with FaultProxy(s3_server.endpoint_url, Faults()) as proxy:
        client = s3_client(proxy.url, retries={"max_attempts": 1, "mode": "standard"}, connect_timeout=2)
        client.head_bucket(Bucket=BUCKET)
        proxy.go_down()
        host, port = proxy.url.removeprefix("http://").split(":")
        with pytest.raises(ConnectionRefusedError), socket.create_connection((host, int(port)), timeout=2):
            pass
        with pytest.raises(EndpointConnectionError):
            client.head_bucket(Bucket=BUCKET)
        proxy.come_back()
        client.head_bucket(Bucket=BUCKET)
        assert proxy.injected["down"] == 1
