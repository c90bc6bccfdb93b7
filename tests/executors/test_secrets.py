"""No secret on a command line: any local user reads /proc/<pid>/cmdline (``ps``), while a
process's environment is readable by its own user only. The KVS password, the admin token
and the cluster's token must appear in no cluster process's arguments."""

from __future__ import annotations

import os
from pathlib import Path
from urllib.parse import unquote, urlsplit

from executors.hosts.cluster import LocalCluster
from executors.hosts.cluster_config import ClusterConfig


def _cluster_cmdlines(c: LocalCluster) -> dict[int, str]:
    """Every process whose command line or working directory ties it to the cluster: the
    supervisor, its gateway, its executors and the KVS server (found as the supervisor's descendants)."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    out, todo = {}, [c.proc.pid]
    while todo:
        pid = todo.pop()
        try:
            out[pid] = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        todo.extend(children.get(pid, ()))
    return out


def test_no_secret_in_any_cluster_process_arguments():
    token = "user-token-" + os.urandom(8).hex()
    with LocalCluster(ClusterConfig(executors=2, token=token)) as c:
        password = unquote(urlsplit(c.state["kvs_url"]).password or "")
        assert password and c.state["admin_token"]
        cmdlines = _cluster_cmdlines(c)
        kinds = {
            k
            for k in (
                "executors.hosts.supervisor",
                "executors.hosts.local_gateway",
                "executors.worker.executor",
                "redis-server",
            )
            if any(k in line for line in cmdlines.values())
        }
        assert kinds == {
            "executors.hosts.supervisor",
            "executors.hosts.local_gateway",
            "executors.worker.executor",
            "redis-server",
        }, cmdlines
        assert len(cmdlines) >= 5, cmdlines  # supervisor, gateway, 2 executors, the KVS server
        for pid, line in cmdlines.items():
            for name, secret in (("KVS password", password), ("admin token", c.state["admin_token"]), ("token", token)):
                assert secret not in line, f"the {name} is on process {pid}'s command line: {line}"
        # the state file with them is this user's only
        assert (c.dir / "cluster.json").stat().st_mode & 0o077 == 0
        assert c.dir.stat().st_mode & 0o077 == 0
