"""``flowserve k8s``: render the Kubernetes manifests for review or GitOps.

    flowserve k8s render --namespace ml --image reg.example.com/flowserve:0.1.0 --out flowserve.yaml
    flowserve k8s render --script examples/ensemble.py --out -     # GPU executors if a stage needs one
    kubectl apply -f flowserve.yaml
    flowserve k8s render --kustomize k8s/base && kubectl apply -k k8s/base   # a kustomize base

Wired into the main CLI by ``add_k8s_parser(sub)`` in ``flowserve.cli.build_parser``; it
also runs alone: ``python -m k8s.commands render ...``.
"""

from __future__ import annotations

import argparse
import json
import os
import runpy
import sys
from pathlib import Path

from flow.configuration import ConfigError
from flow.errors import FlowError
from k8s.kube_config import DEFAULT_IMAGE, SERVICE_TYPES, KubeConfig
from k8s.manifests import render, to_yaml


def add_k8s_parser(subparsers) -> argparse.ArgumentParser:
    """Add ``k8s`` (with ``render``) to an argparse ``subparsers``; sets ``fn=main``.

    sub = parser.add_subparsers(dest="command")
    add_k8s_parser(sub)          # flowserve k8s render ...
    """
    k8s = subparsers.add_parser(
        "k8s", help="Kubernetes: render manifests", description="Run FlowServe on Kubernetes (see docs/kubernetes.md)."
    )
    _add_commands(k8s.add_subparsers(dest="k8s_command", required=True, metavar="K8S_COMMAND"))
    k8s.set_defaults(fn=main)
    return k8s


def _add_commands(k8s_sub) -> None:
    r = k8s_sub.add_parser(
        "render",
        help="write the manifests as multi-document YAML",
        description="Write the manifests of a FlowServe instance (KVS, gateway, CPU/GPU executors) as YAML for "
        "review or GitOps. Secrets are referenced by name, never included.",
    )
    r.add_argument("--config", metavar="FILE", help="KubeConfig fields as a JSON or YAML mapping; flags override it")
    r.add_argument("--name", help="instance name, prefix of every object (default flowserve)")
    r.add_argument("--namespace", help="namespace (default flowserve)")
    r.add_argument("--image", help=f"FlowServe image with a tag or digest (default {DEFAULT_IMAGE})")
    r.add_argument("--gateway-replicas", type=int, metavar="N", help="gateway replicas (default 1)")
    r.add_argument("--cpu-executors", type=int, metavar="N", help="CPU executor replicas (default 2)")
    r.add_argument(
        "--gpu-executors",
        type=int,
        metavar="N",
        help="GPU executor replicas (default: 1 if a --script flow has a GPU stage, else 0)",
    )
    r.add_argument("--service-type", choices=SERVICE_TYPES, help="gateway Service type (default ClusterIP)")
    r.add_argument("--token-secret", metavar="SECRET", help="Secret (key 'token') with the public API's bearer token")
    r.add_argument(
        "--script",
        metavar="SCRIPT",
        help="a .py file building Flow objects: their optimized plans decide whether GPU executors "
        "are needed and annotate the executors",
    )
    r.add_argument(
        "--out", default=None, metavar="FILE|-", help="where to write the YAML (default -: stdout, unless --kustomize)"
    )
    r.add_argument(
        "--kustomize",
        metavar="DIR",
        help="also write a kustomize base into DIR: kustomization.yaml and one file per object (kubectl apply -k DIR)",
    )
    r.set_defaults(fn=main)


def _load_config(args) -> KubeConfig:
    fields: dict = {}
    if args.config:
        path = Path(args.config)
        try:
            text = path.read_text()
        except OSError as e:
            raise ConfigError(f"--config {args.config!r}: cannot read it: {e.strerror or e}") from None
        try:
            doc = json.loads(text)
        except ValueError:
            try:
                import yaml

                doc = yaml.safe_load(text)
            except Exception as e:  # yaml's errors have no common base worth naming: any is "not YAML"
                raise ConfigError(f"--config {args.config!r}: neither JSON nor YAML: {e}") from None
        if not isinstance(doc, dict):
            raise ConfigError(
                f"--config {args.config!r} must hold a mapping of KubeConfig fields, got {type(doc).__name__}"
            )
        fields.update(doc)
    flags = {
        "name": args.name,
        "namespace": args.namespace,
        "image": args.image,
        "gateway_replicas": args.gateway_replicas,
        "cpu_executors": args.cpu_executors,
        "gpu_executors": args.gpu_executors,
        "service_type": args.service_type,
        "token_secret": args.token_secret,
    }
    fields.update({k: v for k, v in flags.items() if v is not None})
    return KubeConfig.from_dict(fields)


def _plans(script: str | None) -> list:
    if not script:
        return []
    from flow.flow import Flow
    from optimizer import optimize

    path = Path(script)
    if not path.is_file():
        raise ConfigError(f"--script {script!r}: no such file")
    sys.path.insert(0, str(path.parent.resolve()))
    try:
        namespace = runpy.run_path(str(path), run_name="__flowserve_render__")
    finally:
        sys.path.pop(0)
    flows = [v for v in namespace.values() if isinstance(v, Flow)]
    if not flows:
        raise ConfigError(f"--script {script!r} defines no Flow at module level")
    return [optimize(f) for f in flows]


def main(args) -> int:
    """Run a parsed ``flowserve k8s ...`` command (or parse ``args`` when it is a list)."""
    if args is None or isinstance(args, (list, tuple)):
        parser = argparse.ArgumentParser(
            prog="python -m k8s.commands", description="Run FlowServe on Kubernetes (see docs/kubernetes.md)."
        )
        _add_commands(parser.add_subparsers(dest="k8s_command", required=True, metavar="K8S_COMMAND"))
        args = parser.parse_args(list(args) if args is not None else sys.argv[1:])
    try:
        if args.k8s_command == "render":
            return _render(args)
        raise ConfigError(f"unknown k8s command {args.k8s_command!r}")  # pragma: no cover - argparse
    except FlowError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2 if isinstance(e, ValueError) else 1


def _render(args) -> int:
    config = _load_config(args)
    manifests = render(config, _plans(args.script) or None)
    if args.kustomize:
        from k8s.kustomize import write_base

        files = write_base(manifests, args.kustomize)
        print(
            f"wrote a kustomize base of {len(manifests)} objects into {files[-1].parent} (kubectl apply -k)",
            file=sys.stderr,
        )
        if args.out is None:
            return 0
    text = to_yaml(manifests)
    if args.out in (None, "-"):
        sys.stdout.write(text)
        sys.stdout.flush()
        return 0
    out = Path(args.out)
    tmp = out.with_name(f".{out.name}.tmp-{os.getpid()}")
    try:
        tmp.write_text(text)
        os.replace(tmp, out)
    except OSError as e:
        tmp.unlink(missing_ok=True)
        raise ConfigError(f"--out {args.out!r}: cannot write it: {e.strerror or e}") from None
    print(f"wrote {out} ({len(manifests)} objects)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
