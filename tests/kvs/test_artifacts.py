"""kvs.artifacts.fetch against a real S3-compatible server (moto's server mode on loopback).

Nothing of boto3 is mocked: the requests go over HTTP to moto's server, started on a free
127.0.0.1 port for this module. Downloads are counted with botocore's own event hooks.
"""

from __future__ import annotations

import logging
import os
import pickle
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from flow.errors import (
    AccessDeniedError,
    FlowDefinitionError,
    FlowError,
    FlowTypeError,
    FlowValueError,
    InternalError,
    RetryableError,
    UnavailableError,
    UnreachableError,
)
from kvs.artifacts import (
    ArtifactNotFoundError,
    cache_path,
    fetch,
    parse_s3_uri,
    s3_endpoint,
)

boto3 = pytest.importorskip("boto3")
moto_server = pytest.importorskip("moto.server")
from botocore.config import Config  # noqa: E402
from botocore.exceptions import ClientError  # noqa: E402

BUCKET = "models"
AWS_ENV = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
    "AWS_CONFIG_FILE": os.devnull,
    "AWS_SHARED_CREDENTIALS_FILE": os.devnull,
    "AWS_EC2_METADATA_DISABLED": "true",
}


@pytest.fixture(scope="module")
def endpoint():
    """moto's S3 server on a free loopback port; FLOWSERVE_S3_ENDPOINT points at it."""
    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # no access log per request
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    url = f"http://{host}:{port}"
    with pytest.MonkeyPatch.context() as mp:
        for k, v in AWS_ENV.items():
            mp.setenv(k, v)
        mp.delenv("AWS_ENDPOINT_URL", raising=False)
        mp.delenv("AWS_PROFILE", raising=False)
        mp.setenv("FLOWSERVE_S3_ENDPOINT", url)
        s3 = boto3.client("s3", endpoint_url=url)
        s3.create_bucket(Bucket=BUCKET)
        yield url
    server.stop()


@pytest.fixture
def s3(endpoint):
    """A plain client to put objects with (the store's other users)."""
    return boto3.client("s3", endpoint_url=endpoint)


def counting_client(endpoint, **config):
    """A client whose GetObject calls are counted through botocore's event system."""
    client = boto3.client("s3", endpoint_url=endpoint, config=Config(**config) if config else None)
    client.gets = 0

    def count(**_):
        client.gets += 1

    client.meta.events.register("before-call.s3.GetObject", count)
    return client


def put(s3, key: str, data: bytes) -> str:
    s3.put_object(Bucket=BUCKET, Key=key, Body=data)
    return f"s3://{BUCKET}/{key}"


def leftovers(cache: Path) -> list:
    return [p for p in cache.rglob("*") if p.name.endswith(".part")]


def test_fetch_downloads_once_and_reuses_the_unchanged_object(endpoint, s3, tmp_path):
    data = os.urandom(3 << 20) + b"end"  # several read chunks
    uri = put(s3, "resnet/v1.pt", data)
    client = counting_client(endpoint)
    p1 = fetch(uri, tmp_path, s3_client=client)
    assert p1.read_bytes() == data and p1.is_relative_to(tmp_path) and p1.name.endswith("-v1.pt")
    assert client.gets == 1
    mtime = p1.stat().st_mtime_ns
    p2 = fetch(uri, tmp_path, s3_client=client)
    assert p2 == p1 and client.gets == 1  # no second download
    assert p2.stat().st_mtime_ns == mtime
    assert oct(p1.stat().st_mode & 0o777) == oct(0o644)
    assert leftovers(tmp_path) == []


def test_a_changed_object_is_downloaded_again(endpoint, s3, tmp_path):
    uri = put(s3, "model.bin", b"version one")
    client = counting_client(endpoint)
    old = fetch(uri, tmp_path, s3_client=client)
    put(s3, "model.bin", b"version two")
    new = fetch(uri, tmp_path, s3_client=client)
    assert new != old and new.read_bytes() == b"version two" and client.gets == 2
    assert old.read_bytes() == b"version one"  # a reader of the old version is not disturbed


def test_the_cache_key_includes_the_uri(endpoint, s3, tmp_path):
    s3.create_bucket(Bucket="models-b")
    a = put(s3, "same/key.pt", b"same bytes")
    s3.put_object(Bucket="models-b", Key="same/key.pt", Body=b"same bytes")
    pa = fetch(a, tmp_path)
    pb = fetch("s3://models-b/same/key.pt", tmp_path)
    assert pa != pb and pa.read_bytes() == pb.read_bytes()


def test_concurrent_threads_share_one_download(endpoint, s3, tmp_path):
    data = os.urandom(2 << 20)
    uri = put(s3, "big.pt", data)
    client = counting_client(endpoint)
    start = threading.Barrier(8)
    paths, errors = [], []

    def worker():
        start.wait()
        try:
            paths.append(fetch(uri, tmp_path, s3_client=client))
        except Exception as e:  # pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not errors
    assert len(set(paths)) == 1 and len(paths) == 8
    assert paths[0].read_bytes() == data
    assert client.gets == 1
    assert leftovers(tmp_path) == []


def test_concurrent_processes_share_one_download(endpoint, s3, tmp_path):
    data = os.urandom(1 << 20)
    uri = put(s3, "shared.pt", data)
    code = (
        "import sys, kvs.artifacts as a\n"
        "c = a._default_client(); n = [0]\n"
        "c.meta.events.register('before-call.s3.GetObject', lambda **k: n.__setitem__(0, n[0] + 1))\n"
        "print(a.fetch(sys.argv[1], sys.argv[2]), n[0])\n"
    )
    env = dict(os.environ)
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", code, uri, str(tmp_path)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        for _ in range(3)
    ]
    outs = [p.communicate(timeout=60) for p in procs]
    assert all(p.returncode == 0 for p in procs), [o[1][-2000:] for o in outs]
    results = [o[0].split() for o in outs]
    assert len({r[0] for r in results}) == 1
    assert sum(int(r[1]) for r in results) == 1  # one process downloaded, the others found its file
    assert Path(results[0][0]).read_bytes() == data
    assert leftovers(tmp_path) == []


def test_an_object_replaced_during_the_download_is_refused(endpoint, s3, tmp_path):
    uri = put(s3, "racy.pt", b"first")
    client = counting_client(endpoint)

    def replace_first(**_):  # another writer lands between our HEAD and our GET
        client.meta.events.unregister("before-call.s3.GetObject", replace_first)
        put(s3, "racy.pt", b"second")

    client.meta.events.register("before-call.s3.GetObject", replace_first)
    with pytest.raises(UnavailableError, match="changed while it was being fetched"):
        fetch(uri, tmp_path, s3_client=client)
    assert leftovers(tmp_path) == []
    assert [p for p in tmp_path.rglob("*racy*") if not p.name.endswith(".lock")] == []  # nothing cached
    assert fetch(uri, tmp_path, s3_client=client).read_bytes() == b"second"  # retrying works


def test_missing_objects_and_buckets(endpoint, tmp_path):
    with pytest.raises(ArtifactNotFoundError, match=r"artifact 's3://models/nope.pt' not found") as info:
        fetch(f"s3://{BUCKET}/nope.pt", tmp_path)
    e = info.value
    assert isinstance(e, FileNotFoundError) and isinstance(e, FlowDefinitionError) and isinstance(e, FlowError)
    assert e.uri == "s3://models/nope.pt"
    with pytest.raises(ArtifactNotFoundError, match="s3://no-such-bucket/x"):
        fetch("s3://no-such-bucket/x", tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_unreachable_store_is_retryable(endpoint, tmp_path):
    dead = boto3.client(
        "s3", endpoint_url="http://127.0.0.1:9", config=Config(retries={"max_attempts": 1}, connect_timeout=1)
    )
    with pytest.raises(UnreachableError, match=r"HEAD 's3://models/x': cannot reach the store") as info:
        fetch(f"s3://{BUCKET}/x", tmp_path, s3_client=dead)
    assert isinstance(info.value, RetryableError)


def test_endpoint_comes_from_flowserve_or_aws_variables(endpoint, s3, tmp_path, monkeypatch):
    uri = put(s3, "via-aws-var.pt", b"ok")
    monkeypatch.delenv("FLOWSERVE_S3_ENDPOINT")
    monkeypatch.setenv("AWS_ENDPOINT_URL", endpoint)
    assert s3_endpoint() == endpoint
    assert fetch(uri, tmp_path).read_bytes() == b"ok"  # the default client, built for this endpoint
    monkeypatch.setenv("FLOWSERVE_S3_ENDPOINT", "http://minio.example:9000")
    assert s3_endpoint() == "http://minio.example:9000"  # FlowServe's own variable wins
    monkeypatch.delenv("FLOWSERVE_S3_ENDPOINT")
    monkeypatch.delenv("AWS_ENDPOINT_URL")
    assert s3_endpoint() is None  # AWS itself


def test_cache_directory_defaults(monkeypatch, tmp_path):
    monkeypatch.setenv("FLOWSERVE_ARTIFACT_CACHE", str(tmp_path / "c"))
    assert cache_path() == tmp_path / "c"
    assert cache_path(tmp_path / "explicit") == tmp_path / "explicit"
    monkeypatch.delenv("FLOWSERVE_ARTIFACT_CACHE")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_path() == tmp_path / "xdg" / "flowserve" / "artifacts"


def test_env_cache_directory_is_used_by_fetch(endpoint, s3, tmp_path, monkeypatch):
    uri = put(s3, "env-cache.pt", b"cached here")
    monkeypatch.setenv("FLOWSERVE_ARTIFACT_CACHE", str(tmp_path / "cache"))
    assert fetch(uri).is_relative_to(tmp_path / "cache")


# -- local paths --------------------------------------------------------------------------


def test_local_paths_and_file_uris_pass_through(tmp_path):
    f = tmp_path / "my model.pt"
    f.write_bytes(b"weights")
    assert fetch(str(f)) == f
    assert fetch(f) == f
    assert fetch(f.as_uri()) == f  # file:///.../my%20model.pt
    assert fetch(f"file://localhost{f}") == f
    with pytest.raises(ArtifactNotFoundError, match=r"artifact '.*missing.pt': no such file"):
        fetch(str(tmp_path / "missing.pt"))
    with pytest.raises(ArtifactNotFoundError):
        fetch((tmp_path / "missing.pt").as_uri())


@pytest.mark.parametrize(
    "uri,match",
    [
        ("", "artifact URI is empty"),
        ("s3://", r"bad S3 URI 's3://'"),
        ("s3://models", r"expected s3://bucket/key"),
        ("s3://models/", r"expected s3://bucket/key"),
        ("s3://models/dir/", r"expected s3://bucket/key"),
        ("s3://Bad_Bucket/k", r"bucket 'Bad_Bucket' is not a valid bucket name"),
        ("s3://models/k?versionId=3", r"no query or fragment"),
        ("gs://models/k", r"unsupported artifact URI 'gs://models/k'"),
        ("https://example.com/model.pt", r"unsupported artifact URI 'https://example.com/model.pt'"),
        ("file://otherhost/model.pt", r"host 'otherhost' is not local"),
    ],
)
def test_bad_uris_are_value_errors_quoting_the_uri(uri, match):
    with pytest.raises(FlowValueError, match=match) as info:
        fetch(uri)
    assert isinstance(info.value, ValueError) and info.value.uri == uri


def test_wrong_type():
    with pytest.raises(FlowTypeError, match="artifact URI must be a str or a path, got int 3"):
        fetch(3)


def test_parse_s3_uri():
    assert parse_s3_uri("s3://models/a/b%20c.pt") == ("models", "a/b c.pt")
    assert parse_s3_uri("S3://models/k") == ("models", "k")


def test_errors_pickle_with_their_uri():
    e = pickle.loads(pickle.dumps(ArtifactNotFoundError("gone", uri="s3://m/k")))
    assert type(e) is ArtifactNotFoundError and e.uri == "s3://m/k" and str(e) == "gone"


def test_store_answers_are_classified():
    from kvs.artifacts import _classify

    def err(code, status):
        return ClientError(
            {"Error": {"Code": code, "Message": "m"}, "ResponseMetadata": {"HTTPStatusCode": status}}, "GetObject"
        )

    assert type(_classify(err("AccessDenied", 403), "s3://m/k", "GET")) is AccessDeniedError
    assert type(_classify(err("SlowDown", 503), "s3://m/k", "GET")) is UnavailableError
    assert type(_classify(err("NoSuchKey", 404), "s3://m/k", "GET")) is ArtifactNotFoundError
    assert type(_classify(err("InvalidRange", 416), "s3://m/k", "GET")) is InternalError
