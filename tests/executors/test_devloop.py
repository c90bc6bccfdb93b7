"""``flowserve serve app.py``, the dev loop, as a user runs it: a real process serving a
script on a real cluster, its output read as the terminal would show it, edits to the
script, and Ctrl-C (SIGINT)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import httpx
import pytest

from tests.executors.test_cli import _cluster_pids, _running, flowserve

REPO = Path(__file__).resolve().parents[2]


def with_repo(env: dict) -> dict:
    """``env`` with this checkout importable: the commands run in the script's folder, as a
    user runs them, whether or not the package is installed."""
    path = [str(REPO), *filter(None, env.get("PYTHONPATH", "").split(os.pathsep))]
    return {**env, "PYTHONPATH": os.pathsep.join(path)}


APP = textwrap.dedent("""
    import flowserve as fs
    from helper import factor


    def scale(row):
        if row.x < 0:
            raise ValueError(f"x must be >= 0, got {row.x}")
        return row.x * factor()


    def setup(store):
        store.put("devloop/setup-ran", {"yes": True})


    def flows():
        f = fs.Flow("devloop", schema={"x": int})
        f.map(scale, names=["y"])
        return f
    """)


def _interruptible() -> None:
    """In the child: SIGINT interrupts, as in a terminal (a shell running tests in the
    background would have it ignored, and the child would inherit that)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


class Serve:
    """A ``flowserve serve`` process; its stdout and stderr as one stream of lines."""

    def __init__(self, *args, cwd: Path, env: dict | None = None):
        env = {k: v for k, v in (env or os.environ).items() if k != "FLOWSERVE_QUIET"}  # progress lines too
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "flowserve.cli", "serve", *args],
            cwd=cwd,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=with_repo(env),
            start_new_session=True,  # a terminal's foreground group of its own, which stop() signals
            preexec_fn=_interruptible,
        )
        self.lines: list[str] = []
        self.ended = False  # its output is all read
        self.changed = threading.Condition()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            with self.changed:
                self.lines.append(line.rstrip("\n"))
                self.changed.notify_all()
        with self.changed:
            self.ended = True
            self.changed.notify_all()

    def wait_for(self, pattern: str, after: int = 0, timeout: float = 60) -> re.Match:
        """The first line from index ``after`` on that matches ``pattern`` (a regex)."""
        regex = re.compile(pattern)
        deadline = time.monotonic() + timeout
        with self.changed:
            while True:
                for line in self.lines[after:]:
                    m = regex.search(line)
                    if m:
                        return m
                left = deadline - time.monotonic()
                if left <= 0 or self.ended:
                    raise AssertionError(f"no line matching {pattern!r} in:\n" + "\n".join(self.lines))
                self.changed.wait(min(left, 0.5))

    def stop(self, timeout: float = 60) -> int:
        # what Ctrl-C in a terminal does: SIGINT to the foreground process group, which holds
        # the embedded cluster's supervisor and store server too
        os.killpg(self.proc.pid, signal.SIGINT)
        return self.proc.wait(timeout)

    def output(self) -> str:
        with self.changed:
            return "\n".join(self.lines)


@pytest.fixture
def app(tmp_path):
    (tmp_path / "app.py").write_text(APP)
    (tmp_path / "helper.py").write_text("def factor():\n    return 2\n")
    return tmp_path


def post(url: str, row: dict, **headers):
    return httpx.post(url, json=row, headers=headers, timeout=30)


def test_serve_answers_shows_tracebacks_reloads_and_ctrl_c_stops_what_it_started(app, tmp_path):
    env = dict(os.environ, TMPDIR=str(tmp_path))  # the embedded cluster's directory is under tmp_path
    serve = Serve("app.py", "--port", "0", "--executors", "1", "--reload", cwd=app, env=env)
    try:
        url = serve.wait_for(r"serving flow devloop v\d+ at (http://127\.0\.0\.1:\d+/flows/devloop)").group(1)
        base = url.rsplit("/flows/", 1)[0]
        assert serve.wait_for(r"API page .*: (\S+)").group(1) == f"{base}/docs"
        home = Path(serve.wait_for(r"^logs: (\S+) ").group(1))
        pids = _cluster_pids(home)  # the supervisor and every process below it
        assert post(url, {"x": 5}).json()["rows"][0]["y"] == 10
        # setup(store) ran before the deploy, on the cluster's own store
        assert json.loads(flowserve("kvs", "get", "devloop/setup-ran", home=home).stdout) == {"yes": True}

        # an operator's error: the client's request id, the flow, stage and qid on the line,
        # then the traceback at the script's own file and line
        r = post(url, {"x": -1}, **{"X-Request-Id": "devloop-boom-1"})
        assert r.status_code == 500 and r.headers["x-request-id"] == "devloop-boom-1"
        qid = r.json()["qid"]
        serve.wait_for(
            rf"^cpu0 +\| .* WARNING flow devloop stage scale qid {qid} request devloop-boom-1: "
            r"operator 'scale' raised ValueError: x must be >= 0, got -1$"
        )
        raise_line = APP.splitlines().index('        raise ValueError(f"x must be >= 0, got {row.x}")') + 1
        serve.wait_for(rf'^cpu0 +\|   File "{re.escape(str(app / "app.py"))}", line {raise_line}, in scale$')
        serve.wait_for(
            rf"^cluster +\| .* flow devloop request devloop-boom-1: 500 OperatorFailedError \(operator 'scale', qid {qid}\) in "
        )
        assert len(re.findall(r"request devloop-boom-1: operator", serve.output())) == 1  # logged once

        # a module the script imports changes: deployed again, the answers change
        n = len(serve.lines)
        (app / "helper.py").write_text("def factor():\n    return 3  # edited\n")
        serve.wait_for(r"^helper\.py changed: deploying again$", after=n)
        serve.wait_for(r"^flow devloop: v\d+ serves \(was v\d+\)", after=n)
        serve.wait_for(r"^reloaded: the new version serves$", after=n)
        assert post(url, {"x": 5}).json()["rows"][0]["y"] == 15

        # the script breaks: said where, and the version before keeps serving
        n = len(serve.lines)
        (app / "app.py").write_text(APP.replace("return row.x * factor()", "return row.x * factor("))
        serve.wait_for(r"^error: app\.py raised SyntaxError", after=n)
        serve.wait_for(r"^what served before still serves: devloop$", after=n)
        serve.wait_for(r"^reload failed: fix it and save again$", after=n)
        assert post(url, {"x": 5}).json()["rows"][0]["y"] == 15
        n = len(serve.lines)
        (app / "app.py").write_text(APP.replace("row.x * factor()", "row.x * factor() + 1"))
        serve.wait_for(r"^reloaded: the new version serves$", after=n)
        assert post(url, {"x": 5}).json()["rows"][0]["y"] == 16

        assert serve.stop() == 0
    finally:
        if serve.proc.poll() is None:
            serve.proc.kill()
    out = serve.output()
    # the cluster's own processes got the SIGINT too: undeployed, or gone with the cluster
    assert re.search(r"^(undeployed devloop|devloop goes with the local cluster)", out, re.M), out
    assert "stopped the local cluster" in out, out
    assert not [p for p in pids if _running(p)], "processes of the cluster it started outlived `flowserve serve`"
    assert not home.exists()


SLOW_APP = textwrap.dedent("""
    import time

    import flowserve as fs


    class Model:
        def __init__(self):
            time.sleep(1.5)  # loading a model: the step the deploy waits for

        def __call__(self, t):
            return t.column("x").to_numpy() + 1


    def flows():
        f = fs.Flow("slowbuild", schema={"x": int})
        f.map(Model, names=["y"], batching=True)
        return f
    """)


def test_serve_on_an_up_cluster_says_what_a_slow_deploy_waits_for_and_leaves_the_cluster_running(tmp_path):
    home = tmp_path / "cluster"
    (tmp_path / "slow.py").write_text(SLOW_APP)
    (tmp_path / "other.py").write_text(
        "import flowserve as fs\nf = fs.Flow('kept', schema={'x': int})\nf.map(lambda r: r.x, names=['y'])\n"
    )
    flowserve("up", "--port", "0", "--executors", "1", home=home)
    try:
        flowserve("deploy", str(tmp_path / "other.py"), home=home)  # not the serve's: it must stay
        serve = Serve("slow.py", "--dir", str(home), cwd=tmp_path)
        try:
            serve.wait_for(
                r"flow 'slowbuild': the executors build its stages \(Model: constructors run, models load\) "
                r"\.\.\. still waiting \(\d+ s\)"
            )
            url = serve.wait_for(r"serving flow slowbuild v\d+ at (\S+)").group(1)
            assert "stops the local cluster" not in serve.output()  # it did not start this one
            assert post(url, {"x": 1}).json()["rows"][0]["y"] == 2
            assert serve.stop() == 0
        finally:
            if serve.proc.poll() is None:
                serve.proc.kill()
        assert "undeployed slowbuild" in serve.output() and "stopped the local cluster" not in serve.output()
        state = json.loads((home / "cluster.json").read_text())
        assert _running(state["pid"])
        served = [f["name"] for f in httpx.get(f"{state['url']}/flows", timeout=10).json()["flows"]]
        assert served == ["kept"]
    finally:
        flowserve("down", home=home, check=False)


def test_serve_of_a_missing_script_or_cluster_says_so(tmp_path):
    r = flowserve("serve", str(tmp_path / "nope.py"), home=tmp_path / "c", check=False)
    assert r.returncode == 2 and "no such script" in r.stderr
    (tmp_path / "app.py").write_text(APP)
    r = subprocess.run(
        [sys.executable, "-m", "flowserve.cli", "serve", "app.py", "--dir", str(tmp_path / "none")],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        env=with_repo(dict(os.environ)),
    )
    assert r.returncode == 1 and f"no cluster is running in {tmp_path / 'none'}" in r.stderr, r.stderr


def readme_dev_loop() -> tuple[str, list[str], list[str]]:
    """The README's dev-loop section: its app.py, the serve output it shows, and its
    request (``$ curl ...``), answer and log lines."""
    section = (REPO / "README.md").read_text().split("## The dev loop", 1)[1].split("\n## ", 1)[0]
    script = next(b for b in re.findall(r"```python\n(.*?)```", section, re.S) if b.startswith("# app.py"))
    shown, request = (b.splitlines() for b in re.findall(r"```text\n(.*?)```", section, re.S)[:2])
    return script, shown, request


def normal(line: str, app_file: Path) -> str:
    """A line without what differs from run to run: versions, ports, directories, times."""
    line = re.sub(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}", "<time>", line)
    line = re.sub(r"\bv\d{6,}", "v<version>", line)
    line = re.sub(r"http://(127\.0\.0\.1|localhost):\d+", "<url>", line)
    line = re.sub(r"/tmp/flowserve-\w+|\S+/flowserve-\w+", "<dir>", line)
    line = re.sub(r"in \d+\.\d ms$", "in <ms> ms", line)
    return line.replace(str(app_file), "<app.py>").replace("/home/me/app.py", "<app.py>")


def test_the_readmes_dev_loop_is_what_serve_does(tmp_path):
    """The README's app.py served as it says, its request sent as its curl line sends it: the
    lines it shows are in the output, the answer is the one it shows."""
    script, shown, request = readme_dev_loop()
    app_file = tmp_path / "app.py"
    app_file.write_text(script)
    serve = Serve(
        "app.py",
        "--reload",
        "--port",
        "0",
        "--executors",
        "1",
        cwd=tmp_path,
        env=dict(os.environ, TMPDIR=str(tmp_path)),
    )
    try:
        url = serve.wait_for(r"serving flow scale v\d+ at (\S+)").group(1)
        serve.wait_for(r"^Ctrl-C undeploys")
        got = [normal(line, app_file) for line in serve.lines]
        assert [normal(line, app_file) for line in shown] == [
            line for line in got if line in {normal(s, app_file) for s in shown}
        ], serve.output()

        curl, answer, *logged = [line for line in request if line.strip()]
        headers = dict(h.split(": ", 1) for h in re.findall(r"-H '([^']*)'", curl))
        body = re.search(r"-d '([^']*)'", curl).group(1)
        r = httpx.post(url, content=body, headers=headers, timeout=30)
        assert r.json() == json.loads(answer) and r.headers["x-request-id"] == headers["X-Request-Id"]
        want = [normal(line, app_file) for line in logged]
        executor = [w for w in want if w.startswith("cpu0 ")]  # its line and traceback: one block, in order
        deadline = time.monotonic() + 30
        while True:
            got = [normal(line, app_file) for line in serve.lines if not _carets(line)]
            at = got.index(executor[0]) if executor[0] in got else -1
            if at >= 0 and got[at : at + len(executor)] == executor and set(want) <= set(got):
                break
            assert time.monotonic() < deadline, "\n".join(["README lines:", *want, "not in:", serve.output()])
            time.sleep(0.1)
        assert serve.stop() == 0
    finally:
        if serve.proc.poll() is None:
            serve.proc.kill()


def _carets(line: str) -> bool:
    """A traceback's line of carets under an expression (which Python versions draw differently)."""
    rest = line.split(" | ", 1)[-1]
    return bool(rest.strip()) and not rest.strip(" ^~")
