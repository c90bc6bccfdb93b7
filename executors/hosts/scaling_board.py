"""What the gateways of one cluster share in the store so that one control loop serves them all.

* **Load.** Every gateway posts what it saw per stage (requests routed, run time, answers:
  running totals since it started; requests in flight now) and its SLO flows' arrival
  counts, every step of its loop: one HSET of its own field in ``LOAD_KEY``. The leader
  reads them all (one HGETALL) and scales on the sum: behind a Service that spreads
  requests, each gateway sees only its share. Totals, not deltas: the leader takes the
  differences itself, so a post it reads twice or misses counts once all the same. A
  gateway whose post has not changed for ``STALE_S`` is gone; its field is dropped.
* **Placements.** The leader posts where each stage of each served flow runs (one field
  per flow in ``PLACEMENTS_KEY``), and the others serve the same (``ScalingLoop.follow``):
  a scale-up or scale-down reaches every gateway within a step.
* **Decisions.** Each decision is appended to ``DECISIONS_KEY``, a stream capped at
  ``MAX_DECISIONS``: the cluster's one record of what the control loop did, by whom, under
  which fencing token.

Placements and decisions are written by one Lua script that first checks the writer's
fencing token is the current one (``leadership.Fence``): a leader that lost its lease,
however late it wakes up, writes nothing. Every key carries the ``{scaling}`` hash tag, so
the script's keys are in one slot of a Redis Cluster.
"""

from __future__ import annotations

import json

from executors.hosts.leadership import FENCE_KEY, Fence

LOAD_KEY = "flowserve:{scaling}:load"  # gateway id -> its latest post (JSON)
PLACEMENTS_KEY = "flowserve:{scaling}:placements"  # flow -> {"version", "token", "stages", "why"}
DECISIONS_KEY = "flowserve:{scaling}:decisions"  # a stream: one entry ("d": JSON) per decision
MAX_DECISIONS = 1000
STALE_S = 3.0  # a gateway whose post has not changed for this long is gone

# KEYS: fence, placements, decisions. ARGV: token, flow, record, max stream length, then one
# JSON document per decision. Writes nothing unless the token is the fence's current one.
_POST = """
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
redis.call('HSET', KEYS[2], ARGV[2], ARGV[3])
for i = 5, #ARGV do
  redis.call('XADD', KEYS[3], 'MAXLEN', '~', ARGV[4], '*', 'd', ARGV[i])
end
return 1
"""


class ScalingBoard:
    """The cluster's shared control state in the store (see the module's docstring).

    board = ScalingBoard(store.redis)
    board.post_load("gw-1", seq, totals, inflight, arrivals)
    board.post_placement(token, "f", 7, {"s": ["cpu0", "cpu2"]}, [decision])
    """

    def __init__(self, redis, fence_key: str = FENCE_KEY):
        self.redis = redis
        self.fence = Fence(redis, fence_key)
        self._post = redis.register_script(_POST)

    # -- load ----------------------------------------------------------------------------------

    def post_load(self, gateway: str, seq: int, totals: dict, inflight: dict, arrivals: dict) -> None:
        """``totals``: flow -> stage -> [requests routed, run ms, answers] since the gateway
        started; ``inflight``: flow -> stage -> requests in flight; ``arrivals``: SLO flow ->
        window ms -> arrivals in that window (its arrival envelope now)."""
        doc = {"seq": seq, "totals": totals, "inflight": inflight, "arrivals": arrivals}
        self.redis.hset(LOAD_KEY, gateway, json.dumps(doc, separators=(",", ":")))

    def read_load(self) -> dict[str, dict]:
        out = {}
        for k, v in self.redis.hgetall(LOAD_KEY).items():
            try:
                out[k.decode() if isinstance(k, bytes) else k] = json.loads(v)
            except ValueError:
                continue  # not a post of ours: ignored
        return out

    def forget_load(self, gateways) -> None:
        if gateways:
            self.redis.hdel(LOAD_KEY, *gateways)

    # -- placements and decisions -----------------------------------------------------------------

    def post_placement(
        self, token: int, flow: str, version: int, stages: dict[str, list[str]], decisions=(), why=None
    ) -> bool:
        """Record where ``flow`` v``version``'s stages run, and the ``decisions`` (JSON-able
        dicts) that led there, if ``token`` is the current fencing token; False (nothing
        written) if it is not."""
        record = json.dumps({"version": version, "token": token, "stages": stages, "why": why or {}})
        args = [token, flow, record, MAX_DECISIONS, *(json.dumps(d) for d in decisions)]
        return bool(self._post(keys=[self.fence.key, PLACEMENTS_KEY, DECISIONS_KEY], args=args))

    def placements(self) -> dict[str, dict]:
        out = {}
        for k, v in self.redis.hgetall(PLACEMENTS_KEY).items():
            try:
                out[k.decode() if isinstance(k, bytes) else k] = json.loads(v)
            except ValueError:
                continue
        return out

    def forget_placement(self, token: int, flow: str) -> None:
        """Drop an undeployed flow's record (only the current leader does)."""
        if self.fence.admits(token):
            self.redis.hdel(PLACEMENTS_KEY, flow)

    def decisions(self, count: int = MAX_DECISIONS) -> list[dict]:
        """The latest decisions, oldest first."""
        out = []
        for _id, fields in self.redis.xrevrange(DECISIONS_KEY, count=count):
            try:
                out.append(json.loads(fields[b"d"] if b"d" in fields else fields["d"]))
            except (KeyError, ValueError):
                continue
        return out[::-1]
