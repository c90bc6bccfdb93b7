"""Replicated and sharded Redis on this machine, from the server binary the project ships
(``kvs.server.find_server_binary``): a Sentinel set and a Redis Cluster, for the tests and
benchmarks that kill a primary, and for trying the store URL forms (``kvs/urls.py``)
without a managed service.

    with SentinelStore(replicas=1, sentinels=3) as s:     # a primary, a replica, 3 sentinels
        store = KVS.from_url(s.url)                       # redis+sentinel://...
        s.primary().kill()                                # kill -9; the sentinels promote the replica
    with ClusterStore(masters=3, replicas=1) as c:        # 3 primaries, one replica each
        store = KVS.from_url(c.url)                       # redis+cluster://...
        c.primary_for("emb/1").kill()

Every process listens on a free loopback port, lives in a directory of its own under
``dir`` (a temporary one by default, removed on ``stop``) and dies with this process.
Failure detection is quick (``down_after_ms`` / ``node_timeout_ms``, 1 s by default), as a
test wants; production settings are the operator's.
"""

from __future__ import annotations

import random
import shutil
import socket
import tempfile
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any
from urllib.parse import quote

import redis
from redis.crc import key_slot

from flow.errors import InternalError
from kvs.server import RedisServer

SLOTS = 16384


def _wait(what: str, predicate: Callable[[], bool], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    last: Exception | None = None
    while True:
        try:
            if predicate():
                return
        except redis.RedisError as e:  # a node not up yet, a link not made yet
            last = e
        if time.monotonic() > deadline:
            raise InternalError(
                f"{what} did not happen within {timeout:g} s" + (f" (last error: {last})" if last else "")
            )
        time.sleep(0.02)


def _client(server: RedisServer, password: str | None) -> Any:  # redis-py's replies are loosely typed
    return redis.Redis(
        host="127.0.0.1",
        port=server.port,
        password=password,
        socket_timeout=2,
        socket_connect_timeout=2,
        decode_responses=True,
        protocol=2,
    )


def _auth(password: str | None) -> str:
    return f":{quote(password, safe='')}@" if password else ""


class _Local:
    """What both sets share: a directory, the binary, start/stop as a context manager."""

    def __init__(self, dir: str | Path | None, binary: str | None, password: str | None):
        self._dir_arg = Path(dir) if dir is not None else None
        self.dir: Path | None = None
        self.binary = binary
        self.password = password
        self.servers: list[RedisServer] = []

    def _mkdir(self) -> Path:
        if self.dir is None:
            self.dir = self._dir_arg or Path(tempfile.mkdtemp(prefix="flowserve-replicated-"))
            self.dir.mkdir(parents=True, exist_ok=True)
        return self.dir

    def _server(self, name: str, lines: list[str], port: int | None = None) -> RedisServer:
        # a replica's first sync starts at once (Redis waits 5 s by default, for more replicas)
        server = RedisServer(
            port=port,
            dir=self._mkdir() / name,
            password=self.password,
            binary=self.binary,
            extra_config=["repl-diskless-sync-delay 0", *lines],
        )
        self.servers.append(server)
        return server

    def stop(self) -> None:
        for s in self.servers:
            s.stop(timeout=5)
        if self._dir_arg is None and self.dir is not None:
            shutil.rmtree(self.dir, ignore_errors=True)
        self.dir = None
        self.servers = []

    def start(self):  # pragma: no cover - each set starts its own way
        raise NotImplementedError

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


class SentinelStore(_Local):
    """A primary, ``replicas`` replicas of it and ``sentinels`` sentinels monitoring it as
    ``service`` (quorum: a majority of the sentinels)."""

    def __init__(
        self,
        *,
        replicas: int = 1,
        sentinels: int = 3,
        password: str | None = "flowserve-test",
        service: str = "flowserve",
        down_after_ms: int = 1000,
        failover_timeout_ms: int = 5000,
        dir: str | Path | None = None,
        binary: str | None = None,
    ):
        super().__init__(dir, binary, password)
        self.n_replicas, self.n_sentinels = replicas, sentinels
        self.service = service
        self.down_after_ms, self.failover_timeout_ms = down_after_ms, failover_timeout_ms
        self.nodes: list[RedisServer] = []
        self.sentinels: list[RedisServer] = []

    def start(self) -> SentinelStore:
        auth = [f"masterauth {self.password}"] if self.password else []
        primary = self._server("node0", auth).start()
        self.nodes = [primary]
        for i in range(self.n_replicas):
            lines = [*auth, f"replicaof 127.0.0.1 {primary.port}"]
            self.nodes.append(self._server(f"node{i + 1}", lines).start())
        for replica in self.nodes[1:]:
            _wait(f"replica on port {replica.port} in sync", partial(_in_sync, _client(replica, self.password)), 30)
        quorum = self.n_sentinels // 2 + 1
        for i in range(self.n_sentinels):
            lines = [
                f"sentinel monitor {self.service} 127.0.0.1 {primary.port} {quorum}",
                f"sentinel down-after-milliseconds {self.service} {self.down_after_ms}",
                f"sentinel failover-timeout {self.service} {self.failover_timeout_ms}",
                f"sentinel parallel-syncs {self.service} 1",
            ]
            if self.password:
                lines.append(f"sentinel auth-pass {self.service} {self.password}")
            # sentinels themselves take no password here; requirepass would need sentinel_password
            server = RedisServer(
                dir=self._mkdir() / f"sentinel{i}", binary=self.binary, extra_config=lines, sentinel=True
            )
            self.servers.append(server)
            self.sentinels.append(server.start())
        for s in self.sentinels:
            _wait(f"sentinel on port {s.port} to see the whole set", partial(self._sees_all, s), 30)
        return self

    def _sees_all(self, sentinel: RedisServer) -> bool:
        c = _client(sentinel, None)
        master = c.sentinel_master(self.service)
        return (
            int(master["num-slaves"]) >= self.n_replicas and int(master["num-other-sentinels"]) >= self.n_sentinels - 1
        )

    @property
    def url(self) -> str:
        hosts = ",".join(f"127.0.0.1:{s.port}" for s in self.sentinels)
        return f"redis+sentinel://{_auth(self.password)}{hosts}/{self.service}/0"

    def primary_port(self) -> int:
        """The primary's port as a majority of the live sentinels name it."""
        votes: dict[int, int] = {}
        for s in self.sentinels:
            if not s.running:
                continue
            try:
                addr = _client(s, None).sentinel_get_master_addr_by_name(self.service)
            except redis.RedisError:
                continue
            if addr:
                votes[int(addr[1])] = votes.get(int(addr[1]), 0) + 1
        if not votes:
            raise InternalError("no sentinel names a primary")
        return max(votes, key=votes.__getitem__)

    def primary(self) -> RedisServer:
        port = self.primary_port()
        return next(n for n in self.nodes if n.port == port)

    def wait_new_primary(self, old_port: int, timeout: float = 30) -> RedisServer:
        """The node the sentinels promoted in place of the one on ``old_port``, once it
        takes writes."""

        def promoted() -> bool:
            port = self.primary_port()
            if port == old_port:
                return False
            node = next(n for n in self.nodes if n.port == port)
            return _client(node, self.password).info("replication")["role"] == "master"

        _wait(f"a new primary in place of port {old_port}", promoted, timeout)
        return self.primary()

    def rejoin(self, node: RedisServer) -> None:
        """Start a stopped or killed ``node`` again as a replica of the current primary, as
        a deployment's start script does (Sentinel itself would reconfigure a node that came
        back as a primary, at its next INFO round: up to 10 s later)."""
        primary = self.primary()
        kept = [line for line in node.extra_config if not line.startswith("replicaof ")]
        node.extra_config = (*kept, f"replicaof 127.0.0.1 {primary.port}")
        node.start()

    def wait_replicas_attached(self, count: int, timeout: float = 60) -> None:
        """Until the primary has ``count`` replicas in sync (a restarted node rejoined)."""

        def attached() -> bool:
            info = _client(self.primary(), self.password).info("replication")
            up = [
                v
                for k, v in info.items()
                if k.startswith("slave") and isinstance(v, dict) and v.get("state") == "online"
            ]
            return len(up) >= count

        _wait(f"{count} replica(s) attached to the primary", attached, timeout)


class ClusterStore(_Local):
    """A Redis Cluster of ``masters`` primaries, each with ``replicas`` replicas, the slots
    split evenly; with ``require_full_coverage`` False (the default here, Redis's is yes)
    the shards whose primary is up keep serving while another fails over."""

    def __init__(
        self,
        *,
        masters: int = 3,
        replicas: int = 1,
        password: str | None = "flowserve-test",
        node_timeout_ms: int = 1000,
        require_full_coverage: bool = False,
        dir: str | Path | None = None,
        binary: str | None = None,
    ):
        super().__init__(dir, binary, password)
        self.n_masters, self.n_replicas = masters, replicas
        self.node_timeout_ms = node_timeout_ms
        self.require_full_coverage = require_full_coverage
        self.nodes: list[RedisServer] = []

    def start(self) -> ClusterStore:
        lines = [
            "cluster-enabled yes",
            "cluster-config-file nodes.conf",
            f"cluster-node-timeout {self.node_timeout_ms}",
            # a replica promotes itself however long its link was down: a test kills and
            # restarts nodes quickly, and waits for the failover rather than an operator
            "cluster-replica-validity-factor 0",
            # the other shards keep serving while one has no primary (Redis's default, yes,
            # stops the whole cluster from a primary's failure until its replica takes over)
            f"cluster-require-full-coverage {'yes' if self.require_full_coverage else 'no'}",
        ]
        if self.password:
            lines.append(f"masterauth {self.password}")
        total = self.n_masters * (1 + self.n_replicas)
        self.nodes = [self._node(f"node{i}", lines) for i in range(total)]
        clients = [_client(n, self.password) for n in self.nodes]
        ids = [c.execute_command("CLUSTER", "MYID") for c in clients]
        per = SLOTS // self.n_masters
        for i in range(self.n_masters):
            first, last = i * per, SLOTS - 1 if i == self.n_masters - 1 else (i + 1) * per - 1
            clients[i].execute_command("CLUSTER", "ADDSLOTSRANGE", first, last)
        for c in clients[1:]:
            c.execute_command("CLUSTER", "MEET", "127.0.0.1", self.nodes[0].port)
        _wait("every node to know every other", lambda: all(_known(c) >= total for c in clients), 30)
        for r in range(self.n_replicas):
            for i in range(self.n_masters):
                replica = clients[self.n_masters * (1 + r) + i]
                _wait("a replica to take its primary", partial(_replicate, replica, ids[i]), 30)
        _wait("the cluster to be ok on every node", lambda: all(_state_ok(c) for c in clients), 30)
        _wait("every replica in sync", lambda: all(_in_sync(c) for c in clients[self.n_masters :]), 30)
        return self

    def _node(self, name: str, lines: list[str]) -> RedisServer:
        """A node on a port whose cluster bus port (port + 10000, as Redis fixes it) is free too."""
        for _ in range(20):
            server = self._server(name, lines, _port_pair())
            try:
                return server.start()
            except InternalError:  # lost the race for a port: another pair
                self.servers.remove(server)
                server.stop()
        raise InternalError(f"no free pair of ports for cluster node {name}")

    @property
    def url(self) -> str:
        hosts = ",".join(f"127.0.0.1:{n.port}" for n in self.nodes[: self.n_masters])
        return f"redis+cluster://{_auth(self.password)}{hosts}"

    def _live_client(self) -> Any:
        for n in self.nodes:
            if n.running:
                return _client(n, self.password)
        raise InternalError("no node of the cluster is running")

    def primary_port_for_slot(self, slot: int) -> int:
        """The port of the primary serving ``slot`` as a live node sees it."""
        for first, last, primary, *_ in self._live_client().execute_command("CLUSTER", "SLOTS"):
            if first <= slot <= last:
                return int(primary[1])
        raise InternalError(f"slot {slot} is not served")

    def primary_for(self, key: str) -> RedisServer:
        port = self.primary_port_for_slot(key_slot(key.encode()))
        return next(n for n in self.nodes if n.port == port)

    def primaries(self) -> list[RedisServer]:
        ports = {int(p[1]) for _, _, p, *_ in self._live_client().execute_command("CLUSTER", "SLOTS")}
        return [n for n in self.nodes if n.port in ports]

    def wait_new_primary(self, key: str, old_port: int, timeout: float = 30) -> RedisServer:
        """The replica promoted for ``key``'s slot in place of the primary on ``old_port``,
        once every live node says the cluster is ok."""
        slot = key_slot(key.encode())

        def promoted() -> bool:
            live = [_client(n, self.password) for n in self.nodes if n.running]
            return self.primary_port_for_slot(slot) != old_port and all(_state_ok(c) for c in live)

        _wait(f"a new primary for slot {slot} in place of port {old_port}", promoted, timeout)
        return self.primary_for(key)

    def wait_in_sync(self, timeout: float = 60) -> None:
        """Until every running replica's link to its primary is up (a restarted node
        rejoined as a replica)."""

        def synced() -> bool:
            for n in self.nodes:
                if not n.running:
                    continue
                c = _client(n, self.password)
                if c.info("replication")["role"] != "master" and not _in_sync(c):
                    return False
            return True

        _wait("every replica in sync", synced, timeout)


def _port_pair() -> int:
    """A loopback port below 55536 that is free now, with port + 10000 free as well."""
    while True:
        port = random.randrange(20000, 55535)
        try:
            with socket.socket() as a, socket.socket() as b:
                a.bind(("127.0.0.1", port))
                b.bind(("127.0.0.1", port + 10000))
            return port
        except OSError:
            continue


def _replicate(c: Any, primary_id: str) -> bool:
    return c.execute_command("CLUSTER", "REPLICATE", primary_id) in (True, "OK")


def _known(c: Any) -> int:
    return int(c.execute_command("CLUSTER", "INFO").split("cluster_known_nodes:")[1].split()[0])


def _state_ok(c: Any) -> bool:
    return "cluster_state:ok" in c.execute_command("CLUSTER", "INFO")


def _in_sync(c: Any) -> bool:
    info = c.info("replication")
    return info["role"] != "master" and info.get("master_link_status") == "up"
