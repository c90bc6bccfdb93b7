"""The ``flowserve`` command line: the runtime's commands (executors/hosts/commands.py) and each deploy
target's (``flowserve k8s``, k8s/commands.py), composed here, above both, so the runtime never
imports a deploy target.

    flowserve serve app.py [--reload]           the dev loop: serve a script in the foreground, stream its logs
    flowserve logs [FLOW] [-f]                  the cluster's logs (of one flow); -f follows them
    flowserve up [--executors N] [--port P]     start a local cluster in the background
    flowserve status                            flows, stages, replicas, latencies
    flowserve deploy script.py [--no-optimize]  deploy the Flow(s) a script defines (--canary F, --shadow)
    flowserve deploy -f flowserve.yaml          what a config file lists, applied idempotently
    flowserve promote NAME | rollback NAME      end a canary or shadow version, either way
    flowserve build app.py                      an OCI image of the project and the script
    flowserve profile NAME --samples rows.json  time a deployed flow's stages per batch size
    flowserve invoke NAME --json '{"x": 1}'     call a deployed flow
    flowserve undeploy NAME                     stop serving a flow
    flowserve kvs put KEY FILE | --json J       put data (bytes, a .npy array, JSON) into the store
    flowserve kvs get KEY [--out FILE]          read it back; `flowserve kvs ls [PATTERN]` lists keys
    flowserve kvs rm KEY [KEY...]               remove keys
    flowserve k8s render ...                    Kubernetes manifests (docs/kubernetes.md)
    flowserve down                              stop the cluster (in-flight requests finish)
"""

from __future__ import annotations

import argparse
import sys

from executors.hosts.commands import add_runtime_commands
from flow.configuration import ConfigError
from flow.errors import FlowError
from k8s.commands import add_k8s_parser


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="flowserve", description="Serve prediction pipelines as optimized dataflows.")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    add_runtime_commands(p, sub)
    add_k8s_parser(sub)  # flowserve k8s render: manifests for review / GitOps
    return p


def main(argv=None) -> int:
    """Run one command; our errors print ``error: ...`` (never a traceback) and exit 2 for a
    bad flag or config value (argparse's status for bad usage), 1 for anything else."""
    args = build_parser().parse_args(argv)
    try:
        return args.fn(args)
    except ConfigError as e:  # e.g. `flowserve up --executors 0`: the message names the field and value
        print(f"error: {e}", file=sys.stderr)
        return 2
    except FlowError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
