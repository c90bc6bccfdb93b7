"""The ``flowserve`` command line.

    flowserve up [--executors N] [--port P]     start a local cluster in the background
    flowserve status                            flows, stages, replicas, latencies
    flowserve deploy script.py [--no-optimize]  deploy the Flow(s) a script defines
    flowserve invoke NAME --json '{"x": 1}'     call a deployed flow
    flowserve down                              stop the cluster (in-flight requests finish)
"""

from __future__ import annotations

import argparse
import json
import runpy
import sys
from pathlib import Path

from flow.exceptions import FlowError


def _cluster(args):
    from executors.cluster import LocalCluster

    return LocalCluster.connect(args.dir)


def cmd_up(args) -> int:
    from executors.cluster import LocalCluster
    from executors.config import ClusterConfig
    from executors.daemon import STATE_FILE

    if (Path(args.dir) / STATE_FILE).exists():
        try:
            c = LocalCluster.connect(args.dir)
            print(f"a cluster is already running at {c.url} (dir {args.dir})")
            return 0
        except FlowError:
            pass  # stale state file from a crashed cluster: start a new one
    fields = {"dir": str(args.dir), "persistence": True, "host": args.host, "port": args.port}
    if args.executors is not None:
        fields["executors"] = args.executors
    if args.token:
        fields["token"] = args.token
    if args.autoscale:
        from executors.autoscale import AutoscalingConfig

        fields["autoscaling"] = AutoscalingConfig(max_replicas=args.max_replicas)
    c = LocalCluster(ClusterConfig(**fields), detached=True).start()
    print(f"cluster up at {c.url}  (stop it with `flowserve down`)")
    return 0


def cmd_down(args) -> int:
    c = _cluster(args)
    c.stop()
    print("cluster stopped")
    return 0


def cmd_status(args) -> int:
    st = _cluster(args).status()
    if args.json:
        print(json.dumps(st, indent=2))
        return 0
    h = st["health"]
    print(f"cluster {st['url']}: {h['executors']} executors alive, {len(st['flows'])} flow(s)")
    for f in st["flows"]:
        print(f"\nflow {f['name']} (v{f['version']})")
        rows = [("stage", "replicas", "device", "batch", "wait", "p50 ms")]
        for s in f["stages"]:
            batch = f"{s['batch']['max_batch_size']}/{s['batch']['max_wait_ms']}ms" if s["batch"] else "-"
            comp = f" x{s['competitive']}" if s["competitive"] > 1 else ""
            p50 = f"{s['p50_ms']:.2f}" if s["p50_ms"] is not None else "-"
            rows.append((s["name"], f"{s['replicas']}{comp}", s["device"], batch, s["wait"], p50))
        widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
        for r in rows:
            print("  " + "  ".join(v.ljust(w) for v, w in zip(r, widths)))
        for s in f["stages"]:
            if s.get("autoscaling") and s["autoscaling"].get("last_decision"):
                print(f"  autoscaler: {s['autoscaling']['last_decision']}")
    return 0


def cmd_deploy(args) -> int:
    from flow.flow import Flow

    c = _cluster(args)
    script = Path(args.script)
    if not script.exists():
        print(f"error: no such script: {script}", file=sys.stderr)
        return 2
    sys.path.insert(0, str(script.parent.resolve()))
    namespace = runpy.run_path(str(script), run_name="__flowserve_deploy__")
    flows = [v for v in namespace.values() if isinstance(v, Flow)]
    if args.flow:
        flows = [f for f in flows if f.name == args.flow]
    if not flows:
        print(f"error: {script} defines no Flow" + (f" named {args.flow!r}" if args.flow else ""), file=sys.stderr)
        return 2
    for f in flows:
        d = c.deploy(f, optimize=not args.no_optimize)
        print(f"deployed {f.name} at {d.url}")
    return 0


def cmd_invoke(args) -> int:
    c = _cluster(args)
    try:
        body = json.loads(args.json)
    except ValueError as e:
        print(f"error: --json is not valid JSON: {e}", file=sys.stderr)
        return 2
    r = c.http.post(f"/flows/{args.name}", json=body)
    print(json.dumps(r.json(), indent=2))
    return 0 if r.status_code == 200 else 1


def build_parser() -> argparse.ArgumentParser:
    from executors.cluster import DEFAULT_DIR

    p = argparse.ArgumentParser(prog="flowserve", description="Serve prediction pipelines as optimized dataflows.")
    p.add_argument("--dir", default=str(DEFAULT_DIR), help=f"cluster directory (default {DEFAULT_DIR})")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    up = sub.add_parser("up", help="start a local cluster in the background")
    up.add_argument("--executors", type=int, help="executor processes (default: one per core, at least 2)")
    up.add_argument("--host", default="127.0.0.1", help="gateway bind address (default 127.0.0.1)")
    up.add_argument("--port", type=int, default=8000, help="gateway port (default 8000; 0 for a free one)")
    up.add_argument("--token", help="require this bearer token on /flows calls")
    up.add_argument("--autoscale", action="store_true", help="scale each stage's replicas on its own load")
    up.add_argument("--max-replicas", type=int, default=8, help="autoscaling: replicas per stage at most (default 8)")
    up.set_defaults(fn=cmd_up)

    sub.add_parser("down", help="stop the local cluster").set_defaults(fn=cmd_down)

    st = sub.add_parser("status", help="flows, stages, replicas and latencies")
    st.add_argument("--json", action="store_true", help="machine-readable output")
    st.set_defaults(fn=cmd_status)

    dp = sub.add_parser("deploy", help="deploy the Flow(s) a Python script defines")
    dp.add_argument("script", help="a .py file that builds one or more Flow objects")
    dp.add_argument("--flow", help="deploy only the flow with this name")
    dp.add_argument("--no-optimize", action="store_true", help="one stage per operator")
    dp.set_defaults(fn=cmd_deploy)

    iv = sub.add_parser("invoke", help="call a deployed flow")
    iv.add_argument("name", help="flow name")
    iv.add_argument("--json", required=True, help="one row as a JSON object, or a list of rows")
    iv.set_defaults(fn=cmd_invoke)

    from k8s.cli import add_k8s_parser

    add_k8s_parser(sub)  # flowserve k8s render: manifests for review / GitOps
    return p


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.fn(args)
    except FlowError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
