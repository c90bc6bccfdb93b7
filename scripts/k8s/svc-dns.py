#!/usr/bin/env python3
"""A stand-in for the cluster DNS (CoreDNS) and the service proxy (kube-proxy) of the real
node (real-node.sh): neither is built from Debian's `kubernetes` source package (CoreDNS is
another project; kube-proxy would be a second cold Go build on a 2-core machine).

It answers A queries for ``<service>.<namespace>.svc.cluster.local`` (the name the pods'
search path turns ``<service>.<namespace>.svc`` into) with the IPs of the Service's
endpoints, read from the API server at query time: a Service resolves the way a headless
one does, so no ClusterIP has to be routed. Every other name is NXDOMAIN (the pods need no
outside names); other query types get an empty answer.

    svc-dns.py --listen 10.88.0.1:53 --kubeconfig CP_DIR/admin.kubeconfig [--pidfile F]
"""

from __future__ import annotations

import argparse
import json
import socket
import socketserver
import ssl
import struct
import urllib.error
import urllib.request

import yaml

A, CLASS_IN, NOERROR, NXDOMAIN, SERVFAIL = 1, 1, 0, 3, 2
TTL_S = 1  # endpoints change when pods come and go: let the pods' resolver ask again soon


class Endpoints:
    """Reads a Service's endpoint IPs from the API server, with the kubeconfig's token."""

    def __init__(self, kubeconfig: str):
        doc = yaml.safe_load(open(kubeconfig))
        cluster = doc["clusters"][0]["cluster"]
        self.server = cluster["server"].rstrip("/")
        self.token = doc["users"][0]["user"]["token"]
        self.tls = ssl.create_default_context(cafile=cluster["certificate-authority"])

    def ips(self, namespace: str, service: str) -> list[str] | None:
        """Ready addresses first; with none ready, the not-ready ones (a ClusterIP name
        resolves whether or not a backend is ready); None when the Service does not exist."""
        req = urllib.request.Request(
            f"{self.server}/api/v1/namespaces/{namespace}/endpoints/{service}",
            headers={"Authorization": f"Bearer {self.token}"},
        )
        try:
            with urllib.request.urlopen(req, context=self.tls, timeout=2) as r:
                subsets = json.load(r).get("subsets") or []
        except urllib.error.HTTPError as e:
            if e.code == 404:
                return None
            raise
        ready = [a["ip"] for s in subsets for a in s.get("addresses") or []]
        return ready or [a["ip"] for s in subsets for a in s.get("notReadyAddresses") or []]


def parse_question(packet: bytes) -> tuple[int, int, str, int, bytes]:
    """(id, flags, name, qtype, the question's bytes) of a one-question query."""
    qid, flags = struct.unpack("!HH", packet[:4])
    labels, i = [], 12
    while packet[i]:
        n = packet[i]
        labels.append(packet[i + 1 : i + 1 + n].decode("ascii", "replace"))
        i += 1 + n
    qtype = struct.unpack("!H", packet[i + 1 : i + 3])[0]
    return qid, flags, ".".join(labels).lower(), qtype, packet[12 : i + 5]


def service_of(name: str) -> tuple[str, str] | None:
    """(namespace, service) for ``<service>.<namespace>.svc.cluster.local``, else None."""
    parts = name.rstrip(".").split(".")
    if len(parts) == 5 and parts[2:] == ["svc", "cluster", "local"]:
        return parts[1], parts[0]
    return None


def answer(packet: bytes, endpoints: Endpoints) -> bytes:
    qid, flags, name, qtype, question = parse_question(packet)
    rcode, ips = NXDOMAIN, []
    svc = service_of(name)
    if svc is not None:
        try:
            found = endpoints.ips(*svc)
            rcode, ips = (NXDOMAIN, []) if found is None else (NOERROR, found if qtype == A else [])
        except Exception:  # noqa: BLE001 - the API server did not answer: the pod retries
            rcode = SERVFAIL
    header = struct.pack("!HHHHHH", qid, 0x8000 | (flags & 0x0100) | 0x0400 | 0x0080 | rcode, 1, len(ips), 0, 0)
    records = b"".join(struct.pack("!HHHIH", 0xC00C, A, CLASS_IN, TTL_S, 4) + socket.inet_aton(ip) for ip in ips)
    return header + question + records


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--listen", required=True, help="HOST:PORT (UDP)")
    p.add_argument("--kubeconfig", required=True)
    args = p.parse_args()
    endpoints = Endpoints(args.kubeconfig)

    class Handler(socketserver.BaseRequestHandler):
        def handle(self):
            data, sock = self.request
            try:
                sock.sendto(answer(data, endpoints), self.client_address)
            except (IndexError, struct.error, UnicodeError):
                pass  # not a query we can parse: no answer, as for a lost packet

    host, _, port = args.listen.rpartition(":")
    socketserver.ThreadingUDPServer.allow_reuse_address = True
    with socketserver.ThreadingUDPServer((host, int(port)), Handler) as server:
        server.serve_forever()


if __name__ == "__main__":
    main()
