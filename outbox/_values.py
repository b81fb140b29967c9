"""Faithful values: what a boundary hands back in replay has the type it had when recorded.

Record mode writes outputs (a tool's result, an effect's result, a run's input) in a
tagged JSON encoding: plain JSON stays as it is, and every other value that can come
back the same is written as an object whose ``"$type"`` key names what it was
(``{"$type": "tuple", "items": [...]}``, ``{"$type": "dataclass", "$class":
"shop.models:Refund", "amount": ...}``). Anything else is refused at record time with
:class:`~agent_blackbox.schemas.NotSerialisable`, naming the path and how to make the
value recordable. Inputs (tool arguments, LLM requests) are not encoded here: their
digests must stay what they always were.

Exceptions get the same care: :func:`describe_error` records the module-qualified class
and the typed arguments, :func:`rebuild_error` raises the same class again in replay, or
a :class:`~agent_blackbox.outbox.RecordedError` subclass carrying the type name when the
class is not at hand.

A class is looked up among the modules already imported (the agent's own imports
decide); replay never imports a module because a recording names it. Where the same
code runs under another module name than when it was recorded (a script recorded as
``__main__`` and replayed by module, or the reverse), the replay says which imported
module stands in for the recorded one (``aliases``): it is looked in first. A
:class:`Converter` registered for a class (:func:`register_converter`) takes over its
recorded form both ways, for values and exceptions alike.
"""

from __future__ import annotations

import base64
import dataclasses
import datetime as dt
import json
import math
import sys
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from decimal import Decimal
from enum import Enum
from typing import Any, Generic, TypeVar

from agent_blackbox.outbox._errors import RecordedError
from agent_blackbox.schemas import (
    MAX_VALUE_DEPTH,
    BlackboxError,
    NotSerialisable,
    canonical_text,
    not_unicode,
    too_deep,
)

__all__ = [
    "DEFAULT_CONVERTERS",
    "TAG",
    "TAGGED",
    "Converter",
    "Converters",
    "ValueNotRestorable",
    "decode_value",
    "describe_error",
    "encode_value",
    "rebuild_error",
    "recorded_value",
    "register_converter",
    "restore_tags",
]

T = TypeVar("T")

TAG = "$type"
"""The key that marks a tagged value; ``$`` keys never name a field of a Python class."""
_CLASS = "$class"
TAGGED = "tagged"
"""The codec a body names (``input_codec``, ``result_codec``) for a value in this encoding."""
_HOW = (
    "Record JSON values, tuples, sets, dataclasses, enums, named tuples, datetimes, "
    "Decimal, UUID, bytes or pydantic models of classes defined at module level, or "
    "register a converter for the class (agent_blackbox.outbox.register_converter)."
)
_SCALAR_TAGS = frozenset(
    {"float", "bytes", "datetime", "date", "time", "timedelta", "decimal", "uuid", "enum"}
)


class ValueNotRestorable(BlackboxError):
    """A recorded value cannot be given back with its type in this process: its class is
    not imported, is no longer what it was, or its converter is not registered."""


@dataclass(frozen=True, slots=True)
class Converter(Generic[T]):
    """How one class crosses a boundary: ``to_recorded`` turns an instance into a value
    that is itself recordable (JSON, or any type this module round-trips),
    ``from_recorded`` turns that value back into an instance. For an exception class the
    recorded value is kept as the error's arguments."""

    cls: type[T]
    to_recorded: Callable[[T], Any]
    from_recorded: Callable[[Any], T]

    @property
    def name(self) -> str:
        """The name the recorded form carries: ``module:qualname`` of the class."""
        return class_path(self.cls)


class Converters:
    """The converters by class (exact class: a subclass needs its own)."""

    def __init__(self) -> None:
        self._by_class: dict[type[Any], Converter[Any]] = {}
        self._by_name: dict[str, Converter[Any]] = {}

    def register(
        self,
        cls: type[T],
        *,
        to_recorded: Callable[[T], Any],
        from_recorded: Callable[[Any], T],
    ) -> None:
        """Record instances of ``cls`` as ``to_recorded(instance)`` and give them back in
        replay as ``from_recorded(value)``; the last registration of a class wins.

        Raises:
            TypeError: ``cls`` is not a class, or not defined at module level (replay
                finds a converter by the class's ``module:qualname``).
        """
        if not isinstance(cls, type):
            raise TypeError(f"a converter is registered for a class, not {cls!r}")
        if _resolve(class_path(cls)) is not cls:
            raise TypeError(
                f"{class_path(cls)} is not reachable by its module and name; define the "
                "class at module level to register a converter for it"
            )
        converter = Converter(cls, to_recorded, from_recorded)
        self._by_class[cls] = converter
        self._by_name[converter.name] = converter

    def unregister(self, cls: type[Any]) -> None:
        """Forget the converter of ``cls`` (if any)."""
        converter = self._by_class.pop(cls, None)
        if converter is not None:
            self._by_name.pop(converter.name, None)

    def get(self, cls: type[Any]) -> Converter[Any] | None:
        """The converter of exactly ``cls``."""
        return self._by_class.get(cls) if self._by_class else None

    def named(self, name: str) -> Converter[Any] | None:
        """The converter whose class is ``module:qualname`` ``name``."""
        return self._by_name.get(name)


DEFAULT_CONVERTERS = Converters()
"""The converters every recorder and replay use."""


def register_converter(
    cls: type[T], *, to_recorded: Callable[[T], Any], from_recorded: Callable[[Any], T]
) -> None:
    """Register a converter for ``cls`` with :data:`DEFAULT_CONVERTERS` (see
    :meth:`Converters.register`). Register it in a module both the recording process
    and the replay import (the agent's own module, typically)."""
    DEFAULT_CONVERTERS.register(cls, to_recorded=to_recorded, from_recorded=from_recorded)


def class_path(cls: type[Any]) -> str:
    """``module:qualname`` of a class."""
    return f"{cls.__module__}:{cls.__qualname__}"


def _resolve(path: str) -> Any:
    """The object ``module:qualname`` names among the modules already imported, or None."""
    module_name, _, qualname = path.partition(":")
    found: Any = sys.modules.get(module_name)
    for part in qualname.split("."):
        if found is None or part == "<locals>":
            return None
        found = getattr(found, part, None)
    return found


# Encoding ---------------------------------------------------------------------------


def _unicode(text: str, path: str) -> str:
    """``text``, when it is Unicode (it has a UTF-8 form, which a body's JSON needs).

    Raises:
        NotSerialisable: it holds a lone surrogate (a JSON text can, after decoding).
    """
    refused = not_unicode(text, path)
    if refused is not None:
        raise refused
    return text


def encode_value(
    value: Any, *, path: str = "$", converters: Converters = DEFAULT_CONVERTERS
) -> Any:
    """The tagged JSON form of ``value`` (plain JSON is its own form).

    Raises:
        NotSerialisable: naming the path of the first value that would not come back
            with its type, and how to make it recordable.
    """
    return _Encoder(converters).encode(value, path, 0)


class _Encoder:
    __slots__ = ("_converters",)

    def __init__(self, converters: Converters) -> None:
        self._converters = converters

    def encode(self, value: Any, path: str, depth: int) -> Any:
        kind = type(value)
        if kind is str:
            return value if value.isascii() else _unicode(value, path)
        if kind is int or kind is bool or value is None:
            return value
        if kind is float:
            return value if math.isfinite(value) else {TAG: "float", "value": repr(value)}
        if depth >= MAX_VALUE_DEPTH:  # every other kind may hold values: stop before the stack
            raise too_deep(path)
        if kind is list:
            return [self.encode(item, f"{path}[{i}]", depth + 1) for i, item in enumerate(value)]
        if kind is dict:
            return self._dict(value, path, depth)
        converter = self._converters.get(kind)
        if converter is not None:
            recorded = self.encode(converter.to_recorded(value), path, depth + 1)
            return {TAG: "custom", _CLASS: converter.name, "value": recorded}
        scalar = _SCALARS.get(kind)
        if scalar is not None:
            return {TAG: scalar[0], **scalar[1](value)}
        if kind is tuple:
            return {TAG: "tuple", "items": self._items(value, path, depth)}
        if kind is set or kind is frozenset:
            items = sorted(self._items(value, path, depth), key=canonical_text)
            return {TAG: kind.__name__, "items": items}
        return self._classed(value, path, depth)

    def _items(self, values: Any, path: str, depth: int) -> list[Any]:
        return [self.encode(item, f"{path}[{i}]", depth + 1) for i, item in enumerate(values)]

    def _dict(self, value: dict[Any, Any], path: str, depth: int) -> Any:
        below = depth + 1
        if TAG not in value and all(type(key) is str for key in value):
            if not "".join(value).isascii():
                for key in value:
                    _unicode(key, f"{path}.<key>")
            return {key: self.encode(item, f"{path}.{key}", below) for key, item in value.items()}
        pairs = [
            [
                self.encode(key, f"{path}.<key {i}>", below),
                self.encode(item, f"{path}.{key}", below),
            ]
            for i, (key, item) in enumerate(value.items())
        ]
        return {TAG: "dict", "items": pairs}

    def _classed(self, value: Any, path: str, depth: int) -> Any:
        cls = type(value)
        if isinstance(value, Enum):
            return {TAG: "enum", _CLASS: _importable(cls, path), "name": value.name}
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            fields = {f.name: getattr(value, f.name) for f in dataclasses.fields(value)}
            return self._object("dataclass", cls, fields, path, depth)
        if isinstance(value, tuple) and hasattr(cls, "_fields"):
            return {
                TAG: "namedtuple",
                _CLASS: _importable(cls, path),
                "items": self._items(value, path, depth),
            }
        pydantic = sys.modules.get("pydantic")  # no model exists unless it was imported
        if pydantic is not None and isinstance(value, pydantic.BaseModel):
            fields = {name: getattr(value, name) for name in type(value).model_fields}
            fields.update(value.model_extra or {})
            return self._object("pydantic", cls, fields, path, depth)
        article = "an" if cls.__qualname__[:1].lower() in "aeiou" else "a"
        raise NotSerialisable(
            path, f"{article} {cls.__qualname__} would not come back the same", _HOW
        )

    def _object(
        self, tag: str, cls: type[Any], fields: Mapping[str, Any], path: str, depth: int
    ) -> Any:
        encoded = {
            name: self.encode(item, f"{path}.{name}", depth + 1) for name, item in fields.items()
        }
        return {TAG: tag, _CLASS: _importable(cls, path), **encoded}


def _importable(cls: type[Any], path: str) -> str:
    name = class_path(cls)
    if _resolve(name) is not cls:
        raise NotSerialisable(
            path,
            f"class {name} is not reachable by its module and name, so replay could not "
            "give it back",
            _HOW,
        )
    return name


def _datetime(value: dt.datetime | dt.date | dt.time) -> dict[str, Any]:
    return {"iso": value.isoformat()}


def _timedelta(value: dt.timedelta) -> dict[str, Any]:
    return {"days": value.days, "seconds": value.seconds, "microseconds": value.microseconds}


_SCALARS: dict[type[Any], tuple[str, Callable[[Any], dict[str, Any]]]] = {
    bytes: ("bytes", lambda v: {"base64": base64.b64encode(v).decode("ascii")}),
    dt.datetime: ("datetime", _datetime),
    dt.date: ("date", _datetime),
    dt.time: ("time", _datetime),
    dt.timedelta: ("timedelta", _timedelta),
    Decimal: ("decimal", lambda v: {"value": str(v)}),
    uuid.UUID: ("uuid", lambda v: {"value": str(v)}),
}


def restore_tags(encoded: Any, scrubbed: Any) -> Any:
    """``scrubbed`` (``encoded`` after redaction) with the tags and the text of typed
    scalars put back: redaction works on strings, and a timestamp or a UUID is not one
    (a rule that replaced a whole tagged value keeps its placeholder)."""
    if type(encoded) is list and type(scrubbed) is list and len(encoded) == len(scrubbed):
        return [restore_tags(e, s) for e, s in zip(encoded, scrubbed, strict=True)]
    if type(encoded) is not dict or type(scrubbed) is not dict:
        return scrubbed
    tag = encoded.get(TAG)
    if tag is not None and scrubbed.get(TAG) != tag:
        scrubbed = {**scrubbed, TAG: tag}
    restored = {}
    for key, item in scrubbed.items():
        if key not in encoded:
            restored[key] = item
        elif tag is not None and (key.startswith("$") or tag in _SCALAR_TAGS):
            restored[key] = encoded[key]
        else:
            restored[key] = restore_tags(encoded[key], item)
    return restored


# Decoding ---------------------------------------------------------------------------


def recorded_value(data: Any, codec: str, *, aliases: Mapping[str, str] | None = None) -> Any:
    """The value a body recorded as ``data`` with ``codec`` (its ``*_codec`` field);
    ``aliases`` maps a recorded module name to the imported module that stands in for it.

    Raises:
        ValueNotRestorable: an unknown codec, or a class or converter not at hand.
    """
    if codec != TAGGED:
        raise ValueNotRestorable(
            f"a recorded value is in the {codec!r} encoding, which this release does not "
            "read; replay it with the release that recorded it or a newer one"
        )
    kind = type(data)
    return decode_value(data, aliases=aliases) if kind is dict or kind is list else data


def decode_value(
    data: Any,
    *,
    converters: Converters = DEFAULT_CONVERTERS,
    aliases: Mapping[str, str] | None = None,
) -> Any:
    """The value whose tagged JSON form is ``data``; ``aliases`` maps a recorded module
    name to the imported module that stands in for it (looked in first).

    Raises:
        ValueNotRestorable: a class or converter the value needs is not at hand.
    """
    return _decode(data, _Lookup(converters, aliases or {}))


@dataclass(frozen=True, slots=True)
class _Lookup:
    """Where decoding finds what a recorded value names: converters, and classes among
    the imported modules (a stand-in module first)."""

    converters: Converters
    aliases: Mapping[str, str]

    def names(self, path: str) -> tuple[str, ...]:
        """``module:qualname`` as recorded, after its stand-in's when it has one."""
        module_name, _, qualname = path.partition(":")
        alias = self.aliases.get(module_name)
        return (path,) if alias is None else (f"{alias}:{qualname}", path)

    def resolve(self, path: str) -> Any:
        """The class ``path`` names in this process, or None."""
        for name in self.names(path):
            found = _resolve(name)
            if found is not None:
                return found
        return None

    def converter(self, path: str) -> Converter[Any] | None:
        """The converter of the class ``path`` names, or None."""
        for name in self.names(path):
            converter = self.converters.named(name)
            if converter is not None:
                return converter
        return None


def _decode(data: Any, how: _Lookup) -> Any:
    kind = type(data)
    if kind is list:
        return [_decode(item, how) for item in data]
    if kind is not dict:
        return data
    tag = data.get(TAG)
    if tag is None:
        return {key: _decode(item, how) for key, item in data.items()}
    decode = _DECODERS.get(tag)
    if decode is None:
        raise ValueNotRestorable(
            f"a recorded value is tagged {tag!r}, which this release does not know"
        )
    try:
        return decode(data, how)
    except BlackboxError:
        raise
    except Exception as exc:  # a damaged or redacted form; name what failed
        raise ValueNotRestorable(
            f"a recorded {tag} value does not rebuild: {type(exc).__name__}: {exc}"
        ) from exc


def _items(data: Mapping[str, Any], how: _Lookup) -> list[Any]:
    return [_decode(item, how) for item in data["items"]]


def _fields(data: Mapping[str, Any], how: _Lookup) -> dict[str, Any]:
    return {key: _decode(item, how) for key, item in data.items() if not key.startswith("$")}


def _class(data: Mapping[str, Any], how: _Lookup, check: Callable[[Any], bool], what: str) -> Any:
    name = str(data[_CLASS])
    cls = how.resolve(name)
    if cls is None:
        raise ValueNotRestorable(
            f"the recorded {what} {name} is not among the imported modules; import its "
            "module in the agent's code (replay imports nothing a recording names)"
        )
    if not isinstance(cls, type) or not check(cls):
        raise ValueNotRestorable(
            f"{name} is no longer a {what}; it cannot rebuild the recorded value"
        )
    return cls


def _dataclass(data: Mapping[str, Any], how: _Lookup) -> Any:
    cls = _class(data, how, dataclasses.is_dataclass, "dataclass")
    value = cls.__new__(cls)  # the recorded fields exactly, as they were after __init__
    for name, item in _fields(data, how).items():
        object.__setattr__(value, name, item)
    return value


def _pydantic(data: Mapping[str, Any], how: _Lookup) -> Any:
    base = sys.modules.get("pydantic")
    cls = _class(
        data, how, lambda c: base is not None and issubclass(c, base.BaseModel), "pydantic model"
    )
    return cls.model_validate(_fields(data, how))


def _custom(data: Mapping[str, Any], how: _Lookup) -> Any:
    converter = how.converter(str(data[_CLASS]))
    if converter is None:
        raise ValueNotRestorable(
            f"the recorded value of class {data[_CLASS]} needs its converter; register it "
            "(agent_blackbox.outbox.register_converter) in a module the replay imports"
        )
    return converter.from_recorded(_decode(data["value"], how))


def _namedtuple(data: Mapping[str, Any], how: _Lookup) -> Any:
    cls = _class(data, how, lambda c: issubclass(c, tuple) and hasattr(c, "_fields"), "named tuple")
    return cls(*_items(data, how))


def _enum(data: Mapping[str, Any], how: _Lookup) -> Any:
    return _class(data, how, lambda c: issubclass(c, Enum), "enum")[data["name"]]


_DECODERS: dict[str, Callable[[Mapping[str, Any], _Lookup], Any]] = {
    "float": lambda d, c: float(d["value"]),
    "bytes": lambda d, c: base64.b64decode(d["base64"], validate=True),
    "datetime": lambda d, c: dt.datetime.fromisoformat(d["iso"]),
    "date": lambda d, c: dt.date.fromisoformat(d["iso"]),
    "time": lambda d, c: dt.time.fromisoformat(d["iso"]),
    "timedelta": lambda d, c: dt.timedelta(d["days"], d["seconds"], d["microseconds"]),
    "decimal": lambda d, c: Decimal(d["value"]),
    "uuid": lambda d, c: uuid.UUID(d["value"]),
    "tuple": lambda d, c: tuple(_items(d, c)),
    "set": lambda d, c: set(_items(d, c)),
    "frozenset": lambda d, c: frozenset(_items(d, c)),
    "dict": lambda d, c: {_decode(k, c): _decode(v, c) for k, v in d["items"]},
    "enum": _enum,
    "dataclass": _dataclass,
    "namedtuple": _namedtuple,
    "pydantic": _pydantic,
    "custom": _custom,
}


# Exceptions -------------------------------------------------------------------------


def describe_error(
    exc: BaseException, *, converters: Converters = DEFAULT_CONVERTERS
) -> dict[str, str]:
    """The recorded form of an exception: ``type`` (qualname), ``message``, ``module`` and
    ``args_json`` (canonical JSON of the typed arguments, or of what its converter
    records; left out when they cannot be recorded)."""
    cls = type(exc)
    info = {"type": cls.__qualname__, "message": _message(exc), "module": cls.__module__}
    converter = converters.get(cls)
    try:
        args = converter.to_recorded(exc) if converter is not None else list(exc.args)
        info["args_json"] = canonical_text(encode_value(args, path="args", converters=converters))
    except NotSerialisable:
        pass  # the class and message are still worth recording
    return info


def _message(exc: BaseException) -> str:
    """``str(exc)``, as text a body can hold: a lone surrogate (text decoded with
    ``surrogateescape``, say) written as its escape, and an exception whose ``__str__``
    raises named by its class, so the agent's own error is what is recorded and raised."""
    try:
        message = str(exc)
    except Exception:  # its own __str__ failed
        return f"<{type(exc).__qualname__}: the message could not be written>"
    try:
        message.encode("utf-8")
    except UnicodeEncodeError:
        return message.encode("utf-8", "backslashreplace").decode("utf-8")
    return message


def rebuild_error(
    info: Mapping[str, str],
    *,
    converters: Converters = DEFAULT_CONVERTERS,
    aliases: Mapping[str, str] | None = None,
) -> Exception:
    """The exception a recorded error stands for: its own class where it is imported and
    its arguments were recorded, else a :class:`RecordedError` subclass named like it.
    ``aliases`` maps a recorded module name to the imported module that stands in for it
    (``{"__main__": "agent"}``: a script's class found in the module it is replayed as).

    The exception carries ``recorded_error`` (``info``), so a run that ends on it records
    the same error again.
    """
    exc = _rebuilt(info, _Lookup(converters, aliases or {})) or _recorded_error(info)
    exc.recorded_error = dict(info)  # type: ignore[attr-defined]
    return exc


def _rebuilt(info: Mapping[str, str], how: _Lookup) -> Exception | None:
    module, args_json = info.get("module"), info.get("args_json")
    if module is None or args_json is None:
        return None
    cls = how.resolve(f"{module}:{info['type']}")
    if not isinstance(cls, type) or not issubclass(cls, Exception):
        return None
    try:
        args = _decode(json.loads(args_json), how)
    except (ValueError, BlackboxError):
        return None
    converter = how.converters.get(cls)
    if converter is not None:
        rebuilt = converter.from_recorded(args)
        return rebuilt if isinstance(rebuilt, cls) else None
    try:
        rebuilt = cls(*args)
    except Exception:
        # Its __init__ takes other arguments than it keeps in args: the class and args
        # are restored; attributes __init__ would set are not (register a converter).
        rebuilt = cls.__new__(cls, *args)
        rebuilt.args = tuple(args)
    return rebuilt if isinstance(rebuilt, cls) else None


_RECORDED_CLASSES: dict[tuple[str | None, str], type[RecordedError]] = {}


def _recorded_error(info: Mapping[str, str]) -> RecordedError:
    module, qualname = info.get("module"), info["type"]
    cls = _RECORDED_CLASSES.get((module, qualname))
    if cls is None:
        name = qualname.rsplit(".", 1)[-1]
        namespace = {"__qualname__": qualname, "__module__": module or RecordedError.__module__}
        made = type(name, (RecordedError,), namespace)
        cls = _RECORDED_CLASSES.setdefault((module, qualname), made)  # one, across threads
    return cls(qualname, info["message"], module=module)


# The recorder's own refusal comes back whole (its message is built from three parts).
DEFAULT_CONVERTERS.register(
    NotSerialisable,
    to_recorded=lambda exc: [exc.path, exc.reason, exc.advice],
    from_recorded=lambda args: NotSerialisable(*args),
)
