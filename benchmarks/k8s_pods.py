"""Real pods (root; see docs/kubernetes.md, "Real pods"): a control plane and a real node
(kubelet v1.20.2, containerd, runc, CNI bridge) started here, FlowServe's image built
without pulling anything, and two runs on the rendered manifests:

* fault: a flow served by KVS, gateway and 2 executor pods under continuous load
  (``--concurrency`` clients); one executor container is SIGKILLed (the kubelet restarts
  it), later the other executor pod is deleted (the ReplicaSet replaces it). Reports
  answered / lost / wrong / duplicated and the recovery times.
* scale-up: the gateway runs the autoscaler (``--autoscale ... --scaler k8s``) with one
  executor; a load step (1 -> ``--step`` clients on an operator that takes 20 ms) makes it
  add an executor pod. Reports the time from the step to the Deployment's new replica
  count, the new pod Running, Ready, and its first answer (each answer names its pod).

    sudo python -m benchmarks.k8s_pods [--seconds 20] [--concurrency 4] [--step 8]

Writes results/k8s_pods.json.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from benchmarks.common import machine, progress, save

SERVICE_S = 0.02  # the scale-up flow's operator time: 1 client keeps one executor ~busy


def double(row):
    return row.x * 2


def slow_double(row):
    import os
    import time

    time.sleep(0.02)
    return row.x * 2, os.environ.get("POD_NAME", "?")


def latency(load, t_from: float, t_to: float) -> dict:
    ms = [(done - sent) * 1000 for s, _, sent, done in load.answers.values() if s == 200 and t_from <= sent < t_to]
    if not ms:
        return {"n": 0}
    ms.sort()
    return {
        "n": len(ms),
        "p50_ms": round(statistics.median(ms), 1),
        "p99_ms": round(ms[int(0.99 * (len(ms) - 1))], 1),
        "max_ms": round(ms[-1], 1),
    }


def fault_run(node, args) -> dict:
    from flow import Flow
    from tests.k8s import realcluster as rc
    from tests.k8s.test_real_node import namespace, serve

    core, ns = namespace(node, "bench-fault")
    flow = Flow("double")
    flow.map(double, names=["y"])
    t0 = time.monotonic()
    cluster, d, core = serve(node, ns, flow)
    out = {"serve_s": round(time.monotonic() - t0, 1)}
    try:
        executors = sorted(rc.pod_ips(core, ns, "executor-cpu"))
        load = rc.Load(d.url, concurrency=args.concurrency).start()
        time.sleep(args.seconds / 4)  # steady load before the first fault (a measurement, not a wait)
        crashed, evicted = executors
        t_kill = time.monotonic() - load.t0
        node.kill_container(core.read_namespaced_pod(crashed, ns), "executor")
        rc.wait_for(
            "the restarted container ready",
            lambda: (lambda s: s.restart_count >= 1 and s.ready)(
                core.read_namespaced_pod(crashed, ns).status.container_statuses[0]
            ),
            timeout=180,
        )
        t_restarted = time.monotonic() - load.t0
        time.sleep(args.seconds / 4)
        t_delete = time.monotonic() - load.t0
        core.delete_namespaced_pod(evicted, ns)
        rc.wait_for(
            "a replacement pod ready",
            lambda: (
                len(set(rc.pod_ips(core, ns, "executor-cpu")) - set(executors)) == 1
                and cluster.status()["components"]["executor-cpu"]["ready"] == 2
            ),
            timeout=240,
        )
        t_replaced = time.monotonic() - load.t0
        time.sleep(args.seconds / 4)
        t_end = time.monotonic() - load.t0
        summary = load.stop()
        out.update(
            summary,
            concurrency=args.concurrency,
            seconds=round(t_end, 1),
            throughput_rps=round(summary["requests"] / t_end, 1),
            crash={
                "t": round(t_kill, 1),
                "container_ready_again_s": round(t_restarted - t_kill, 1),
                "latency_during": latency(load, t_kill, t_restarted),
            },
            delete={
                "t": round(t_delete, 1),
                "replacement_ready_s": round(t_replaced - t_delete, 1),
                "latency_during": latency(load, t_delete, t_replaced),
            },
            latency_steady=latency(load, 0, t_kill),
        )
    finally:
        cluster.close()
        cluster.delete()
    return out


def scale_run(node, args) -> dict:
    from kubernetes import client

    from executors.hosts.autoscale import AutoscalingConfig
    from flow import Flow
    from tests.k8s import realcluster as rc
    from tests.k8s.test_real_node import namespace, serve

    core, ns = namespace(node, "bench-scale")
    flow = Flow("slow")
    flow.map(slow_double, names=["y", "pod"])
    scaling = AutoscalingConfig(min_replicas=1, max_replicas=2, upscale_delay_s=1.0, upscale_cooldown_s=2.0)
    cluster, d, core = serve(node, ns, flow, cpu_executors=1, autoscaling=scaling)
    apps = client.AppsV1Api(node.cp.api_client("admin"))
    out = {
        "autoscaling": {"min_replicas": 1, "max_replicas": 2, "upscale_delay_s": 1.0},
        "before_step": "1 client at 10 req/s",
        "step_clients": args.step,
    }
    try:
        (first,) = rc.pod_ips(core, ns, "executor-cpu")
        # before the step: one client at 10 requests/s (20 % of one executor), well under
        # target_utilisation; after: ``--step`` clients as fast as they are answered
        base = rc.Load(d.url, concurrency=1, rate=10).start()
        time.sleep(args.seconds / 2)
        replicas_before = apps.read_namespaced_deployment_scale("flowserve-executor-cpu", ns).spec.replicas
        step = rc.Load(d.url, concurrency=args.step, first_id=1 << 40)
        step.t0 = base.t0
        t_step = time.monotonic()
        step.start()
        marks = {}

        def progressed():
            now = time.monotonic() - t_step
            if (
                "replicas_2" not in marks
                and (apps.read_namespaced_deployment_scale("flowserve-executor-cpu", ns).spec.replicas or 0) >= 2
            ):
                marks["replicas_2"] = now
            pods = [
                p
                for p in core.list_namespaced_pod(ns, label_selector="app.kubernetes.io/component=executor-cpu").items
                if p.metadata.name != first
            ]
            for p in pods:
                if "running" not in marks and p.status.phase == "Running":
                    marks["running"] = now
                if "ready" not in marks and any(c.ready for c in p.status.container_statuses or []):
                    marks["ready"] = now
                    marks["pod"] = p.metadata.name
            if "pod" in marks and "serving" not in marks:
                served = [
                    done
                    for load in (base, step)
                    for s, rows, _, done in list(load.answers.values())
                    if s == 200 and rows and rows[0].get("pod") == marks["pod"]
                ]
                if served:
                    marks["serving"] = min(served) - (t_step - base.t0)
            return "serving" in marks

        rc.wait_for("the new executor pod serving", progressed, timeout=300, every=0.2)
        time.sleep(args.seconds / 4)
        t_end = time.monotonic() - base.t0
        s1, s2 = base.stop(), step.stop()
        answers = {**base.answers, **step.answers}
        by_pod = {}
        for s, rows, _, _ in answers.values():
            if s == 200:
                by_pod[rows[0]["pod"]] = by_pod.get(rows[0]["pod"], 0) + 1
        out.update(
            {k: round(v, 2) if isinstance(v, float) else v for k, v in marks.items()},
            executor_replicas_before_step=replicas_before,
            requests=s1["requests"] + s2["requests"],
            lost=s1["lost"] + s2["lost"],
            wrong=s1["wrong"] + s2["wrong"],
            answers_by_pod=by_pod,
            latency_before=latency(base, 0, t_step - base.t0),
            latency_after_ready=latency(step, t_step - base.t0 + marks["ready"], t_end),
        )
        out["seconds_to"] = {k: out.pop(k) for k in ("replicas_2", "running", "ready", "serving") if k in out}
    finally:
        cluster.close()
        cluster.delete()
    return out


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seconds", type=float, default=20.0, help="steady load around the faults (in all)")
    p.add_argument("--concurrency", type=int, default=4)
    p.add_argument("--step", type=int, default=8, help="clients after the load step (1 before)")
    p.add_argument("--only", choices=["fault", "scale"])
    args = p.parse_args(argv)
    os.environ.setdefault("FLOWSERVE_QUIET", "1")
    from tests.k8s import realcluster as rc

    why = rc.real_node_unavailable()
    if why is not None:
        raise SystemExit(f"k8s_pods: {why}")
    result = {"machine": machine(), "load_average_before": os.getloadavg()}
    t0 = time.monotonic()
    progress("k8s_pods: control plane, real node, FlowServe image")
    node = rc.RealNode(Path(tempfile.mkdtemp(prefix="k8s-pods-")))
    try:
        result["node"] = {
            "start_and_image_s": round(time.monotonic() - t0, 1),
            "image_build_and_import_s": round(node.image_build_s, 1),
            "versions": versions(node),
        }
        if args.only in (None, "fault"):
            progress("k8s_pods: fault run")
            result["fault"] = fault_run(node, args)
            progress(f"k8s_pods: fault {result['fault']}")
        if args.only in (None, "scale"):
            progress("k8s_pods: scale-up run")
            result["scale_up"] = scale_run(node, args)
            progress(f"k8s_pods: scale-up {result['scale_up']}")
    finally:
        node.stop()
        shutil.rmtree(node.dir, ignore_errors=True)
    result["load_average_after"] = os.getloadavg()
    save("k8s_pods", result)
    return result


def versions(node) -> dict:
    import subprocess

    def out(*cmd):
        r = subprocess.run(cmd, capture_output=True, text=True)
        return (r.stdout or r.stderr).strip().splitlines()[0] if (r.stdout or r.stderr).strip() else "?"

    b = node.cp.env["K8S_BIN"]
    return {
        "kubelet": out(f"{b}/kubelet", "--version"),
        "kube-apiserver": out(f"{b}/kube-apiserver", "--version"),
        "containerd": out("containerd", "--version"),
        "runc": out("runc", "--version"),
        "cni_bridge": out("dpkg-query", "-W", "containernetworking-plugins"),
    }


if __name__ == "__main__":
    main()
