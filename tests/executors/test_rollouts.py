"""Canary and shadow versions on a real local cluster (executors/gateway/rollouts.py): the
canary's share held exactly, both versions' figures side by side, a shadow's answers never
returned and compared per column, promote and rollback from the client, the command line
and HTTP, versions only moving forward, and bad input refused alike on every path."""

from __future__ import annotations

import collections
import subprocess
import sys

import httpx
import pytest

from executors.errors import BadRequestError, RolloutStateError
from executors.gateway.rollouts import SPLIT_BLOCK, Split
from flow import Flow
from flow.errors import FlowError
from tests.executors.conftest import unique
from tests.executors.processes import wait_until


def adder(name: str, k: int, fail_below: int | None = None) -> Flow:
    """y = x + k (a version is told apart by its k); z = x, alike in every version."""

    def add(row):
        if fail_below is not None and row.x < fail_below:
            raise ValueError(f"x below {fail_below}")
        return row.x + k, row.x

    f = Flow(name, schema={"x": int})
    f.map(add, names=["y", "z"])
    return f


def ys(url: str, xs, client: httpx.Client) -> collections.Counter:
    """How many answers gave each y - x (which version answered)."""
    seen: collections.Counter = collections.Counter()
    for x in xs:
        r = client.post(url, json={"x": x})
        seen[r.json()["rows"][0]["y"] - x if r.status_code == 200 else r.status_code] += 1
    return seen


def flow_doc(cluster, name: str) -> dict:
    return httpx.get(f"{cluster.url}/flows/{name}", timeout=10).json()


def admin(cluster, method: str, path: str, **kw) -> httpx.Response:
    headers = {"Authorization": f"Bearer {cluster.state['admin_token']}"}
    return httpx.request(method, cluster.url + path, headers=headers, timeout=60, **kw)


def test_split_takes_exactly_its_share_of_every_block_at_random_positions():
    for share in (0.1, 0.237, 0.001, 0.999):
        split = Split(share)
        k = round(share * SPLIT_BLOCK)
        taken = [split.take() for _ in range(3 * SPLIT_BLOCK)]
        blocks = [taken[b * SPLIT_BLOCK : (b + 1) * SPLIT_BLOCK] for b in range(3)]
        assert [sum(b) for b in blocks] == [k, k, k], share
        for w in range(0, len(taken) - 100, 37):  # any run of 100: within two requests of its share
            assert abs(sum(taken[w : w + 100]) - share * 100) <= 2, (share, w)
    split = Split(0.1)
    taken = [split.take() for _ in range(3 * SPLIT_BLOCK)]
    positions = [[i for i, t in enumerate(taken[b * SPLIT_BLOCK : (b + 1) * SPLIT_BLOCK]) if t] for b in range(3)]
    assert positions[0] != positions[1] != positions[2]  # not a fixed period that traffic could line up with
    # each position of a run of 10 is as likely as any other: a client sending every 10th
    # request gets its share, whichever position it is at
    counts = [0] * 10
    for i in range(200 * SPLIT_BLOCK):
        if split.take():
            counts[i % 10] += 1
    assert all(abs(c - 2000) < 200 for c in counts), counts


def test_a_canary_answers_its_share_and_both_versions_are_reported_side_by_side(cluster, http):
    name = unique("canary")
    d = cluster.deploy(adder(name, 1))
    canary = cluster.deploy(adder(name, 100, fail_below=0), canary=0.2)
    assert canary.version > d.version
    seen = ys(d.url, range(SPLIT_BLOCK), http)  # one block: exactly its share
    assert seen == {1: 800, 100: 200}
    failed = ys(d.url, [-1] * SPLIT_BLOCK, http)  # the canary fails these, the served version does not
    assert failed == {1: 800, 500: 200}
    r = flow_doc(cluster, name)["rollout"]
    assert r["mode"] == "canary" and r["share"] == 0.2
    assert r["primary"]["version"] == d.version and r["candidate"]["version"] == canary.version
    assert (r["primary"]["requests"], r["primary"]["errors"]) == (1600, 0)
    assert (r["candidate"]["requests"], r["candidate"]["errors"], r["candidate"]["by_status"]) == (
        400,
        200,
        {"500": 200},
    )
    assert r["primary"]["p50_ms"] > 0 and r["candidate"]["p99_ms"] >= r["candidate"]["p50_ms"]
    listed = {f["name"]: f for f in http.get(f"{cluster.url}/flows").json()["flows"]}
    assert listed[name]["version"] == d.version and listed[name]["candidate"]["version"] == canary.version
    status = cluster.status()
    assert [f["rollout"]["mode"] for f in status["flows"] if f["name"] == name] == ["canary"]


def test_a_shadow_never_answers_and_its_differences_are_counted_per_column(cluster, http):
    name = unique("shadow")
    d = cluster.deploy(adder(name, 1))
    cluster.deploy(adder(name, 2), shadow=True)
    for x in range(40):
        assert http.post(d.url, json={"x": x}).json()["rows"][0]["y"] == x + 1  # the served version's answer
    rows = [{"x": x} for x in range(5)]
    assert list(d.invoke(rows)["y"]) == [1, 2, 3, 4, 5]  # Arrow, several rows: parsed here, not relayed
    r = wait_until(
        "the shadow's answers compared",
        lambda: (lambda r: r["differences"]["compared"] == 41 and r)(flow_doc(cluster, name)["rollout"]),
    )
    assert r["mode"] == "shadow" and r["candidate"]["requests"] == 41 and r["primary"]["requests"] == 41
    assert r["differences"]["differ"] == 41 and r["differences"]["columns"] == {"y": 41}  # z is alike: not counted


def test_promote_serves_the_candidate_and_ends_the_rollout(cluster, http):
    name = unique("promote")
    d = cluster.deploy(adder(name, 1))
    canary = cluster.deploy(adder(name, 100), canary=0.5)
    out = cluster.promote(name)
    assert out["promoted"] == {"version": canary.version, "replaced": d.version}
    assert ys(d.url, range(50), http) == {100: 50}
    doc = flow_doc(cluster, name)
    assert doc["version"] == canary.version and "rollout" not in doc
    assert cluster.kvs.redis.hget("flowserve:deployed", name) == str(canary.version).encode()  # registered
    with pytest.raises(RolloutStateError, match="no canary or shadow version to promote") as e:
        cluster.promote(name)
    assert e.value.status == 409
    history = http.get(f"{cluster.url}/flows/{name}/history").json()["history"]
    assert [(h["action"], h["version"]) for h in history] == [
        ("promote", canary.version),
        ("canary", canary.version),
        ("deploy", d.version),
    ]
    assert history[0]["replaced"] == d.version and history[0]["stats"]["candidate"]["version"] == canary.version


def test_rollback_drops_the_candidate_for_good(cluster, http):
    name = unique("rollback")
    d = cluster.deploy(adder(name, 1))
    canary = cluster.deploy(adder(name, 100), canary=0.5)
    out = cluster.rollback(name)["rolled_back"]
    # the served plan again, as a version newer than the dropped one: versions only move forward
    assert out["plan_of"] == d.version and out["dropped"] == canary.version and out["version"] > canary.version
    assert ys(d.url, range(50), http) == {1: 50}
    assert flow_doc(cluster, name)["version"] == out["version"]
    again = admin(cluster, "POST", "/admin/deploy", json={"flow": name, "version": canary.version, "canary": 0.5})
    assert again.status_code == 409 and again.json()["error"] == "DeployConflict"  # never served again
    plain = admin(cluster, "POST", "/admin/deploy", json={"flow": name, "version": canary.version})
    assert plain.status_code == 409 and plain.json()["error"] == "DeployConflict"
    history = http.get(f"{cluster.url}/flows/{name}/history").json()["history"]
    assert history[0]["action"] == "rollback" and history[0]["dropped"] == canary.version


def test_rollback_without_a_candidate_goes_back_to_the_version_before(cluster, http):
    name = unique("back")
    d1 = cluster.deploy(adder(name, 1))
    d2 = cluster.deploy(adder(name, 2))
    assert ys(d1.url, range(5), http) == {2: 5}
    out = d2.rollback()["rolled_back"]  # the Deployment's own: ClusterClient.rollback(name)
    assert out["plan_of"] == d1.version and out["replaced"] == d2.version and out["version"] > d2.version
    assert ys(d1.url, range(5), http) == {1: 5}
    first = unique("first")
    cluster.deploy(adder(first, 1))
    with pytest.raises(RolloutStateError, match="nothing to roll back to"):
        cluster.rollback(first)


def test_promote_and_rollback_from_the_command_line(cluster, http, tmp_path):
    name = unique("cli")
    d = cluster.deploy(adder(name, 1))
    cluster.deploy(adder(name, 100), canary=0.3)
    cli = [sys.executable, "-m", "flowserve.cli", "--dir", str(cluster.dir)]
    st = subprocess.run([*cli, "status"], capture_output=True, text=True, timeout=60)
    assert st.returncode == 0 and "canary v" in st.stdout and "30.0% of requests" in st.stdout
    r = subprocess.run([*cli, "promote", name], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "promoted" in r.stdout, r.stderr
    assert ys(d.url, range(10), http) == {100: 10}
    r = subprocess.run([*cli, "rollback", name], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "rolled back to the plan of" in r.stdout, r.stderr
    assert ys(d.url, range(10), http) == {1: 10}
    r = subprocess.run([*cli, "promote", name], capture_output=True, text=True, timeout=60)
    assert r.returncode == 1 and "RolloutStateError" not in r.stdout and "no canary or shadow" in r.stderr


@pytest.mark.parametrize(
    "kwargs, body, message",
    [
        ({"canary": 1.5}, {"canary": 1.5}, "canary must be the share of requests the new version answers"),
        ({"canary": "a lot"}, {"canary": "a lot"}, "canary must be the share"),
        ({"canary": 0.1, "shadow": True}, {"canary": 0.1, "shadow": True}, "not both"),
        ({"shadow": "yes"}, {"shadow": "yes"}, "shadow must be true or false"),
    ],
)
def test_a_bad_canary_or_shadow_is_refused_alike_on_every_path(cluster, kwargs, body, message):
    name = unique("bad")
    d = cluster.deploy(adder(name, 1))
    before = cluster.kvs.redis.get(f"flowserve:version:{name}")
    with pytest.raises(BadRequestError, match=message):
        cluster.deploy(adder(name, 2), **kwargs)
    assert cluster.kvs.redis.get(f"flowserve:version:{name}") == before  # refused before a version was made
    r = admin(cluster, "POST", "/admin/deploy", json={"flow": name, "version": d.version + 1, **body})
    assert r.status_code == 400 and r.json()["error"] == "BadRequestError" and message in r.json()["message"]


def test_a_canary_needs_a_served_version_with_the_same_input(cluster):
    with pytest.raises(FlowError, match="no served version of flow") as e:
        cluster.deploy(adder(unique("alone"), 1), canary=0.1)
    assert e.value.status == 404
    name = unique("schema")
    cluster.deploy(adder(name, 1))
    other = Flow(name, schema={"x": float})
    other.map(lambda r: r.x, names=["y"])
    with pytest.raises(BadRequestError, match="must take the same input") as e:
        cluster.deploy(other, canary=0.1)
    assert "x: float" in str(e.value) and "x: int" in str(e.value)
    cluster.deploy(adder(name, 2), canary=0.1)
    with pytest.raises(RolloutStateError, match="in progress"):
        cluster.deploy(adder(name, 3), shadow=True)


def test_a_new_deploy_ends_a_canary_and_an_undeploy_ends_its_candidate(cluster, http):
    name = unique("ended")
    d = cluster.deploy(adder(name, 1))
    cluster.deploy(adder(name, 100), canary=0.5)
    d3 = cluster.deploy(adder(name, 3))
    assert "rollout" not in flow_doc(cluster, name) and ys(d.url, range(20), http) == {3: 20}
    assert cluster.kvs.redis.hget("flowserve:rollout", name) is None  # the record is over too
    cluster.deploy(adder(name, 4), shadow=True)
    d3.undeploy()
    assert http.get(f"{cluster.url}/flows/{name}").status_code == 404
    assert cluster.kvs.redis.hget("flowserve:rollout", name) is None
