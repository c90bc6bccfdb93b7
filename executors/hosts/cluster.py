"""The user's side of a local cluster: start or find one, deploy flows, call them.

    cluster = LocalCluster().start()          # or LocalCluster.connect(dir) for `flowserve up`
    d = cluster.deploy(flow)                  # optimized plan, built on the executors
    d.invoke([{"x": 1}])                      # HTTP under the hood; returns a Table
    d.undeploy(); cluster.stop()

``flow.deploy()`` uses a process-wide embedded cluster started on first use (or the
`flowserve up` cluster when one is running in the default directory).
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import functools
import importlib.metadata
import inspect
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import cloudpickle
import httpx
import numpy as np

from executors.codec.bodies import ARROW
from executors.errors import ClusterNotOwnedError, ClusterStartError, DeployConflictError, error_for_answer
from executors.gateway.streaming import NDJSON
from executors.hosts.cluster_config import CONFIG_ENV, STARTING_FILE, STATE_FILE, ClusterConfig
from executors.plans import PLAN_KEY, next_version
from flow.errors import DeadlineExceededError, FlowError, UnreachableError
from flow.flow import as_rows
from flow.table import Table
from kvs import KVS
from kvs.errors import StoreWriteError
from kvs.redact import redact_url
from kvs.server import popen, terminate

DEFAULT_DIR = Path(os.environ.get("FLOWSERVE_HOME", Path.home() / ".flowserve"))


def _progress(msg: str) -> None:
    if os.environ.get("FLOWSERVE_QUIET") != "1":
        print(f"[flowserve] {msg}", file=sys.stderr, flush=True)


class _Starting:
    """A starting cluster's progress on a long step, as its supervisor writes it
    (STARTING_FILE): each new report moves the start's deadline on; one in SAY_S is said."""

    SAY_S = 5.0

    def __init__(self, path: Path):
        self.path = path
        self.seen: dict | None = None
        self.said_at = 0.0

    def moved(self) -> bool:
        """True when a new report says the step got further (a higher percentage), or
        the step it reported on is over (its report gone). A store that answers while its
        load stands still does not move the deadline."""
        try:
            report = json.loads(self.path.read_text())
        except FileNotFoundError:  # none (the usual start), or the step is over
            if self.seen is None or self.seen.get("over"):
                return False
            self.seen = {**self.seen, "over": True}
            return True
        except (OSError, ValueError):  # being replaced
            return False
        if not isinstance(report, dict) or report == self.seen:
            return False
        further = self.seen is None or report.get("percent", 0) > self.seen.get("percent", 0)
        self.seen = report
        now = time.monotonic()
        if now - self.said_at >= self.SAY_S:
            self.said_at = now
            _progress(self._said(report))
        return further

    def last(self) -> str:
        return "" if self.seen is None else f" (last: {self._said(self.seen)})"

    @staticmethod
    def _said(report: dict) -> str:
        return (
            f"{report.get('step', 'starting')}: {report.get('percent', 0):.0f}% after "
            f"{report.get('elapsed_s', 0):.0f} s, about {report.get('eta_s', '?')} s left"
        )


class ClusterClient:
    """The client side of a running cluster, wherever it runs: deploy flows, call them,
    read its status. Needs the gateway's URL, the KVS URL (plans are registered there)
    and the admin token; ``LocalCluster`` fills them in from the cluster it starts, a
    Kubernetes deploy from its Secrets and Services.

        c = ClusterClient("http://gateway:8000", "redis://:pw@kvs:6379/0", admin_token="...")
        c.deploy(flow).invoke({"x": 1})
    """

    def __init__(
        self,
        url: str,
        kvs_url: str,
        admin_token: str,
        token: str | None = None,
        *,
        cluster_key: str | None = None,
        config: ClusterConfig | None = None,
        load_timeout_s: float | None = None,
        request_timeout_s: float | None = None,
    ):
        config = config or ClusterConfig()  # only its timeouts matter here
        timeouts = {
            k: v
            for k, v in (("load_timeout_s", load_timeout_s), ("request_timeout_s", request_timeout_s))
            if v is not None
        }
        self.config = dataclasses.replace(config, **timeouts) if timeouts else config
        self.state: dict = {
            "url": url.rstrip("/"),
            "kvs_url": kvs_url,
            "admin_token": admin_token,
            "token": token,
            "cluster_key": cluster_key,
        }
        self._kvs: KVS | None = None
        self._http: httpx.Client | None = None

    def close(self) -> None:
        if self._http is not None:
            self._http.close()
            self._http = None
        if self._kvs is not None:
            self._kvs.close()
            self._kvs = None

    # -- access -----------------------------------------------------------------------------

    @property
    def url(self) -> str:
        return self.state["url"]

    @property
    def kvs(self) -> KVS:
        """A client of the cluster's key-value store (put lookup data here)."""
        if self._kvs is None:
            key = self.state.get("cluster_key")  # plans are signed with it (kvs.serialization)
            self._kvs = KVS.from_url(self.state["kvs_url"], signing_key=bytes.fromhex(key) if key else None)
        return self._kvs

    @property
    def http(self) -> httpx.Client:
        if self._http is None:
            headers = {"Authorization": f"Bearer {self.state['token']}"} if self.state.get("token") else {}
            self._http = httpx.Client(base_url=self.url, headers=headers, timeout=60)
        return self._http

    def request(
        self,
        method: str,
        path: str,
        what: str,
        *,
        failed: str | None = None,
        check: bool = True,
        idempotent: bool = False,
        **kwargs,
    ) -> httpx.Response:
        """An HTTP call to the gateway, its failures raised as the tree's classes: a
        connection refused, reset or cut is an ``UnreachableError`` (retry; a call that was
        sent may have run), no answer within the client's timeout a ``DeadlineExceededError``,
        and with ``check`` an answer other than 200 the class its body names, with ``.status``
        and ``.body`` (``errors.error_for_answer``). ``what`` starts the messages (``"flow
        'f'"``); ``failed``, an error answer's (``{status}`` is filled in; default ``"<what>
        failed ({status})"``).

        ``idempotent``: the call may run twice (an invocation: flows are pure), so an
        ``UnreachableError`` is retried once, on a new connection, with the same
        ``X-Request-Id`` (the caller's, else a new one): a gateway killed with the call in
        flight drops its connections, and with several gateways on one address the retry
        lands on a live one."""
        if not idempotent:
            return self._request_once(method, path, what, failed, check, kwargs)
        headers = dict(kwargs.pop("headers", None) or {})
        if not any(k.lower() == "x-request-id" for k in headers):
            headers["X-Request-Id"] = uuid.uuid4().hex[:16]
        kwargs["headers"] = headers
        try:
            return self._request_once(method, path, what, failed, check, kwargs)
        except UnreachableError:
            return self._request_once(method, path, what, failed, check, kwargs)

    def _request_once(self, method: str, path: str, what: str, failed, check: bool, kwargs: dict) -> httpx.Response:
        try:
            r = self.http.request(method, path, **kwargs)
        except (httpx.ConnectTimeout, httpx.PoolTimeout) as e:  # never got a connection
            raise UnreachableError(f"{what}: the gateway at {self.url} did not answer ({e})", url=self.url) from e
        except httpx.TimeoutException as e:  # sent, no answer in time: the call's deadline passed
            raise DeadlineExceededError(
                f"{what}: no answer within the client's timeout ({type(e).__name__})", url=self.url
            ) from e
        except httpx.TransportError as e:  # refused, reset, cut mid-answer
            raise UnreachableError(
                f"{what}: the connection to {self.url} failed ({type(e).__name__}: {e})", url=self.url
            ) from e
        if check and r.status_code != 200:
            raise answer_error(r, failed or f"{what} failed ({{status}})")
        return r

    def status(self) -> dict:
        flows = self.request("GET", "/flows", "listing the flows").json()["flows"]
        out = {"url": self.url, "health": self.request("GET", "/healthz", "reading /healthz").json(), "flows": []}
        for f in flows:
            what = f"reading flow {f['name']!r}"
            r = self.request("GET", f"/flows/{f['name']}", what, check=False)
            if r.status_code == 404:
                continue  # undeployed since it was listed
            if r.status_code != 200:
                raise answer_error(r, f"{what} failed ({{status}})")
            out["flows"].append(r.json())
        return out

    # -- deploy -------------------------------------------------------------------------------

    def deploy(
        self,
        flow,
        *,
        optimize: bool = True,
        rules=None,
        options=None,
        timeout_s: float | None = None,
        slo=None,
        canary: float | None = None,
        shadow: bool = False,
        autoscaling=None,
        **serving,
    ) -> Deployment:
        """Optimize ``flow``, register its plan and build its stages on the executors.
        ``timeout_s``: this flow's deadline (default: the cluster's ``request_timeout_s``;
        at most its ``max_request_timeout_s``). ``autoscaling``: an ``AutoscalingConfig``
        (or a mapping of its fields) scaling this flow's stages (default: the cluster's
        ``ClusterConfig.autoscaling``, if any).

        ``canary=0.1`` serves the new version beside the served one, answering that share
        of the requests; ``shadow=True`` mirrors every request to it and compares the
        answers, returning only the served version's. Both versions' figures are in
        ``status()``; ``promote(name)`` makes the new version the served one,
        ``rollback(name)`` drops it (executors/gateway/rollouts.py).

        ``slo=SLO(p99_ms=50)`` serves it under a latency objective (executors/hosts/profiling.py):
        ``traffic=`` (req/s, or arrival ms), ``samples=`` (rows to profile on), ``profile=``,
        ``planner=PlannerOptions(...)``. Raises ``DeployConflictError`` (409) when a
        concurrent deploy of the same name with a newer version won: that one is served;
        for another failed deploy the class the gateway named (``DeployError``: building the
        stages failed; ``NoExecutorError``, ``UnavailableError``: retry; ...)."""
        from executors.gateway.rollouts import rollout_mode
        from optimizer import Plan

        rollout = rollout_mode(canary, shadow)  # a bad value is refused before a version is made
        if optimize:
            from optimizer import optimize as run_optimizer

            plan = run_optimizer(flow, rules=rules, options=options)
        else:
            plan = Plan.from_flow(flow)
        if timeout_s is not None:
            plan = plan.with_timeout(timeout_s)
        if autoscaling is not None:
            from executors.hosts.autoscale import AutoscalingConfig
            from flow.configuration import Nested, check_value

            config = check_value(autoscaling, "deploy(autoscaling=...)", Nested(AutoscalingConfig, accept_mapping=True))
            plan = plan.with_autoscaling(config)
        if slo is not None or serving:
            from executors.hosts.profiling import plan_for_deploy

            plan = plan_for_deploy(self.kvs, plan, slo, **serving)
        _register_by_value(plan)
        try:
            # with the client's retries: a failover of the store is waited out, not raised
            version = self.kvs.call(lambda r: next_version(r, flow.name), "the version counter")
            self.kvs.put_trusted(PLAN_KEY.format(flow=flow.name, version=version), plan)
        except StoreWriteError as e:
            raise StoreWriteError(f"deploying flow {flow.name!r} failed: {e}") from None
        how = (
            "" if rollout is None else f" as a canary ({rollout[1]:.1%})" if rollout[0] == "canary" else " as a shadow"
        )
        _progress(
            f"deploying flow {flow.name!r} v{version}{how} "
            f"({len(plan.stages)} stage{'s' if len(plan.stages) != 1 else ''})"
        )
        doc: dict = {"flow": flow.name, "version": version}
        if rollout is not None:
            doc[rollout[0]] = rollout[1] if rollout[0] == "canary" else True
        try:
            self.request(
                "POST",
                "/admin/deploy",
                f"deploying flow {flow.name!r}",
                json=doc,
                headers={"Authorization": f"Bearer {self.state['admin_token']}"},
                timeout=self.config.load_timeout_s + 30,
            )
        except DeployConflictError as e:
            e.version = version  # this deploy's; ``winner`` is the one served
            raise
        return Deployment(self, flow.name, plan, version)

    def undeploy(self, name: str) -> None:
        httpx.delete(f"{self.url}/admin/flows/{name}", headers={"Authorization": f"Bearer {self.state['admin_token']}"})

    def promote(self, name: str) -> dict:
        """Make flow ``name``'s canary or shadow version the served one; returns the flow as
        the gateway describes it, with ``promoted``: ``{"version", "replaced"}``. Raises
        ``RolloutStateError`` when none is in progress."""
        return self._admin(name, "promote", f"promoting flow {name!r}")

    def rollback(self, name: str) -> dict:
        """Roll flow ``name`` back: drop its canary or shadow version if one is in progress,
        else go back to the version before the served one. Either way the older plan serves
        as a new version (versions only move forward); returns the flow with
        ``rolled_back``: ``{"version", "plan_of", "replaced", "dropped"?}``. Raises
        ``RolloutStateError`` when there is nothing to roll back to."""
        return self._admin(name, "rollback", f"rolling back flow {name!r}")

    def _admin(self, name: str, action: str, what: str) -> dict:
        return self.request(
            "POST",
            f"/admin/flows/{name}/{action}",
            what,
            headers={"Authorization": f"Bearer {self.state['admin_token']}"},
            timeout=self.config.load_timeout_s + 30,
        ).json()


def answer_error(r: httpx.Response, failed: str) -> FlowError:
    """The exception for an error answer: the class of the tree its body names, with
    ``.status`` and ``.body``; the message is ``failed`` (its ``{status}`` filled in) and
    the server's message."""
    try:
        body = r.json()
    except ValueError:
        body = None
    if not isinstance(body, dict):
        body = {"message": r.text}
    return error_for_answer(r.status_code, body, f"{failed.format(status=r.status_code)}: {body.get('message')}")


class LocalCluster(ClusterClient):
    """A local cluster: KVS server, gateway and executor processes on this machine."""

    def __init__(self, config: ClusterConfig | None = None, *, detached: bool = False):
        self.config = config or ClusterConfig()
        self.detached = detached  # True: outlives this process (flowserve up)
        self.dir: Path | None = Path(self.config.dir) if self.config.dir else None
        self._owns_dir = False
        self.proc: subprocess.Popen | None = None
        self.state: dict = {}
        self._kvs: KVS | None = None
        self._http: httpx.Client | None = None

    # -- lifecycle ------------------------------------------------------------------------

    def start(self, timeout: float = 120.0) -> LocalCluster:
        """Start the cluster's processes; returns once it serves. ``timeout``: seconds the
        start may go without progress: a store with persistence reads its data back first
        (seconds a GB), and while it reports progress (said every 5 s) the start waits."""
        if self.dir is None:
            self.dir = Path(tempfile.mkdtemp(prefix="flowserve-"))
            self._owns_dir = True
        self.dir.mkdir(parents=True, exist_ok=True)
        (self.dir / STATE_FILE).unlink(missing_ok=True)
        (self.dir / STARTING_FILE).unlink(missing_ok=True)  # a crashed start's last report
        store = "" if self.config.kvs_url is None else f" on the store at {redact_url(self.config.kvs_url)}"
        _progress(f"starting local cluster ({self.config.executors} executors) in {self.dir}{store}")
        t0 = time.monotonic()
        cmd = [sys.executable, "-m", "executors.hosts.supervisor", "--dir", str(self.dir)]
        env = dict(os.environ)
        # the config may hold the cluster's token: the environment (this user's only), not argv
        env[CONFIG_ENV] = json.dumps(self.config.to_json())
        # executors unpickle user functions by reference: give them the caller's import path
        env["PYTHONPATH"] = os.pathsep.join(p for p in [os.getcwd(), *sys.path] if p)
        log = open(self.dir / "daemon.out", "ab")
        self.proc = popen(
            cmd,
            die_with_parent=not self.detached,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
        )
        log.close()
        state_file = self.dir / STATE_FILE
        starting = _Starting(self.dir / STARTING_FILE)
        deadline = t0 + timeout
        while not state_file.exists():
            if self.proc.poll() is not None:
                raise ClusterStartError(f"the local cluster exited with {self.proc.returncode}:\n{self._log_tail()}")
            if starting.moved():  # a long step that moves on (a big store loading): no time limit
                deadline = time.monotonic() + timeout
            if time.monotonic() > deadline:
                self.stop()
                raise ClusterStartError(
                    f"the local cluster did not start within {timeout:.0f} s{starting.last()}:\n{self._log_tail()}"
                )
            time.sleep(0.05)
        self.state = json.loads(state_file.read_text())
        if not self.detached:
            atexit.register(self.stop)
        _progress(f"local cluster ready at {self.url} in {time.monotonic() - t0:.1f} s")
        return self

    @classmethod
    def connect(cls, dir_: str | os.PathLike = DEFAULT_DIR) -> LocalCluster:
        """Attach to a running cluster (e.g. `flowserve up`) by its directory."""
        state_file = Path(dir_) / STATE_FILE
        if not state_file.exists():
            raise ClusterStartError(f"no cluster is running in {dir_} (start one with `flowserve up`)")
        c = cls(ClusterConfig(dir=str(dir_)))
        c.state = json.loads(state_file.read_text())
        try:
            c.http.get("/healthz", timeout=5).raise_for_status()
        except httpx.HTTPError as e:
            raise ClusterStartError(f"the cluster in {dir_} does not answer at {c.url}: {e}") from None
        return c

    @property
    def owned(self) -> bool:
        """Whether this process started the cluster (``start()``), as opposed to connecting to
        one that runs for others (``connect()``: the `flowserve up` cluster)."""
        return self.proc is not None

    def stop(self, timeout: float = 60.0, *, force: bool = False) -> None:
        """Stop the cluster gracefully (in-flight requests finish), then remove its files.
        Returns once its processes are gone.

        Only a cluster this process started: ``stop()`` of one it connected to (what
        ``default_cluster()`` returns while `flowserve up` runs) raises
        ``ClusterNotOwnedError`` and leaves it serving, unless ``force=True``
        (`flowserve down`). ``release()`` stops a cluster only if this process started it."""
        if not self.owned and self.state.get("pid") and not force:
            self.close()
            raise ClusterNotOwnedError(
                f"not stopping the cluster at {self.url}: this process did not start it (it runs for others "
                f"from {self.dir}); `flowserve down` stops it, or stop(force=True); release() lets go of it"
            )
        self.close()
        if self.proc is not None:
            terminate(self.proc, timeout)
            self.proc = None
        elif self.state.get("pid"):
            _stop_supervisor(self.state["pid"], timeout)
        if self._owns_dir and self.dir is not None:
            shutil.rmtree(self.dir, ignore_errors=True)
        self.state = {}

    def release(self, timeout: float = 60.0) -> None:
        """Let go of the cluster: stop it if this process started it (``stop()``), else only
        close this process's connections to it, leaving it serving.

            cluster = fs.default_cluster()
            try: ...
            finally: cluster.release()    # never stops the `flowserve up` cluster
        """
        if self.owned:
            self.stop(timeout)
        else:
            self.close()

    def _log_tail(self, n: int = 40) -> str:
        lines = []
        for name in ("daemon.out", "cluster.log"):
            p = self.dir / name
            if p.exists():
                lines += p.read_text(errors="replace").splitlines()[-n:]
        return "\n".join(lines)

    def __enter__(self) -> LocalCluster:
        return self if self.state else self.start()

    def __exit__(self, *exc) -> None:
        self.release()


def _stop_supervisor(pid: int, timeout: float) -> None:
    """SIGTERM a cluster's supervisor (not our child: `flowserve up` started it) and wait
    until it has exited; it exits only after its gateway, executors and store have. SIGKILL
    after ``timeout`` (its children then die with it: they are bound to its life)."""
    if not _is_supervisor(pid):
        return  # gone already (its pid may be another process's by now)
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + timeout
    while _is_supervisor(pid):
        if time.monotonic() > deadline:
            _progress(f"the cluster (pid {pid}) did not stop within {timeout:.0f} s; killing it")
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            deadline = float("inf")
        time.sleep(0.05)


def _is_supervisor(pid: int) -> bool:
    """Whether ``pid`` is a running cluster supervisor (``python -m executors.hosts.supervisor``)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            cmdline = f.read()
        with open(f"/proc/{pid}/stat", "rb") as f:
            state = f.read().rsplit(b")", 1)[1].split()[0]
    except OSError:
        return False
    return state != b"Z" and b"executors.hosts.supervisor" in cmdline


def _register_by_value(plan) -> None:
    """Ship user code from scripts and test modules inside the plan (not by import path),
    so executors need not import the user's files; installed packages stay by reference.

    Not only the operators' own modules: a class's bases and the functions and classes an
    operator's code names can come from the user's helper modules too (examples/models.py
    under a script run by `flowserve deploy`, whose cluster was started elsewhere)."""
    for stage in plan.stages.values():
        for node in stage.nodes:
            for fn in _callables(node.op):
                for mod in _user_modules(fn):
                    try:
                        cloudpickle.register_pickle_by_value(mod)
                    except ValueError:
                        pass


_RUNTIME_PACKAGES = ("flowserve", "flow", "optimizer", "executors", "kvs", "k8s")


def _user_modules(fn) -> list:
    """Importable user modules (not installed packages, not the stdlib, not FlowServe's
    own) that ``fn`` comes from or names: its module, its bases' modules for a class, and
    the modules of the globals its code (or its methods' code) reads."""
    seen: dict[str, object] = {}

    def consider(name: str | None) -> None:
        mod = sys.modules.get(name or "")
        if mod is None or mod.__name__ == "__main__" or mod.__name__ in seen:
            return
        path = getattr(mod, "__file__", None) or ""
        top = mod.__name__.split(".")[0]
        if (
            not path
            or "site-packages" in path
            or path.startswith(sys.base_prefix)
            or top in _RUNTIME_PACKAGES
            # installed elsewhere (pip --target, a folder on PYTHONPATH); not the user's own files
            or (top in _installed_packages() and not path.startswith(os.getcwd() + os.sep))
        ):
            return
        seen[mod.__name__] = mod

    functions = []
    for cls in fn.__mro__ if isinstance(fn, type) else ():
        consider(cls.__module__)
        functions += [v for v in vars(cls).values() if callable(v) and hasattr(v, "__code__")]
    consider(getattr(fn, "__module__", None))
    if hasattr(fn, "__code__"):
        functions.append(fn)
    for f in functions:
        for name in f.__code__.co_names:
            ref = f.__globals__.get(name)
            if ref is None:
                continue
            consider(ref.__name__ if inspect.ismodule(ref) else getattr(ref, "__module__", None))
    return list(seen.values())


@functools.lru_cache(maxsize=1)
def _installed_packages() -> frozenset[str]:
    """Top-level names of installed distributions: the executors import these themselves,
    so they are never shipped by value (torch pickled by value would recurse for ever)."""
    try:
        return frozenset(importlib.metadata.packages_distributions())
    except Exception:  # a broken distribution's metadata must not stop a deploy
        return frozenset()


def _callables(op):
    for attr in ("fn", "init", "pred", "valid"):
        v = getattr(op, attr, None)
        if callable(v):
            yield v
    yield from getattr(op, "alternatives", ()) or ()
    yield from getattr(op, "models", ()) or ()  # select (flow/prediction.py)
    anyof = getattr(op, "anyof", None)
    if anyof is not None:
        yield from _callables(anyof)


@dataclass(frozen=True)
class Answer:
    """A deployed flow's output, and the qids the gateway gave the input rows (in order)."""

    table: Table
    input_qids: np.ndarray


class Deployment:
    """A deployed flow: ``.url`` to POST to, ``.invoke(rows)`` from Python, ``.explain()``."""

    def __init__(self, cluster: ClusterClient, name: str, plan, version: int | None = None):
        self.cluster = cluster
        self.name = name
        self.plan = plan
        self.version = version  # as the gateway serves it (GET /flows shows it too)

    @property
    def url(self) -> str:
        return f"{self.cluster.url}/flows/{self.name}"

    def explain(self) -> str:
        """The deployed plan, with the replicas each stage was placed on (as ``GET
        /flows/{name}`` and ``flowserve status`` show them)."""
        try:
            r = self.cluster.http.get(f"/flows/{self.name}", timeout=10)
            if r.status_code == 200:
                return r.json()["explain"]
        except (httpx.HTTPError, ValueError, KeyError):
            pass  # the plan as optimized still explains it, without the placement
        return self.plan.explain()

    def invoke(self, rows, timeout: float | None = None, stream: bool = False):
        """Run the flow on rows (dict, list of dicts, DataFrame, Table) over HTTP; a Table back.

        ``stream=True``: an iterator of ``(qid, row)`` pairs as the rows complete (the
        request's row i is qid ``X-Qid-Start + i``; each row a dict of JSON values, tensors
        as nested lists; ``.final`` of a pair is False for a first_then's fast row that a
        slow one follows: ``StreamedRow``), from a streamed answer (``Accept: application/x-ndjson``); an error,
        before or during the stream, raises as below when the iterator reaches it.

        Uses Arrow IPC both ways so types survive exactly. An error answer raises the class
        of the tree it names (``OperatorFailedError``, ``SchemaError``, ...; else by status:
        504 ``DeadlineExceededError``, 503 a ``RetryableError``, 4xx ``BadRequestError``),
        with ``.status``, ``.body`` and the server's message. A connection that fails (a
        gateway killed with the call in flight) is tried once more with the same
        ``X-Request-Id`` (flows are pure, so the request runs again), then raises
        ``UnreachableError``.
        """
        if stream:
            return self._stream(rows, timeout)
        return self.call(rows, timeout).table

    def _stream(self, rows, timeout: float | None):
        what = f"flow {self.name!r}"
        try:
            with self.cluster.http.stream(
                "POST",
                f"/flows/{self.name}",
                content=_arrow_body(rows, self.plan),
                headers={"Content-Type": ARROW, "Accept": NDJSON, "X-Request-Id": uuid.uuid4().hex[:16]},
                timeout=timeout or self.cluster.config.request_timeout_s + 10,
            ) as r:
                if r.status_code != 200:
                    r.read()
                    raise answer_error(r, f"{what} answered {{status}}")
                for line in r.iter_lines():
                    if not line:
                        continue
                    event = json.loads(line)
                    if "row" in event:
                        yield StreamedRow(event["qid"], event["row"], event.get("final", True))
                    elif "error" in event:
                        status = int(event.get("status", 500))
                        raise error_for_answer(status, event, f"{what} failed mid-stream: {event.get('message')}")
                    elif event.get("end"):
                        return
                raise UnreachableError(f"{what}: the stream ended without its end event", url=self.cluster.url)
        except httpx.TimeoutException as e:
            raise DeadlineExceededError(f"{what}: no answer within the client's timeout ({type(e).__name__})") from e
        except httpx.TransportError as e:
            raise UnreachableError(
                f"{what}: the connection to {self.cluster.url} failed ({type(e).__name__}: {e})", url=self.cluster.url
            ) from e

    def call(self, rows, timeout: float | None = None) -> Answer:
        """Like ``invoke``, also returning the qids the gateway gave the input rows."""
        import pyarrow as pa

        table = Table.from_any(as_rows(rows, getattr(self.plan, "input_schema", None)))
        r = self.cluster.request(
            "POST",
            f"/flows/{self.name}",
            f"flow {self.name!r}",
            failed=f"flow {self.name!r} answered {{status}}",
            content=_arrow_body(table, self.plan),
            headers={"Content-Type": ARROW, "Accept": ARROW},
            timeout=timeout or self.cluster.config.request_timeout_s + 10,
            idempotent=True,  # flows are pure: a call cut by a gateway that died runs again
        )
        out = Table.from_arrow(pa.ipc.open_stream(r.content).read_all(), qid="qid")
        start = int(r.headers["x-qid-start"])
        return Answer(out, np.arange(start, start + len(table), dtype=np.int64))

    def undeploy(self) -> None:
        self.cluster.undeploy(self.name)

    def promote(self) -> dict:
        """Make this flow's canary or shadow version the served one (``ClusterClient.promote``)."""
        return self.cluster.promote(self.name)

    def rollback(self) -> dict:
        """Roll this flow back (``ClusterClient.rollback``)."""
        return self.cluster.rollback(self.name)

    def __enter__(self) -> Deployment:
        return self

    def __exit__(self, *exc) -> None:
        self.undeploy()

    def __repr__(self) -> str:
        return f"Deployment({self.name!r} at {self.url})"


class StreamedRow(tuple):
    """One row of a streamed answer: the pair ``(qid, row)``, and ``final``: False for a
    first_then's fast row that a slow one follows (flow/progressive.py), else True."""

    final: bool

    def __new__(cls, qid: int, row: dict, final: bool = True):
        item = super().__new__(cls, (qid, row))
        item.final = final
        return item


def _arrow_body(rows, plan) -> bytes:
    """An invocation's body: the rows as an Arrow IPC stream."""
    import pyarrow as pa

    # one dict is one row, as flow.run and an HTTP JSON object take it (the schema tells
    # one row from a dict of columns); the server types the values, as for any client
    table = Table.from_any(as_rows(rows, getattr(plan, "input_schema", None)))  # no plan: by name only
    arrow = table.to_arrow().drop_columns(["qid"])
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, arrow.schema) as w:
        w.write_table(arrow)
    return sink.getvalue().to_pybytes()


_default_lock = threading.Lock()
_default: LocalCluster | None = None


def default_cluster() -> LocalCluster:
    """The `flowserve up` cluster if one runs in the default directory, else an embedded one."""
    global _default
    with _default_lock:
        if _default is not None and _default.state:
            return _default
        if (DEFAULT_DIR / STATE_FILE).exists():
            try:
                _default = LocalCluster.connect(DEFAULT_DIR)
                return _default
            except ClusterStartError:
                pass
        _default = LocalCluster().start()
        return _default
