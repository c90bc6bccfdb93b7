"""The flowserve CLI end to end: up, deploy a script, invoke, status, down."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import textwrap

import pytest


def flowserve(*args, home, check=True):
    r = subprocess.run(
        [sys.executable, "-m", "flowserve.cli", "--dir", str(home), *args],
        capture_output=True,
        text=True,
        timeout=120,
        env={"FLOWSERVE_QUIET": "1", **__import__("os").environ},
    )
    if check and r.returncode != 0:
        raise AssertionError(f"flowserve {' '.join(args)} failed ({r.returncode}):\n{r.stdout}\n{r.stderr}")
    return r


@pytest.fixture
def home(tmp_path):
    d = tmp_path / "cluster"
    yield d
    if (d / "cluster.json").exists():
        flowserve("down", home=d, check=False)


def test_up_deploy_invoke_status_down(home, tmp_path):
    up = flowserve("up", "--port", "0", "--executors", "2", home=home)
    assert "cluster up at http://127.0.0.1:" in up.stdout
    again = flowserve("up", "--port", "0", home=home)
    assert "already running" in again.stdout

    script = tmp_path / "myflow.py"
    script.write_text(
        textwrap.dedent("""
        from flow import Flow

        def triple(row):
            return row.x * 3

        flow = Flow("tripler", schema={"x": int})
        flow.map(triple, names=["y"])
    """)
    )
    deployed = flowserve("deploy", str(script), home=home)
    assert "deployed tripler at http://127.0.0.1:" in deployed.stdout

    out = flowserve("invoke", "tripler", "--json", '[{"x": 2}, {"x": 5}]', home=home)
    assert [r["y"] for r in json.loads(out.stdout)["rows"]] == [6, 15]

    bad = flowserve("invoke", "tripler", "--json", '{"x": "no"}', home=home, check=False)
    assert bad.returncode == 1 and "'x'" in bad.stdout  # the server's answer, as it sent it
    said = json.loads(bad.stdout)["error"]
    assert f"error: {said}: flow 'tripler' answered 400: " in bad.stderr  # the class the client raises

    status = flowserve("status", home=home)
    # versions are unique across KVS restarts (floored at the server clock in ms: README)
    assert re.search(r"flow tripler \(v\d+\)", status.stdout) and "triple" in status.stdout
    assert "2 executors answering" in status.stdout
    as_json = json.loads(flowserve("status", "--json", home=home).stdout)
    assert as_json["flows"][0]["name"] == "tripler"

    down = flowserve("down", home=home)
    assert "cluster stopped" in down.stdout
    assert not (home / "cluster.json").exists()


def test_helpful_errors(home, tmp_path):
    r = flowserve("status", home=home, check=False)
    assert r.returncode == 1 and "flowserve up" in r.stderr
    r = subprocess.run([sys.executable, "-m", "flowserve.cli", "--help"], capture_output=True, text=True)
    assert r.returncode == 0 and "deploy" in r.stdout and "status" in r.stdout
    r = subprocess.run([sys.executable, "-m", "flowserve.cli", "bogus"], capture_output=True, text=True)
    assert r.returncode == 2 and "invalid choice" in r.stderr


def _example_rows(name: str):
    if name == "recommender":
        return [{"user": 3, "category": "books"}, {"user": 5, "category": "toys"}]
    from sklearn.datasets import load_digits

    digits = load_digits()
    img = (digits.images[0] * 16).clip(0, 255).astype("uint8")
    img28 = [[0] * 28 for _ in range(28)]
    for i in range(8):
        for j in range(8):
            for a in range(3):
                for b in range(3):
                    img28[2 + 3 * i + a][2 + 3 * j + b] = int(img[i, j])
    return [{"img": img28}]


def test_every_example_deploys_with_the_cli_and_answers(home, tmp_path):
    """The README's walk-through: `flowserve up`, `flowserve deploy examples/X.py` (its
    setup(store) loads models and data), `flowserve invoke`, a plain HTTP POST, `down`."""
    import os
    from pathlib import Path

    import httpx

    examples = sorted(  # the scripts, not their helper modules (models.py, sharing.py)
        p for p in (Path(__file__).resolve().parents[2] / "examples").glob("*.py") if "\ndef flows(" in p.read_text()
    )
    os.environ["FLOWSERVE_EXAMPLE_SMALL"] = "1"  # quick training in setup(); inherited by the CLI
    flowserve("up", "--port", "0", "--executors", "2", home=home)
    url = json.loads((home / "cluster.json").read_text())["url"]
    for script in examples:
        name = script.stem
        out = flowserve("deploy", str(script), home=home)
        assert f"deployed {name} at {url}/flows/{name}" in out.stdout, out.stdout
        rows = _example_rows(name)
        answer = json.loads(flowserve("invoke", name, "--json", json.dumps(rows), home=home).stdout)
        assert len(answer["rows"]) == len(rows), answer
        r = httpx.post(f"{url}/flows/{name}", json=rows, timeout=60)  # what curl would send
        assert r.status_code == 200 and len(r.json()["rows"]) == len(rows), r.text
    listed = flowserve("status", "--json", home=home)
    assert sorted(f["name"] for f in json.loads(listed.stdout)["flows"]) == sorted(p.stem for p in examples)
    assert "stopped" in flowserve("down", home=home).stdout


def test_kvs_put_get_ls(home, tmp_path):
    import numpy as np

    flowserve("up", "--port", "0", "--executors", "1", home=home)
    arr = np.arange(12, dtype=np.float32).reshape(3, 4)
    np.save(tmp_path / "w.npy", arr)
    (tmp_path / "blob.bin").write_bytes(b"\x00\x01raw")
    assert "array float32 (3, 4)" in flowserve("kvs", "put", "models/w", str(tmp_path / "w.npy"), home=home).stdout
    flowserve("kvs", "put", "blob", str(tmp_path / "blob.bin"), home=home)
    flowserve("kvs", "put", "cfg", "--json", '{"k": [1, 2]}', home=home)
    assert json.loads(flowserve("kvs", "get", "cfg", home=home).stdout) == {"k": [1, 2]}
    flowserve("kvs", "get", "models/w", "--out", str(tmp_path / "back.npy"), home=home)
    assert np.array_equal(np.load(tmp_path / "back.npy"), arr)
    flowserve("kvs", "get", "blob", "--out", str(tmp_path / "back.bin"), home=home)
    assert (tmp_path / "back.bin").read_bytes() == b"\x00\x01raw"
    assert flowserve("kvs", "ls", home=home).stdout.split() == ["blob", "cfg", "models/w"]
    assert flowserve("kvs", "ls", "models/*", home=home).stdout.split() == ["models/w"]
    missing = flowserve("kvs", "get", "nope", home=home, check=False)
    assert missing.returncode == 1 and "no key 'nope'" in missing.stderr
    bad = flowserve("kvs", "put", "x", "--json", "{oops", home=home, check=False)
    assert bad.returncode == 2 and "not valid JSON" in bad.stderr

    rm = flowserve("kvs", "rm", "blob", "cfg", "nope", home=home, check=False)
    assert rm.returncode == 1 and rm.stdout.strip() == "removed 2 keys; not found: nope"  # the others still go
    assert flowserve("kvs", "ls", home=home).stdout.split() == ["models/w"]
    flowserve("kvs", "put", "flowserve:scratch", "--json", "1", home=home)
    own = flowserve("kvs", "rm", "models/w", "flowserve:scratch", home=home, check=False)
    assert own.returncode == 2 and "flowserve:scratch: the runtime's own key (flowserve:*)" in own.stderr
    assert "--force" in own.stderr and "models/w" in flowserve("kvs", "ls", home=home).stdout  # nothing removed
    forced = flowserve("kvs", "rm", "flowserve:scratch", "--force", home=home)
    assert (
        forced.stdout.strip() == "removed 1 key"
        and "flowserve:scratch" not in flowserve("kvs", "ls", "--all", home=home).stdout
    )
    flowserve("down", home=home)


def test_down_is_idempotent(home):
    first = flowserve("down", home=home)
    assert first.returncode == 0 and "no cluster is running" in first.stdout
    home.mkdir(parents=True, exist_ok=True)
    (home / "cluster.json").write_text('{"url": "http://127.0.0.1:9", "pid": 999999999}')  # a crashed cluster's
    (home / "e0.ipc").write_text("")
    stale = flowserve("down", home=home)
    assert stale.returncode == 0 and "stale" in stale.stdout
    assert not (home / "cluster.json").exists() and not list(home.glob("*.ipc"))


def test_flows_come_back_after_down_and_up(home, tmp_path):
    script = tmp_path / "doubler.py"
    script.write_text(
        textwrap.dedent("""
        import flowserve as fs

        def flows():
            f = fs.Flow("doubler", schema={"x": int})
            f.map(lambda r: r.x * 2, names=["y"])
            return f
    """)
    )
    flowserve("up", "--port", "0", "--executors", "1", home=home)
    flowserve("deploy", str(script), home=home)
    flowserve("down", home=home)
    flowserve("up", "--port", "0", "--executors", "1", home=home)  # the same store, persisted
    out = flowserve("invoke", "doubler", "--json", '{"x": 21}', home=home)
    assert json.loads(out.stdout)["rows"][0]["y"] == 42
    flowserve("down", home=home)
    assert not (home / "cluster.json").exists() and not list(home.glob("*.ipc"))
    log = (home / "daemon.out").read_text() if (home / "daemon.out").exists() else ""
    assert "Traceback" not in log, log[-2000:]


@pytest.mark.parametrize(
    "args, message",
    [
        (["up", "--executors", "0"], "error: ClusterConfig.executors must be an int >= 1, got 0"),
        (["up", "--port", "70000"], "error: ClusterConfig.port must be an int in 0..65535 (0: a free port), got 70000"),
        (
            ["up", "--autoscale", "--max-replicas", "0"],
            "error: AutoscalingConfig.max_replicas must be an int >= 1, got 0",
        ),
        (
            ["up", "--token", "short"],
            "error: ClusterConfig.token must be None or a string of at least 8 characters, "
            "got a string of 5 characters",
        ),
    ],
)
def test_bad_flags_say_error_and_exit_2_without_a_traceback(home, args, message):
    r = flowserve(*args, home=home, check=False)
    assert r.returncode == 2 and r.stderr.strip() == message, r.stderr
    assert "Traceback" not in r.stderr and not (home / "cluster.json").exists()


@pytest.mark.parametrize(
    "args, message",
    [
        (["--autoscale", "{bad"], "error: Expecting property name"),
        (["--autoscale", '{"max_replica": 2}'], "error: AutoscalingConfig: unknown field(s) ['max_replica']; known: ["),
        (["--autoscale", '{"max_replicas": 0}'], "error: AutoscalingConfig.max_replicas must be an int >= 1, got 0"),
        (["--config", "[1]"], "error: ClusterConfig.from_json needs a dict, got [1]"),
        (["--config", '{"executors": 0}'], "error: ClusterConfig.executors must be an int >= 1, got 0"),
    ],
)
def test_standalone_gateway_bad_config_json_exits_2_without_a_traceback(args, message):
    env = {**__import__("os").environ, "FLOWSERVE_ADMIN_TOKEN": "a" * 32}
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "executors.hosts.standalone",
            "--kvs",
            "redis://127.0.0.1:1",
            "--address",
            "tcp://127.0.0.1:1",
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert r.returncode == 2 and message in r.stderr, r.stderr
    assert "Traceback" not in r.stderr


def test_profile_then_deploy_under_an_slo_and_status_shows_it(home, tmp_path):
    flowserve("up", "--port", "0", "--executors", "2", home=home)
    script = tmp_path / "sloflow.py"
    script.write_text(
        textwrap.dedent("""
        from flow import Flow

        def triple(t):
            return t.column("x").to_numpy() * 3

        flow = Flow("slotripler", schema={"x": int})
        flow.map(triple, names=["y"], batching=True)
        """)
    )
    samples = tmp_path / "rows.json"
    samples.write_text(json.dumps([{"x": i} for i in range(5)]))
    flowserve("deploy", str(script), home=home)
    prof = flowserve("profile", "slotripler", "--samples", str(samples), "--max-batch", "4", home=home)
    assert re.search(r"triple \[cpu\] ms by batch size: 1: [\d.]+, 2: [\d.]+, 3: [\d.]+, 4: [\d.]+", prof.stdout)
    dep = flowserve("deploy", str(script), "--slo-p99-ms", "50", "--traffic-rps", "20", home=home)
    assert "SLO p99 <= 50 ms: simulated p99" in dep.stdout  # planned from the stored profile
    flowserve("invoke", "slotripler", "--json", '{"x": 2}', home=home)
    st = flowserve("status", home=home)
    assert "SLO p99 <= 50 ms: 100.0% of 1 answers within it" in st.stdout
    assert "triple: 100% of the budget" in st.stdout


def _cluster_pids(home) -> set[int]:
    """The supervisor named in the state file and every process below it."""
    pid = json.loads((home / "cluster.json").read_text())["pid"]
    children: dict[int, list[int]] = {}
    for stat in __import__("pathlib").Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    out, todo = {pid}, [pid]
    while todo:
        for child in children.get(todo.pop(), ()):
            out.add(child)
            todo.append(child)
    return out


def _running(pid: int) -> bool:
    try:
        state = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def test_down_returns_once_every_process_is_gone(home):
    flowserve("up", "--port", "0", "--executors", "2", home=home)
    pids = _cluster_pids(home)
    assert len(pids) >= 5, pids  # supervisor, gateway, 2 executors, the store
    assert "cluster stopped" in flowserve("down", home=home).stdout
    assert not [p for p in pids if _running(p)], "`down` said stopped while processes of the cluster still ran"


def test_up_on_a_busy_port_fails_at_once_and_says_so(home):
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        r = flowserve("up", "--port", str(port), home=home, check=False)
    assert r.returncode == 1, (r.stdout, r.stderr)
    assert f"port {port} on 127.0.0.1 is in use by another process" in r.stderr
    assert "cluster up" not in r.stdout and not (home / "cluster.json").exists()


@pytest.mark.parametrize("how", ["file", "env"])
def test_the_token_from_a_file_or_the_environment(home, tmp_path, how):
    import os

    import httpx

    token = "token-" + os.urandom(8).hex()
    if how == "file":
        path = tmp_path / "token"
        path.write_text(token + "\n")
        flowserve("up", "--port", "0", "--executors", "1", "--token-file", str(path), home=home)
    else:
        r = subprocess.run(
            [sys.executable, "-m", "flowserve.cli", "--dir", str(home), "up", "--port", "0", "--executors", "1"],
            capture_output=True,
            text=True,
            timeout=120,
            env={**os.environ, "FLOWSERVE_QUIET": "1", "FLOWSERVE_TOKEN": token},
        )
        assert r.returncode == 0, r.stderr
    for pid in _cluster_pids(home):  # never on a command line
        assert token not in open(f"/proc/{pid}/cmdline").read()
    url = json.loads((home / "cluster.json").read_text())["url"]
    assert httpx.get(f"{url}/flows").status_code == 401
    assert httpx.get(f"{url}/flows", headers={"Authorization": f"Bearer {token}"}).status_code == 200


def test_a_missing_token_file_is_a_clear_error(home, tmp_path):
    r = flowserve("up", "--port", "0", "--token-file", str(tmp_path / "nope"), home=home, check=False)
    # a bad flag value: argparse's status for bad usage (flowserve/cli.py), said without a traceback
    assert r.returncode == 2 and "cannot read the token file" in r.stderr and "Traceback" not in r.stderr


TWO_FLOWS = textwrap.dedent("""
    import flowserve as fs


    def check(row):
        if row.x < 0:
            raise ValueError(f"x must be >= 0, got {row.x}")
        return row.x


    def flows():
        out = []
        for name in ("loud", "quiet"):
            f = fs.Flow(name, schema={"x": int})
            f.map(check, names=["y"])
            out.append(f)
        return out
    """)


def test_logs_of_one_flow_follow_new_requests_and_undeploy(home, tmp_path):
    import os

    import httpx

    flowserve("up", "--port", "0", "--executors", "1", home=home)
    script = tmp_path / "two.py"
    script.write_text(TWO_FLOWS)
    flowserve("deploy", str(script), home=home)
    url = json.loads((home / "cluster.json").read_text())["url"]

    def fail(flow: str, rid: str) -> None:
        r = httpx.post(f"{url}/flows/{flow}", json={"x": -1}, headers={"X-Request-Id": rid}, timeout=30)
        assert r.status_code == 500 and r.headers["x-request-id"] == rid

    fail("quiet", "quiet-1")
    fail("loud", "loud-1")
    follow = subprocess.Popen(
        [sys.executable, "-m", "flowserve.cli", "--dir", str(home), "logs", "loud", "-f"],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "FLOWSERVE_QUIET": "1"},
    )
    try:
        seen: list[str] = []

        def until(needle: str) -> None:  # reads lines until one holds ``needle`` (the test's timeout bounds it)
            for line in follow.stdout:
                seen.append(line)
                if needle in line:
                    return
            raise AssertionError(f"`logs -f` ended without {needle!r}:\n{''.join(seen)}")

        until("request loud-1: operator 'check' raised ValueError")  # from the log as it was
        fail("quiet", "quiet-2")
        fail("loud", "loud-2")  # written after `logs -f` read to the end: only following shows it
        until("request loud-2: operator 'check' raised ValueError")
        until(f'  File "{script}", line 7, in check')  # its traceback goes with it
        follow.send_signal(signal.SIGINT)
        assert follow.wait(30) == 0
    finally:
        if follow.poll() is None:
            follow.kill()
    shown = "".join(seen)
    assert "quiet" not in shown, shown  # another flow's lines are left out
    assert re.search(
        r"^cpu0 +\| \S+ \S+ executor cpu0 WARNING flow loud stage check qid \d+ request loud-2:", shown, re.M
    )

    every = flowserve("logs", "-n", "-1", home=home).stdout
    assert "request quiet-2: operator" in every and "request loud-2: operator" in every
    assert re.search(
        r"^cluster +\| .* flowserve.gateway INFO flow quiet request quiet-2: 500 OperatorFailedError", every, re.M
    )
    last = flowserve("logs", "loud", "-n", "5", home=home).stdout.splitlines()
    assert len(last) == 5 and not [line for line in last if "quiet" in line], last

    assert flowserve("undeploy", "loud", home=home).stdout.strip() == "undeployed loud"
    gone = flowserve("invoke", "loud", "--json", '{"x": 1}', home=home, check=False)
    assert gone.returncode == 1 and "no deployed flow named 'loud'" in gone.stdout
    again = flowserve("undeploy", "loud", home=home, check=False)
    assert (
        again.returncode == 1
        and again.stderr.strip() == "error: no deployed flow named 'loud' (`flowserve status` lists them)"
    )
    assert [f["name"] for f in json.loads(flowserve("status", "--json", home=home).stdout)["flows"]] == ["quiet"]


def test_logs_without_a_cluster_directory_say_where_they_looked(tmp_path):
    r = flowserve("logs", home=tmp_path / "none", check=False)
    assert r.returncode == 1 and f"no cluster logs in {tmp_path / 'none'}" in r.stderr
