"""Errors raised by the Kubernetes layer, rooted at ``flow.exceptions.FlowError``.

    K8sError                      root of everything k8s raises on purpose
    ├── K8sConfigError            (also ConfigError, ValueError) a bad KubeConfig / CLI value, quoted
    │   └── K8sConfigTypeError    (also TypeError) a KubeConfig field of the wrong type
    ├── ManifestError             (also ValueError) a manifest the backend cannot send
    ├── K8sClientMissingError     (also ImportError) the ``kubernetes`` package is not installed
    ├── K8sNotReadyError          ``deploy`` waited ``wait_s`` and workloads were still not ready
    ├── K8sUnreachableError       (also RetryableError) the gateway or KVS address did not answer
    └── K8sApiError               the API server refused a call (names kind, namespace/name)
        ├── K8sNotFoundError      404: the object (or namespace) does not exist
        ├── K8sConflictError      409: it exists already / was changed meanwhile
        ├── K8sForbiddenError     401/403: credentials or RBAC do not allow the call
        ├── K8sInvalidError       400/422: the server rejected the object's content
        └── K8sUnavailableError   (also RetryableError) 429/5xx or no connection

Grouped by what the caller can do, like ``kvs.exceptions``: fix the config for a
``K8sConfigError``, fix RBAC for ``K8sForbiddenError``, retry ``K8sUnavailableError``.
"""

from __future__ import annotations

from flow.configuration import ConfigError, ConfigTypeError
from flow.exceptions import FlowError, RetryableError


class K8sError(FlowError):
    """Root of every error the Kubernetes layer raises on purpose."""


class K8sConfigError(K8sError, ConfigError):
    """A configuration value is wrong; the message names the field and quotes the value."""


class K8sConfigTypeError(K8sConfigError, ConfigTypeError):
    """A configuration field has the wrong type (e.g. replicas given as a string)."""


class ManifestError(K8sError, ValueError):
    """A manifest cannot be turned into a Kubernetes API object (unknown kind, no name,
    a field the API model rejects); the message names the object."""


class K8sClientMissingError(K8sError, ImportError):
    """The ``kubernetes`` Python client is not installed: ``pip install 'flowserve[k8s]'``."""


class K8sNotReadyError(K8sError):
    """The instance's workloads did not become ready in time; the message names each one
    with its ready/desired replicas (pods pending for want of a GPU node, an image that
    cannot be pulled, a crashing container...)."""


class K8sUnreachableError(K8sError, RetryableError):
    """The gateway or the KVS address ``deploy`` uses did not answer (from outside the
    cluster the in-cluster DNS names do not resolve: port-forward and pass the addresses)."""


class K8sApiError(K8sError):
    """The API server refused a call. ``verb``, ``kind``, ``namespace``, ``name`` say which
    object; ``status`` is the HTTP status (0: no answer) and ``reason`` the server's text."""

    def __init__(
        self,
        message: str,
        *,
        verb: str = "",
        kind: str = "",
        namespace: str = "",
        name: str = "",
        status: int = 0,
        reason: str = "",
    ):
        super().__init__(message)
        self.verb, self.kind, self.namespace, self.name = verb, kind, namespace, name
        self.status, self.reason = status, reason


class K8sNotFoundError(K8sApiError):
    """404: the object, or its namespace, does not exist."""


class K8sConflictError(K8sApiError):
    """409: the object already exists, or was changed since it was read."""


class K8sForbiddenError(K8sApiError):
    """401/403: the credentials are missing or RBAC does not allow the call."""


class K8sInvalidError(K8sApiError):
    """400/422: the server rejected the object's content (its message says which field)."""


class K8sUnavailableError(K8sApiError, RetryableError):
    """429, 5xx or no connection to the API server: the same call may succeed later."""


def api_error_for(status: int):
    """The K8sApiError subclass for an HTTP ``status`` (0 = no answer)."""
    if status == 404:
        return K8sNotFoundError
    if status == 409:
        return K8sConflictError
    if status in (401, 403):
        return K8sForbiddenError
    if status in (400, 422):
        return K8sInvalidError
    if status == 0 or status == 429 or status >= 500:
        return K8sUnavailableError
    return K8sApiError
