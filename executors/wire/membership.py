"""Cluster membership and the deployed-flows registry, kept in the KVS.

Executors announce themselves; gateways find them. Each executor writes its description
(id, message address, device class, threads) into the hash ``flowserve:{members}:executors``
and keeps a per-executor key ``flowserve:{members}:alive:<id>`` alive with a heartbeat: the
key expires ``3 x heartbeat`` after the last beat, so an executor that dies (or a pod that
is deleted) drops out by itself; a graceful stop deletes it at once. The ``{members}``
hash tag keeps them in one slot of a Redis Cluster, so a gateway reads every alive key in
one MGET and an executor writes its two keys in one MULTI; nothing of it is kept across a
restart (every beat writes it again), so the names changed without a migration.

Gateways started with ``--membership kvs`` (Kubernetes, or any cluster whose executors
are not the gateway's children) read the live members a few times a second and add or
drop executors (``MemberWatch``). Heartbeats are periodic by nature, so this is the one
place the runtime polls the KVS; the data path never does.

Both gateway hosts rebuild the flows on an executor that (re)joins with ``build_on``.
What stays theirs: the local cluster's supervisor (daemon.py) sees its children exit
(certain at once, no grace) and restarts them in place, same id and address, keeping
their placement; the standalone gateway sees registrations expire, debounces them
(``Absence``: a KVS restart drops every key for a moment) and forgets a departed
executor for good (a pod that left does not come back under the same address).

Deployed flows are registered in the hash ``flowserve:deployed`` (flow -> version) by
whichever gateway receives ``POST /admin/deploy``; every gateway loads what the registry
says, so several gateway replicas serve the same flows. An entry only moves to a newer
version (``register_deployed``): of concurrent deploys the newest wins everywhere.
"""

from __future__ import annotations

import json
import logging
import threading
import time
import uuid
from dataclasses import dataclass, field

log = logging.getLogger("flowserve.membership")

MEMBERS_KEY = "flowserve:{members}:executors"
ALIVE_KEY = "flowserve:{{members}}:alive:{id}"  # str.format: {{members}} is the literal hash tag
GATEWAYS_KEY = "flowserve:gateways"  # counter: each gateway takes its own block of qids
HEARTBEAT_S = 1.0


@dataclass(frozen=True)
class Member:
    id: str
    address: str
    device: str = "cpu"
    threads: int = 4
    # new for each process: a container restarted in place keeps its pod's name and IP, and
    # only this tells the gateways that the requests the old process held are lost
    incarnation: str = field(default_factory=lambda: uuid.uuid4().hex[:12], compare=False)


class Heartbeat:
    """An executor's registration: a thread that refreshes its alive key until stopped."""

    def __init__(self, redis, member: Member, interval_s: float = HEARTBEAT_S):
        self.redis = redis
        self.member = member
        self.interval_s = interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="heartbeat", daemon=True)

    def start(self) -> Heartbeat:
        self._thread.start()
        return self

    def beat(self) -> None:
        m = self.member
        ttl_ms = int(self.interval_s * 3000)
        pipe = self.redis.pipeline(transaction=True)  # one slot ({members}): a MULTI on a Cluster too
        pipe.hset(
            MEMBERS_KEY,
            m.id,
            json.dumps({"address": m.address, "device": m.device, "threads": m.threads, "incarnation": m.incarnation}),
        )
        pipe.set(ALIVE_KEY.format(id=m.id), str(time.time()), px=ttl_ms)
        pipe.execute()

    def _loop(self) -> None:
        failing = False
        while not self._stop.is_set():
            try:
                self.beat()
                if failing:
                    log.warning("executor %s: registered again in the KVS", self.member.id)
                failing = False
            except Exception as e:  # the KVS may be restarting: keep beating
                if not failing:
                    log.warning("executor %s: heartbeat failed (%s); retrying", self.member.id, e)
                failing = True
            self._stop.wait(self.interval_s)

    def stop(self) -> None:
        """Leave the cluster now (a graceful stop), not when the key expires."""
        self._stop.set()
        try:
            pipe = self.redis.pipeline(transaction=True)
            pipe.delete(ALIVE_KEY.format(id=self.member.id))
            pipe.hdel(MEMBERS_KEY, self.member.id)
            pipe.execute()
        except Exception as e:  # best effort on the way out: the registration expires by itself anyway
            log.warning("executor %s: could not deregister (%s); it expires by itself", self.member.id, e)


def live_members(redis) -> dict[str, Member]:
    """The executors whose heartbeat has not expired; forgets the descriptions of others."""
    described = redis.hgetall(MEMBERS_KEY)
    if not described:
        return {}
    ids = [k.decode() for k in described]
    alive = redis.mget([ALIVE_KEY.format(id=i) for i in ids])
    out, dead = {}, []
    for id_, beat in zip(ids, alive):
        if beat is None:
            dead.append(id_)
            continue
        try:
            doc = json.loads(described[id_.encode()])
            out[id_] = Member(
                id_,
                str(doc["address"]),
                str(doc.get("device", "cpu")),
                int(doc.get("threads", 4)),
                str(doc.get("incarnation", "")),
            )
        except (ValueError, KeyError, TypeError):
            log.warning("ignoring executor %s: malformed registration", id_)
    if dead:
        redis.hdel(MEMBERS_KEY, *dead)
    return out


class Absence:
    """Debounces departures: an executor counts as gone only after it has been missing for
    ``grace_s`` (a KVS that restarts without persistence loses every alive key until the
    next beats; that must not look like the whole cluster dying)."""

    def __init__(self, grace_s: float):
        self.grace_s = grace_s
        self.missing_since: dict[str, float] = {}

    def gone(self, known: set[str], present: set[str], now: float) -> list[str]:
        for id_ in present:
            self.missing_since.pop(id_, None)
        out = []
        for id_ in known - present:
            first = self.missing_since.setdefault(id_, now)
            if now - first >= self.grace_s:
                out.append(id_)
                del self.missing_since[id_]
        return out
