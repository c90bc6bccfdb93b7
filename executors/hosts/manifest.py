"""The declarative config: a file (``flowserve.yaml``) that says which scripts' flows a
cluster serves and how, applied with ``flowserve deploy -f flowserve.yaml``.

    token: {file: ~/.flowserve/token}      # or {env: FLOWSERVE_TOKEN}; never the token itself
    scripts:
      - path: examples/recommender.py      # every flow it defines, default settings
      - path: examples/ensemble.py
        flows:                             # only these of its flows, with these settings
          ensemble:
            timeout_s: 10
            optimize: true
            optimizer: {competitive_replicas: 3, batch: {max_batch_size: 8}}
            autoscaling: {min_replicas: 1, max_replicas: 4}
            slo: {p99_ms: 50, traffic_rps: 100, samples: samples/ensemble.json}

Paths are relative to the file. Every field is checked as the project's configs are
(``flow/configuration.py``): a wrong value or an unknown key is a ``ConfigError`` naming
the file, where in it, the field and the value. ``token`` names where the bearer token
the cluster requires is (``flowserve up --token-file``): applying a file to a cluster
that requires another token, or none, is refused, so a file cannot silently serve its
flows unprotected. A ``.yaml``/``.yml`` file needs PyYAML; a ``.json`` file holds the same
document as JSON.

Applying is idempotent. Each script's ``setup(store)`` runs (it loads what its flows read),
then each listed flow is deployed unless what was applied last for it is what the file
asks for now and that version still serves: the same optimized plan (``explain()``), the
same input schema, the same settings, the same code (the script's file and the user
modules its operators come from) and the same SLO samples. A flow the file no longer lists
is undeployed only with ``--prune``, and only if a file applied it: flows deployed by hand
are never touched. What was applied, from which file and when, is kept in the store
(``MANIFEST_KEY``); ``flowserve status`` shows it.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from executors.hosts.autoscale import AutoscalingConfig
from flow.configuration import (
    Bool,
    Config,
    ConfigError,
    ConfigTypeError,
    Invalid,
    Nested,
    Number,
    Str,
    setting,
)
from flow.errors import AccessDeniedError, NotInstalledError
from optimizer.options import OptimizerOptions

MANIFEST_KEY = "flowserve:manifest"  # what was applied last: file, time, flows (JSON)
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


@dataclass(frozen=True)
class TokenSource(Config):
    """Where the cluster's bearer token is: ``file`` (a path, ``~`` and relative to the
    manifest allowed) or ``env`` (an environment variable's name). Exactly one."""

    file: str | None = setting(None, Str(optional=True))
    env: str | None = setting(None, Str("an environment variable's name", _ENV_NAME.fullmatch, optional=True))

    def _validate(self) -> None:
        if (self.file is None) == (self.env is None):
            raise self.error(f"TokenSource needs exactly one of file or env, got {self.to_json()!r}")

    def read(self, base: Path) -> str:
        """The token, read now; ``AccessDeniedError`` naming where it was looked for."""
        if self.env is not None:
            token = os.environ.get(self.env, "").strip()
            if not token:
                raise AccessDeniedError(f"the manifest's token is in ${self.env}, which is not set or empty")
            return token
        path = (base / Path(self.file).expanduser()).resolve()  # type: ignore[arg-type]
        try:
            token = path.read_text().strip()
        except OSError as e:
            raise AccessDeniedError(f"cannot read the manifest's token file {path}: {e.strerror or e}") from None
        if not token:
            raise AccessDeniedError(f"the manifest's token file {path} is empty")
        return token


@dataclass(frozen=True)
class SLOSettings(Config):
    """A flow's latency objective (``optimizer.slo.SLO``) and what to plan it for:
    ``traffic_rps`` (requests/s) and ``samples`` (a JSON file of rows to profile on)."""

    p99_ms: float = setting(None, Number(gt=0))
    p50_ms: float | None = setting(None, Number(gt=0, optional=True))
    percentile: float = setting(99.0, Number(ge=50, lt=100))
    traffic_rps: float | None = setting(None, Number(gt=0, optional=True))
    samples: str | None = setting(None, Str(optional=True))


@dataclass(frozen=True)
class FlowSettings(Config):
    """How one flow is deployed: the arguments of ``ClusterClient.deploy``."""

    timeout_s: float | None = setting(None, Number(gt=0, optional=True, note="seconds"))
    optimize: bool = setting(True, Bool())
    optimizer: OptimizerOptions | None = setting(None, Nested(OptimizerOptions, optional=True, accept_mapping=True))
    autoscaling: AutoscalingConfig | None = setting(None, Nested(AutoscalingConfig, optional=True, accept_mapping=True))
    slo: SLOSettings | None = setting(None, Nested(SLOSettings, optional=True, accept_mapping=True))


class _FlowsOf:
    """A check: a mapping of flow names to ``FlowSettings`` (or their fields; None or {}:
    the defaults), or None for every flow a script defines."""

    def __call__(self, value, name: str):
        if value is None:
            return None
        if not isinstance(value, Mapping) or not value:
            raise Invalid("a mapping of flow names to their settings (or absent: every flow)", wrong_type=True)
        out = {}
        for flow, settings in value.items():
            if not isinstance(flow, str) or not flow:
                raise Invalid(message=f"{name} must name flows by non-empty strings, got {flow!r}", wrong_type=True)
            out[flow] = _settings(settings, f"{name}[{flow!r}]")
        return out


def _settings(value, name: str) -> FlowSettings:
    if value is None:
        return FlowSettings()
    if isinstance(value, FlowSettings):
        return value
    if not isinstance(value, Mapping):
        raise Invalid(message=f"{name} must be a mapping of FlowSettings fields, got {value!r}", wrong_type=True)
    try:
        return FlowSettings.from_json(value)
    except ConfigError as e:
        raise Invalid(message=f"{name}: {e}", wrong_type=isinstance(e, TypeError)) from None


@dataclass(frozen=True)
class ScriptEntry(Config):
    """A deploy script (``flowserve deploy``'s convention: ``flows()``, ``setup(store)``)
    and, optionally, which of its flows to deploy with which settings."""

    path: str = setting(None, Str("a path to a .py file", lambda v: v.endswith(".py")))
    flows: dict[str, FlowSettings] | None = setting(None, _FlowsOf())


class _ScriptsOf:
    """A check: a non-empty list of ``ScriptEntry`` (or mappings of its fields)."""

    def __call__(self, value, name: str):
        if not isinstance(value, (list, tuple)) or not value:
            raise Invalid("a non-empty list of scripts ({path: ..., flows: ...})", wrong_type=True)
        out = []
        for i, item in enumerate(value):
            if isinstance(item, ScriptEntry):
                out.append(item)
                continue
            if not isinstance(item, Mapping):
                raise Invalid(message=f"{name}[{i}] must be a mapping with a path, got {item!r}", wrong_type=True)
            try:
                out.append(ScriptEntry.from_json(item))
            except ConfigError as e:
                raise Invalid(message=f"{name}[{i}]: {e}", wrong_type=isinstance(e, TypeError)) from None
        return tuple(out)


@dataclass(frozen=True)
class Manifest(Config):
    """A whole ``flowserve.yaml`` (see the module docstring)."""

    scripts: tuple[ScriptEntry, ...] = setting((), _ScriptsOf())
    token: TokenSource | None = setting(
        None,
        Nested(
            TokenSource,
            optional=True,
            accept_mapping=True,
            what="{file: PATH} or {env: NAME} (where the token is, never the token itself)",
        ),
    )


def load(path: str | os.PathLike) -> Manifest:
    """The manifest in ``path`` (YAML, or JSON for a .json file), checked; a
    ``ConfigError`` naming the file otherwise."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as e:
        raise ConfigError(f"{path}: cannot read the manifest: {e.strerror or e}") from None
    doc = _parse(text, path)
    if not isinstance(doc, Mapping):
        raise ConfigTypeError(f"{path}: a manifest is a mapping with scripts (and token), got {doc!r:.200}")
    try:
        return Manifest.from_json(doc)
    except ConfigError as e:
        raise type(e)(f"{path}: {e}") from None


def _parse(text: str, path: Path):
    if path.suffix == ".json":
        try:
            return json.loads(text)
        except ValueError as e:
            raise ConfigError(f"{path}: not valid JSON: {e}") from None
    try:
        import yaml
    except ImportError:
        raise NotInstalledError(
            f"reading {path} needs PyYAML: `pip install pyyaml` (or write the manifest as JSON, e.g. flowserve.json)"
        ) from None
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise ConfigError(f"{path}: not valid YAML: {e}") from None


# -- applying a manifest ----------------------------------------------------------------------


@dataclass
class Applied:
    """What applying did to one flow: ``action`` is "deployed", "unchanged", "undeployed"
    (pruned) or "kept" (no longer listed; ``--prune`` undeploys it)."""

    flow: str
    action: str
    version: int | None = None
    script: str | None = None


def apply(
    manifest: Manifest, path: str | os.PathLike, cluster, script_flows, *, prune: bool = False, say=print
) -> list[Applied]:
    """Make ``cluster`` serve what ``manifest`` (read from ``path``) lists; returns what
    was done to each flow. ``script_flows(path)``: a script's (flows, setup), as
    ``flowserve deploy`` reads it (commands.py). See the module docstring for what is
    redeployed and when."""
    path = Path(path).resolve()
    base = path.parent
    if manifest.token is not None:
        _check_token(manifest.token.read(base), cluster, manifest.token)
    chosen: list[tuple[Path, Any, FlowSettings]] = []  # (script, flow, settings)
    setups = []
    for i, entry in enumerate(manifest.scripts):
        script = (base / entry.path).resolve()
        if not script.is_file():
            raise ConfigError(f"{path}: scripts[{i}].path: no such script: {script}")
        flows, setup = script_flows(script)
        by_name = {f.name: f for f in flows}
        wanted = entry.flows if entry.flows is not None else {n: FlowSettings() for n in by_name}
        unknown = sorted(set(wanted) - set(by_name))
        if unknown:
            raise ConfigError(
                f"{path}: scripts[{i}].flows: {script.name} defines no flow named {unknown}; it defines {sorted(by_name)}"
            )
        if not wanted:
            raise ConfigError(f"{path}: scripts[{i}]: {script.name} defines no Flow")
        for name, settings in wanted.items():
            if any(f.name == name for _, f, _ in chosen):
                raise ConfigError(f"{path}: flow {name!r} is listed twice (a flow name is one flow)")
            chosen.append((script, by_name[name], settings))
        if setup is not None:
            setups.append((script, setup))
    for script, setup in setups:
        say(f"running setup(store) of {script.name}")
        setup(cluster.kvs)
    before = applied_record(cluster.kvs) or {}
    served = {f["name"]: f["version"] for f in cluster.request("GET", "/flows", "listing the flows").json()["flows"]}
    done: list[Applied] = []
    record: dict = {}
    for script, flow, settings in chosen:
        kwargs = _deploy_kwargs(settings, base)
        fingerprint = _fingerprint(flow, script, settings, base)
        last = (before.get("flows") or {}).get(flow.name) or {}
        rel = os.path.relpath(script, base)
        if last.get("fingerprint") == fingerprint and served.get(flow.name) == last.get("version"):
            done.append(Applied(flow.name, "unchanged", last["version"], rel))
            record[flow.name] = last
            continue
        d = cluster.deploy(flow, **kwargs)
        done.append(Applied(flow.name, "deployed", d.version, rel))
        record[flow.name] = {"version": d.version, "fingerprint": fingerprint, "script": rel}
    listed = {f.name for _, f, _ in chosen}
    for name, last in sorted((before.get("flows") or {}).items()):
        if name in listed or name not in served:
            continue  # listed now, or gone already
        if prune:
            cluster.undeploy(name)
            done.append(Applied(name, "undeployed", served[name], last.get("script")))
        else:
            done.append(Applied(name, "kept", served[name], last.get("script")))
            record[name] = dict(last, unlisted=True)  # still the file's to prune later
    cluster.kvs.put(
        MANIFEST_KEY,
        {
            "file": str(path),
            "applied_at": time.time(),
            "flows": record,
            "actions": [dataclasses.asdict(a) for a in done],
        },
    )
    return done


def _check_token(token: str, cluster, source: TokenSource) -> None:
    where = f"${source.env}" if source.env is not None else source.file
    required = cluster.state.get("token")
    if required is None:
        raise AccessDeniedError(
            f"the manifest says the cluster's token is in {where}, but the cluster at {cluster.url} requires no "
            f"token: its flows would serve unprotected; start it with `flowserve up --token-file FILE`"
        )
    if token != required:
        raise AccessDeniedError(f"the token in {where} is not the one the cluster at {cluster.url} requires")


def _deploy_kwargs(settings: FlowSettings, base: Path) -> dict:
    kwargs: dict[str, Any] = {"optimize": settings.optimize}
    if settings.optimizer is not None:
        kwargs["options"] = settings.optimizer
    if settings.timeout_s is not None:
        kwargs["timeout_s"] = settings.timeout_s
    if settings.autoscaling is not None:
        kwargs["autoscaling"] = settings.autoscaling
    if settings.slo is not None:
        from optimizer.slo import SLO

        s = settings.slo
        kwargs["slo"] = SLO(p99_ms=s.p99_ms, p50_ms=s.p50_ms, percentile=s.percentile)
        if s.traffic_rps is not None:
            kwargs["traffic"] = s.traffic_rps
        if s.samples is not None:
            rows = json.loads(_samples_path(s.samples, base).read_text())
            kwargs["samples"] = [rows] if isinstance(rows, dict) else rows
    return kwargs


def _samples_path(samples: str, base: Path) -> Path:
    path = (base / Path(samples).expanduser()).resolve()
    if not path.is_file():
        raise ConfigError(f"slo.samples: no such file: {path}")
    return path


def _fingerprint(flow, script: Path, settings: FlowSettings, base: Path) -> str:
    """What a deploy of ``flow`` depends on, hashed: its optimized plan as ``explain()``
    prints it, its input schema, the settings, and the bytes of its code (the script and
    the user modules its operators come from) and of its SLO samples. (A plan's pickle
    is no fingerprint: cloudpickle's bytes for the same code differ between processes.)"""
    from executors.hosts.cluster import _callables, _user_modules
    from optimizer import Plan, optimize

    plan = optimize(flow, options=settings.optimizer) if settings.optimize else Plan.from_flow(flow)
    files = {str(script): script.read_bytes()}
    for stage in plan.stages.values():
        for node in stage.nodes:
            for fn in _callables(node.op):
                for mod in _user_modules(fn):
                    where = getattr(mod, "__file__", None)
                    if where and where not in files:
                        files[where] = Path(where).read_bytes()
    if settings.slo is not None and settings.slo.samples is not None:
        where = str(_samples_path(settings.slo.samples, base))
        files[where] = Path(where).read_bytes()
    h = hashlib.sha256()
    schema = {n: t.to_json() for n, t in (flow.schema or {}).items()}
    h.update(json.dumps([plan.explain(), schema, settings.to_json()], sort_keys=True, default=str).encode())
    for name in sorted(files):
        h.update(name.encode() + b"\0" + hashlib.sha256(files[name]).digest())
    return h.hexdigest()


def applied_record(store) -> dict | None:
    """What ``apply`` recorded last in ``store`` (None: no manifest was applied)."""
    record = store.get(MANIFEST_KEY, default=None)
    return record if isinstance(record, dict) else None


def describe_applied(record: dict, now: float | None = None) -> list[str]:
    """``flowserve status``'s lines for a manifest's record: the file, when, each flow."""
    now = time.time() if now is None else now
    at = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(record["applied_at"]))
    lines = [f"applied {record['file']} at {at} ({_ago(now - record['applied_at'])})"]
    for a in record.get("actions", []):
        version = f" v{a['version']}" if a.get("version") is not None else ""
        from_ = f" from {a['script']}" if a.get("script") else ""
        lines.append(f"  {a['flow']}{version}{from_}: {a['action']}")
    return lines


def _ago(seconds: float) -> str:
    seconds = max(0, int(seconds))
    if seconds < 60:
        return f"{seconds} s ago"
    if seconds < 3600:
        return f"{seconds // 60} min ago"
    if seconds < 86400:
        return f"{seconds // 3600} h ago"
    return f"{seconds // 86400} days ago"
