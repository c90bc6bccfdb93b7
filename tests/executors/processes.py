"""Runtime processes started the way a Kubernetes pod starts them, for tests: executors
(``python -m executors.worker.executor``, KVS URL from the environment, registering themselves)
and standalone gateways (``python -m executors.hosts.standalone --membership kvs``)."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import threading
import time

import httpx

from kvs.server import free_port, popen, terminate

ADMIN = "admin-token-for-tests"
HEARTBEAT_S = 0.2  # registrations expire after 0.6 s: departures show quickly


class Procs:
    """The processes a test starts; all stopped at its end."""

    def __init__(self, redis_url: str, logdir, admin_token: str = ADMIN, env: dict | None = None):
        self.redis_url, self.logdir, self.admin_token = redis_url, logdir, admin_token
        self.env = env or {}  # for every process, e.g. the cluster key a pod gets from its Secret
        self.procs: list[subprocess.Popen] = []

    def _start(self, name: str, cmd: list[str], env: dict | None = None) -> subprocess.Popen:
        log = open(self.logdir / f"{name}.log", "ab")
        full_env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path), **self.env, **(env or {}))
        proc = popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=full_env)
        log.close()
        self.procs.append(proc)
        return proc

    def executor(self, id_: str) -> subprocess.Popen:
        return self._start(
            id_,
            [
                sys.executable,
                "-m",
                "executors.worker.executor",
                "--id",
                id_,
                "--address",
                f"tcp://127.0.0.1:{free_port()}",
                "--threads",
                "2",
                "--heartbeat-s",
                str(HEARTBEAT_S),
            ],
            env={"FLOWSERVE_KVS_URL": self.redis_url},
        )  # the URL from the environment, as in a pod

    def gateway(self, name: str, *extra: str) -> str:
        port = free_port()
        self._start(
            name,
            [
                sys.executable,
                "-m",
                "executors.hosts.standalone",
                "--port",
                str(port),
                "--address",
                f"tcp://127.0.0.1:{free_port()}",
                "--membership",
                "kvs",
                "--poll-s",
                "0.1",
                *extra,
            ],
            env={"FLOWSERVE_ADMIN_TOKEN": self.admin_token, "FLOWSERVE_KVS_URL": self.redis_url},
        )
        return f"http://127.0.0.1:{port}"

    def stop(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.terminate()
        for p in self.procs:
            terminate(p, 10)


def wait_until(what: str, cond, timeout: float = 30.0):
    """A bounded poll of the system's own state (membership is periodic by design)."""
    deadline = time.monotonic() + timeout
    while True:
        value = cond()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def health(url: str) -> dict:
    try:
        return httpx.get(f"{url}/healthz", timeout=2).json()
    except httpx.HTTPError:
        return {}


@contextlib.contextmanager
def steady_load(url: str, body: dict, clients: int = 6):
    """Closed-loop clients POSTing ``body`` to ``url`` until the block ends; yields the
    list that collects the text of every non-200 answer."""
    stop, failures = threading.Event(), []

    def client():
        with httpx.Client(timeout=30) as http:
            while not stop.is_set():
                r = http.post(url, json=body)
                if r.status_code != 200:
                    failures.append(r.text)

    threads = [threading.Thread(target=client) for _ in range(clients)]
    for t in threads:
        t.start()
    try:
        yield failures
    finally:
        stop.set()
        for t in threads:
            t.join(30)
