"""scripts/k8s/svc-dns.py, the real node's stand-in for CoreDNS + kube-proxy, against the
real API server: a Service's name resolves to its endpoints' IPs (ready ones first), an
unknown Service or any other name is NXDOMAIN, other query types get an empty answer.
A real UDP socket and hand-built DNS queries; no root needed."""

from __future__ import annotations

import socket
import struct
import subprocess
import sys

import pytest

from kvs.server import free_port
from tests.k8s import realcluster as rc

pytest.importorskip("kubernetes.client")
import kubernetes.client as client  # noqa: E402

SCRIPT = rc.ROOT / "scripts" / "k8s" / "svc-dns.py"
A, AAAA = 1, 28


def query(port: int, name: str, qtype: int = A, qid: int = 0x1234) -> tuple[int, list[str]]:
    """(rcode, A records) of one query to 127.0.0.1:port."""
    question = b"".join(bytes([len(p)]) + p.encode() for p in name.split(".")) + b"\0" + struct.pack("!HH", qtype, 1)
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.settimeout(5)
        s.sendto(struct.pack("!HHHHHH", qid, 0x0100, 1, 0, 0, 0) + question, ("127.0.0.1", port))
        data, _ = s.recvfrom(4096)
    rid, flags, _, ancount, _, _ = struct.unpack("!HHHHHH", data[:12])
    assert rid == qid and flags & 0x8000, "not an answer to the query"
    records, i = [], 12 + len(question)
    for _ in range(ancount):
        _, rtype, _, _, rdlen = struct.unpack("!HHHIH", data[i : i + 12])
        if rtype == A:
            records.append(socket.inet_ntoa(data[i + 12 : i + 12 + rdlen]))
        i += 12 + rdlen
    return flags & 0xF, records


@pytest.fixture
def dns(control_plane):
    port = free_port()
    proc = subprocess.Popen(
        [
            sys.executable,
            str(SCRIPT),
            "--listen",
            f"127.0.0.1:{port}",
            "--kubeconfig",
            control_plane.kubeconfig("admin"),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:
        # UDP: the first answered query says the server is up (a lost one is simply re-sent)
        def answers():
            try:
                return query(port, "x.y.svc.cluster.local")[0] == 3
            except OSError:  # a timeout, or refused: not listening yet
                if proc.poll() is not None:
                    pytest.fail(f"svc-dns.py exited: {proc.stdout.read().decode()[-2000:]}")
                return False

        rc.wait_for("svc-dns to answer", answers, timeout=30)
        yield port
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def test_service_names_resolve_to_their_endpoints_and_nothing_else_resolves(control_plane, dns):
    core = client.CoreV1Api(control_plane.api_client("admin"))
    ns = rc.unique_namespace("dns")
    core.create_namespace({"metadata": {"name": ns}})
    core.create_namespaced_service(ns, {"metadata": {"name": "kvs"}, "spec": {"ports": [{"port": 6379}]}})
    core.create_namespaced_endpoints(
        ns,
        {
            "metadata": {"name": "kvs"},
            "subsets": [
                {
                    "addresses": [{"ip": "10.88.0.7"}],
                    "notReadyAddresses": [{"ip": "10.88.0.8"}],
                    "ports": [{"port": 6379}],
                }
            ],
        },
    )
    core.create_namespaced_service(ns, {"metadata": {"name": "starting"}, "spec": {"ports": [{"port": 80}]}})
    core.create_namespaced_endpoints(
        ns,
        {
            "metadata": {"name": "starting"},
            "subsets": [{"notReadyAddresses": [{"ip": "10.88.0.9"}], "ports": [{"port": 80}]}],
        },
    )
    try:
        assert query(dns, f"kvs.{ns}.svc.cluster.local") == (0, ["10.88.0.7"])
        assert query(dns, f"KVS.{ns}.svc.Cluster.local") == (0, ["10.88.0.7"])  # names are case-blind
        assert query(dns, f"starting.{ns}.svc.cluster.local") == (0, ["10.88.0.9"])  # none ready yet
        assert query(dns, f"kvs.{ns}.svc.cluster.local", AAAA) == (0, [])  # exists, no IPv6
        # what a pod's search path tries first for "kvs.<ns>.svc", and other names
        for name in (
            f"kvs.{ns}.svc.{ns}.svc.cluster.local",
            f"nothing.{ns}.svc.cluster.local",
            "example.com",
            f"kvs.{ns}.svc",
        ):
            assert query(dns, name) == (3, []), name
    finally:
        core.delete_namespace(ns)
