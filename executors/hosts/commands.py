"""The runtime's commands of the ``flowserve`` command line (flowserve/cli.py composes them
with the deploy targets' commands, e.g. ``flowserve k8s``).

    flowserve serve app.py [--reload]           the dev loop: serve a script's flows in the foreground,
                                                stream the logs, deploy again on change (devserver.py)
    flowserve logs [FLOW] [-f]                  the cluster's logs (of one flow); -f follows them
    flowserve up [--executors N] [--port P]     start a local cluster in the background
    flowserve status                            flows, stages, replicas, latencies
    flowserve deploy script.py [--no-optimize]  deploy the Flow(s) a script defines
        [--slo-p99-ms MS --traffic-rps R --samples rows.json]   ...under a latency SLO
    flowserve deploy -f flowserve.yaml [--prune]   what a config file lists, applied idempotently (manifest.py)
    flowserve profile NAME --samples rows.json  time a deployed flow's stages per batch size
    flowserve invoke NAME --json '{"x": 1}'     call a deployed flow
    flowserve deploy script.py --canary 0.1     a new version beside the served one (or --shadow)
    flowserve promote NAME | rollback NAME      end it: serve it, or drop it (rollout_commands.py)
    flowserve build app.py [--tag REF]          an OCI image of FlowServe + the script (image_build.py)
    flowserve undeploy NAME                     stop serving a flow
    flowserve kvs put KEY FILE | --json J       put data (bytes, a .npy array, JSON) into the store
    flowserve kvs get KEY [--out FILE]          read it back; `flowserve kvs ls [PATTERN]` lists keys
    flowserve kvs ls [--after KEY] [--limit N]  ...100 at a time; --all: every key
    flowserve kvs rm KEY [KEY...] [--force]     remove keys (the runtime's own only with --force)
    flowserve down                              stop the cluster (in-flight requests finish)

A script that ``flowserve deploy`` takes defines ``flows()`` (returning a Flow or a list of
them; or module-level Flow objects) and, optionally, ``setup(store)``, which puts the
models and data its flows read into the store before they are deployed. It is run with
``__name__ == "__flowserve_deploy__"``, so its ``if __name__ == "__main__":`` part does not.
"""

from __future__ import annotations

import argparse
import bisect
import json
import os
import runpy
import shlex
import sys
import time
from pathlib import Path

from executors.hosts.image_build import add_build_command
from executors.hosts.rollout_commands import add_rollout_commands, add_rollout_flags, rollout_args, rollout_lines
from flow.configuration import ConfigError
from flow.errors import FlowError, FlowValueError


def _cluster(args):
    from executors.hosts.cluster import LocalCluster

    return LocalCluster.connect(args.dir)


def cmd_up(args) -> int:
    from executors.hosts.cluster import LocalCluster
    from executors.hosts.cluster_config import STATE_FILE, ClusterConfig

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
    if args.gpu_executors is not None:
        fields["gpu_executors"] = args.gpu_executors
    token = _token(args)
    if token:
        fields["token"] = token
    for flag, field in (("request_timeout", "request_timeout_s"), ("max_request_timeout", "max_request_timeout_s")):
        if getattr(args, flag) is not None:
            fields[field] = getattr(args, flag)
    if args.max_body_mb is not None:
        fields["max_body_bytes"] = int(args.max_body_mb * 1024 * 1024)
    if args.autoscale:
        from executors.hosts.autoscale import AutoscalingConfig

        fields["autoscaling"] = AutoscalingConfig(max_replicas=args.max_replicas)
    c = LocalCluster(ClusterConfig(**fields), detached=True).start()
    print(f"cluster up at {c.url}  (stop it with `flowserve down`)")
    return 0


TOKEN_ENV = "FLOWSERVE_TOKEN"


def _token(args) -> str | None:
    """The bearer token `up` requires: ``--token-file`` (kept off the command line, where
    any local user reads it with `ps`), else ``--token``, else ``$FLOWSERVE_TOKEN``."""
    if args.token_file:
        try:
            token = Path(args.token_file).read_text().strip()
        except OSError as e:
            raise ConfigError(f"cannot read the token file {args.token_file}: {e.strerror or e}") from None
        if not token:
            raise ConfigError(f"the token file {args.token_file} is empty")
        return token
    return args.token or os.environ.get(TOKEN_ENV) or None


def _say(msg: str) -> None:
    """Progress of a long step, on stderr (stdout stays for results)."""
    if os.environ.get("FLOWSERVE_QUIET") != "1":
        print(f"[flowserve] {msg}", file=sys.stderr, flush=True)


def cmd_down(args) -> int:
    """Stop the cluster; with none running, say so and succeed (it is down), removing what a
    crashed one left behind (state file, sockets) so the next `up` starts clean."""
    from executors.hosts.cluster import LocalCluster
    from executors.hosts.cluster_config import STATE_FILE

    home = Path(args.dir)
    if not (home / STATE_FILE).exists():
        print(f"no cluster is running in {home}")
        return 0
    try:
        c = LocalCluster.connect(home)
    except FlowError:
        _clean_stale(home)
        print(f"no cluster was answering in {home}; removed its stale state")
        return 0
    c.stop(force=True)  # it runs for others (stop() alone refuses); returns once its processes are gone
    _clean_stale(home)
    print("cluster stopped")
    return 0


def _clean_stale(home: Path) -> None:
    import shutil

    from executors.hosts.cluster_config import STATE_FILE

    state = home / STATE_FILE
    try:
        rundir = json.loads(state.read_text()).get("rundir")
    except (OSError, ValueError):
        rundir = None
    if rundir and Path(rundir).name.startswith("flowserve-run-"):
        shutil.rmtree(rundir, ignore_errors=True)  # its sockets
    for sock in home.glob("*.ipc"):  # sockets of a cluster that kept them in its directory
        sock.unlink(missing_ok=True)
    state.unlink(missing_ok=True)


def cmd_status(args) -> int:
    from executors.hosts.manifest import applied_record, describe_applied

    c = _cluster(args)
    st = c.status()
    applied = applied_record(c.kvs)  # what `deploy -f` applied last, from which file and when
    if args.json:
        print(json.dumps(dict(st, manifest=applied), indent=2))
        return 0
    h = st["health"]
    print(f"cluster {st['url']}: {h['executors']} executors answering, {len(st['flows'])} flow(s)")
    for line in describe_applied(applied) if applied else ():
        print(line)
    for id_, why in sorted((h.get("down") or {}).items()):
        print(f"  executor {id_} is down ({why}); it is being restarted")
    for id_, gpus in sorted((h.get("gpus") or {}).items()):
        for g in gpus:
            used, total = g["memory_used"] / 2**30, g["memory_total"] / 2**30
            print(
                f"  executor {id_}: GPU {g['index']} {g['name']}, {g['utilisation']}% busy, {used:.1f}/{total:.0f} GiB"
            )
    gw = h.get("gateway") or {}
    if gw.get("restarts"):
        print(f"  the gateway process was restarted {gw['restarts']} time(s); it last ended with {gw.get('last_exit')}")
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
        if f.get("slo"):
            slo, att = f["slo"], f["slo"].get("attainment")
            seen = f"{att:.1%} of {slo['answered']} answers within it" if att is not None else "no answers yet"
            print(f"  SLO p{slo['slo']['percentile']:g} <= {slo['slo']['p99_ms']:g} ms: {seen}")
            for name, share in slo["budget_share"].items():
                print(f"    {name}: {share:.0%} of the budget")
        for s in f["stages"]:
            if s.get("autoscaling") and s["autoscaling"].get("last_decision"):
                print(f"  autoscaler: {s['autoscaling']['last_decision']}")
        for line in rollout_lines(f):  # a canary or shadow beside it, side by side
            print(line)
    return 0


def cmd_deploy(args) -> int:
    c = _cluster(args)
    if args.file is not None or args.script is None:
        return _deploy_file(args, c)
    if args.prune:
        print("error: --prune goes with -f FILE (a manifest)", file=sys.stderr)
        return 2
    script = Path(args.script)
    if not script.exists():
        print(f"error: no such script: {script}", file=sys.stderr)
        return 2
    try:
        flows, setup = script_flows(script)
    except FlowValueError as e:  # the script breaks the convention (or its flows are wrong): say what
        print(f"error: {e}", file=sys.stderr)
        return 2
    if args.flow:
        flows = [f for f in flows if f.name == args.flow]
    if not flows:
        print(
            f"error: {script} defines no Flow"
            + (f" named {args.flow!r}" if args.flow else "")
            + " (define flows() returning a Flow or a list of them, or a module-level Flow)",
            file=sys.stderr,
        )
        return 2
    if setup is not None:
        _say(f"running setup(store) of {script.name}: loading its models and data into the store")
        setup(c.kvs)
    for f in flows:
        _say(f"deploying {f.name} (building its stages on the executors)")
        serving = {}
        if args.slo_p99_ms is not None:
            from optimizer.slo import SLO

            serving = {"slo": SLO(p99_ms=args.slo_p99_ms)}
            if args.traffic_rps is not None:
                serving["traffic"] = args.traffic_rps
            if args.samples is not None:
                serving["samples"] = _read_rows(args.samples)
        if args.timeout is not None:
            serving["timeout_s"] = args.timeout
        rollout = rollout_args(args)
        d = c.deploy(f, optimize=not args.no_optimize, **serving, **rollout)
        if rollout:
            how = f"a canary answering {args.canary:.1%} of requests" if "canary" in rollout else "a shadow"
            print(f"deployed {f.name} v{d.version} at {d.url} as {how}; end it: flowserve promote|rollback {f.name}")
        else:
            print(f"deployed {f.name} at {d.url}")
        if d.plan.slo is not None:
            print(d.plan.slo.explain())
    return 0


def _deploy_file(args, c) -> int:
    """``deploy -f FILE``: a manifest says which scripts and settings (manifest.py); the
    flags that say them for one script are refused beside it."""
    from executors.hosts import manifest

    if args.file is None:
        print("error: give a SCRIPT to deploy, or -f FILE (a manifest such as flowserve.yaml)", file=sys.stderr)
        return 2
    given = [flag for flag, value in _SCRIPT_FLAGS.items() if getattr(args, value, None) not in (None, False)]
    if args.script is not None or given:
        print(
            f"error: -f {args.file} takes the scripts and their settings from the file; "
            f"drop {' '.join(([args.script] if args.script else []) + given)}",
            file=sys.stderr,
        )
        return 2
    for a in manifest.apply(manifest.load(args.file), args.file, c, script_flows, prune=args.prune, say=_say):
        version = f" v{a.version}" if a.version is not None else ""
        print(
            f"{a.flow}{version}: "
            + ("no longer listed; kept (--prune undeploys it)" if a.action == "kept" else a.action)
        )
    return 0


# deploy's flags for one script, which a manifest's fields replace (flag -> args attribute)
_SCRIPT_FLAGS = {
    "--flow": "flow",
    "--no-optimize": "no_optimize",
    "--timeout": "timeout",
    "--slo-p99-ms": "slo_p99_ms",
    "--traffic-rps": "traffic_rps",
    "--samples": "samples",
    "--canary": "canary",
    "--shadow": "shadow",
}


def _read_rows(path: str) -> list:
    """Sample rows from a JSON file: a list of objects (or one object)."""
    rows = json.loads(Path(path).read_text())
    return [rows] if isinstance(rows, dict) else rows


def cmd_profile(args) -> int:
    """Time every stage of a deployed flow per batch size on sample rows; store the profile
    so that the next `flowserve deploy --slo-p99-ms` plans from it."""
    from executors.hosts.profiling import profile_plan, save_profile
    from executors.plans import load_plan

    c = _cluster(args)
    r = c.http.get(f"/flows/{args.name}")
    if r.status_code != 200:
        print(f"error: no deployed flow named {args.name!r}", file=sys.stderr)
        return 2
    plan = load_plan(c.kvs, args.name, r.json()["version"])  # signed for this flow and version, or refused
    _say(f"profiling {len(plan.stages)} stage(s) of {args.name} on {args.samples}")
    profile = profile_plan(plan, _read_rows(args.samples), c.kvs, max_batch=args.max_batch)
    save_profile(c.kvs, args.name, profile)
    for stage in profile.stages:
        for cls in profile.classes(stage):
            pts = ", ".join(f"{b}: {profile.latency(stage, cls, b):.2f}" for b in profile.batch_sizes(stage, cls))
            print(f"{stage} [{cls}] ms by batch size: {pts}")
    return 0


def script_flows(script: Path):
    """The Flows a deploy script defines and its ``setup(store)`` hook (or None)."""
    from flow.flow import Flow

    home = str(script.parent.resolve())
    if home not in sys.path:
        sys.path.insert(0, home)  # the script's own imports (examples/models.py)
    namespace = runpy.run_path(str(script), run_name="__flowserve_deploy__")
    make = namespace.get("flows")
    if callable(make):
        made = make()
        flows = [made] if isinstance(made, Flow) else list(made) if isinstance(made, (list, tuple)) else None
        if flows is None or not all(isinstance(f, Flow) for f in flows):
            raise FlowValueError(f"{script}: flows() must return a Flow or a list of Flows, got {made!r}")
    else:
        flows = [v for v in namespace.values() if isinstance(v, Flow)]
    setup = namespace.get("setup")
    if setup is not None and not callable(setup):
        raise FlowValueError(f"{script}: setup must be a function setup(store), got {setup!r}")
    return flows, setup


def cmd_kvs(args) -> int:
    return args.kvs_fn(_cluster(args).kvs, args)


def kvs_put(store, args) -> int:
    if (args.file is None) == (args.json is None):
        print("error: give a FILE or --json (one of them)", file=sys.stderr)
        return 2
    if args.json is not None:
        try:
            value = json.loads(args.json)
        except ValueError as e:
            print(f"error: --json is not valid JSON: {e}", file=sys.stderr)
            return 2
    else:
        path = Path(args.file)
        if not path.is_file():
            print(f"error: no such file: {path}", file=sys.stderr)
            return 2
        value = _read_value(path)
    store.put(args.key, value)
    print(f"put {args.key} ({_describe(value)})")
    return 0


def _read_value(path: Path):
    """A .npy file is an array (never unpickled), a .json file JSON, anything else bytes."""
    if path.suffix == ".npy":
        import numpy as np

        return np.load(path, allow_pickle=False)
    if path.suffix == ".json":
        return json.loads(path.read_text())
    return path.read_bytes()


def _describe(value) -> str:
    shape = getattr(value, "shape", None)
    if shape is not None:
        return f"array {getattr(value, 'dtype', '')} {tuple(shape)}"
    if isinstance(value, (bytes, bytearray)):
        return f"{len(value)} bytes"
    return type(value).__name__


def kvs_get(store, args) -> int:
    absent = object()
    value = store.get(args.key, default=absent)
    if value is absent:
        print(f"error: no key {args.key!r} in the store", file=sys.stderr)
        return 1
    if args.out:
        out = Path(args.out)
        if getattr(value, "shape", None) is not None:
            import numpy as np

            np.save(out, value, allow_pickle=False)
        elif isinstance(value, (bytes, bytearray)):
            out.write_bytes(value)
        else:
            out.write_text(json.dumps(value, default=str))
        print(f"wrote {args.key} ({_describe(value)}) to {out}")
        return 0
    if isinstance(value, (bytes, bytearray)) or getattr(value, "shape", None) is not None:
        print(f"{args.key}: {_describe(value)} (use --out FILE to save it)")
    else:
        print(json.dumps(value, indent=2, default=str))
    return 0


def kvs_rm(store, args) -> int:
    """Remove keys; the runtime's own (``flowserve:*``: plans, the registry, membership)
    only with ``--force``. Exit 1 when some were not there (the others are removed)."""
    keys = list(dict.fromkeys(args.keys))
    own = [k for k in keys if k.startswith(RUNTIME_PREFIX)]
    if own and not args.force:
        print(
            f"error: {', '.join(own)}: the runtime's own key{'s' if len(own) > 1 else ''} ({RUNTIME_PREFIX}*); "
            "removing them can break deployed flows and the cluster: add --force to remove them anyway",
            file=sys.stderr,
        )
        return 2
    missing = [k for k in keys if not store.exists(k)]
    removed = store.delete(*keys)
    print(
        f"removed {removed} key{'s' if removed != 1 else ''}"
        + (f"; not found: {', '.join(missing)}" if missing else "")
    )
    return 1 if missing else 0


RUNTIME_PREFIX = "flowserve:"  # the runtime's own keys in the store


LS_PAGE = 100  # `kvs ls` prints this many keys unless --limit or --all says otherwise


def kvs_ls(store, args) -> int:
    """The store's keys in sorted order, a page at a time: at most ``--limit`` (100) after
    ``--after KEY`` (the last key of the page before), with a line on stderr saying how
    many more there are and how to see them; ``--all`` prints every key, the runtime's own
    flowserve:* keys too. stdout holds only keys, for pipes."""
    keys = sorted(
        k.decode() if isinstance(k, bytes) else k for k in store.redis.scan_iter(match=args.pattern, count=1000)
    )
    if not args.all:
        keys = [k for k in keys if not k.startswith("flowserve:")]  # the runtime's own keys
    if args.after is not None:
        keys = keys[bisect.bisect_right(keys, args.after) :]
    limit = 0 if args.all else args.limit
    page = keys if limit == 0 else keys[:limit]
    for k in page:
        print(k)
    more = len(keys) - len(page)
    if more:
        print(
            f"... and {more} more key{'s' if more != 1 else ''}: `flowserve kvs ls --after {shlex.quote(page[-1])}` "
            f"for the next {min(limit, more)}, --limit N for N at a time (0: no limit), --all for every key",
            file=sys.stderr,
        )
    return 0


def cmd_invoke(args) -> int:
    c = _cluster(args)
    try:
        body = json.loads(args.json)
    except ValueError as e:
        print(f"error: --json is not valid JSON: {e}", file=sys.stderr)
        return 2
    what = f"flow {args.name!r}"
    r = c.request("POST", f"/flows/{args.name}", what, check=False, json=body)  # no answer: UnreachableError
    try:
        print(json.dumps(r.json(), indent=2))  # the answer, or the error as the server sent it
    except ValueError:
        print(r.text)
    if r.status_code == 200:
        return 0
    from executors.hosts.cluster import answer_error

    error = answer_error(r, f"{what} answered {{status}}")  # the class the client raises for it
    print(f"error: {type(error).__name__}: {error}", file=sys.stderr)
    return 1


def cmd_serve(args) -> int:
    """The dev loop (executors/hosts/devserver.py): an embedded cluster, or the one in
    ``--dir``; exit 0 after Ctrl-C."""
    from executors.gateway.invoke import ACCESS_LOG_ENV
    from executors.hosts.cluster import DEFAULT_DIR, LocalCluster
    from executors.hosts.cluster_config import ClusterConfig
    from executors.hosts.devserver import DevServer

    script = Path(args.script)
    if not script.is_file():
        print(f"error: no such script: {script}", file=sys.stderr)
        return 2
    join = args.join or (args.dir if args.dir != str(DEFAULT_DIR) else None)  # `flowserve --dir D serve` too
    if join is not None:
        cluster, owned = LocalCluster.connect(join), False  # never stopped here: it is not ours
    else:
        import tempfile

        os.environ[ACCESS_LOG_ENV] = "1"  # the gateway logs a line per request: the loop shows each
        # its directory made here, so that its logs stream while it starts (DevServer.run)
        fields = {"host": args.host, "port": args.port, "dir": tempfile.mkdtemp(prefix="flowserve-")}
        if args.executors is not None:
            fields["executors"] = args.executors
        cluster, owned = LocalCluster(ClusterConfig(**fields)), True
    server = DevServer(
        script,
        cluster,
        owned=owned,
        load=script_flows,
        reload=args.reload,
        only=args.flow,
        optimize=not args.no_optimize,
    )
    return server.run()


def cmd_logs(args) -> int:
    """Print the cluster's logs (the last ``-n`` lines, of one flow or all); with ``-f``
    follow them until Ctrl-C."""
    from executors.hosts.devserver import POLL_S
    from executors.hosts.logs import LogFollower, log_files

    home = Path(args.dir)
    if not log_files(home):
        print(
            f"error: no cluster logs in {home} (`flowserve up` keeps them there; "
            "another cluster's: `flowserve --dir DIR logs`)",
            file=sys.stderr,
        )
        return 1
    follower = LogFollower(home, flow=args.flow)
    lines = follower.tail(None if args.lines < 0 else args.lines)
    if lines:
        print("\n".join(lines), flush=True)
    if not args.follow:
        return 0
    try:
        while True:
            lines = follower.read()
            if lines:
                print("\n".join(lines), flush=True)
            time.sleep(POLL_S)
    except KeyboardInterrupt:
        return 0


def cmd_undeploy(args) -> int:
    from executors.hosts.devserver import undeploy

    c = _cluster(args)
    status = 0
    for name in args.names:
        try:
            undeploy(c, name)
        except FlowError as e:
            if e.status != 404:
                raise
            print(f"error: no deployed flow named {name!r} (`flowserve status` lists them)", file=sys.stderr)
            status = 1
            continue
        print(f"undeployed {name}")
    return status


def add_runtime_commands(p: argparse.ArgumentParser, sub) -> None:
    """Add the local cluster's commands (serve, logs, up, status, deploy, invoke, undeploy,
    kvs, down) to a parser and its ``add_subparsers()``; each sets ``fn``."""
    from executors.hosts.cluster import DEFAULT_DIR

    p.add_argument("--dir", default=str(DEFAULT_DIR), help=f"cluster directory (default {DEFAULT_DIR})")

    sv = sub.add_parser(
        "serve", help="the dev loop: serve a script's flows in the foreground, stream the logs, reload on change"
    )
    sv.add_argument("script", help="a .py file defining flows() (and optionally setup(store)) or Flow objects")
    sv.add_argument(
        "--reload",
        action="store_true",
        help="deploy again when the script or a module it imports from its folder changes",
    )
    sv.add_argument(
        "--dir",
        dest="join",
        metavar="DIR",
        help="serve on the `flowserve up` cluster in DIR (default: an embedded cluster that stops with this command)",
    )
    sv.add_argument(
        "--executors", type=int, help="the embedded cluster's executor processes (default: one per core but one)"
    )
    sv.add_argument("--host", default="127.0.0.1", help="the embedded cluster's bind address (default 127.0.0.1)")
    sv.add_argument(
        "--port", type=int, default=8000, help="the embedded cluster's port (default 8000; 0 for a free one)"
    )
    sv.add_argument("--flow", help="serve only the flow with this name")
    sv.add_argument("--no-optimize", action="store_true", help="one stage per operator")
    sv.set_defaults(fn=cmd_serve)

    lg = sub.add_parser("logs", help="the cluster's logs (cluster.log, logs/*.log), of one flow or all; -f follows")
    lg.add_argument("flow", nargs="?", help="only the lines that name this flow (with their tracebacks)")
    lg.add_argument(
        "-f", "--follow", action="store_true", help="go on printing lines as they are written (Ctrl-C stops)"
    )
    lg.add_argument("-n", "--lines", type=int, default=100, help="print the last N lines first (default 100; -1: all)")
    lg.set_defaults(fn=cmd_logs)

    up = sub.add_parser("up", help="start a local cluster in the background")
    up.add_argument(
        "--executors", type=int, help="executor processes (default: one per core but the gateway's, at least 1)"
    )
    up.add_argument(
        "--gpu-executors",
        type=int,
        help="GPU-class executor processes for gpu=True stages (default 0), one per GPU in turn",
    )
    up.add_argument("--host", default="127.0.0.1", help="gateway bind address (default 127.0.0.1)")
    up.add_argument("--port", type=int, default=8000, help="gateway port (default 8000; 0 for a free one)")
    up.add_argument(
        "--token", help=f"require this bearer token on /flows calls (also ${TOKEN_ENV}; --token-file keeps it off ps)"
    )
    up.add_argument("--token-file", help="read the bearer token from this file")
    up.add_argument(
        "--request-timeout", type=float, help="seconds a request may take before 504, unless its flow says (default 30)"
    )
    up.add_argument(
        "--max-request-timeout",
        type=float,
        help="the most a request (X-Request-Timeout) or a flow (deploy --timeout) may ask for (default 300)",
    )
    up.add_argument("--max-body-mb", type=float, help="request bodies above this many MiB get 413 (default 64)")
    up.add_argument("--autoscale", action="store_true", help="scale each stage's replicas on its own load")
    up.add_argument("--max-replicas", type=int, default=8, help="autoscaling: replicas per stage at most (default 8)")
    up.set_defaults(fn=cmd_up)

    sub.add_parser("down", help="stop the local cluster").set_defaults(fn=cmd_down)

    st = sub.add_parser("status", help="flows, stages, replicas and latencies")
    st.add_argument("--json", action="store_true", help="machine-readable output")
    st.set_defaults(fn=cmd_status)

    dp = sub.add_parser("deploy", help="deploy the Flow(s) a Python script defines, or what a manifest lists (-f)")
    dp.add_argument(
        "script", nargs="?", help="a .py file defining flows() (and optionally setup(store)) or Flow objects"
    )
    dp.add_argument(
        "-f",
        "--file",
        help="a manifest (flowserve.yaml): the scripts, flows and settings to serve, applied idempotently",
    )
    dp.add_argument(
        "--prune", action="store_true", help="with -f: undeploy the flows a manifest applied and no longer lists"
    )
    dp.add_argument("--flow", help="deploy only the flow with this name")
    dp.add_argument("--no-optimize", action="store_true", help="one stage per operator")
    dp.add_argument("--timeout", type=float, help="the flows' deadline in seconds (default: the cluster's)")
    dp.add_argument("--slo-p99-ms", type=float, help="serve under this p99 latency SLO (ms)")
    dp.add_argument("--traffic-rps", type=float, help="with --slo-p99-ms: the load to plan for (requests/s)")
    dp.add_argument("--samples", help="with --slo-p99-ms: a JSON file of sample rows to profile the stages on")
    add_rollout_flags(dp)
    dp.set_defaults(fn=cmd_deploy)
    add_rollout_commands(sub)  # promote, rollback
    add_build_command(sub)  # build: an image of FlowServe and a script

    pf = sub.add_parser("profile", help="time a deployed flow's stages per batch size on sample rows")
    pf.add_argument("name", help="flow name")
    pf.add_argument("--samples", required=True, help="a JSON file: a list of input rows")
    pf.add_argument("--max-batch", type=int, default=32, help="largest batch size timed (default 32)")
    pf.set_defaults(fn=cmd_profile)

    iv = sub.add_parser("invoke", help="call a deployed flow")
    iv.add_argument("name", help="flow name")
    iv.add_argument("--json", required=True, help="one row as a JSON object, or a list of rows")
    iv.set_defaults(fn=cmd_invoke)

    ud = sub.add_parser("undeploy", help="stop serving deployed flows")
    ud.add_argument("names", nargs="+", metavar="NAME", help="flow name")
    ud.set_defaults(fn=cmd_undeploy)

    kv = sub.add_parser("kvs", help="put data and models into the cluster's store, read them, list keys")
    kvs_sub = kv.add_subparsers(dest="kvs_command", required=True, metavar="ACTION")
    put = kvs_sub.add_parser("put", help="put a file (.npy: an array, .json: JSON, else bytes) or --json under KEY")
    put.add_argument("key")
    put.add_argument("file", nargs="?", help="the value's file")
    put.add_argument("--json", help="the value as JSON text instead of a file")
    put.set_defaults(fn=cmd_kvs, kvs_fn=kvs_put)
    get = kvs_sub.add_parser("get", help="print KEY's value (JSON), or save it with --out")
    get.add_argument("key")
    get.add_argument("--out", help="write the value here (.npy for arrays, raw bytes, JSON)")
    get.set_defaults(fn=cmd_kvs, kvs_fn=kvs_get)
    ls = kvs_sub.add_parser(
        "ls", help=f"list keys, {LS_PAGE} at a time (not the runtime's own flowserve:* keys, unless --all)"
    )
    ls.add_argument("pattern", nargs="?", default="*", help="glob pattern (default *)")
    ls.add_argument(
        "--limit", type=int, default=LS_PAGE, help=f"print at most this many keys (default {LS_PAGE}; 0: no limit)"
    )
    ls.add_argument("--after", metavar="KEY", help="start after this key (the last one of the page before)")
    ls.add_argument("--all", action="store_true", help="every key, the runtime's own too, with no limit")
    ls.set_defaults(fn=cmd_kvs, kvs_fn=kvs_ls)
    rm = kvs_sub.add_parser("rm", help="remove keys (not the runtime's own flowserve:* keys, unless --force)")
    rm.add_argument("keys", nargs="+", metavar="KEY")
    rm.add_argument("--force", action="store_true", help="remove the runtime's own keys too")
    rm.set_defaults(fn=cmd_kvs, kvs_fn=kvs_rm)
