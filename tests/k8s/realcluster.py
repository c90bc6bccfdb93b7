"""A real Kubernetes control plane for the tests: etcd, kube-apiserver (token auth, RBAC),
kube-controller-manager and kube-scheduler v1.20.2, started by scripts/k8s/control-plane.sh
from the binaries it built (or found in its cache), plus a "fakelet".

There is no kubelet: the fakelet registers one Node (with ``nvidia.com/gpu`` capacity) and
does the part of a kubelet the API server sees: it marks the pods the real scheduler binds to
that Node Running and Ready (pod IP 127.0.0.1) and finishes the deletion of pods that are
terminating. No container runs; the tests start the pods' processes themselves when they
need them (test_real_deploy.py).
"""

from __future__ import annotations

import datetime
import os
import re
import subprocess
import threading
import time
import uuid
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "k8s" / "control-plane.sh"
DOCS = ROOT / "docs" / "kubernetes.md"
REQUIRE_ENV = "FLOWSERVE_K8S_REQUIRED"  # CI sets it: a missing control plane fails, never skips
NODE = "fakelet-node"
NODE_CAPACITY = {"cpu": "64", "memory": "256Gi", "pods": "110", "nvidia.com/gpu": "4", "ephemeral-storage": "100Gi"}
DEVELOPER = "developer"  # the non-admin user of the tokens file, bound to the docs' deployer Role


def binaries() -> tuple[str | None, str]:
    """The control plane's binary directory, or None and why not."""
    r = subprocess.run(["bash", str(SCRIPT), "bindir"], capture_output=True, text=True)
    if r.returncode == 0:
        return r.stdout.strip(), ""
    return None, r.stderr.strip()


def wait_for(what: str, cond, timeout: float = 30.0, every: float = 0.05):
    """Poll ``cond`` until it returns something truthy (returned); fail after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while True:
        value = cond()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(every)


class ControlPlane:
    """One started control plane: its directory, addresses, credentials and clients."""

    def __init__(self, directory: Path):
        self.dir = directory
        r = subprocess.run(["bash", str(SCRIPT), "start", str(directory)], capture_output=True, text=True)
        if r.returncode != 0:
            self.stop()
            raise RuntimeError(f"control-plane.sh start failed ({r.returncode}):\n{r.stderr[-4000:]}")
        self.env = dict(line.split("=", 1) for line in (directory / "env").read_text().splitlines() if "=" in line)
        self.url = self.env["K8S_API"]
        self.kubectl_bin = Path(self.env["K8S_BIN"]) / "kubectl"

    def kubeconfig(self, user: str) -> str:
        return str(self.dir / f"{user}.kubeconfig")

    def api_client(self, user: str = "admin"):
        from kubernetes import config

        return config.new_client_from_config(config_file=self.kubeconfig(user))

    def token_client(self, token: str):
        """An ApiClient authenticating with a bearer token (a ServiceAccount's)."""
        import kubernetes.client as client

        c = client.Configuration()
        c.host = self.url
        c.ssl_ca_cert = self.env["K8S_CA"]
        c.api_key = {"authorization": token}
        c.api_key_prefix = {"authorization": "Bearer"}
        return client.ApiClient(c)

    def kubectl(self, *args: str, user: str = "admin", check: bool = True) -> str:
        r = subprocess.run(
            [str(self.kubectl_bin), "--kubeconfig", self.kubeconfig(user), *args], capture_output=True, text=True
        )
        if check and r.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)}: {r.stderr}")
        return r.stdout

    def stop(self) -> None:
        subprocess.run(["bash", str(SCRIPT), "stop", str(self.dir)], capture_output=True, text=True)

    def logs(self, component: str, lines: int = 40) -> str:
        p = self.dir / f"{component}.log"
        return "\n".join(p.read_text(errors="replace").splitlines()[-lines:]) if p.exists() else ""


class Fakelet(threading.Thread):
    """The API-visible half of a kubelet for one Node: bound pods become Running/Ready,
    terminating pods are removed. Event-driven (a watch on the Node's pods)."""

    def __init__(self, api_client, node: str = NODE, capacity: dict | None = None):
        super().__init__(name=f"fakelet-{node}", daemon=True)
        import kubernetes.client as client

        self.v1 = client.CoreV1Api(api_client)
        self.node, self.capacity = node, dict(capacity or NODE_CAPACITY)
        self.stopping = threading.Event()
        self.paused = threading.Event()  # while set, new pods stay Pending-not-ready
        self.errors: list[str] = []

    def register(self) -> None:
        import kubernetes.client as client

        now = _now()
        try:
            self.v1.create_node(
                client.V1Node(
                    metadata=client.V1ObjectMeta(
                        name=self.node, labels={"kubernetes.io/hostname": self.node, "kubernetes.io/os": "linux"}
                    )
                )
            )
        except client.ApiException as e:
            if e.status != 409:
                raise
        self.v1.patch_node_status(
            self.node,
            {
                "status": {
                    "capacity": self.capacity,
                    "allocatable": self.capacity,
                    "addresses": [{"type": "InternalIP", "address": "127.0.0.1"}],
                    "conditions": [
                        {
                            "type": "Ready",
                            "status": "True",
                            "reason": "KubeletReady",
                            "lastHeartbeatTime": now,
                            "lastTransitionTime": now,
                        }
                    ],
                }
            },
        )
        # admission taints a new Node not-ready; the node lifecycle controller (not run here:
        # there is no kubelet heartbeat to judge) would lift it once the Node reports Ready
        self.v1.patch_node(self.node, {"spec": {"taints": None}}, _content_type="application/merge-patch+json")

    def run(self) -> None:
        from kubernetes import watch

        selector = f"spec.nodeName={self.node}"
        while not self.stopping.is_set():
            try:
                pods = self.v1.list_pod_for_all_namespaces(field_selector=selector)
                for p in pods.items:
                    self._sync(p)
                w = watch.Watch()
                for event in w.stream(
                    self.v1.list_pod_for_all_namespaces,
                    field_selector=selector,
                    resource_version=pods.metadata.resource_version,
                    timeout_seconds=1,
                ):
                    if event["type"] in ("ADDED", "MODIFIED"):
                        self._sync(event["object"])
                    if self.stopping.is_set():
                        w.stop()
            except Exception as e:  # noqa: BLE001 - a conflict or a closed watch: resync
                if self.stopping.is_set():
                    return
                self.errors.append(f"{type(e).__name__}: {e}"[:300])

    def _sync(self, pod) -> None:
        import kubernetes.client as client

        md = pod.metadata
        try:
            if md.deletion_timestamp is not None:
                self.v1.delete_namespaced_pod(md.name, md.namespace, grace_period_seconds=0)
                return
            if pod.status.phase == "Running" or self.paused.is_set():
                return
            t = _now()
            statuses = [
                {
                    "name": c.name,
                    "ready": True,
                    "restartCount": 0,
                    "image": c.image,
                    "imageID": "",
                    "started": True,
                    "state": {"running": {"startedAt": t}},
                }
                for c in pod.spec.containers
            ]
            self.v1.patch_namespaced_pod_status(
                md.name,
                md.namespace,
                {
                    "status": {
                        "phase": "Running",
                        "podIP": "127.0.0.1",
                        "podIPs": [{"ip": "127.0.0.1"}],
                        "hostIP": "127.0.0.1",
                        "startTime": t,
                        "containerStatuses": statuses,
                        "conditions": [
                            {"type": k, "status": "True", "lastTransitionTime": t}
                            for k in ("Initialized", "Ready", "ContainersReady", "PodScheduled")
                        ],
                    }
                },
            )
        except client.ApiException as e:
            if e.status not in (404, 409):
                raise

    def stop(self) -> None:
        self.stopping.set()
        self.join(timeout=10)


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def deployer_rbac_from_docs(namespace: str, user: str = DEVELOPER) -> list[dict]:
    """The deployer Role of docs/kubernetes.md (the ```yaml block after the marker comment),
    put in ``namespace`` and bound to ``user``: the tests grant exactly what the docs say."""
    text = DOCS.read_text()
    m = re.search(r"<!-- deployer-rbac -->\s*```yaml\n(.*?)```", text, re.S)
    if m is None:
        raise AssertionError("docs/kubernetes.md has no ```yaml block after <!-- deployer-rbac -->")
    docs = [d for d in yaml.safe_load_all(m.group(1)) if d]
    for d in docs:
        d["metadata"]["namespace"] = namespace
        if d["kind"] == "RoleBinding":
            d["subjects"] = [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}]
    return docs


def unique_namespace(prefix: str = "t") -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def env_requires_real() -> bool:
    return os.environ.get(REQUIRE_ENV, "") not in ("", "0")


# -- a real node: kubelet + containerd + runc + CNI (scripts/k8s/real-node.sh) ------------------

NODE_SCRIPT = ROOT / "scripts" / "k8s" / "real-node.sh"
IMAGE_SCRIPT = ROOT / "scripts" / "k8s" / "flowserve-image.sh"
FLOWSERVE_IMAGE = "localhost/flowserve:dev"  # flowserve-image.sh's default reference
REAL_NODE = "realnode"
REAL_NODE_ENV = "FLOWSERVE_K8S_REAL_NODE"


def real_node_unavailable() -> str | None:
    """Why a real node cannot be started here (None: it can): it is opt-in and needs root."""
    if os.environ.get(REAL_NODE_ENV) != "1":
        return f"opt-in: {REAL_NODE_ENV}=1 as root (starts containerd, a kubelet and real pods)"
    if os.geteuid() != 0:
        return f"{REAL_NODE_ENV}=1 needs root (containerd, runc, the CNI bridge)"
    return None


class RealNode:
    """A control plane of its own plus one real node (``REAL_NODE``), optionally with
    FlowServe's image built (flowserve-image.sh) and imported into the node's containerd."""

    def __init__(self, directory: Path, flowserve_image: bool = True):
        self.dir = directory
        self.node_dir = directory / "node"
        self.image_build_s: float | None = None
        self.cp = ControlPlane(directory / "cp")
        try:
            self._run("start", str(self.node_dir), str(self.cp.dir))
            if flowserve_image:
                t0 = time.monotonic()
                tar = directory / "flowserve.tar"
                r = subprocess.run(
                    ["bash", str(IMAGE_SCRIPT), "build", str(tar), FLOWSERVE_IMAGE], capture_output=True, text=True
                )
                if r.returncode != 0:
                    raise RuntimeError(f"flowserve-image.sh build failed ({r.returncode}):\n{r.stderr[-4000:]}")
                self._run("import", str(self.node_dir), str(tar))
                tar.unlink()
                self.image_build_s = time.monotonic() - t0
        except BaseException:
            self.stop()
            raise

    def _run(self, *args: str) -> None:
        r = subprocess.run(["bash", str(NODE_SCRIPT), *args], capture_output=True, text=True)
        if r.returncode != 0:
            raise RuntimeError(
                f"real-node.sh {args[0]} failed ({r.returncode}):\n{r.stderr[-4000:]}\n"
                f"kubelet log:\n{self.log('kubelet')}"
            )

    def log(self, component: str, lines: int = 40) -> str:
        p = self.node_dir / f"{component}.log"
        return "\n".join(p.read_text(errors="replace").splitlines()[-lines:]) if p.exists() else ""

    def ctr(self, *args: str) -> str:
        r = subprocess.run(
            ["ctr", "--address", str(self.node_dir / "containerd.sock"), "-n", "k8s.io", *args],
            capture_output=True,
            text=True,
        )
        if r.returncode != 0:
            raise AssertionError(f"ctr {' '.join(args)}: {r.stderr}")
        return r.stdout

    def events(self) -> subprocess.Popen:
        """containerd's event stream (``ctr events``): a line an event, "TIME ZONE NAMESPACE
        TOPIC JSON", from now until the caller terminates the process."""
        return subprocess.Popen(
            ["ctr", "--address", str(self.node_dir / "containerd.sock"), "events"],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )

    def kill_container(self, pod, container: str) -> str:
        """SIGKILL the process of ``pod``'s ``container`` through containerd: a crash, as the
        kernel's OOM killer or a segfault would cause. Returns the container id."""
        (status,) = [c for c in pod.status.container_statuses if c.name == container]
        cid = status.container_id.split("://", 1)[1]
        self.ctr("tasks", "kill", "--signal", "SIGKILL", cid)
        return cid

    def stop(self) -> None:
        subprocess.run(["bash", str(NODE_SCRIPT), "stop", str(self.node_dir)], capture_output=True)
        self.cp.stop()


def real_node_fixture(directory: str):
    """A module-scoped pytest fixture: a ``RealNode`` for the module's tests (in a temporary
    ``directory``), stopped after them (no containerd, kubelet or bridge left)."""
    import pytest

    @pytest.fixture(scope="module")
    def node(tmp_path_factory):
        n = RealNode(tmp_path_factory.mktemp(directory))
        try:
            yield n
        finally:
            n.stop()

    return node


def wait_namespace_ready(core, namespace: str, timeout: float = 30) -> None:
    """The namespace's ``default`` ServiceAccount has its token (the admission of pods needs it)."""
    import kubernetes.client as client

    def token():
        try:
            return core.read_namespaced_service_account("default", namespace).secrets
        except client.ApiException as e:
            if e.status == 404:
                return None
            raise

    wait_for(f"namespace {namespace}'s ServiceAccount token", token, timeout=timeout)


def pod_ips(core, namespace: str, component: str) -> dict[str, str]:
    """name -> IP of the component's Running, not terminating pods."""
    pods = core.list_namespaced_pod(namespace, label_selector=f"app.kubernetes.io/component={component}").items
    return {
        p.metadata.name: p.status.pod_ip
        for p in pods
        if p.status.phase == "Running" and p.metadata.deletion_timestamp is None and p.status.pod_ip
    }


def serves(url: str) -> bool:
    """Whether ``url`` (a flow's) answers ``{"x": 1}`` with 200."""
    import httpx

    try:
        return httpx.post(url, json={"x": 1}, timeout=5).status_code == 200
    except httpx.HTTPError:
        return False


def refusal(answer: tuple) -> str | None:
    """How a gateway refused a request without running it (its client may send it to another
    gateway), or None: an answer, or a failure after which it may have run (lost).
    ``answer``: (status, body text, headers or the exception), as ``Load`` gets it."""
    status, body, detail = answer
    if status == 0:  # no connection, so nothing was sent: refused, or the pod's address gone
        if not body.startswith("ConnectError"):
            return None
        return "connection refused" if "refused" in body.lower() else "unreachable"
    if status == 503 and '"error":"ShuttingDown"' in body.replace(" ", ""):
        # the answer closes its connection, so the next request goes on a new one
        return "503 ShuttingDown" if detail.get("connection") == "close" else None
    return None


class Load:
    """``concurrency`` clients POSTing ``{"x": i}`` (i unique, from ``first_id``) to ``url``
    one after another until ``stop()``, each at most ``rate`` requests a second (None: as
    fast as answers come); every answer is kept, so a fault's cost can be counted afterwards.

    With ``fallback`` (another gateway's URL), a client whose request ``url`` refuses
    (``refusal``) sends it there and sends the next ones there too: what a Service does once
    the pod has left its endpoints (there is no kube-proxy on the real node). ``refused``
    keeps how each of those was refused, ``moved`` every request sent to ``fallback``.
    ``closing`` holds the requests whose answer closed its connection (``Connection: close``:
    a draining gateway's)."""

    def __init__(
        self,
        url: str,
        concurrency: int = 4,
        timeout: float = 60.0,
        rate: float | None = None,
        first_id: int = 0,
        fallback: str | None = None,
    ):
        self.url, self.concurrency, self.timeout, self.rate = url, concurrency, timeout, rate
        self.fallback = fallback
        self.answers: dict[int, tuple] = {}  # x -> (status, rows or error text, t_sent, t_done)
        self.refused: dict[int, tuple[str, float]] = {}  # x -> (how url refused it, t_done there)
        self.moved: set[int] = set()
        self.closing: set[int] = set()
        self._ids = iter(range(first_id, 1 << 62))
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._threads = [threading.Thread(target=self._client, daemon=True) for _ in range(concurrency)]
        self.t0 = time.monotonic()

    def start(self) -> Load:
        for t in self._threads:
            t.start()
        return self

    def _client(self) -> None:
        import httpx

        next_at = time.monotonic()
        url = self.url
        with httpx.Client(timeout=self.timeout) as http:
            while not self._stopping.is_set():
                if self.rate:
                    next_at += 1.0 / self.rate
                    if self._stopping.wait(max(0.0, next_at - time.monotonic())):  # pacing, not synchronisation
                        return
                with self._lock:
                    x = next(self._ids)
                t = time.monotonic()
                got = self._post(http, url, x)
                if self.fallback is not None and url != self.fallback and (how := refusal(got)):
                    self.refused[x] = (how, time.monotonic() - self.t0)
                    url = self.fallback
                    got = self._post(http, url, x)
                if url == self.fallback:
                    self.moved.add(x)
                if got[2].get("connection") == "close":
                    self.closing.add(x)
                self.answers[x] = (*got[:2], t - self.t0, time.monotonic() - self.t0)

    @staticmethod
    def _post(http, url: str, x: int) -> tuple:
        """(status, rows or error text, the answer's headers); status 0: no answer."""
        import httpx

        try:
            r = http.post(url, json={"x": x})
            return r.status_code, r.json()["rows"] if r.status_code == 200 else r.text[:300], r.headers
        except (httpx.HTTPError, OSError, ValueError) as e:
            return 0, f"{type(e).__name__}: {e}"[:300], {}

    def count(self) -> int:
        return len(self.answers)

    def stop(self) -> dict:
        self._stopping.set()
        for t in self._threads:
            t.join(timeout=self.timeout + 5)
        return self.summary()

    def summary(self, expected=lambda x: 2 * x, column: str = "y") -> dict:
        """answered (200 with the one right row), lost (an error, or no answer; unsent: those
        of them never sent, their connection refused or not made), wrong rows, duplicated (a
        200 with more than one row), repeated qids across answers."""
        lost, wrong, duplicated, qids = [], 0, 0, []
        for x, (status, body, _, _) in sorted(self.answers.items()):
            if status != 200:
                lost.append((x, status, body))
                continue
            duplicated += len(body) != 1
            wrong += any(r.get(column) != expected(x) for r in body)
            qids.extend(r.get("qid") for r in body)
        return {
            "requests": len(self.answers),
            "answered": len(self.answers) - len(lost),
            "lost": len(lost),
            "unsent": sum(status == 0 and body.startswith("ConnectError") for _, status, body in lost),
            "wrong": wrong,
            "duplicated": duplicated,
            "repeated_qids": len(qids) - len(set(qids)),
            "lost_sample": lost[:5],
        }
