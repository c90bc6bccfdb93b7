"""``flowserve k8s render --kustomize DIR`` (k8s/kustomize.py): a kustomize base that
``kubectl kustomize`` builds back into exactly the rendered objects, that the real control
plane accepts (``kubectl apply -k`` as the deployer of docs/kubernetes.md, its controllers
and scheduler rolling it out), and whose gateway probes and termination grace the API
server keeps as rendered (a server-side dry run returns the objects it would store)."""

from __future__ import annotations

import json
import subprocess
import sys

import yaml

from k8s import KubeConfig, render
from k8s.kustomize import KUSTOMIZATION, write_base
from tests.k8s import realcluster as rc

CLI = [sys.executable, "-m", "flowserve.cli", "k8s", "render"]


def render_base(directory, namespace: str, **fields) -> subprocess.CompletedProcess:
    config = directory.parent / f"{directory.name}-config.json"
    config.write_text(json.dumps({"namespace": namespace, "kvs_storage": None, **fields}))
    return subprocess.run(
        [*CLI, "--config", str(config), "--kustomize", str(directory)], capture_output=True, text=True
    )


def key(m: dict) -> tuple[str, str]:
    return m["kind"], m["metadata"]["name"]


def test_kubectl_kustomize_builds_the_rendered_objects_back(control_plane, tmp_path):
    base = tmp_path / "base"
    r = render_base(base, "ml", gpu_executors=1)
    assert r.returncode == 0 and r.stdout == "", r.stderr  # only the directory: no YAML on stdout
    built = list(yaml.safe_load_all(control_plane.kubectl("kustomize", str(base))))
    expected = render(KubeConfig(namespace="ml", kvs_storage=None, gpu_executors=1))
    assert {key(m): m for m in built} == {key(m): m for m in expected}
    listed = yaml.safe_load((base / KUSTOMIZATION).read_text())["resources"]
    assert len(listed) == len(expected) and "deployment-flowserve-executor-gpu.yaml" in listed
    # rendered again without GPU executors: their file goes, a file of the user's stays
    (base / "patch.yaml").write_text("# the user's own\n")
    assert render_base(base, "ml", gpu_executors=0).returncode == 0
    assert not (base / "deployment-flowserve-executor-gpu.yaml").exists() and (base / "patch.yaml").exists()
    built = list(yaml.safe_load_all(control_plane.kubectl("kustomize", str(base))))
    assert ("Deployment", "flowserve-executor-gpu") not in {key(m) for m in built}


def test_the_base_applies_on_the_real_control_plane_as_the_deployer(control_plane, k8s_namespace, tmp_path):
    base = tmp_path / "base"
    assert render_base(base, k8s_namespace, cpu_executors=2).returncode == 0
    control_plane.kubectl("apply", "-k", str(base), user="developer")
    expected = {key(m) for m in render(KubeConfig(namespace=k8s_namespace, kvs_storage=None, cpu_executors=2))}
    live = control_plane.kubectl(
        "-n",
        k8s_namespace,
        "get",
        "deployments,statefulsets,services,networkpolicies,serviceaccounts",
        "-l",
        "app.kubernetes.io/instance=flowserve",
        "-o",
        "jsonpath={range .items[*]}{.kind} {.metadata.name}{'\\n'}{end}",
    )
    assert {tuple(line.split()) for line in live.splitlines() if line.strip()} == expected
    # the real controllers and scheduler roll it out (the fakelet marks the pods ready)
    rc.wait_for(
        "the executors to roll out",
        lambda: (
            control_plane.kubectl(
                "-n",
                k8s_namespace,
                "get",
                "deployment",
                "flowserve-executor-cpu",
                "-o",
                "jsonpath={.status.readyReplicas}",
            )
            == "2"
        ),
        timeout=60,
    )
    again = control_plane.kubectl("apply", "-k", str(base), user="developer")
    assert "configured" not in again  # idempotent: every object "unchanged"


def test_the_api_server_keeps_the_gateways_probes_and_grace_period(control_plane, k8s_namespace, tmp_path):
    base = tmp_path / "base"
    write_base(render(KubeConfig(namespace=k8s_namespace, gateway_settings={"request_timeout_s": 20})), base)
    out = control_plane.kubectl("apply", "-k", str(base), "--dry-run=server", "-o", "json", user="developer")
    items = json.loads(out)
    items = items["items"] if "items" in items else [items]
    gw = next(m for m in items if key(m) == ("Deployment", "flowserve-gateway"))
    pod = gw["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    assert c["livenessProbe"]["httpGet"]["path"] == "/livez" and c["startupProbe"]["httpGet"]["path"] == "/livez"
    assert c["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert pod["terminationGracePeriodSeconds"] == 20 + 15  # the drain (request_timeout_s) and a margin
