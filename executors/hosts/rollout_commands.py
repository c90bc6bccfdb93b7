"""The rollout commands of the ``flowserve`` command line: end a canary or shadow version
(executors/gateway/rollouts.py), and what ``flowserve status`` shows of one.

    flowserve deploy app.py --canary 0.1     the new version answers 10% of requests
    flowserve deploy app.py --shadow         ...sees every request, its answers compared, never returned
    flowserve promote NAME                   the new version becomes the served one
    flowserve rollback NAME                  drop it; with none in progress, back to the version before
"""

from __future__ import annotations

import time


def cmd_promote(args) -> int:
    from executors.hosts.cluster import LocalCluster

    out = LocalCluster.connect(args.dir).promote(args.name)
    p = out["promoted"]
    print(f"flow {args.name}: v{p['version']} promoted; it serves every request (it replaces v{p['replaced']})")
    return 0


def cmd_rollback(args) -> int:
    from executors.hosts.cluster import LocalCluster

    out = LocalCluster.connect(args.dir).rollback(args.name)
    rb = out["rolled_back"]
    dropped = f"; v{rb['dropped']} dropped" if rb.get("dropped") is not None else ""
    print(
        f"flow {args.name}: rolled back to the plan of v{rb['plan_of']}, served as v{rb['version']} "
        f"(it replaces v{rb['replaced']}{dropped})"
    )
    return 0


def rollout_lines(flow: dict) -> list[str]:
    """``flowserve status``'s lines about a flow's canary or shadow: both versions side by
    side (requests, errors, p50, p99) and, for a shadow, where the answers differ."""
    r = flow.get("rollout")
    if not r:
        return []
    since = time.strftime("%H:%M:%S", time.localtime(r["since"]))
    cand = r["candidate"]
    if r["mode"] == "canary":
        head = f"  canary v{cand['version']} answers {r['share']:.1%} of requests (since {since})"
    else:
        head = f"  shadow v{cand['version']} sees every request; its answers are compared, not returned (since {since})"
    rows = [("version", "", "requests", "errors", "p50 ms", "p99 ms")]
    for role, s in (("served", r["primary"]), (r["mode"], cand)):
        rows.append(
            (
                f"v{s['version']}",
                role,
                str(s["requests"]),
                f"{s['errors']}" + (f" ({s['error_rate']:.1%})" if s["errors"] else ""),
                "-" if s["p50_ms"] is None else f"{s['p50_ms']:.2f}",
                "-" if s["p99_ms"] is None else f"{s['p99_ms']:.2f}",
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = [head] + ["    " + "  ".join(v.ljust(w) for v, w in zip(row, widths)).rstrip() for row in rows]
    d = r.get("differences")
    if d is not None:
        cols = ", ".join(f"{c} {n}" for c, n in d["columns"].items())
        lines.append(
            f"    answers compared: {d['compared']}, differing: {d['differ']}"
            + (f" (by column: {cols})" if cols else "")
            + (f", of another length: {d['rows']}" if d["rows"] else "")
        )
    return lines


def add_rollout_commands(sub) -> None:
    """Add ``promote`` and ``rollback`` to a ``flowserve`` parser's subcommands."""
    pr = sub.add_parser("promote", help="make a flow's canary or shadow version the served one")
    pr.add_argument("name", help="flow name")
    pr.set_defaults(fn=cmd_promote)
    rb = sub.add_parser(
        "rollback",
        help="drop a flow's canary or shadow version; with none, serve the version before again",
        description="Roll a flow back: with a canary or shadow in progress, drop it; else serve the version "
        "the served one replaced. The older plan serves as a new version (versions only move forward); "
        "the action is recorded in the flow's history (GET /flows/NAME/history).",
    )
    rb.add_argument("name", help="flow name")
    rb.set_defaults(fn=cmd_rollback)


def rollout_args(args) -> dict:
    """``ClusterClient.deploy``'s ``canary=``/``shadow=`` from ``flowserve deploy``'s flags."""
    out: dict = {}
    if getattr(args, "canary", None) is not None:
        out["canary"] = args.canary
    if getattr(args, "shadow", False):
        out["shadow"] = True
    return out


def add_rollout_flags(deploy_parser) -> None:
    """``--canary SHARE`` and ``--shadow`` on ``flowserve deploy``."""
    deploy_parser.add_argument(
        "--canary",
        type=float,
        metavar="SHARE",
        help="serve the new version beside the served one, answering this share of requests (e.g. 0.1)",
    )
    deploy_parser.add_argument(
        "--shadow",
        action="store_true",
        help="mirror every request to the new version and compare its answers; only the served one's are returned",
    )
