"""Recorders for the Kubernetes client: what the backend would send, without a cluster.

There is no Kubernetes API server here. These run the real ``kubernetes`` client stack
(typed APIs -> ApiClient -> REST layer) and stop at the HTTP transport:

* ``WireRecorder`` replaces urllib3's pool manager: it records each request (method,
  path, query, headers, JSON body) and answers with what the test scripted (default:
  success, echoing the body). It models no cluster state: a test says "this create gets
  409" and "this read returns that object".
* ``ApiRecorder`` wraps one real typed API (``AppsV1Api``...) and records each method call
  with its arguments (the ``V1Deployment``... objects the backend built) before passing it
  on to the real method.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from urllib.parse import parse_qs, urlsplit

from kubernetes import client

HOST = "https://k8s.invalid:6443"


@dataclass
class Request:
    method: str
    path: str
    query: dict
    headers: dict
    body: object

    @property
    def content_type(self) -> str:
        return self.headers.get("Content-Type", "")


class _Response:
    def __init__(self, status: int, body):
        self.status = status
        self.reason = {
            200: "OK",
            201: "Created",
            403: "Forbidden",
            404: "Not Found",
            409: "Conflict",
            422: "Unprocessable Entity",
            500: "Internal Server Error",
            503: "Service Unavailable",
        }.get(status, "")
        self.data = json.dumps(body).encode() if body is not None else b""
        self._headers = {"Content-Type": "application/json"}

    def getheaders(self):
        return self._headers

    def getheader(self, name, default=None):
        return self._headers.get(name, default)


def status_body(code: int, message: str, reason: str = "") -> dict:
    """A ``v1 Status`` document, as the API server sends with an error."""
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    }


@dataclass
class WireRecorder:
    """Stands in for urllib3's PoolManager under a real ``kubernetes.client.ApiClient``."""

    requests: list = field(default_factory=list)
    replies: list = field(default_factory=list)  # (method, path regex, status, body or callable)

    def reply(self, method: str, path_pattern: str, status: int, body=None) -> WireRecorder:
        """Answer requests matching ``method`` and ``path_pattern`` (full match) like this.
        ``body`` may be a callable taking the Request. Later rules win."""
        self.replies.insert(0, (method, re.compile(path_pattern), status, body))
        return self

    # the only method the kubernetes REST layer calls on its pool manager
    def request(self, method, url, body=None, fields=None, preload_content=True, timeout=None, headers=None, **_):
        parts = urlsplit(url)
        query = {k: v[0] if len(v) == 1 else v for k, v in parse_qs(parts.query).items()}
        if fields:
            query.update(dict(fields))
        req = Request(method, parts.path, query, dict(headers or {}), json.loads(body) if body else None)
        self.requests.append(req)
        for m, pattern, status, reply in self.replies:
            if m == method and pattern.fullmatch(parts.path):
                return _Response(status, reply(req) if callable(reply) else reply)
        return _Response(*self._default(req))

    @staticmethod
    def _default(req: Request):
        if req.method in ("POST", "PUT", "PATCH"):
            return (201 if req.method == "POST" else 200), req.body
        if req.method == "DELETE":
            return 200, {"kind": "Status", "apiVersion": "v1", "status": "Success"}
        if req.path.rsplit("/", 1)[-1] in _COLLECTIONS:  # a list: empty
            return 200, {"kind": "List", "apiVersion": "v1", "metadata": {}, "items": []}
        return 404, status_body(404, f"{req.path} not found", "NotFound")

    def calls(self, method: str | None = None, pattern: str | None = None) -> list[Request]:
        return [
            r
            for r in self.requests
            if (method is None or r.method == method) and (pattern is None or re.fullmatch(pattern, r.path))
        ]


_COLLECTIONS = {
    "deployments",
    "statefulsets",
    "services",
    "serviceaccounts",
    "networkpolicies",
    "configmaps",
    "secrets",
    "persistentvolumeclaims",
    "roles",
    "rolebindings",
    "pods",
}


class ApiRecorder:
    """Wraps a real typed API object; records ``(method, args, kwargs)`` of every call."""

    def __init__(self, api):
        self._api = api
        self.calls: list[tuple[str, tuple, dict]] = []

    def __getattr__(self, name):
        real = getattr(self._api, name)  # AttributeError for a method the client does not have
        if not callable(real):
            return real

        def record(*args, **kwargs):
            self.calls.append((name, args, kwargs))
            return real(*args, **kwargs)

        return record

    def names(self) -> list[str]:
        return [c[0] for c in self.calls]


def recorded_cluster(config=None, wire: WireRecorder | None = None, cls=None):
    """(``cls`` (default KubernetesCluster) on recorded APIs, wire, apis)."""
    from k8s import KubeConfig
    from k8s.backend import KubernetesCluster

    wire, apis = recorded_apis(wire)
    cluster = (cls or KubernetesCluster)(
        config=config or KubeConfig(),
        apps_api=apis["apps"],
        core_api=apis["core"],
        networking_api=apis["networking"],
        rbac_api=apis["rbac"],
    )
    return cluster, wire, apis


def recorded_apis(wire: WireRecorder | None = None):
    """(wire, {"apps": ApiRecorder(AppsV1Api), "core": ..., "networking": ..., "rbac": ...})
    sharing one real ApiClient whose transport is ``wire``."""
    wire = wire or WireRecorder()
    cfg = client.Configuration()
    cfg.host = HOST
    api_client = client.ApiClient(cfg)
    api_client.rest_client.pool_manager = wire
    apis = {
        "apps": ApiRecorder(client.AppsV1Api(api_client)),
        "core": ApiRecorder(client.CoreV1Api(api_client)),
        "networking": ApiRecorder(client.NetworkingV1Api(api_client)),
        "rbac": ApiRecorder(client.RbacAuthorizationV1Api(api_client)),
    }
    return wire, apis
