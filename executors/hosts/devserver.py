"""``flowserve serve app.py``: the dev loop in the foreground.

It starts an embedded local cluster (or joins the ``flowserve up`` one named with
``--dir``), runs the script's ``setup(store)`` and deploys its flows (the contract of
``flowserve deploy``), prints each flow's URL and the API page, then streams the cluster's
logs (executors/hosts/logs.py) to the terminal: the gateway's line about each request
(its id, status and time), and an operator's error with the user's traceback, from the
executor where it ran. With ``--reload`` it deploys again when the script, or a module it
imports from the script's directory, changes, and says whether the new version serves.
Ctrl-C (or SIGTERM) undeploys what it deployed and stops the cluster if it started it,
never one it did not.

    server = DevServer(Path("app.py"), cluster, owned=True, load=script_flows, reload=True)
    server.run()   # until Ctrl-C
"""

from __future__ import annotations

import os
import shutil
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable
from pathlib import Path

from executors.hosts.logs import LogFollower
from flow.errors import FlowError, RetryableError

POLL_S = 0.1  # how often new log lines are looked for
WATCH_S = 0.5  # how often the watched files are looked at
SETTLE_S = 0.2  # a changed file is read once it has not changed for this long (editors save in steps)
_RUNTIME_PACKAGES = ("flowserve", "flow", "optimizer", "executors", "kvs", "k8s")


def say(msg: str) -> None:
    """Progress of a step, on stderr (stdout has the URLs and the logs)."""
    if os.environ.get("FLOWSERVE_QUIET") != "1":
        print(f"[flowserve] {msg}", file=sys.stderr, flush=True)


class Waiting:
    """Says what a long step waits for: nothing if it ends within ``first`` seconds, else a
    line then and every ``every`` seconds after, and how long it took once it ends.

        with Waiting("flow 'f': building its stages"):
            cluster.deploy(flow)
    """

    def __init__(self, what: str, first: float = 1.0, every: float = 5.0, tell: Callable[[str], None] = say):
        self.what, self.first, self.every, self.tell = what, first, every, tell
        self.done = threading.Event()
        self.said = False
        self.thread: threading.Thread | None = None

    def __enter__(self) -> Waiting:
        self.t0 = time.monotonic()
        self.thread = threading.Thread(target=self._watch, name="flowserve-waiting", daemon=True)
        self.thread.start()
        return self

    def _watch(self) -> None:
        wait = self.first
        while not self.done.wait(wait):  # a timer: the step ends whenever it ends
            self.said = True
            self.tell(f"{self.what} ... still waiting ({time.monotonic() - self.t0:.0f} s)")
            wait = self.every

    def __exit__(self, *exc) -> None:
        self.done.set()
        if self.thread is not None:
            self.thread.join()
        if self.said and exc[0] is None:
            self.tell(f"{self.what}: done in {time.monotonic() - self.t0:.1f} s")


def user_modules(root: Path) -> dict[str, Path]:
    """Modules imported from the user's directory ``root`` (not FlowServe's own, not an
    installed package), by name: what a reload must import again, and watch."""
    root = root.resolve()
    found = {}
    for name, mod in list(sys.modules.items()):
        file = getattr(mod, "__file__", None)
        top = name.split(".")[0]
        if not file or top in _RUNTIME_PACKAGES or top.startswith("__") or "site-packages" in file:  # __main__
            continue
        path = Path(file).resolve()
        if path.is_relative_to(root):
            found[name] = path
    return found


class Watcher:
    """Which of some files changed since it last looked (their size or modification time)."""

    def __init__(self, files):
        self.files = sorted(set(files))
        self.seen = self._stat()

    def _stat(self) -> dict:
        out = {}
        for f in self.files:
            try:
                st = f.stat()
                out[f] = (st.st_mtime_ns, st.st_size)
            except OSError:
                out[f] = None  # gone (an editor between its delete and its write): a change too
        return out

    def changed(self) -> list[Path]:
        now = self._stat()
        if now == self.seen:
            return []
        while True:  # let the save finish: read the files once they have settled
            time.sleep(SETTLE_S)
            later = self._stat()
            if later == now:
                break
            now = later
        changed = [f for f in self.files if now[f] != self.seen.get(f)]
        self.seen = now
        return changed


def constructors(flow) -> list[str]:
    """The names of a flow's operators that build state on each replica (a class, an
    ``init=``): what a deploy that takes long is waiting for (models loading)."""
    names = []
    for node in flow.nodes:
        op = node.op
        if isinstance(getattr(op, "fn", None), type) or getattr(op, "init", None) is not None:
            names.append(node.name)
    return names


class DevServer:
    """Serves a script's flows on a cluster until stopped; see the module's docstring.
    ``owned``: a ``LocalCluster`` not started yet, with a directory of its own, which this
    server starts, and stops and removes at the end; else a running cluster, left running.
    ``load(script)`` gives the script's flows and its ``setup(store)`` (commands.script_flows)."""

    def __init__(
        self,
        script: Path,
        cluster,
        *,
        owned: bool,
        load: Callable,
        reload: bool = False,
        only: str | None = None,
        optimize: bool = True,
        out=None,
    ):
        self.script = script.resolve()
        self.cluster = cluster
        self.owned = owned
        self.load = load
        self.reload = reload
        self.only = only  # serve only the flow of this name
        self.optimize = optimize
        self.out = out or sys.stdout
        self.lock = threading.Lock()  # one line at a time from the log thread and this one
        self.served: dict[str, int] = {}  # flow -> the version this server deployed and serves
        self.watcher: Watcher | None = None
        self.follower = LogFollower(cluster.dir)
        if not owned:
            self.follower.skip_to_end()  # a cluster that ran before: only what happens from now
        self.stopping = threading.Event()
        self.streamer = threading.Thread(target=self._stream, name="flowserve-logs", daemon=True)

    def emit(self, line: str) -> None:
        with self.lock:
            print(line, file=self.out, flush=True)

    # -- the loop ------------------------------------------------------------------------

    def run(self) -> int:
        """Deploy, then stream and (with reload) watch until Ctrl-C or SIGTERM; the exit
        status: 0 after a stop, 1 when the first deploy failed (without reload) or the
        cluster this server started ended by itself."""
        previous = signal.signal(signal.SIGTERM, _interrupt)  # a process manager's stop: as Ctrl-C
        self.streamer.start()  # from now: the cluster's own lines as it starts, if it does
        try:
            if self.owned:
                self.cluster.start()
            ok = self._deploy(first=True)
            if not ok and not self.reload:
                return 1
            self._announce()
            while True:
                time.sleep(WATCH_S)
                if self.owned and self.cluster.proc is not None and self.cluster.proc.poll() is not None:
                    self.emit(f"the local cluster ended by itself (exit {self.cluster.proc.returncode}); stopping")
                    return 1
                if self.watcher is not None:
                    changed = self.watcher.changed()
                    if changed:
                        self._redeploy(changed)
        except KeyboardInterrupt:
            return 0
        finally:
            signal.signal(signal.SIGTERM, previous)
            self._stop()

    def _stream(self) -> None:
        while not self.stopping.wait(POLL_S):
            for line in self.follower.read():
                self.emit(line)

    def _announce(self) -> None:
        url = self.cluster.url
        for name, version in self.served.items():
            self.emit(f"serving flow {name} v{version} at {url}/flows/{name}")
        self.emit(f"API page (every flow, try it out): {url}/docs")
        self.emit(f"logs: {self.cluster.dir} (cluster.log, logs/*.log), streamed below")
        if self.watcher is not None:
            n = len(self.watcher.files) - 1
            also = f" and {n} module{'s' if n != 1 else ''} it imports" if n else ""
            self.emit(f"watching {self.script.name}{also} for changes")
        what = ", ".join(self.served) or "nothing"
        self.emit(f"Ctrl-C undeploys {what}" + (" and stops the local cluster" if self.owned else ""))

    # -- deploying -----------------------------------------------------------------------

    def _load(self):
        """The script's flows and setup, its user modules imported afresh; the files to
        watch. Raises what the script raised."""
        for name in user_modules(self.script.parent):
            sys.modules.pop(name, None)  # the script's imports run the code as it is now
        try:
            flows, setup = self.load(self.script)
        finally:
            if self.reload:
                self.watcher = Watcher([self.script, *user_modules(self.script.parent).values()])
        if self.only is not None:
            flows = [f for f in flows if f.name == self.only]
        return flows, setup

    def _deploy(self, first: bool) -> bool:
        """Load the script and deploy its flows; True if every one serves its new version.
        A flow that fails keeps serving its previous version (a reload's), if it had one."""
        try:
            flows, setup = self._load()
        except Exception as e:  # the user's script raised: show where, keep what serves
            self._script_failed(e, first)
            return False
        if not flows:
            self.emit(
                f"error: {self.script.name} defines no Flow"
                + (f" named {self.only!r}" if self.only else "")
                + " (define flows() returning a Flow or a list of them, or a module-level Flow)"
            )
            return False
        if setup is not None:
            try:
                with Waiting(f"running setup(store) of {self.script.name}"):
                    setup(self.cluster.kvs)
            except Exception as e:  # the user's setup raised
                self._script_failed(e, first, "setup(store)")
                return False
        ok = True
        for f in flows:
            old = self.served.get(f.name)
            building = constructors(f)
            what = f"flow {f.name!r}: the executors build its stages" + (
                f" ({', '.join(building)}: constructors run, models load)" if building else ""
            )
            if first and not self.owned and f.name in self._listed():
                self.emit(
                    f"note: flow {f.name} already serves on this cluster; the script's version replaces it, "
                    "and Ctrl-C undeploys it"
                )
            try:
                with Waiting(what):
                    d = self.cluster.deploy(f, optimize=self.optimize)
            except Exception as e:  # a flow that does not build, or that cannot be pickled: said, the others go on
                ok = False
                kept = f"; v{old} still serves" if old is not None else ""
                self.emit(f"flow {f.name}: the new version did not deploy: {type(e).__name__}: {e}{kept}")
                continue
            self.served[f.name] = d.version
            if not first:
                was = f" (was v{old})" if old is not None else ""
                self.emit(f"flow {f.name}: v{d.version} serves{was} at {d.url}")
        if not first:
            for name in [n for n in self.served if n not in {f.name for f in flows}]:
                self._undeploy(name)  # no longer in the script
        return ok

    def _listed(self) -> set[str]:
        """The flows the cluster serves now."""
        listed = self.cluster.request("GET", "/flows", "listing the flows").json()["flows"]
        return {f["name"] for f in listed}

    def _redeploy(self, changed: list[Path]) -> None:
        names = ", ".join(_shown(p, self.script.parent) for p in changed)
        self.emit(f"{names} changed: deploying again")
        ok = self._deploy(first=False)
        self.emit("reloaded: the new version serves" if ok else "reload failed: fix it and save again")

    def _script_failed(self, e: Exception, first: bool, where: str = "") -> None:
        what = f"{self.script.name}{' ' + where if where else ''}"
        self.emit(f"error: {what} raised {type(e).__name__}: {e}")
        for line in _user_traceback(e, self.script.parent).splitlines():
            self.emit("  " + line)
        if not first and self.served:
            self.emit(f"what served before still serves: {', '.join(self.served)}")

    # -- stopping ------------------------------------------------------------------------

    def _undeploy(self, name: str) -> None:
        try:
            undeploy(self.cluster, name)
            self.emit(f"undeployed {name}")
        except RetryableError as e:
            if self.owned:  # a Ctrl-C in the terminal reaches the cluster's own process too
                self.emit(f"{name} goes with the local cluster, which is stopping")
            else:
                self.emit(f"could not undeploy {name}: {e}")
        except FlowError as e:
            self.emit(f"could not undeploy {name}: {e}")
        self.served.pop(name, None)

    def _stop(self) -> None:
        """Undeploy what this server deployed; stop the cluster if it started it. Runs once,
        whatever ended the loop; a second Ctrl-C meanwhile is ignored (a cleanup cut short
        would leave the cluster's processes behind; each of its calls has a timeout)."""
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # the cleanup runs to its end
        started = bool(self.cluster.state)  # a cluster that did not start has nothing to stop
        try:
            if started:
                self.emit("stopping")
            for name in list(self.served):
                self._undeploy(name)
            self.stopping.set()
            self.streamer.join()
            for line in self.follower.read():  # the last lines, before an embedded cluster's files go
                self.emit(line)
            if self.owned:
                self.cluster.stop()
                shutil.rmtree(self.cluster.dir, ignore_errors=True)
                if started:
                    self.emit("stopped the local cluster")
            else:
                self.cluster.close()
        finally:
            signal.signal(signal.SIGINT, signal.default_int_handler)


def undeploy(cluster, name: str) -> None:
    """Stop serving flow ``name``; raises the tree's class for an error answer (a flow that
    is not deployed: ``BadRequestError`` 404)."""
    cluster.request(
        "DELETE",
        f"/admin/flows/{name}",
        f"undeploying flow {name!r}",
        headers={"Authorization": f"Bearer {cluster.state['admin_token']}"},
        timeout=30,
    )


def _interrupt(signum, frame) -> None:
    raise KeyboardInterrupt


def _shown(path: Path, root: Path) -> str:
    try:
        return str(path.relative_to(root.resolve()))
    except ValueError:
        return str(path)


def _user_traceback(e: BaseException, root: Path) -> str:
    """``e``'s traceback from the first frame in the user's directory on (the runtime's
    frames that ran the script left out)."""
    root = root.resolve()
    tb = e.__traceback__
    while tb is not None and not Path(tb.tb_frame.f_code.co_filename).resolve().is_relative_to(root):
        tb = tb.tb_next
    return "".join(traceback.format_exception(type(e), e, tb or e.__traceback__)).rstrip("\n")
