"""Opt-in (FLOWSERVE_K8S_REAL_NODE=1, root): a gateway pod deleted under load drains on a
real kubelet (tests/k8s/test_real_node.py has the node).

Two gateway pods serve one flow under continuous load, each loaded at its IP (there is no
kube-proxy here). One is deleted as a rolling update deletes it: the API's pod delete with
the pod's grace period, after which the kubelet sends the container SIGTERM. Its clients
lose nothing: every request it had accepted is answered, and each client's next one is
refused cleanly (503 ShuttingDown with Connection: close, or the connection refused),
which the client sends to the other pod, as a Service would once the pod has left its
endpoints. The container exits by itself (status 0, containerd's exit event) within
terminationGracePeriodSeconds; the kubelet's pod status turns not ready, and the kubelet
removes the pod. A gateway whose SIGTERM ends it at once fails this: the requests its
clients had in flight are reset (lost) and none is answered with Connection: close.
"""

from __future__ import annotations

import datetime
import json
import threading
import time

import pytest

from flow import Flow
from tests.k8s import realcluster as rc

pytestmark = pytest.mark.skipif(rc.real_node_unavailable() is not None, reason=str(rc.real_node_unavailable()))
client = pytest.importorskip("kubernetes.client")
from tests.k8s.test_real_node import applied, namespace  # noqa: E402

node = rc.real_node_fixture("k8s-real-drain")

CLIENTS = 4  # per gateway pod


def slow_double(row):
    import time

    time.sleep(0.05)  # requests stay in flight long enough for the SIGTERM to catch some
    return row.x * 2


class PodWatch(threading.Thread):
    """Every state of one pod the API server shows, from now until it is deleted: the
    kubelet's status (readiness) and the pod's removal are read from these."""

    def __init__(self, core, namespace: str, name: str):
        super().__init__(name=f"watch-{name}", daemon=True)
        from kubernetes import watch

        self.core, self.namespace, self.name = core, namespace, name
        self.events: list[tuple[float, str, object]] = []  # (monotonic time, type, V1Pod)
        self.watch = watch.Watch()
        self.version = core.read_namespaced_pod(name, namespace).metadata.resource_version
        self.deleted = threading.Event()

    def run(self) -> None:
        for event in self.watch.stream(
            self.core.list_namespaced_pod,
            self.namespace,
            field_selector=f"metadata.name={self.name}",
            resource_version=self.version,
            timeout_seconds=300,
        ):
            self.events.append((time.monotonic(), event["type"], event["object"]))
            if event["type"] == "DELETED":
                self.deleted.set()
                return

    def first(self, what: str, cond) -> tuple[float, object]:
        """The first state for which ``cond(pod)`` holds (time seen, pod)."""
        for t, _, pod in self.events:
            if cond(pod):
                return t, pod
        raise AssertionError(f"the pod's states never showed {what}: {[self._brief(p) for _, _, p in self.events]}")

    @staticmethod
    def _brief(pod) -> str:
        ready = _ready(pod)
        states = [c.state.to_dict() for c in pod.status.container_statuses or ()]
        return f"ready={ready} deleting={pod.metadata.deletion_timestamp} containers={states}"


class TaskExit(threading.Thread):
    """The exit of one container's process as containerd reports it (its /tasks/exit event):
    ``status`` and ``at`` (UTC). The kubelet v1.20 shows a deleted pod's exited container as
    "waiting: ContainerCreating", without its exit code or time."""

    def __init__(self, node, container_id: str):
        super().__init__(name=f"exit-{container_id[:12]}", daemon=True)
        self.events = node.events()
        self.container_id = container_id
        self.status: int | None = None
        self.at: datetime.datetime | None = None
        self.seen = threading.Event()

    def run(self) -> None:
        for line in self.events.stdout:
            _, _, doc = line.partition(" /tasks/exit ")
            if not doc:
                continue
            e = json.loads(doc)
            if e.get("container_id") == self.container_id and e.get("id") == self.container_id:  # its main process
                self.status = e.get("exit_status", 0)  # 0 is left out of the JSON
                self.at = datetime.datetime.fromisoformat(e["exited_at"])
                self.seen.set()
                return

    def stop(self) -> None:
        self.events.terminate()
        self.events.wait(10)


def _ready(pod) -> str | None:
    return {c.type: c.status for c in pod.status.conditions or ()}.get("Ready")


def test_a_gateway_pod_deleted_under_load_drains_answers_what_it_accepted_and_exits_in_its_grace(node):
    core, ns = namespace(node, "drain")
    cluster, cfg = applied(node, ns, cpu_executors=1, gateway_replicas=2)
    try:
        cluster.wait_ready(wait_s=300)
        gateways = rc.wait_for("two gateway pods", lambda: (p := rc.pod_ips(core, ns, "gateway")) and len(p) == 2 and p)
        urls = {name: f"http://{ip}:{cfg.gateway_port}/flows/slow" for name, ip in gateways.items()}
        (kvs_ip,) = rc.pod_ips(core, ns, "kvs").values()
        flow = Flow("slow", schema={"x": int})
        flow.map(slow_double, names=["y"])
        victim, other = sorted(urls)
        cluster.deploy(
            flow,
            gateway_url=urls[other].rsplit("/flows/", 1)[0],
            kvs_url=f"redis://{kvs_ip}:{cfg.redis_port}/0",
            wait_s=120,
        )
        for name, url in urls.items():
            rc.wait_for(f"gateway pod {name} to serve the flow", lambda u=url: rc.serves(u), timeout=60)
        pod = core.read_namespaced_pod(victim, ns)
        grace_s = pod.spec.termination_grace_period_seconds
        drained = rc.Load(urls[victim], concurrency=CLIENTS, fallback=urls[other])
        kept = rc.Load(urls[other], concurrency=CLIENTS, first_id=1 << 40)
        watch = PodWatch(core, ns, victim)
        watch.start()
        (container,) = [c for c in pod.status.container_statuses if c.name == "gateway"]
        exit_ = TaskExit(node, container.container_id.split("://", 1)[1])
        exit_.start()
        drained.start()
        kept.start()
        try:
            rc.wait_for("answers from the pod to be deleted", lambda: drained.count() >= 30, timeout=60)
            deleted_at, deleted_wall = time.monotonic() - drained.t0, datetime.datetime.now(datetime.timezone.utc)
            core.delete_namespaced_pod(victim, ns)  # the pod's own grace period, as a rollout's
            assert exit_.seen.wait(grace_s + 30), "the gateway's container did not exit"
            assert watch.deleted.wait(30), "the deleted pod is still in the API"
            rc.wait_for("every client of the deleted pod to go to the other", lambda: len(drained.refused) == CLIENTS)
            moved = drained.count()
            rc.wait_for("answers from the other pod to them", lambda: drained.count() >= moved + 30, timeout=60)
        finally:
            summaries = {"drained": drained.stop(), "kept": kept.stop()}
            watch.watch.stop()
            exit_.stop()

        # the container's exit: status 0 (by itself, not the SIGKILL at the end of the grace
        # period: 137), its time from the delete; the kubelet's status: the pod not ready, then
        # the pod removed once its container had stopped
        exit_s = (exit_.at - deleted_wall).total_seconds()
        unready_t, _ = watch.first("the pod not ready", lambda p: _ready(p) == "False")
        deleted_t = next(t for t, kind, _ in watch.events if kind == "DELETED")
        refused = sorted(drained.refused.values(), key=lambda r: r[1])
        # answered (so accepted before the SIGTERM: after it a request is refused) with
        # Connection: close (so answered after it: the drain's answers close their connection)
        by_it = {x: a for x, a in drained.answers.items() if a[0] == 200 and x not in drained.moved}
        in_flight = [x for x in by_it if x in drained.closing]
        figures = {
            "grace_s": grace_s,
            "exit_status": exit_.status,
            "exit_s_from_delete": round(exit_s, 3),
            "unready_seen_s": round(unready_t - drained.t0 - deleted_at, 3),
            "pod_gone_s": round(deleted_t - drained.t0 - deleted_at, 3),
            "answered_by_it_after_the_delete": sum(done > deleted_at for _, _, _, done in by_it.values()),
            "in_flight_at_sigterm_answered": len(in_flight),
            "refused": [how for how, _ in refused],
            **{f"{k}_{name}": v for name, s in summaries.items() for k, v in s.items() if k != "lost_sample"},
        }
        print(f"drain of a deleted gateway pod: {figures}")
        for name, s in summaries.items():
            assert s["lost"] == 0, (name, s)  # a reset, or no answer, for a request a pod accepted
            assert s["wrong"] == 0 and s["duplicated"] == 0 and s["repeated_qids"] == 0, (name, s)
        assert len(in_flight) >= 1, figures
        # refused, so nothing was run: the client may send it elsewhere ("unreachable": the
        # pod's address gone with its sandbox)
        assert set(figures["refused"]) <= {"503 ShuttingDown", "connection refused", "unreachable"}, figures
        assert exit_.status == 0 and exit_s <= grace_s, figures
    finally:
        cluster.close()
        cluster.delete()
