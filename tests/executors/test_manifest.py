"""The declarative config (executors/hosts/manifest.py): a ``flowserve.yaml`` checked as the
project's configs are, and ``flowserve deploy -f`` applying it to a real `flowserve up`
cluster idempotently: what did not change is not redeployed, what is no longer listed is
undeployed only with ``--prune``, ``flowserve status`` says what was applied and when."""

from __future__ import annotations

import contextlib
import io
import json
import re
import subprocess
import sys
import textwrap
import time

import pytest

from executors.hosts.manifest import FlowSettings, Manifest, ScriptEntry, TokenSource, load
from flow.configuration import ConfigError, ConfigTypeError
from flow.errors import NotInstalledError
from flowserve.cli import main

SCRIPT = """
from flow import Flow

def flows():
    double = Flow("double", schema={"x": int})
    double.map(lambda r: r.x * 2, names=["y"])
    triple = Flow("triple", schema={"x": int})
    triple.map(lambda r: r.x * 3, names=["y"])
    return [double, triple]

def setup(store):
    store.put("setup-ran", store.get("setup-ran", default=0) + 1)
"""


def write(path, text: str):
    path.write_text(textwrap.dedent(text))
    return path


# -- the file is checked as every config is ------------------------------------------------------


@pytest.mark.parametrize(
    "text, error, says",
    [
        ("scripts: []", ConfigTypeError, "Manifest.scripts must be a non-empty list of scripts"),
        ("scripts: [{path: a.py, flow: {}}]", ConfigError, "scripts[0]: ScriptEntry: unknown field(s) ['flow']"),
        ("scripts: [{path: a.txt}]", ConfigError, "ScriptEntry.path must be a path to a .py file, got 'a.txt'"),
        (
            "scripts: [{path: a.py, flows: {f: {timeout_s: -1}}}]",
            ConfigError,
            "scripts[0]: ScriptEntry.flows['f']: FlowSettings.timeout_s must be a number > 0 (seconds) or None, got -1",
        ),
        (
            "scripts: [{path: a.py, flows: {f: {timeout: 5}}}]",
            ConfigError,
            "FlowSettings: unknown field(s) ['timeout']; known: ['autoscaling', 'optimize', 'optimizer', 'slo', "
            "'timeout_s']",
        ),
        (
            "scripts: [{path: a.py, flows: {f: {autoscaling: {max_replicas: 0}}}}]",
            ConfigError,
            "FlowSettings.autoscaling: AutoscalingConfig.max_replicas must be an int >= 1, got 0",
        ),
        (
            "scripts: [{path: a.py, flows: {f: {optimizer: {competitive_replicas: 0}}}}]",
            ConfigError,
            "FlowSettings.optimizer: OptimizerOptions.competitive_replicas must be an int >= 1, got 0",
        ),
        ("scripts: [{path: a.py, flows: {f: {slo: {traffic_rps: 5}}}}]", ConfigError, "SLOSettings.p99_ms must be"),
        (
            "token: s3cret\nscripts: [{path: a.py}]",
            ConfigTypeError,
            "Manifest.token must be {file: PATH} or {env: NAME} (where the token is, never the token itself) or "
            "None, got 's3cret'",
        ),
        (
            "token: {file: t, env: T}\nscripts: [{path: a.py}]",
            ConfigError,
            "TokenSource needs exactly one of file or env",
        ),
        ("token: {env: 'not a name'}\nscripts: [{path: a.py}]", ConfigError, "an environment variable's name"),
        ("scripts: [{path: a.py}]\nextra: 1", ConfigError, "Manifest: unknown field(s) ['extra']"),
        ("- a.py", ConfigTypeError, "a manifest is a mapping with scripts"),
        ("scripts: [", ConfigError, "not valid YAML"),
    ],
)
def test_a_bad_manifest_is_one_error_naming_the_file_the_field_and_the_value(tmp_path, text, error, says):
    path = write(tmp_path / "flowserve.yaml", text)
    with pytest.raises(error) as e:
        load(path)
    assert str(e.value).startswith(f"{path}: ") and says in str(e.value), str(e.value)


def test_a_manifest_reads_from_yaml_or_json_and_round_trips(tmp_path):
    text = """
        token: {env: FLOWSERVE_TOKEN}
        scripts:
          - path: app.py
            flows:
              double: {timeout_s: 5, optimizer: {batch: {max_batch_size: 8}}, autoscaling: {max_replicas: 2}}
              triple:
          - path: other.py
        """
    m = load(write(tmp_path / "flowserve.yaml", text))
    assert m.token == TokenSource(env="FLOWSERVE_TOKEN")
    assert m.scripts[1] == ScriptEntry(path="other.py")
    double = m.scripts[0].flows["double"]
    assert double.timeout_s == 5 and double.optimizer.batch.max_batch_size == 8 and double.autoscaling.max_replicas == 2
    assert m.scripts[0].flows["triple"] == FlowSettings()
    assert Manifest.from_json(m.to_json()) == m
    assert load(write(tmp_path / "flowserve.json", json.dumps(m.to_json()))) == m


def test_without_pyyaml_a_yaml_manifest_says_what_to_install(tmp_path):
    path = write(tmp_path / "flowserve.yaml", "scripts: [{path: a.py}]")
    code = f"import sys; sys.modules['yaml'] = None\nfrom executors.hosts.manifest import load\nload({str(path)!r})"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert NotInstalledError.__name__ in r.stderr and "pip install pyyaml" in r.stderr and "JSON" in r.stderr


# -- applied to a real cluster -------------------------------------------------------------------


@pytest.fixture(scope="module")
def up(tmp_path_factory):
    """A `flowserve up` cluster that requires a token (read from a file beside the manifests)."""
    home = tmp_path_factory.mktemp("manifest") / "cluster"
    home.parent.joinpath("token").write_text("t0ken-for-the-test\n")
    cli("up", "--port", "0", "--executors", "1", "--token-file", str(home.parent / "token"), home=home)
    yield home
    cli("down", home=home, check=False)


def cli(*args, home, check=True) -> tuple[int, str, str]:
    """``flowserve ARGS`` in this process (a process per command cost seconds each): its exit
    status, stdout and stderr."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(["--dir", str(home), *args])
    if check and code != 0:
        raise AssertionError(f"flowserve {' '.join(args)} failed ({code}):\n{out.getvalue()}\n{err.getvalue()}")
    return code, out.getvalue(), err.getvalue()


def status(home) -> dict:
    return json.loads(cli("status", "--json", home=home)[1])


def served(home) -> dict[str, int]:
    return {f["name"]: f["version"] for f in status(home)["flows"]}


def stages_of(home, flow: str) -> list[dict]:
    return next(f for f in status(home)["flows"] if f["name"] == flow)["stages"]


def wait_for(condition, seconds: float = 30.0) -> bool:
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.2)
    return True


def test_deploy_f_refuses_a_token_not_the_clusters_and_flags_the_file_replaces(up, monkeypatch):
    home = up
    write(home.parent / "app.py", SCRIPT)
    manifest = write(home.parent / "refused.yaml", "token: {env: APP_TOKEN}\nscripts: [{path: app.py}]")
    monkeypatch.setenv("APP_TOKEN", "another")
    code, _, err = cli("deploy", "-f", str(manifest), home=home, check=False)
    assert code == 1 and "the token in $APP_TOKEN is not the one the cluster at" in err
    monkeypatch.setenv("APP_TOKEN", "")
    code, _, err = cli("deploy", "-f", str(manifest), home=home, check=False)
    assert code == 1 and "$APP_TOKEN, which is not set or empty" in err
    code, _, err = cli("deploy", "-f", str(manifest), "--timeout", "3", home=home, check=False)
    assert code == 2 and "takes the scripts and their settings from the file; drop --timeout" in err
    missing = write(home.parent / "missing.yaml", "scripts: [{path: nowhere.py}]")
    code, _, err = cli("deploy", "-f", str(missing), home=home, check=False)
    assert code == 2 and "scripts[0].path: no such script" in err
    code, _, err = cli("deploy", home=home, check=False)
    assert code == 2 and "give a SCRIPT to deploy, or -f FILE" in err
    assert served(home) == {}  # nothing was deployed by any of them


def test_deploy_f_applies_a_manifest_idempotently(up):
    home = up
    write(home.parent / "app.py", SCRIPT)
    write(home.parent / "hand.py", 'from flow import Flow\nf = Flow("by-hand")\nf.map(lambda r: 1, names=["y"])\n')
    cli("deploy", str(home.parent / "hand.py"), home=home)  # by hand: never the manifest's to prune
    manifest = home.parent / "flowserve.yaml"
    listing = """
        token: {file: token}
        scripts:
          - path: app.py
            flows:
              double: {timeout_s: %s, autoscaling: {min_replicas: 1, max_replicas: 2}}
              triple: {optimize: false, slo: {p99_ms: 500}}
        """
    write(manifest, listing % 5)
    first = cli("deploy", "-f", str(manifest), home=home)[1]
    assert re.fullmatch(r"double v\d+: deployed\ntriple v\d+: deployed\n", first), first
    versions = served(home)
    assert set(versions) == {"by-hand", "double", "triple"}

    again = cli("deploy", "-f", str(manifest), home=home)[1]  # nothing changed: nothing redeployed
    assert again == f"double v{versions['double']}: unchanged\ntriple v{versions['triple']}: unchanged\n"
    assert served(home) == versions

    write(manifest, listing % 7)  # one flow's settings changed: that one only
    changed = cli("deploy", "-f", str(manifest), home=home)[1]
    now = served(home)
    assert now["double"] > versions["double"] and now["triple"] == versions["triple"]
    assert changed == f"double v{now['double']}: deployed\ntriple v{now['triple']}: unchanged\n"
    # the flow's own autoscaling (the cluster has none): its stages get a scaler, triple's do not
    assert wait_for(lambda: all(s["autoscaling"] for s in stages_of(home, "double")))
    assert not any(s["autoscaling"] for s in stages_of(home, "triple"))
    flows = {f["name"]: f for f in status(home)["flows"]}  # each flow's settings, as the gateway serves it
    assert flows["double"]["timeout_s"] == 7 and flows["triple"]["timeout_s"] is None
    assert flows["triple"]["slo"]["slo"]["p99_ms"] == 500 and "slo" not in flows["double"]

    write(manifest, listing.replace("              triple: {optimize: false, slo: {p99_ms: 500}}\n", "") % 7)
    kept = cli("deploy", "-f", str(manifest), home=home)[1]
    assert f"triple v{now['triple']}: no longer listed; kept (--prune undeploys it)" in kept
    assert f"double v{now['double']}: unchanged" in kept and set(served(home)) == {"by-hand", "double", "triple"}

    pruned = cli("deploy", "-f", str(manifest), "--prune", home=home)[1]
    assert f"triple v{now['triple']}: undeployed" in pruned and set(served(home)) == {"by-hand", "double"}

    text = cli("status", home=home)[1]
    line = next(line for line in text.splitlines() if line.startswith("applied "))
    assert line.startswith(f"applied {manifest.resolve()} at {time.strftime('%Y-%m-%d', time.gmtime())}"), line
    assert f"  double v{now['double']} from app.py: unchanged" in text
    assert f"  triple v{now['triple']} from app.py: undeployed" in text
    record = status(home)["manifest"]
    assert record["file"] == str(manifest.resolve()) and time.time() - record["applied_at"] < 300
    assert json.loads(cli("kvs", "get", "setup-ran", home=home)[1]) == 5  # setup(store) ran at each apply


def test_the_readmes_flowserve_yaml_is_a_valid_manifest_of_existing_flows(tmp_path):
    """README.md's example config: checked as `deploy -f` checks it, its scripts exist and
    define the flows it names (paths are relative to the file: here the repository root)."""
    from pathlib import Path

    from executors.hosts.commands import script_flows

    root = Path(__file__).resolve().parents[2]
    text = re.search(r"```yaml\n(.*?)```", (root / "README.md").read_text(), re.S).group(1)
    path = write(tmp_path / "flowserve.yaml", text)
    m = load(path)
    assert m.token == TokenSource(env="FLOWSERVE_TOKEN") and len(m.scripts) == 2
    for entry in m.scripts:
        flows, _ = script_flows(root / entry.path)
        assert set(entry.flows or {}) <= {f.name for f in flows}, entry
    assert m.scripts[1].flows["ensemble"].autoscaling.max_replicas == 4
