"""``flowserve k8s render``: valid YAML out, clear errors for bad values."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

from k8s.commands import main
from tests.k8s.conftest import K8S_VERSIONS

yaml = pytest.importorskip("yaml")
kv = pytest.importorskip("kubernetes_validate")


def run(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def names(docs):
    return [(d["kind"], d["metadata"]["name"]) for d in docs]


def test_render_to_stdout_is_valid_multi_document_yaml(capsys):
    code, out, err = run(
        capsys, "render", "--namespace", "ml", "--image", "reg.example.com/flowserve:0.1.0", "--gpu-executors", "2"
    )
    assert code == 0, err
    docs = list(yaml.safe_load_all(out))
    assert ("Deployment", "flowserve-executor-gpu") in names(docs)
    for d in docs:
        assert d["metadata"]["namespace"] == "ml"
        kv.validate(d, K8S_VERSIONS[-1], strict=True)
    gpu = next(d for d in docs if d["metadata"]["name"] == "flowserve-executor-gpu")
    assert gpu["spec"]["replicas"] == 2
    assert gpu["spec"]["template"]["spec"]["containers"][0]["image"] == "reg.example.com/flowserve:0.1.0"


def test_render_to_a_file(tmp_path, capsys):
    out = tmp_path / "flowserve.yaml"
    code, stdout, err = run(capsys, "render", "--out", str(out), "--cpu-executors", "4", "--name", "vision")
    assert code == 0 and stdout == ""
    assert f"wrote {out} (9 objects)" in err
    docs = list(yaml.safe_load_all(out.read_text()))
    assert len(docs) == 9
    assert next(d for d in docs if d["metadata"]["name"] == "vision-executor-cpu")["spec"]["replicas"] == 4
    assert not list(tmp_path.glob(".*tmp*"))  # no temporary file left behind


def test_render_from_a_config_file_with_flags_on_top(tmp_path, capsys):
    cfg = tmp_path / "k8s.yaml"
    cfg.write_text(
        textwrap.dedent("""\
        namespace: staging
        service_type: LoadBalancer
        token_secret: api-token
        gpu_executors: 1
        gpu_node_selector: {"nvidia.com/gpu.product": "NVIDIA-L4"}
        gpu_executor_resources: {cpu: "2", memory: 8Gi}
    """)
    )
    code, out, err = run(capsys, "render", "--config", str(cfg), "--namespace", "prod")
    assert code == 0, err
    docs = list(yaml.safe_load_all(out))
    assert {d["metadata"]["namespace"] for d in docs} == {"prod"}
    gpu = next(d for d in docs if d["metadata"]["name"] == "flowserve-executor-gpu")
    assert gpu["spec"]["template"]["spec"]["nodeSelector"] == {"nvidia.com/gpu.product": "NVIDIA-L4"}
    svc = next(d for d in docs if d["kind"] == "Service" and d["metadata"]["name"] == "flowserve-gateway")
    assert svc["spec"]["type"] == "LoadBalancer"
    (tmp_path / "k8s.json").write_text(json.dumps({"cpu_executors": 3}))
    code, out, _ = run(capsys, "render", "--config", str(tmp_path / "k8s.json"))
    assert code == 0
    assert (
        next(d for d in yaml.safe_load_all(out) if d["metadata"]["name"] == "flowserve-executor-cpu")["spec"][
            "replicas"
        ]
        == 3
    )


def test_render_sizes_gpu_executors_from_a_flow_script(tmp_path, capsys):
    script = tmp_path / "vision.py"
    script.write_text(
        textwrap.dedent("""\
        import numpy as np
        from flow import Flow

        def pre(row):
            return row.raw * 2.0

        def net(table):
            return [np.zeros(len(table))]

        flow = Flow("vision", schema={"raw": float})
        flow.map(pre, names=["x"]).map(net, names=["y"], batching=True, gpu=True)
    """)
    )
    code, out, err = run(capsys, "render", "--script", str(script))
    assert code == 0, err
    gpu = next(d for d in yaml.safe_load_all(out) if d["metadata"]["name"] == "flowserve-executor-gpu")
    assert gpu["spec"]["replicas"] == 1
    assert gpu["metadata"]["annotations"]["flowserve.io/gpu-stages"] == "vision/net"


@pytest.mark.parametrize(
    "argv,message",
    [
        (["--image", "flowserve:latest"], "KubeConfig.image must not use the 'latest' tag"),
        (["--namespace", "Prod"], "KubeConfig.namespace must be a string: a DNS label"),
        (
            ["--gpu-executors", "-2"],
            "KubeConfig.gpu_executors must be None (decide from the plan) or an int in 0..1000, got -2",
        ),
        (["--config", "/nonexistent/k8s.yaml"], "--config '/nonexistent/k8s.yaml': cannot read it"),
        (["--script", "/nonexistent/flow.py"], "--script '/nonexistent/flow.py': no such file"),
        (["--out", "/nonexistent/dir/x.yaml"], "--out '/nonexistent/dir/x.yaml': cannot write it"),
    ],
)
def test_bad_values_exit_2_quoting_the_value(capsys, argv, message):
    code, out, err = run(capsys, "render", *argv)
    assert code == 2
    assert out == ""
    assert err.startswith("error: ") and message in err


def test_a_config_file_with_unknown_fields_is_refused(tmp_path, capsys):
    cfg = tmp_path / "k8s.yaml"
    cfg.write_text("replicas: 3\n")
    code, _, err = run(capsys, "render", "--config", str(cfg))
    assert code == 2 and "unknown field(s) ['replicas']" in err
    cfg.write_text("- a\n- b\n")
    code, _, err = run(capsys, "render", "--config", str(cfg))
    assert code == 2 and "must hold a mapping of KubeConfig fields, got list" in err


def test_wires_into_the_flowserve_parser(capsys):
    """flowserve/cli.py adds the k8s commands to `flowserve`; main calls args.fn(args)."""
    from flowserve.cli import build_parser

    parser = build_parser()
    args = parser.parse_args(["k8s", "render", "--namespace", "ml"])
    assert args.fn(args) == 0
    assert "namespace: ml" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        parser.parse_args(["k8s", "render", "--service-type", "Ingress"])
    assert "invalid choice: 'Ingress'" in capsys.readouterr().err


def test_runs_as_a_module():
    r = subprocess.run(
        [sys.executable, "-m", "k8s.commands", "render", "--namespace", "ml"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 0, r.stderr
    assert len(list(yaml.safe_load_all(r.stdout))) == 9
    r = subprocess.run(
        [sys.executable, "-m", "k8s.commands", "render", "--help"], capture_output=True, text=True, timeout=60
    )
    assert r.returncode == 0 and "--gpu-executors N" in r.stdout and "Secrets are referenced" in r.stdout


def test_autoscaling_from_a_config_file(tmp_path, capsys):
    cfg = tmp_path / "k8s.yaml"
    cfg.write_text("namespace: ml\nautoscaling:\n  max_replicas: 4\n  target_queue_per_replica: 8\n")
    code, out, err = run(capsys, "render", "--config", str(cfg))
    assert code == 0, err
    docs = list(yaml.safe_load_all(out))
    assert names(docs)[:3] == [
        ("ServiceAccount", "flowserve"),
        ("Role", "flowserve-autoscaler"),
        ("RoleBinding", "flowserve-autoscaler"),
    ]
    gw = next(d for d in docs if (d["kind"], d["metadata"]["name"]) == ("Deployment", "flowserve-gateway"))
    args = gw["spec"]["template"]["spec"]["containers"][0]["args"]
    autoscale = json.loads(args[args.index("--autoscale") + 1])
    assert (autoscale["max_replicas"], autoscale["target_queue_per_replica"]) == (4, 8)
    cfg.write_text("autoscaling:\n  max_replicas: 0\n")
    code, _, err = run(capsys, "render", "--config", str(cfg))
    assert code == 2 and "KubeConfig.autoscaling: AutoscalingConfig.max_replicas must be an int >= 1, got 0" in err
