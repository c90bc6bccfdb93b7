"""Model artifacts by URI, cached on the executor's disk.

    from kvs.artifacts import fetch
    path = fetch("s3://models/resnet/v3.pt")       # downloaded once per content version
    path = fetch("s3://models/resnet/v3.pt")       # unchanged object: the cached file, no download
    path = fetch("/models/resnet.pt")              # plain paths and file:// URIs pass through

``s3://bucket/key`` goes through boto3 (credentials the usual AWS way: environment,
profile, IAM role). An S3-compatible store (MinIO, Ceph, moto) is reached through
``FLOWSERVE_S3_ENDPOINT`` (or ``AWS_ENDPOINT_URL``). Each fetch asks the store for the
object's ETag (a HEAD request) and keys the cached copy by URI + ETag: a changed object is
downloaded again, an unchanged one is not. Downloads go to a temporary file in the cache
directory, checked against the expected size, then renamed into place, so concurrent
fetches (threads or processes) never see a partial file; a per-object lock keeps them from
downloading the same bytes twice.

Cache directory: ``cache_dir``, else ``FLOWSERVE_ARTIFACT_CACHE``, else
``$XDG_CACHE_HOME/flowserve/artifacts`` (``~/.cache/flowserve/artifacts``).

Errors (``flow.errors``' tree; ``uri`` names the artifact): ``FlowValueError`` for a
malformed or unsupported URI, ``ArtifactNotFoundError`` (also FileNotFoundError) for a
missing object, bucket or file, ``AccessDeniedError`` for refused or missing credentials,
``UnreachableError`` / ``UnavailableError`` (retryable) when the store cannot be reached or
fails for now, ``NotInstalledError`` without boto3, ``InternalError`` for anything else.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import tempfile
import threading
from pathlib import Path
from urllib.parse import unquote, urlsplit

from flow.configuration import ConfigError
from flow.errors import (
    AccessDeniedError,
    FlowDefinitionError,
    FlowError,
    FlowTypeError,
    FlowValueError,
    InternalError,
    NotInstalledError,
    UnavailableError,
    UnreachableError,
)

ENDPOINT_ENV = ("FLOWSERVE_S3_ENDPOINT", "AWS_ENDPOINT_URL")
CACHE_ENV = "FLOWSERVE_ARTIFACT_CACHE"
_BUCKET = re.compile(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")
_CHUNK = 1 << 20


class ArtifactNotFoundError(FlowDefinitionError, FileNotFoundError):
    """The object, its bucket, or the local file does not exist (``uri`` names it): fix the
    URI or upload the artifact. Also a ``FileNotFoundError`` (so an ``OSError``): ``fetch``
    stands in for ``open`` on a path, and callers catch a missing file as they would there."""

    uri: str | None = None

    def __str__(self) -> str:  # FileNotFoundError would format (errno, strerror)
        return str(self.args[0])


# -- public -------------------------------------------------------------------------------


def fetch(uri, cache_dir=None, *, s3_client=None) -> Path:
    """A local path holding the artifact at ``uri`` (``s3://``, ``file://`` or a plain path).

    ``cache_dir``: where S3 objects are cached (default: ``FLOWSERVE_ARTIFACT_CACHE`` or the
    user cache). ``s3_client``: a boto3 S3 client to use instead of the default one (which
    honours ``FLOWSERVE_S3_ENDPOINT``/``AWS_ENDPOINT_URL``).

        model = torch.load(fetch("s3://models/small.pt"), weights_only=True)
    """
    if isinstance(uri, os.PathLike):
        uri = os.fspath(uri)
    if not isinstance(uri, str):
        raise FlowTypeError(f"artifact URI must be a str or a path, got {type(uri).__name__} {uri!r:.80}")
    if not uri:
        raise FlowValueError("artifact URI is empty", uri=uri)
    scheme = urlsplit(uri).scheme.lower() if "://" in uri else ""
    if scheme == "s3":
        bucket, key = parse_s3_uri(uri)
        return _fetch_s3(uri, bucket, key, cache_path(cache_dir), s3_client)
    if scheme == "file":
        return _local(_file_uri_path(uri), uri)
    if scheme:
        raise FlowValueError(
            f"unsupported artifact URI {uri!r}: expected s3://bucket/key, file:///path or a plain path", uri=uri
        )
    return _local(Path(uri).expanduser(), uri)


def parse_s3_uri(uri: str) -> tuple[str, str]:
    """``"s3://bucket/a/b.pt"`` -> ``("bucket", "a/b.pt")``; a bad URI raises ``FlowValueError``."""
    parts = urlsplit(uri)
    if parts.scheme.lower() != "s3":
        raise FlowValueError(f"not an s3:// URI: {uri!r}", uri=uri)
    bucket, key = parts.netloc, parts.path.lstrip("/")
    if parts.query or parts.fragment:  # "?" and "#" are not part of a key here: refuse, not guess
        raise FlowValueError(f"bad S3 URI {uri!r}: no query or fragment allowed (quote '?' and '#' in keys)", uri=uri)
    if not _BUCKET.match(bucket) or ".." in bucket:
        raise FlowValueError(
            f"bad S3 URI {uri!r}: bucket {bucket!r} is not a valid bucket name "
            f"(3-63 lowercase letters, digits, '.', '-')",
            uri=uri,
        )
    if not key or key.endswith("/"):
        raise FlowValueError(f"bad S3 URI {uri!r}: expected s3://bucket/key with a key naming an object", uri=uri)
    return bucket, unquote(key)


def cache_path(cache_dir=None) -> Path:
    """The artifact cache directory ``fetch`` uses (created on first use)."""
    if cache_dir is not None:
        return Path(cache_dir).expanduser()
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV]).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "flowserve" / "artifacts"


def s3_endpoint() -> str | None:
    """The S3 endpoint URL from ``FLOWSERVE_S3_ENDPOINT`` or ``AWS_ENDPOINT_URL`` (None: AWS)."""
    for name in ENDPOINT_ENV:
        if os.environ.get(name):
            return os.environ[name]
    return None


# -- local --------------------------------------------------------------------------------


def _file_uri_path(uri: str) -> Path:
    parts = urlsplit(uri)
    if parts.netloc not in ("", "localhost"):
        raise FlowValueError(
            f"bad file URI {uri!r}: host {parts.netloc!r} is not local (use file:///absolute/path)", uri=uri
        )
    if not parts.path:
        raise FlowValueError(f"bad file URI {uri!r}: no path", uri=uri)
    return Path(unquote(parts.path))


def _local(path: Path, uri: str) -> Path:
    if not path.exists():
        raise ArtifactNotFoundError(f"artifact {uri!r}: no such file {str(path)!r}", uri=uri)
    return path


# -- S3 -----------------------------------------------------------------------------------

_clients: dict = {}
_clients_lock = threading.Lock()
_thread_locks: dict = {}


def _default_client():
    """One boto3 S3 client per endpoint (clients are thread-safe; building one costs ~50 ms)."""
    endpoint = s3_endpoint()
    with _clients_lock:
        client = _clients.get(endpoint)
        if client is None:
            try:
                import boto3
                from botocore.config import Config
            except ImportError as e:
                raise NotInstalledError(f"s3:// artifacts need boto3: pip install 'flowserve[k8s]' ({e})") from e
            cfg = Config(retries={"max_attempts": 3, "mode": "standard"}, connect_timeout=5, read_timeout=60)
            client = boto3.client("s3", endpoint_url=endpoint, config=cfg)
            _clients[endpoint] = client
        return client


def _classify(e: Exception, uri: str, what: str) -> FlowError:
    """Turn a botocore error into the error of the tree a caller can act on."""
    try:
        from botocore.exceptions import BotoCoreError, ClientError, NoCredentialsError
    except ImportError:  # pragma: no cover - boto3 was importable a moment ago
        return InternalError(f"{what} {uri!r} failed: {type(e).__name__}: {e}", uri=uri)
    if isinstance(e, ClientError):
        err = e.response.get("Error", {})
        code = str(err.get("Code", ""))
        status = e.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0)
        if code in ("404", "NoSuchKey", "NoSuchBucket", "NotFound") or status == 404:
            return ArtifactNotFoundError(
                f"artifact {uri!r} not found: no such object or bucket ({code or status})", uri=uri
            )
        if code in ("403", "401", "AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch") or status in (
            401,
            403,
        ):
            return AccessDeniedError(
                f"{what} {uri!r}: access denied ({code or status}); check the credentials and the bucket policy",
                uri=uri,
            )
        if code == "PreconditionFailed" or status == 412:  # GET IfMatch: a new version since the HEAD
            return UnavailableError(f"artifact {uri!r} changed while it was being fetched; fetch it again", uri=uri)
        if status >= 500 or code in ("SlowDown", "ServiceUnavailable", "InternalError", "RequestTimeout"):
            return UnavailableError(f"{what} {uri!r}: the store failed ({code or status})", uri=uri)
        return InternalError(f"{what} {uri!r} failed: {code or status}: {err.get('Message', e)}", uri=uri)
    if isinstance(e, NoCredentialsError):
        return AccessDeniedError(f"{what} {uri!r}: no AWS credentials found (environment, profile or role)", uri=uri)
    if isinstance(e, BotoCoreError):
        endpoint = s3_endpoint() or "AWS"
        return UnreachableError(f"{what} {uri!r}: cannot reach the store at {endpoint}: {e}", uri=uri)
    return InternalError(f"{what} {uri!r} failed: {type(e).__name__}: {e}", uri=uri)


def _cache_file(cache: Path, uri: str, etag: str, key: str) -> Path:
    digest = hashlib.sha256(f"{uri}\0{etag}".encode()).hexdigest()
    base = re.sub(r"[^A-Za-z0-9._-]", "_", key.rsplit("/", 1)[-1])[-80:] or "object"
    return cache / digest[:2] / f"{digest[:32]}-{base}"


@contextlib.contextmanager
def _object_lock(target: Path):
    """Serialize fetches of one cached file: a thread lock plus an flock for other processes."""
    with _clients_lock:
        tlock = _thread_locks.setdefault(str(target), threading.Lock())
    with tlock:
        try:
            import fcntl
        except ImportError:  # pragma: no cover - not POSIX: rename atomicity still holds
            yield
            return
        fd = os.open(target.with_name(target.name + ".lock"), os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)


def _fetch_s3(uri: str, bucket: str, key: str, cache: Path, client) -> Path:
    client = client if client is not None else _default_client()
    try:
        head = client.head_object(Bucket=bucket, Key=key)
    except Exception as e:  # botocore's own tree, or an injected client's: _classify sorts it
        raise _classify(e, uri, "HEAD") from e
    etag = str(head.get("ETag", "")).strip('"')
    if not etag:  # every S3 implementation sends one; without it nothing proves a copy is current
        raise InternalError(f"artifact {uri!r}: the store sent no ETag", uri=uri)
    target = _cache_file(cache, uri, etag, key)
    if target.is_file():
        return target
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ConfigError(  # cache_dir / FLOWSERVE_ARTIFACT_CACHE names a place it cannot write
            f"artifact {uri!r}: cannot create the cache directory {str(target.parent)!r}: {e.strerror or e}", uri=uri
        ) from e
    with _object_lock(target):
        if target.is_file():  # another thread or process finished it while we waited
            return target
        _download(client, uri, bucket, key, etag, int(head.get("ContentLength", -1)), target)
    return target


def _download(client, uri: str, bucket: str, key: str, etag: str, size: int, target: Path) -> None:
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".part")
    try:
        with os.fdopen(fd, "wb") as f:
            try:
                # IfMatch: the bytes must be the version the cache key names, not a newer one
                resp = client.get_object(Bucket=bucket, Key=key, IfMatch=f'"{etag}"')
                body = resp["Body"]
                for chunk in iter(lambda: body.read(_CHUNK), b""):
                    f.write(chunk)
            except Exception as e:  # botocore's own tree, or an injected client's: _classify sorts it
                raise _classify(e, uri, "GET") from e
            f.flush()
            os.fsync(f.fileno())
            written = f.tell()
        if size >= 0 and written != size:
            raise UnreachableError(f"artifact {uri!r}: got {written} bytes, expected {size} (connection cut?)", uri=uri)
        os.chmod(tmp, 0o644)
        os.replace(tmp, target)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)


__all__ = [
    "ArtifactNotFoundError",
    "cache_path",
    "fetch",
    "parse_s3_uri",
    "s3_endpoint",
]
