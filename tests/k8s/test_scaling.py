"""KubernetesExecutors: the autoscaler's backend on Kubernetes, against the client's typed APIs.

Scaling up and down, the pod annotation, in-cluster credentials and the baseline read
under the rendered Role run against a real API server in test_real_scaling.py; what stays
here needs scripted timing (concurrent scale-ups, an executor that never registers) or
answers a real server does not give on demand.

What is under test is the Kubernetes side: which requests go to the API server (scale
reads and patches, the pod annotation), in which order, and what happens on a timeout or
an API error. The Kubernetes client runs for real with the recorder as its transport.

The dispatcher is the gateway's and is not under test here: ``StandInDispatcher`` is a
plain object with the two things the backend reads (``executors``, whose entries carry
``id``/``device``/``alive``, and ``wait_for_executor``), scripted per test.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from dataclasses import dataclass

import pytest

from flow.configuration import ConfigError, ConfigTypeError
from flow.errors import AccessDeniedError, InternalError, UnavailableError
from k8s import KubeConfig
from k8s.errors import K8sNotFoundError

client = pytest.importorskip("kubernetes.client")
from k8s.scaling import KubernetesExecutors, incluster_cluster  # noqa: E402 - needs the client
from tests.k8s.recorders import WireRecorder, recorded_cluster, status_body  # noqa: E402

NS = "flowserve"
APPS = f"/apis/apps/v1/namespaces/{NS}"
CORE = f"/api/v1/namespaces/{NS}"
CPU_SCALE = f"{APPS}/deployments/flowserve-executor-cpu/scale"
GPU_SCALE = f"{APPS}/deployments/flowserve-executor-gpu/scale"


@dataclass
class Info:
    id: str
    device: str = "cpu"
    alive: bool = True


class StandInDispatcher:
    """Registered executors and ``wait_for_executor``, as the gateway's dispatcher offers them."""

    def __init__(self, *infos: Info):
        self.executors = {i.id: i for i in infos}
        self.waits: list[tuple[str, set, float]] = []
        self._registered = asyncio.Condition()  # bound to the loop on first use

    async def register(self, info: Info) -> None:
        async with self._registered:
            self.executors[info.id] = info
            self._registered.notify_all()

    async def wait_for_executor(self, device: str, known: set[str], timeout: float) -> str | None:
        self.waits.append((device, set(known), timeout))

        def new():
            return next(
                (i.id for i in self.executors.values() if i.device == device and i.alive and i.id not in known), None
            )

        try:
            async with self._registered:
                await asyncio.wait_for(self._registered.wait_for(lambda: new() is not None), timeout)
                return new()
        except asyncio.TimeoutError:
            return None


class Replicas:
    """The scale subresource of the executor Deployments: GETs read it, PATCHes set it."""

    def __init__(self, **replicas: int):
        self.replicas = dict(replicas)
        self.threads: set[int] = set()
        self.lock = threading.Lock()

    def install(self, wire: WireRecorder) -> WireRecorder:
        for device in ("cpu", "gpu"):
            path = CPU_SCALE if device == "cpu" else GPU_SCALE
            if device in self.replicas:
                wire.reply("GET", path, 200, self._read(device)).reply("PATCH", path, 200, self._patch(device))
        return wire

    def _doc(self, device: str) -> dict:
        return {
            "kind": "Scale",
            "apiVersion": "autoscaling/v1",
            "metadata": {"name": f"flowserve-executor-{device}", "namespace": NS},
            "spec": {"replicas": self.replicas[device]},
        }

    def _read(self, device: str):
        def answer(req):
            with self.lock:
                self.threads.add(threading.get_ident())
                return self._doc(device)

        return answer

    def _patch(self, device: str):
        def answer(req):
            with self.lock:
                self.threads.add(threading.get_ident())
                self.replicas[device] = req.body["spec"]["replicas"]
                return self._doc(device)

        return answer


def backend(dispatcher, replicas: Replicas | None = None, baseline=None, wait_s: float = 5, wire=None):
    base = (replicas or Replicas(cpu=2)).install(WireRecorder())
    if wire is not None:
        base.replies = wire.replies + base.replies  # the test's own answers win
    cluster, wire, apis = recorded_cluster(KubeConfig(), base)
    return KubernetesExecutors(cluster, dispatcher, baseline if baseline is not None else {"cpu": 2}, wait_s), wire


def trace(wire: WireRecorder) -> list[tuple]:
    return [(r.method, r.path, r.body) for r in wire.requests]


# -- add_executor -------------------------------------------------------------------------


def test_a_new_executor_that_does_not_register_in_time_is_scaled_back(caplog):
    d = StandInDispatcher(Info("cpu-a"), Info("cpu-b"))
    replicas = Replicas(cpu=2)
    b, wire = backend(d, replicas, wait_s=0.05)
    with caplog.at_level(logging.WARNING, logger="flowserve.k8s.scaling"):
        assert asyncio.run(b.add_executor("cpu")) is None
    assert trace(wire) == [
        ("GET", CPU_SCALE, None),
        ("PATCH", CPU_SCALE, {"spec": {"replicas": 3}}),
        ("GET", CPU_SCALE, None),
        ("PATCH", CPU_SCALE, {"spec": {"replicas": 2}}),
    ]
    assert replicas.replicas == {"cpu": 2}
    assert "no new cpu executor registered within 0.05s: scaling executor-cpu back down" in caplog.text


def test_no_executor_deployment_for_the_device_means_impossible(caplog):
    d = StandInDispatcher(Info("cpu-a"))
    b, wire = backend(d, Replicas(cpu=1), baseline={"cpu": 1})  # no GPU Deployment: its scale GET is a 404
    with caplog.at_level(logging.WARNING, logger="flowserve.k8s.scaling"):
        assert asyncio.run(b.add_executor("gpu")) is None
    assert trace(wire) == [("GET", GPU_SCALE, None)]  # nothing scaled
    assert d.waits == []
    assert "Deployment flowserve/flowserve-executor-gpu does not exist" in caplog.text


def test_an_api_refusal_while_scaling_up_is_raised_naming_the_deployment():
    d = StandInDispatcher()
    wire = WireRecorder().reply("PATCH", CPU_SCALE, 403, status_body(403, "cannot patch deployments/scale"))
    b, wire = backend(d, Replicas(cpu=2), wire=wire)
    with pytest.raises(AccessDeniedError, match="patch Deployment flowserve/flowserve-executor-cpu failed: 403"):
        asyncio.run(b.add_executor("cpu"))
    assert d.waits == []


def test_concurrent_scale_ups_add_one_pod_each_and_claim_different_executors():
    d = StandInDispatcher(Info("cpu-a"))
    replicas = Replicas(cpu=1)
    b, wire = backend(d, replicas, baseline={"cpu": 1})

    async def run():
        tasks = [asyncio.create_task(b.add_executor("cpu")) for _ in range(2)]
        while len(d.waits) < 2:
            await asyncio.sleep(0.001)
        await d.register(Info("cpu-new-1"))
        await asyncio.sleep(0.01)
        await d.register(Info("cpu-new-2"))
        return await asyncio.gather(*tasks)

    assert sorted(asyncio.run(run())) == ["cpu-new-1", "cpu-new-2"]
    # read-then-write under one lock: 1 -> 2 -> 3, not 1 -> 2 twice
    assert [r.body for r in wire.calls("PATCH")] == [{"spec": {"replicas": 2}}, {"spec": {"replicas": 3}}]
    assert replicas.replicas == {"cpu": 3}


def test_add_executor_rejects_an_unknown_device_before_calling():
    b, wire = backend(StandInDispatcher())
    with pytest.raises(ConfigError, match="device must be 'cpu' or 'gpu', got 'tpu'"):
        asyncio.run(b.add_executor("tpu"))
    assert wire.requests == []


# -- remove_executor ----------------------------------------------------------------------


def test_removing_a_pod_that_is_gone_scales_nothing_down():
    d = StandInDispatcher(Info("cpu-a"), Info("cpu-gone"))
    wire = WireRecorder().reply(
        "PATCH", f"{CORE}/pods/cpu-gone", 404, status_body(404, 'pods "cpu-gone" not found', "NotFound")
    )
    b, wire = backend(d, Replicas(cpu=2), baseline={"cpu": 1}, wire=wire)
    with pytest.raises(K8sNotFoundError, match="patch Pod flowserve/cpu-gone failed: 404"):
        asyncio.run(b.remove_executor("cpu-gone"))
    assert [r.method for r in wire.requests] == ["PATCH"]  # no scale-down of some other pod


def test_removing_an_unknown_executor_is_an_error():
    b, wire = backend(StandInDispatcher(Info("cpu-a")))
    with pytest.raises(InternalError, match="cannot remove executor 'cpu-zzz': the dispatcher knows no such executor"):
        asyncio.run(b.remove_executor("cpu-zzz"))
    assert wire.requests == []


def test_a_refused_scale_down_is_raised():
    d = StandInDispatcher(Info("cpu-a"), Info("cpu-b"))
    wire = WireRecorder().reply("PATCH", CPU_SCALE, 503, status_body(503, "etcd timeout"))
    b, wire = backend(d, Replicas(cpu=2), baseline={"cpu": 1}, wire=wire)
    with pytest.raises(UnavailableError, match="patch Deployment flowserve/flowserve-executor-cpu failed: 503"):
        asyncio.run(b.remove_executor("cpu-b"))


# -- removable ----------------------------------------------------------------------------


def test_removable_lists_live_executors_beyond_the_baseline_newest_first():
    d = StandInDispatcher(
        Info("cpu-1"),
        Info("gpu-1", "gpu"),
        Info("cpu-2"),
        Info("cpu-dead", alive=False),
        Info("cpu-3"),
        Info("cpu-4"),
        Info("gpu-2", "gpu"),
    )
    b, wire = backend(d, baseline={"cpu": 2, "gpu": 1})
    assert b.removable() == ["cpu-4", "cpu-3", "gpu-2"]
    assert backend(d, baseline={"cpu": 4, "gpu": 2})[0].removable() == []
    assert backend(d, baseline={})[0].removable() == ["cpu-4", "cpu-3", "cpu-2", "cpu-1", "gpu-2", "gpu-1"]
    assert wire.requests == []  # decided from the registrations alone


# -- construction -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "baseline,error,match",
    [
        ([2], ConfigTypeError, r"baseline must be a mapping of device to executor count, got list \[2\]"),
        ({"tpu": 1}, ConfigError, r"device must be 'cpu' or 'gpu', got 'tpu'"),
        ({"cpu": -1}, ConfigError, r"baseline\['cpu'\] must be an int >= 0, got -1"),
        ({"cpu": "2"}, ConfigTypeError, r"baseline\['cpu'\] must be an int >= 0, got str '2'"),
    ],
)
def test_bad_baselines(baseline, error, match):
    with pytest.raises(error, match=match):
        backend(StandInDispatcher(), baseline=baseline)


def test_bad_wait_and_cluster():
    with pytest.raises(ConfigError, match="wait_s must be a number of seconds > 0, got 0"):
        backend(StandInDispatcher(), wait_s=0)
    with pytest.raises(ConfigTypeError, match="cluster must be a k8s.KubernetesCluster, got str"):
        KubernetesExecutors("flowserve", StandInDispatcher(), {})


def test_outside_a_pod_there_are_no_incluster_credentials(monkeypatch):
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    with pytest.raises(
        AccessDeniedError, match="no in-cluster Kubernetes credentials for namespace 'ml', instance 'vision'"
    ):
        KubernetesExecutors.from_incluster("ml", "vision", StandInDispatcher(), {"cpu": 1})
    with pytest.raises(ConfigError, match="namespace must be .*got 'Bad NS'"):
        incluster_cluster("Bad NS", "vision")
