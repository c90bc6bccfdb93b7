"""The Kubernetes layer's own errors, leaves of the one tree in ``flow.errors``.

    K8sNotFoundError     (FlowDefinitionError) 404: the object, or its namespace, does not
                         exist: fix the name or namespace (or deploy first)
    K8sConflictError     (RetryableError) 409: the object exists already, or changed since it
                         was read: read it again and retry

An API call that fails raises the class ``api_error_for`` picks from its HTTP status, with
``verb``, ``kind``, ``namespace``, ``name``, ``status`` (0: no answer) and ``reason`` set:
the two above, ``AccessDeniedError`` (401/403: credentials or RBAC), ``FlowValueError``
(400/422: the server rejected the object's content), ``UnavailableError`` (429/5xx: retry),
``UnreachableError`` (no answer: retry), ``InternalError`` (anything else). The rest of
the layer raises the tree's shared classes: ``ConfigError``/``ConfigTypeError`` (a
``KubeConfig`` or CLI value, a Secret without its key), ``FlowValueError`` (a manifest the
backend cannot send), ``NotInstalledError`` (no ``kubernetes`` client),
``DeadlineExceededError`` (``deploy`` waited ``wait_s`` and workloads were still not
ready), ``UnreachableError`` (the gateway or the KVS address did not answer).
"""

from __future__ import annotations

from flow.errors import (
    AccessDeniedError,
    FlowDefinitionError,
    FlowError,
    FlowValueError,
    InternalError,
    RetryableError,
    UnavailableError,
    UnreachableError,
)


class K8sNotFoundError(FlowDefinitionError):
    """404: the object, or its namespace, does not exist."""


class K8sConflictError(RetryableError):
    """409: the object already exists, or was changed since it was read."""


def api_error_for(status: int) -> type[FlowError]:
    """The class of the tree for an API server's HTTP ``status`` (0 = no answer)."""
    if status == 404:
        return K8sNotFoundError
    if status == 409:
        return K8sConflictError
    if status in (401, 403):
        return AccessDeniedError
    if status in (400, 422):
        return FlowValueError
    if status == 0:
        return UnreachableError
    if status == 429 or status >= 500:
        return UnavailableError
    return InternalError
