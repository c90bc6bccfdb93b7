"""One auth rule, checked route by route over the gateway's own OpenAPI document: with a
token, every route but the probes (/livez, /healthz, /readyz, /readyz/{flow}: the operations the document
declares public) needs it (or the admin token); admin routes need the admin token; errors are the JSON error
format, 404 and 405 included."""

from __future__ import annotations

import httpx
import pytest

from executors.hosts.cluster import LocalCluster
from executors.hosts.cluster_config import ClusterConfig
from flow import Flow

TOKEN = "user-token-for-tests"


@pytest.fixture(scope="module")
def secured():
    with LocalCluster(ClusterConfig(executors=1, token=TOKEN)) as c:
        f = Flow("guarded", schema={"x": int})
        f.map(lambda r: r.x + 1, names=["y"])
        c.deploy(f)
        yield c


def _routes(c) -> list[tuple[str, str, bool]]:
    """(method, path, public) of each operation: public where the document declares that it
    needs no security (``security: []``)."""
    doc = httpx.get(c.url + "/openapi.json", headers={"Authorization": f"Bearer {TOKEN}"}).json()
    return [
        (method.upper(), path, op.get("security") == [])
        for path, ops in doc["paths"].items()
        for method, op in ops.items()
    ]


def _call(c, method, path, token=None):
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    return httpx.request(method, c.url + path, headers=headers, json={"x": 1} if method == "POST" else None, timeout=30)


def test_every_route_but_the_probes_needs_the_token(secured):
    routes = _routes(secured)
    assert {(m, p) for m, p, _ in routes} >= {("POST", "/flows/guarded"), ("GET", "/metrics")} and len(routes) >= 6
    assert {p for _, p, public in routes if public} == {"/livez", "/healthz", "/readyz", "/readyz/guarded"}
    for method, path, public in routes:
        without = _call(secured, method, path)
        wrong = _call(secured, method, path, "not-the-token")
        right = _call(secured, method, path, TOKEN)
        admin = _call(secured, method, path, secured.state["admin_token"])
        if public:  # the probes
            assert without.status_code == 200, (method, path)
            continue
        for r in (without, wrong):
            assert r.status_code == 401, (method, path, r.status_code)
            assert r.json()["error"] == "Unauthorized"
        assert right.status_code == 200, (method, path, right.text)
        assert admin.status_code == 200, (method, path, admin.text)


def test_admin_routes_need_the_admin_token(secured):
    for method, path in (("POST", "/admin/deploy"), ("DELETE", "/admin/flows/guarded")):
        r = _call(secured, method, path, TOKEN)
        assert r.status_code == 401 and r.json()["error"] == "Unauthorized", (method, path)


def test_404_and_405_are_json_errors(secured):
    r = _call(secured, "GET", "/no/such/route", TOKEN)
    assert r.status_code == 404 and r.json()["error"] == "NotFound" and "/no/such/route" in r.json()["message"]
    r = _call(secured, "PUT", "/flows", TOKEN)
    assert r.status_code == 405 and r.json()["error"] == "MethodNotAllowed"


def test_metrics_may_be_public():
    with LocalCluster(ClusterConfig(executors=1, token=TOKEN, public_metrics=True)) as c:
        assert httpx.get(c.url + "/metrics").status_code == 200
        assert httpx.get(c.url + "/flows").status_code == 401
