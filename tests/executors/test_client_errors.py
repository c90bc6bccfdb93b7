"""The Python client raises the class of the tree the server named (executors/errors.py
``error_for_answer``), so a caller catches the branch it acts on: real answers of a real
LocalCluster, not scripted ones."""

from __future__ import annotations

import signal
import threading

import httpx
import pytest

import flowserve as fs
from executors.hosts.cluster import ClusterClient, LocalCluster
from executors.hosts.cluster_config import ClusterConfig
from flow import Flow
from kvs.server import free_port
from tests.executors.conftest import unique
from tests.executors.processes import wait_until


def slow(row):
    import time

    time.sleep(1.0)  # the operator's own work, longer than the flow's 0.3 s deadline
    return row.x


def double(row):
    return row.x * 2


def test_a_real_504_is_a_deadline_exceeded_error(cluster):
    f = Flow(unique("late"), schema={"x": int})
    f.map(slow, names=["y"])
    d = cluster.deploy(f, timeout_s=0.3)  # the gateway's deadline for its requests
    with pytest.raises(fs.DeadlineExceededError) as e:
        d.invoke({"x": 1})
    error = e.value
    assert type(error) is fs.OperatorTimeoutError and error.status == 504 and error.operator == "slow"
    assert error.body["error"] == "OperatorTimeoutError" and "deadline" in str(error)
    assert not isinstance(error, fs.RetryableError)  # the same call would run out of time again
    assert isinstance(error, fs.FlowError)


def test_a_real_400_is_a_request_error_naming_the_column(cluster):
    f = Flow(unique("typed"), schema={"x": int})
    f.map(double, names=["y"])
    d = cluster.deploy(f)
    with pytest.raises(fs.DataError) as e:  # fix the request
        d.invoke({"z": 1})
    assert e.value.status == 400 and "'x'" in str(e.value)
    assert type(e.value).__name__ == e.value.body["error"]  # the very class the gateway named
    assert not isinstance(e.value, fs.RetryableError)


def blocked(row):
    """Holds its request in flight until the test creates the file the row names."""
    import os
    import time

    while not os.path.exists(row.release):
        time.sleep(0.01)
    return row.x


def test_a_real_503_during_a_graceful_stop_is_retryable(tmp_path):
    release = tmp_path / "release"
    c = LocalCluster(ClusterConfig(executors=1)).start()
    try:
        held = Flow("held", schema={"x": int, "release": str})
        held.map(blocked, names=["y"])
        d_held = c.deploy(held)
        quick = Flow("quick", schema={"x": int})
        quick.map(double, names=["y"])
        d = c.deploy(quick)
        answers: dict = {}
        t = threading.Thread(target=lambda: answers.update(r=d_held.invoke({"x": 1, "release": str(release)})))
        t.start()
        wait_until("the held request in flight", lambda: httpx.get(c.url + "/healthz").json()["inflight"])
        c.proc.send_signal(signal.SIGTERM)  # a graceful stop: drains the held request, refuses new ones
        wait_until("the gateway draining", lambda: httpx.post(d.url, json={"x": 1}).status_code == 503)
        with pytest.raises(fs.RetryableError) as e:
            d.invoke({"x": 2})
        assert type(e.value) is fs.UnavailableError and e.value.status == 503
        assert e.value.body["error"] == "ShuttingDown" and "retry" in str(e.value)
        release.touch()
        t.join(30)
        assert answers["r"].column("y").to_list() == [1]  # the one in flight was answered
    finally:
        release.touch()
        c.stop()


def test_a_connection_refused_is_unreachable():
    port = free_port()  # nothing listens there
    client = ClusterClient(f"http://127.0.0.1:{port}", "redis://127.0.0.1:1/0", admin_token="x")
    with pytest.raises(fs.UnreachableError) as e:
        client.status()
    assert isinstance(e.value, fs.RetryableError) and f"127.0.0.1:{port}" in str(e.value)
    assert isinstance(e.value.__cause__, httpx.ConnectError)
