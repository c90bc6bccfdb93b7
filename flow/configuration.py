"""One way to declare, validate and serialise a configuration object.

Why one helper and not pydantic v2: every config here is a few dozen scalars checked once per
process, at start-up, and its errors must stay in this project's exception tree naming the
field and quoting the value. Measured (benchmarks/config_cost.py, a ClusterConfig-shaped
26-field model): pydantic costs 28 ms to import and 76 ms with the model class defined, in
every process (CLI, gateway, each executor), against 3.6 ms here; it builds an object in
2.3 us against 20 us here, which no request pays (configs are built at start-up; a request
only reads fields: 27 ns on a pydantic model, 11 ns on a dataclass). It is also not a
declared dependency, and its ValidationError would need translating into our tree.

A config is a frozen dataclass deriving from ``Config``; each field declares its check with
``setting(default, check)``. ``Config.__post_init__`` runs the checks in field order (a check
may convert, e.g. a list to a tuple), then the class's ``_validate()`` for rules that join
fields. A bad value raises the class's ``error`` (a ``ConfigError``) or, for a value of the
wrong type, its ``type_error`` (a ``ConfigTypeError``), naming the field and quoting the value:

    @dataclass(frozen=True)
    class PoolConfig(Config):
        size: int = setting(4, Int(1, 64))                  # an int in 1..64
        timeout_s: float = setting(5.0, Number(gt=0, note="seconds"))
        mode: str = setting("fast", OneOf("fast", "safe"))
        name: str | None = setting(None, Str(optional=True))

        def _validate(self):                                # optional: rules across fields
            if self.mode == "safe" and self.size > 8:
                raise self.error(f"PoolConfig.size must be <= 8 in mode 'safe', got {self.size!r}")

    PoolConfig(size=0)   # ConfigError: PoolConfig.size must be an int in 1..64, got 0

JSON: ``to_json()`` gives plain data (nested configs as dicts, tuples as lists);
``from_json(doc)`` reads it back. Missing keys take their defaults; an unknown key is an error
naming it and listing the known ones (``PoolConfig: unknown field(s) ['sise']; known: [...]``).

A check is any callable ``check(value, name) -> value`` (``name``: ``"Owner.field"``) that
raises ``Invalid`` (or, for a message of its own, the class's ConfigError); the ones below
cover ints, numbers, bools, strings, choices and nested configs.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
import os
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, ClassVar

from flow.errors import FlowValueError


class ConfigError(FlowValueError):
    """A configuration value is wrong; the message names the field and quotes the value.
    Every config of the project raises it (ClusterConfig, KVSOptions, KubeConfig, ...)."""


class ConfigTypeError(ConfigError, TypeError):
    """A configuration value has the wrong type (e.g. ``"2"`` where an int is needed)."""


class Invalid(Exception):
    """What a check raises; ``Config`` turns it into the class's error.

    ``what``: what a good value is (the message says ``<name> must be <what>, got <value>``);
    ``message``: a whole message instead; ``wrong_type``: raise the TypeError class."""

    def __init__(self, what: str | None = None, *, message: str | None = None, wrong_type: bool = False):
        super().__init__(message or what)
        self.what, self.message, self.wrong_type = what, message, wrong_type


class Check:
    """A field check: type (``types``, bools excluded unless listed), then an optional
    conversion, then ``ok(value)``. ``optional``: None is accepted (and the message says so,
    unless ``what`` mentions None already)."""

    def __init__(
        self,
        what: str,
        ok: Callable[[Any], bool] | None = None,
        *,
        types: tuple = (),
        optional: bool = False,
        convert: Callable[[Any], Any] | None = None,
    ):
        self.what = f"{what} or None" if optional and "None" not in what else what
        self.ok, self.types, self.optional, self.convert = ok, types, optional, convert

    def __call__(self, value, name: str):
        if value is None and self.optional:
            return None
        if self.types and (not isinstance(value, self.types) or (isinstance(value, bool) and bool not in self.types)):
            raise Invalid(self.what, wrong_type=True)
        if self.convert is not None:
            value = self.convert(value)
        if self.ok is not None and not self.ok(value):
            raise Invalid(self.what)
        return value


def _note(what: str, note: str | None) -> str:
    return f"{what} ({note})" if note else what


def Int(
    min: int | None = None,
    max: int | None = None,
    *,
    optional: bool = False,
    note: str | None = None,
    what: str | None = None,
) -> Check:
    """An int (numpy ints too, never a bool) in ``min..max`` (either bound may be None)."""
    if what is None:
        bounds = (
            f" in {min}..{max}"
            if min is not None and max is not None
            else f" >= {min}"
            if min is not None
            else f" <= {max}"
            if max is not None
            else ""
        )
        what = f"an int{bounds}"
    return Check(
        _note(what, note),
        lambda v: (min is None or v >= min) and (max is None or v <= max),
        types=(numbers.Integral,),
        optional=optional,
    )


def Number(
    *,
    gt: float | None = None,
    ge: float | None = None,
    lt: float | None = None,
    le: float | None = None,
    optional: bool = False,
    note: str | None = None,
    what: str | None = None,
) -> Check:
    """A finite int or float (never a bool, NaN or infinity) within the given bounds."""
    low = f"({gt:g}" if gt is not None else f"[{ge:g}" if ge is not None else None
    high = f"{lt:g})" if lt is not None else f"{le:g}]" if le is not None else None
    if what is None:
        if low and high:
            what = f"a number in {low}, {high}"
        elif low:
            what = f"a number {'>' if gt is not None else '>='} {low[1:]}"
        elif high:
            what = f"a number {'<' if lt is not None else '<='} {high[:-1]}"
        else:
            what = "a number"

    def ok(v) -> bool:
        return (
            math.isfinite(v)
            and (gt is None or v > gt)
            and (ge is None or v >= ge)
            and (lt is None or v < lt)
            and (le is None or v <= le)
        )

    return Check(_note(what, note), ok, types=(numbers.Real,), optional=optional)


def Bool() -> Check:
    return Check("a bool", types=(bool,))


def Str(what: str = "a non-empty string", ok: Callable[[str], bool] = bool, *, optional: bool = False) -> Check:
    """A string with ``ok(value)`` true (default: non-empty)."""
    return Check(what, ok, types=(str,), optional=optional)


def OneOf(*choices, optional: bool = False) -> Check:
    return Check(f"one of {choices}", lambda v: v in choices, optional=optional)


class Nested:
    """A field holding another Config (``kind``: the class, or a function returning it, to
    import it only when used). ``from_json`` turns a mapping into one; ``accept_mapping``:
    the constructor does too. Errors of the nested config are re-raised as the owner's,
    prefixed with the field."""

    def __init__(self, kind, *, optional: bool = False, accept_mapping: bool = False, what: str | None = None):
        self._kind, self.optional, self.accept_mapping, self._what = kind, optional, accept_mapping, what

    @property
    def kind(self) -> type[Config]:
        return self._kind if isinstance(self._kind, type) else self._kind()

    def __call__(self, value, name: str):
        if value is None and self.optional:
            return None
        kind = self.kind
        if self.accept_mapping and isinstance(value, Mapping):
            return self.decode(value, name)
        if not isinstance(value, kind):
            article = "an" if kind.__name__[:1] in "AEIOU" else "a"
            what = self._what or (
                f"{article} {kind.__name__}" + (" or a mapping of its fields" if self.accept_mapping else "")
            )
            raise Invalid(f"{what} or None" if self.optional else what, wrong_type=True)
        return value

    def decode(self, value, name: str):
        """A mapping (JSON) as the nested config; the nested errors prefixed with ``name``."""
        if not isinstance(value, Mapping):
            return value
        try:
            return self.kind.from_json(value)
        except ConfigError as e:
            raise Invalid(message=f"{name}: {e}", wrong_type=isinstance(e, TypeError)) from None


def setting(
    default: Any = dataclasses.MISSING, check: Callable | None = None, *, default_factory: Any = dataclasses.MISSING
) -> Any:
    """A dataclass field with its check (run by ``Config.__post_init__``)."""
    return dataclasses.field(default=default, default_factory=default_factory, metadata={"check": check})


class Config:
    """Base of the frozen config dataclasses (see the module docstring)."""

    error: ClassVar[type[ConfigError]] = ConfigError
    type_error: ClassVar[type[ConfigTypeError]] = ConfigTypeError

    if TYPE_CHECKING:
        # Every subclass is a dataclass: tell the checker so ``dataclasses.fields(self)`` type-checks
        # (declared for the checker only, so the dataclass machinery never sees it)
        __dataclass_fields__: ClassVar[dict[str, dataclasses.Field[Any]]]

    def __post_init__(self) -> None:
        owner = type(self).__name__
        for f in dataclasses.fields(self):
            check = f.metadata.get("check")
            if check is None:
                continue
            value = getattr(self, f.name)
            name = f"{owner}.{f.name}"
            try:
                new = check(value, name)
            except Invalid as bad:
                raise self._error(bad, name, value) from None
            if new is not value:
                object.__setattr__(self, f.name, new)
        self._validate()

    def _validate(self) -> None:
        """Rules that join fields; raise ``self.error`` / ``self.type_error``."""

    def _error(self, bad: Invalid, name: str, value) -> ConfigError:
        cls = self.type_error if bad.wrong_type else self.error
        return cls(bad.message or f"{name} must be {bad.what}, got {value!r}")

    def to_json(self) -> dict:
        """The fields as plain JSON-able data (``from_json`` reads it back)."""
        return {f.name: _plain(getattr(self, f.name)) for f in dataclasses.fields(self)}

    @classmethod
    def from_json(cls, doc: Mapping):
        """A config from ``to_json`` output: missing keys default; unknown keys are an error."""
        if not isinstance(doc, Mapping):
            raise cls.type_error(f"{cls.__name__}.from_json needs a dict, got {doc!r}")
        fields = {f.name: f for f in dataclasses.fields(cls)}
        unknown = sorted(set(doc) - set(fields), key=str)
        if unknown:
            raise cls.error(f"{cls.__name__}: unknown field(s) {unknown}; known: {sorted(fields)}")
        kwargs = {}
        for key, value in doc.items():
            check = fields[key].metadata.get("check")
            if isinstance(check, Nested) and isinstance(value, Mapping):
                try:
                    value = check.decode(value, f"{cls.__name__}.{key}")
                except Invalid as bad:  # decode always sets the message; the fallback is _error's
                    raise (cls.type_error if bad.wrong_type else cls.error)(
                        bad.message or f"{cls.__name__}.{key} must be {bad.what}, got {value!r}"
                    ) from None
            kwargs[key] = value
        return cls(**kwargs)


def _plain(value):
    if isinstance(value, Config):
        return value.to_json()
    if isinstance(value, Mapping):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (tuple, list)):
        return [_plain(v) for v in value]
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    return value


def check_value(
    value,
    name: str,
    check: Callable,
    *,
    error: type[ConfigError] = ConfigError,
    type_error: type[ConfigTypeError] = ConfigTypeError,
):
    """Run one check outside a Config (a constructor argument, a command-line flag)."""
    try:
        return check(value, name)
    except Invalid as bad:
        raise (type_error if bad.wrong_type else error)(
            bad.message or f"{name} must be {bad.what}, got {value!r}"
        ) from None
