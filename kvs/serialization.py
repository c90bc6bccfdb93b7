"""The KVS value codec: a small tagged header, then the payload.

Every stored value starts with ``MAGIC`` (0xF5, never the first byte of UTF-8 text,
so raw strings written by other tools are refused rather than misread) and a one-byte
tag:

    B  bytes / bytearray / memoryview    raw payload, decoded as ``bytes``
    S  str                               UTF-8
    J  None, bool, int, float, list, dict (str keys)   JSON, checked strictly so it
                                         round-trips exactly (no tuples, no int keys)
    N  numpy array or numpy scalar       small header (flags, ndim, dtype, shape),
                                         padding to 16 bytes, then the raw buffer
    A  pyarrow.Table                     Arrow IPC stream
    T  flow.table.Table                  Arrow IPC stream of ``table.to_arrow()``
    R  KVSRef                            the UTF-8 key
    P  trusted pickle (cloudpickle)      ONLY via ``dumps_trusted``/``loads_trusted``
                                         or ``decode(..., trusted=True)``
    K  signed trusted pickle, bound to   ``sign_trusted``: the key it is stored under
       the key it is stored under        (u16 LE length, UTF-8), an HMAC-SHA256 over
                                         that key and the "P" value, then the "P" value
    Q  signed pickle of the old format   (MAC over the pickle only) refused: re-deploy

Why not pickle for everything: values come back from the network, and unpickling
network data runs arbitrary code. Pickle is kept for one trusted use, user functions
registered by a deploy, behind its own tag and an explicit ``trusted=True``.

Why a signature names its key: plans are stored under ``flowserve:plan:{flow}:{version}``.
A MAC over the pickle alone would let anyone with the store's password copy one flow's
signed plan over another's key (or an old version over the current one) and have it
served; signing the key too makes a value valid only where the cluster put it.

Arrays are decoded zero-copy with ``np.frombuffer`` (so they come back **read-only**;
``.copy()`` to modify) and encoded with exactly one copy (``b"".join``).

    >>> decode(encode({"a": [1, 2.5, None]}))
    {'a': [1, 2.5, None]}
"""

from __future__ import annotations

import ast
import json
import math
import struct
from typing import Any

import numpy as np

from kvs.errors import SerializationError
from kvs.ref import KVSRef

MAGIC = 0xF5
_M = bytes([MAGIC])

TAG_BYTES = ord("B")
TAG_STR = ord("S")
TAG_JSON = ord("J")
TAG_NUMPY = ord("N")
TAG_ARROW = ord("A")
TAG_TABLE = ord("T")
TAG_REF = ord("R")
TAG_PICKLE = ord("P")
TAG_SIGNED = ord("Q")  # old format, refused: MAGIC, "Q", HMAC-SHA256 of the "P" value alone, the "P" value
TAG_BOUND = ord("K")  # MAGIC, "K", u16 LE key length, the key (UTF-8), 32-byte MAC, the "P" value

# what a bound signature covers, before the key and the pickle: a fixed label (so the MAC
# of a plan can never be mistaken for one the cluster key makes for anything else), then
# the key's length (so key and pickle cannot be split differently into the same bytes)
_BOUND_LABEL = b"flowserve-signed-pickle\0v2\0"
_BOUND_KEY_LEN = struct.Struct("<H")
_MAC_LEN = 32

_H_BYTES = _M + b"B"
_H_STR = _M + b"S"
_H_JSON = _M + b"J"
_H_ARROW = _M + b"A"
_H_TABLE = _M + b"T"
_H_REF = _M + b"R"
_H_PICKLE = _M + b"P"

# numpy header: magic, tag, flags, ndim, dtype length (u16 LE); then dtype text and the
# shape as ndim u64 LE; then zero padding so the array data starts 16-byte aligned
# (bytes objects hold their data 16-byte aligned, so frombuffer views are aligned).
_NP_FIXED = struct.Struct("<BBBBH")
_NP_ALIGN = 16
_F_FORTRAN = 1  # data is in Fortran order (stored as is to avoid a copy)
_F_SCALAR = 2  # value was a numpy scalar (np.float32(1.0)), decode with arr[()]
_F_DESCR = 4  # dtype text is repr() of a structured descr, not dtype.str

_JSON_MAX_DEPTH = 100
_json_encoder = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), check_circular=False)
_json_decoder = json.JSONDecoder()


# -- public API ------------------------------------------------------------------------


def encode(value: Any) -> bytes:
    """Encode a supported value to bytes for the KVS; refuses anything else.

    Raises ``SerializationError`` (a ``TypeError``) naming the type for arbitrary
    objects and object-dtype arrays. Use ``dumps_trusted`` for trusted objects.

        >>> encode("hi")
        b'\\xf5Shi'
    """
    cls = type(value)
    if cls is bytes:
        return _H_BYTES + value
    if cls is str:
        return _H_STR + value.encode("utf-8")
    if cls is np.ndarray:
        return _encode_array(value, 0)
    if value is None or cls in (bool, int, float, list, dict):
        return _encode_json(value)
    if cls is KVSRef:
        return _H_REF + value.key.encode("utf-8")
    # subclasses and less common types: slower isinstance checks
    if isinstance(value, (bytes, bytearray, memoryview)):
        return b"".join((_H_BYTES, memoryview(value).cast("B")))
    if isinstance(value, str):
        return _H_STR + str(value).encode("utf-8")
    if isinstance(value, np.ndarray):
        return _encode_array(np.asarray(value), 0)
    if isinstance(value, np.generic):
        return _encode_array(np.asarray(value), _F_SCALAR)
    if isinstance(value, (bool, int, float, list, dict)):
        return _encode_json(value)
    if isinstance(value, KVSRef):
        return _H_REF + value.key.encode("utf-8")
    pa = _pyarrow()
    if pa is not None and isinstance(value, pa.Table):
        return _encode_arrow(_H_ARROW, value)
    table_cls = _table_class()
    if table_cls is not None and isinstance(value, table_cls):
        return _encode_arrow(_H_TABLE, value.to_arrow())
    raise SerializationError(
        f"cannot encode a value of type {_typename(value)} for the KVS: supported are "
        "bytes, str, None, bool, int, float, JSON-able list/dict, numpy arrays "
        "(not object dtype), pyarrow.Table, flow Table and KVSRef; use "
        "dumps_trusted() only for trusted internal objects"
    )


def decode(
    data: bytes | bytearray | memoryview,
    *,
    trusted: bool = False,
    signing_key: bytes | None = None,
    key: str | None = None,
) -> Any:
    """Decode bytes written by ``encode`` (or ``dumps_trusted`` when ``trusted=True``).

    Arrays are zero-copy, read-only views of ``data``. A pickle payload is refused
    unless ``trusted=True``: only pass that for data this deployment wrote itself. With a
    ``signing_key`` (the cluster's), only signed pickles whose MAC checks are unpickled
    (``sign_trusted``): anyone who can write to the store cannot make a process run code.
    A signed pickle is checked against ``key``, the key it was read from: one signed for
    another key (another flow's plan, or an older version's) is refused.

        >>> decode(encode([1, "a"]))
        [1, 'a']
    """
    view = memoryview(data)
    if len(view) < 2 or view[0] != MAGIC:
        raise SerializationError(
            f"not a FlowServe-encoded value (starts with {bytes(view[:8])!r}, "
            f"{len(view)} bytes); was it written by another client?"
        )
    tag = view[1]
    if tag == TAG_NUMPY:
        return _decode_array(data, view)
    if tag == TAG_BYTES:
        return bytes(view[2:])
    if tag == TAG_STR:
        return str(view[2:], "utf-8")
    if tag == TAG_JSON:
        try:
            return _json_decoder.decode(str(view[2:], "utf-8"))
        except ValueError as exc:
            raise SerializationError(f"corrupt JSON payload: {exc}") from None
    if tag == TAG_REF:
        return KVSRef(str(view[2:], "utf-8"))
    if tag == TAG_ARROW:
        return _decode_arrow(view)
    if tag == TAG_TABLE:
        table_cls = _table_class()
        if table_cls is None:
            raise SerializationError("value is a flow Table but flow.table is not importable")
        return table_cls.from_arrow(_decode_arrow(view), qid="qid")
    if tag == TAG_BOUND:
        if not trusted:
            raise SerializationError(
                "refusing to unpickle a value read from the KVS (a signed pickle): only with trusted=True"
            )
        return _unpickle(_verified(view, signing_key, key))
    if tag == TAG_SIGNED:
        if not trusted:
            raise SerializationError(
                "refusing to unpickle a value read from the KVS (a signed pickle): only with trusted=True"
            )
        if signing_key is None:
            raise SerializationError("a signed pickle, but no cluster key to check it with (set FLOWSERVE_CLUSTER_KEY)")
        # its MAC does not cover the key it is stored under, so it cannot tell a plan that
        # belongs here from one copied from another flow or version: never unpickled
        raise SerializationError(
            "refusing a signed pickle of the old format, whose signature is not bound to the "
            "key it is stored under (written by an older FlowServe): re-deploy the flow to "
            "store its plan again"
        )
    if tag == TAG_PICKLE and trusted and signing_key is not None:
        raise SerializationError(
            "refusing an unsigned pickle: this cluster signs what it unpickles "
            "(written by something without the cluster key, or tampered with)"
        )
    if tag == TAG_PICKLE:
        if not trusted:
            raise SerializationError(
                "refusing to unpickle a value read from the KVS: pickle payloads are "
                "only for trusted internal data; use decode(data, trusted=True) or "
                "loads_trusted() for values this deployment wrote with dumps_trusted()"
            )
        return _unpickle(view)
    raise SerializationError(f"unknown KVS value tag {chr(tag)!r} (byte {tag})")


def dumps_trusted(obj: Any) -> bytes:
    """Pickle (cloudpickle) a trusted internal object, e.g. a user function a deploy
    registers; the result is a KVS value that only ``loads_trusted`` or
    ``decode(..., trusted=True)`` will read.

        >>> loads_trusted(dumps_trusted(len))("abc")
        3
    """
    import cloudpickle  # deferred: only deploys need it

    try:
        return _H_PICKLE + cloudpickle.dumps(obj)
    except Exception as exc:  # cloudpickle raises many types (PicklingError, TypeError...)
        raise SerializationError(f"cannot pickle {_typename(obj)}: {exc}") from exc


def sign_trusted(blob: bytes, signing_key: bytes, key: str) -> bytes:
    """A ``dumps_trusted`` value signed with the cluster key (HMAC-SHA256) for ``key``, the
    key it will be stored under: ``decode`` accepts it only when read from that key.

        >>> k = bytes(range(16))
        >>> decode(sign_trusted(dumps_trusted(1), k, "a"), trusted=True, signing_key=k, key="a")
        1
    """
    if len(blob) < 2 or blob[0] != MAGIC or blob[1] != TAG_PICKLE:
        raise SerializationError("only values written by dumps_trusted() are signed")
    keyb = _key_bytes(key)
    return b"".join(
        (_M, bytes([TAG_BOUND]), _BOUND_KEY_LEN.pack(len(keyb)), keyb, _bound_mac(signing_key, keyb, blob), blob)
    )


def _key_bytes(key: str) -> bytes:
    keyb = key.encode("utf-8", "surrogateescape")
    if len(keyb) > 0xFFFF:
        raise SerializationError(f"cannot sign a value for a key of {len(keyb)} bytes (at most 65535)")
    return keyb


def _bound_mac(signing_key: bytes, keyb: bytes, blob) -> bytes:
    import hmac

    mac = hmac.new(signing_key, _BOUND_LABEL, "sha256")
    mac.update(_BOUND_KEY_LEN.pack(len(keyb)))
    mac.update(keyb)
    mac.update(blob)
    return mac.digest()


def _verified(view: memoryview, signing_key: bytes | None, key: str | None) -> memoryview:
    """The inner pickle value of a key-bound signed one, once its MAC checks for ``key``."""
    import hmac

    if signing_key is None:
        raise SerializationError("a signed pickle, but no cluster key to check it with (set FLOWSERVE_CLUSTER_KEY)")
    if key is None:
        raise SerializationError(
            "a signed pickle is checked against the key it was read from: pass key= (KVS.get(key, trusted=True) does)"
        )
    start = 2 + _BOUND_KEY_LEN.size
    if len(view) < start:
        raise SerializationError("truncated signed pickle")
    (n,) = _BOUND_KEY_LEN.unpack_from(view, 2)
    mac_at = start + n
    if len(view) < mac_at + _MAC_LEN + 2:
        raise SerializationError("truncated signed pickle")
    signed_for = bytes(view[start:mac_at])
    keyb = _key_bytes(key)
    if signed_for != keyb:
        # the name it carries only explains the refusal; the MAC below is what decides
        shown = signed_for[:200].decode("utf-8", "replace")
        raise SerializationError(
            "refusing a signed pickle whose signature does not match this key: a plan copied "
            f"from another flow or version? (it says it was signed for key {shown!r})"
        )
    mac, inner = bytes(view[mac_at : mac_at + _MAC_LEN]), view[mac_at + _MAC_LEN :]
    if not hmac.compare_digest(mac, _bound_mac(signing_key, keyb, inner)):
        raise SerializationError(
            "refusing a signed pickle whose signature does not match (tampered with, or "
            "signed with another cluster's key)"
        )
    if inner[0] != MAGIC or inner[1] != TAG_PICKLE:
        raise SerializationError("a signed value that is not a trusted pickle")
    return inner


def loads_trusted(blob: bytes | bytearray | memoryview) -> Any:
    """Unpickle a value written by ``dumps_trusted``. Never call it on data that
    anyone outside this deployment could have written."""
    view = memoryview(blob)
    if len(view) < 2 or view[0] != MAGIC or view[1] != TAG_PICKLE:
        raise SerializationError("not a value written by dumps_trusted()")
    return _unpickle(view)


def is_trusted_payload(data: bytes | bytearray | memoryview) -> bool:
    """True if ``data`` is a pickle written by ``dumps_trusted``, signed or not (cheap header check)."""
    return len(data) >= 2 and data[0] == MAGIC and data[1] in (TAG_PICKLE, TAG_BOUND, TAG_SIGNED)


def is_mutable_payload(data: bytes | bytearray | memoryview) -> bool:
    """True if ``decode`` returns a fresh mutable object each time (JSON containers,
    pickles), which a cache must not hand out shared."""
    if len(data) < 3 or data[0] != MAGIC:
        return False
    if data[1] == TAG_PICKLE:
        return True
    return data[1] == TAG_JSON and data[2] in (ord("["), ord("{"))


# -- numpy -----------------------------------------------------------------------------


def _encode_array(arr: np.ndarray, flags: int) -> bytes:
    dtype = arr.dtype
    if dtype.hasobject:
        raise SerializationError(
            f"cannot encode a numpy array of dtype {dtype} (object/pointer data): "
            "only arrays of plain numeric, bool, datetime, bytes/unicode or structured "
            "dtypes are stored; convert it first"
        )
    if dtype.fields is not None:
        dtext = repr(np.lib.format.dtype_to_descr(dtype)).encode("ascii")
        flags |= _F_DESCR
    else:
        dtext = dtype.str.encode("ascii")
    if arr.ndim > 1 and arr.flags.f_contiguous and not arr.flags.c_contiguous:
        flags |= _F_FORTRAN
        flat = arr.T  # C-contiguous view of the same memory: no copy
    else:
        flat = np.ascontiguousarray(arr)  # copies only non-contiguous input
    head = _NP_FIXED.pack(MAGIC, TAG_NUMPY, flags, arr.ndim, len(dtext)) + dtext
    head += struct.pack(f"<{arr.ndim}Q", *arr.shape)
    head += b"\0" * (-len(head) % _NP_ALIGN)
    if flat.size == 0 or dtype.itemsize == 0:
        return head
    # a uint8 view exposes every dtype (datetime64 too) through the buffer protocol
    return b"".join((head, flat.reshape(-1).view(np.uint8)))


def _decode_array(data, view: memoryview):
    if len(view) < _NP_FIXED.size:
        raise SerializationError("truncated numpy header")
    _, _, flags, ndim, dlen = _NP_FIXED.unpack_from(view)
    pos = _NP_FIXED.size
    end = pos + dlen + 8 * ndim
    if len(view) < end:
        raise SerializationError("truncated numpy header")
    dtext = str(view[pos : pos + dlen], "ascii")
    shape = struct.unpack_from(f"<{ndim}Q", view, pos + dlen)
    try:
        if flags & _F_DESCR:
            # literal_eval only builds literals: safe on data from the network
            dtype = np.lib.format.descr_to_dtype(ast.literal_eval(dtext))
        else:
            dtype = np.dtype(dtext)
    except Exception as exc:  # stored bytes may be anything: whatever numpy makes of them is a bad value
        raise SerializationError(f"bad numpy dtype {dtext!r} in stored value: {exc}") from None
    if dtype.hasobject:  # raw pointers from the network would crash the process
        raise SerializationError(f"refusing to decode a numpy array of dtype {dtype}")
    offset = end + (-end % _NP_ALIGN)
    count = math.prod(shape)
    if len(view) - offset != count * dtype.itemsize:
        raise SerializationError(f"corrupt numpy payload: {len(view) - offset} data bytes for shape {shape} of {dtype}")
    if count == 0 or dtype.itemsize == 0:
        arr = np.zeros(shape, dtype)
        arr.flags.writeable = False
    else:
        arr = np.frombuffer(data, dtype=dtype, count=count, offset=offset)
        if flags & _F_FORTRAN:
            arr = arr.reshape(shape[::-1]).T
        else:
            arr = arr.reshape(shape)
    if flags & _F_SCALAR:
        return arr[()]
    return arr


# -- JSON ------------------------------------------------------------------------------


def _encode_json(value) -> bytes:
    _check_json(value, 0)
    return _H_JSON + _json_encoder.encode(value).encode("utf-8")


def _check_json(value, depth: int) -> None:
    """Refuse what JSON would silently change (tuples, int keys, numpy scalars...)."""
    cls = type(value)
    if value is None or cls in (str, int, float, bool):
        return
    if depth > _JSON_MAX_DEPTH:
        raise SerializationError(f"JSON value nested deeper than {_JSON_MAX_DEPTH}")
    if cls is list:
        for item in value:
            _check_json(item, depth + 1)
        return
    if cls is dict:
        for key, item in value.items():
            if type(key) is not str:
                raise SerializationError(
                    f"cannot encode a dict with a key of type {_typename(key)} ({key!r}): "
                    "JSON-encoded dicts need str keys"
                )
            _check_json(item, depth + 1)
        return
    if isinstance(value, (str, int, float, list, dict)):  # subclasses: store the base value
        return
    raise SerializationError(
        f"cannot encode a value of type {_typename(value)} inside a list/dict: "
        "containers may hold only None, bool, int, float, str, list and dict"
    )


# -- Arrow -----------------------------------------------------------------------------


def _encode_arrow(header: bytes, table) -> bytes:
    pa = _pyarrow()
    sink = pa.BufferOutputStream()
    sink.write(header)
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return sink.getvalue().to_pybytes()


def _decode_arrow(view: memoryview):
    pa = _pyarrow()
    try:
        with pa.ipc.open_stream(pa.py_buffer(view[2:])) as reader:
            return reader.read_all()  # buffers reference ``view``: no copy
    except pa.ArrowException as exc:
        raise SerializationError(f"corrupt Arrow payload: {exc}") from None


# -- helpers ---------------------------------------------------------------------------


def _unpickle(view: memoryview):
    import pickle

    return pickle.loads(view[2:])


def _typename(value) -> str:
    cls = type(value)
    return cls.__qualname__ if cls.__module__ == "builtins" else f"{cls.__module__}.{cls.__qualname__}"


_pa_module = None


def _pyarrow():
    """pyarrow, imported on first use (it costs ~100 ms to import)."""
    global _pa_module
    if _pa_module is None:
        import pyarrow
        import pyarrow.ipc  # noqa: F401  (registers the submodule)

        _pa_module = pyarrow
    return _pa_module


_table_cls = None


def _table_class():
    """``flow.table.Table`` if it is importable; imported lazily so kvs does not
    depend on flow's import order (flow may import kvs)."""
    global _table_cls
    if _table_cls is None:
        try:
            from flow.table import Table
        except ImportError:
            return None
        _table_cls = Table
    return _table_cls
