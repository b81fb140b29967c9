"""Catching unrecorded nondeterminism: reads of the wall clock, ``random``, UUIDs, the
operating system's randomness and the environment that the agent's own modules make
directly instead of through the run.

Such a read gives another value in replay than it gave when the run was recorded, so the
code may go another way for a reason no recorded event shows. A
:class:`NondeterminismGuard` wraps those functions for as long as it is entered, and
notes each call whose caller (the frame that called the function) is one of the agent's
modules; calls made by the project's own code or by libraries are not noted, even when
an agent's call leads to them.

What is wrapped, for every caller while a guard is entered: ``time.time``,
``time.time_ns``, the drawing functions of ``random``, ``uuid.uuid1``/``uuid4``,
``os.urandom``, ``secrets``' functions, ``os.getenv`` and reads of ``os.environ``. Names
the agent's modules bound to those functions themselves (``from time import time``) are
rebound to the wrappers, and so are the ``datetime`` module and its ``datetime`` and
``date`` classes in those modules only (``datetime.now``/``utcnow``/``today``,
``date.today``): the classes the rest of the process sees are left alone, so type checks
outside the agent are not affected. Everything is restored when the last guard exits,
also on error, unless :meth:`NondeterminismGuard.installed` holds the wrappers in place
(a batch replaying run after run, each under a guard of its own, installs them once).
Guards may overlap and be entered from several threads; the wrappers stay
correct for threads the agent starts while a guard is entered.

Not seen: functions the agent keeps elsewhere than in a module global (a default
argument, a class attribute), the ``datetime`` names of an agent module first imported
while a guard is entered, ``time.monotonic``/``perf_counter`` (they measure durations)
and ``os.getenvb``. Reads of ``os.environb`` count as ``os.environ``.
"""

from __future__ import annotations

import datetime as _dt
import os
import random
import secrets
import sys
import threading
import time
import types
import uuid
import warnings
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from types import FrameType, TracebackType
from typing import Any, Literal

from agent_blackbox.schemas import BlackboxError

NondeterminismMode = Literal["off", "warn", "fail"]
"""What a recorder does about an unrecorded read: nothing, a warning, or an error."""
MODE_VARIABLE = "BLACKBOX_RECORD_NONDETERMINISM"
"""The environment variable that sets a recorder's mode when none is given."""
_MODES = ("off", "warn", "fail")
_OWN_PREFIX = "agent_blackbox.outbox."
_EXAMPLES = "agent_blackbox.examples"

_RANDOM_FUNCTIONS = (
    "random",
    "uniform",
    "randint",
    "randrange",
    "choice",
    "choices",
    "sample",
    "shuffle",
    "getrandbits",
    "randbytes",
    "gauss",
    "normalvariate",
    "lognormvariate",
    "expovariate",
    "vonmisesvariate",
    "gammavariate",
    "betavariate",
    "paretovariate",
    "weibullvariate",
    "triangular",
    "binomialvariate",
)
_SECRETS_FUNCTIONS = (
    "token_bytes",
    "token_hex",
    "token_urlsafe",
    "randbelow",
    "randbits",
    "choice",
)
# Reads of os.environ, patched on its class (os.environ is one shared instance, also
# bound by `from os import environ`). Methods the mapping inherits are set on the class
# and deleted again on exit.
_ENVIRON_METHODS = ("__getitem__", "__contains__", "__iter__", "get", "keys", "items", "values")


class UnrecordedNondeterminism(BlackboxError):
    """The agent's code read the clock, randomness or the environment directly while a
    recorder in ``fail`` mode was watching: the read must cross the run instead."""


class NondeterminismWarning(UserWarning):
    """The agent's code read the clock, randomness or the environment directly while a
    recorder in ``warn`` mode was watching."""


@dataclass(frozen=True, slots=True)
class NondeterministicRead:
    """One place in the agent's code that read something nondeterministic directly."""

    what: str
    """What was read, as the agent would write it: ``time.time``, ``os.environ``, ..."""
    function: str
    file: str
    line: int
    count: int = 1
    """How often that place read it while the guard was entered."""

    def advice(self) -> str:
        """One line for people: where, what, and what to do instead."""
        return (
            f"unrecorded nondeterminism: {self.what} read directly in {self.function} "
            f"({self.file}:{self.line}); use the run's boundary instead (run.now(), "
            "run.random(), run.uuid(), an input or a tool call) so replay sees the value"
        )


def covers(modules: Iterable[str], name: str) -> bool:
    """True when module ``name`` is one of ``modules`` or inside one of them."""
    wanted = tuple(modules)
    return name in wanted or name.startswith(tuple(m + "." for m in wanted))


class NondeterminismGuard:
    """Notes the direct nondeterministic reads of the agent's ``modules`` (each name
    covers the module and its submodules) while entered.

    Args:
        modules: the agent's modules.
        on_read: called with each read as it happens (before the function runs); an
            exception it raises reaches the agent's code in place of the value.
    """

    def __init__(
        self,
        modules: Iterable[str],
        *,
        on_read: Callable[[NondeterministicRead], None] | None = None,
    ) -> None:
        self.modules = tuple(sorted(set(modules)))
        self._on_read = on_read
        self._lock = threading.Lock()
        self._counts: dict[tuple[str, str, str, int], int] = {}
        self._matched: dict[str, bool] = {}

    @property
    def reads(self) -> tuple[NondeterministicRead, ...]:
        """Every place that read something directly, in the order first seen."""
        with self._lock:
            return tuple(NondeterministicRead(*key, n) for key, n in self._counts.items())

    def watches(self, module: str) -> bool:
        """True when calls from ``module`` are noted."""
        matched = self._matched.get(module)
        if matched is None:
            matched = self._matched[module] = covers(self.modules, module)
        return matched

    @staticmethod
    @contextmanager
    def installed() -> Iterator[None]:
        """Keep the wrappers installed while entered, also between guards: a guard
        entered inside then only points the agent's names at them, and its exit only
        points them back. Calls outside a guard pass straight through (nothing is
        noted); everything is restored on exit."""
        _PATCHES.hold()
        try:
            yield
        finally:
            _PATCHES.release()

    def __enter__(self) -> NondeterminismGuard:
        _PATCHES.add(self)
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        _PATCHES.remove(self)

    def _noted(self, frame: FrameType, what: str) -> None:
        key = (what, frame.f_code.co_name, frame.f_code.co_filename, frame.f_lineno)
        with self._lock:
            self._counts[key] = self._counts.get(key, 0) + 1
        if self._on_read is not None:
            self._on_read(NondeterministicRead(*key))


def _notice(frame: FrameType, what: str) -> None:
    """Tell every entered guard watching the caller's module about a read."""
    guards = _PATCHES.guards  # a tuple, replaced whole: no lock on the read path
    if not guards:
        return
    module = frame.f_globals.get("__name__")
    if not isinstance(module, str):
        return
    for guard in guards:
        if guard.watches(module):
            guard._noted(frame, what)


def _wrap(original: Callable[..., Any], what: str) -> Callable[..., Any]:
    def read(*args: Any, **kwargs: Any) -> Any:
        _notice(sys._getframe(1), what)
        return original(*args, **kwargs)

    read.__wrapped__ = original  # type: ignore[attr-defined]
    read.__name__ = getattr(original, "__name__", what)
    read.__qualname__ = getattr(original, "__qualname__", what)
    read.__doc__ = getattr(original, "__doc__", None)
    return read


class _DelegatingType(type):
    """Makes a guarded class stand for the real one in ``isinstance`` and
    ``issubclass``: what it builds is always an instance of the real class."""

    __wrapped__: type

    def __instancecheck__(cls, instance: Any) -> bool:
        return isinstance(instance, cls.__wrapped__)

    def __subclasscheck__(cls, subclass: type) -> bool:
        return issubclass(subclass, cls.__wrapped__)


class _GuardedDate(_dt.date, metaclass=_DelegatingType):
    __wrapped__ = _dt.date

    def __new__(cls, *args: Any, **kwargs: Any) -> _dt.date:  # type: ignore[misc]
        return _dt.date(*args, **kwargs)

    @classmethod
    def today(cls) -> _dt.date:  # type: ignore[override]
        _notice(sys._getframe(1), "date.today")
        return _dt.date.today()


class _GuardedDatetime(_dt.datetime, metaclass=_DelegatingType):
    __wrapped__ = _dt.datetime

    def __new__(cls, *args: Any, **kwargs: Any) -> _dt.datetime:  # type: ignore[misc]
        return _dt.datetime(*args, **kwargs)

    @classmethod
    def now(cls, tz: _dt.tzinfo | None = None) -> _dt.datetime:  # type: ignore[override]
        _notice(sys._getframe(1), "datetime.now")
        return _dt.datetime.now(tz)

    @classmethod
    def utcnow(cls) -> _dt.datetime:  # type: ignore[override]
        _notice(sys._getframe(1), "datetime.utcnow")
        return _dt.datetime.utcnow()

    @classmethod
    def today(cls) -> _dt.datetime:  # type: ignore[override]
        _notice(sys._getframe(1), "datetime.today")
        return _dt.datetime.today()


def _guarded_datetime_module() -> types.ModuleType:
    """A copy of the ``datetime`` module whose ``datetime`` and ``date`` are guarded."""
    module = types.ModuleType(_dt.__name__, _dt.__doc__)
    module.__dict__.update(_dt.__dict__)
    module.__dict__.update(datetime=_GuardedDatetime, date=_GuardedDate)
    return module


def _targets() -> list[tuple[Any, str, str]]:
    """(owner, attribute, what) of every function wrapped process-wide."""
    found: list[tuple[Any, str, str]] = [
        (time, "time", "time.time"),
        (time, "time_ns", "time.time_ns"),
        (uuid, "uuid1", "uuid.uuid1"),
        (uuid, "uuid4", "uuid.uuid4"),
        (os, "urandom", "os.urandom"),
        (os, "getenv", "os.getenv"),
    ]
    found += [(random, n, f"random.{n}") for n in _RANDOM_FUNCTIONS if hasattr(random, n)]
    found += [(secrets, n, f"secrets.{n}") for n in _SECRETS_FUNCTIONS]
    found += [(type(os.environ), n, "os.environ") for n in _ENVIRON_METHODS]
    return found


class _Patches:
    """The process-wide state: the wrappers are installed while any guard is entered."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.guards: tuple[NondeterminismGuard, ...] = ()
        self._holds = 0
        """How many :meth:`NondeterminismGuard.installed` keep the wrappers in place."""
        self._installed = False
        self._saved: list[tuple[Any, str, Any, bool]] = []
        """(owner, attribute, original, whether the owner held it itself)."""
        self._rebound: dict[int, Any] = {}
        """id(wrapper or guarded object) → what it replaced, for restoring names."""
        self._replacements: dict[int, Any] = {}
        """id(original) → its wrapper, for rebinding names the agent imported."""
        self._guarded_datetime = _guarded_datetime_module()
        self._made: dict[tuple[int, str], tuple[Any, Any]] = {}
        """(id(owner), attribute) → (original, wrapper), kept between installs."""

    def add(self, guard: NondeterminismGuard) -> None:
        with self._lock:
            if not self._installed:
                self._install()
            self.guards = (*self.guards, guard)
            self._rebind(guard.modules)

    def remove(self, guard: NondeterminismGuard) -> None:
        with self._lock:
            self.guards = tuple(g for g in self.guards if g is not guard)
            self._restore_names(guard.modules)
            if not self.guards and not self._holds:
                self._uninstall()
            else:  # names still watched by another guard are put back
                for other in self.guards:
                    self._rebind(other.modules)

    def hold(self) -> None:
        with self._lock:
            if not self._installed:
                self._install()
            self._holds += 1

    def release(self) -> None:
        with self._lock:
            self._holds -= 1
            if not self.guards and not self._holds:
                self._uninstall()

    def _install(self) -> None:
        self._installed = True
        self._replacements = {
            id(_dt): self._guarded_datetime,
            id(_dt.datetime): _GuardedDatetime,
            id(_dt.date): _GuardedDate,
        }
        self._rebound = {id(new): _dt_original(new) for new in self._replacements.values()}
        for owner, name, what in _targets():
            own = name in vars(owner)
            original = getattr(owner, name)
            wrapper = self._wrapper(owner, name, original, what)
            self._saved.append((owner, name, original, own))
            setattr(owner, name, wrapper)
            self._replacements[id(original)] = wrapper
            self._rebound[id(wrapper)] = original

    def _wrapper(self, owner: Any, name: str, original: Any, what: str) -> Any:
        """The wrapper of ``original``: made once, and again only when something else
        replaced the function since."""
        made = self._made.get((id(owner), name))
        if made is None or made[0] is not original:
            made = self._made[(id(owner), name)] = (original, _wrap(original, what))
        return made[1]

    def _uninstall(self) -> None:
        self._installed = False
        for owner, name, original, own in reversed(self._saved):
            if own:
                setattr(owner, name, original)
            else:
                delattr(owner, name)
        self._saved.clear()
        self._replacements.clear()
        self._rebound.clear()

    def _rebind(self, modules: tuple[str, ...]) -> None:
        """Point the agent's own names for the wrapped functions at the wrappers."""
        for namespace in _namespaces(modules):
            for name, value in list(namespace.items()):
                replacement = self._replacements.get(id(value))
                if replacement is not None and replacement is not value:
                    namespace[name] = replacement

    def _restore_names(self, modules: tuple[str, ...]) -> None:
        """Point the agent's names back at what they were (also names bound while the
        guard was entered, which took the wrappers)."""
        for namespace in _namespaces(modules):
            for name, value in list(namespace.items()):
                original = self._rebound.get(id(value))
                if original is not None:
                    namespace[name] = original


def _dt_original(guarded: Any) -> Any:
    """What a guarded stand-in of the ``datetime`` module stands for."""
    return _dt if isinstance(guarded, types.ModuleType) else guarded.__wrapped__


def _namespaces(modules: tuple[str, ...]) -> list[dict[str, Any]]:
    """The globals of every loaded module covered by ``modules``, never our own."""
    loaded = sys.modules
    key = (modules, len(loaded))
    names = _COVERED.get(key)
    if names is None:  # a scan of every loaded module: once per set of modules and imports
        prefixes = tuple(m + "." for m in modules)
        names = [
            name
            for name in list(loaded)
            if (name in modules or name.startswith(prefixes)) and not name.startswith(_OWN_PREFIX)
        ]
        _COVERED.clear()
        _COVERED[key] = names
    found = []
    for name in names:
        namespace = getattr(loaded.get(name), "__dict__", None)
        if isinstance(namespace, dict):
            found.append(namespace)
    return found


_COVERED: dict[tuple[tuple[str, ...], int], list[str]] = {}
"""The names of the loaded modules a set of modules covers, by the number loaded."""
_PATCHES = _Patches()


# Recording ----------------------------------------------------------------------------


def mode_from(value: str | None) -> NondeterminismMode:
    """The mode ``value`` names, or the one of ``BLACKBOX_RECORD_NONDETERMINISM`` when
    ``value`` is None (``off`` when that is unset).

    Raises:
        ValueError: the value is not ``off``, ``warn`` or ``fail``.
    """
    return watch_mode(value, variable=MODE_VARIABLE, default="off", option="nondeterminism")


def watch_mode(
    value: str | None, *, variable: str, default: NondeterminismMode, option: str
) -> NondeterminismMode:
    """What a recorder does about something it watches for (``off``, ``warn`` or
    ``fail``): ``value`` when given, else the environment ``variable``'s, else
    ``default``.

    Raises:
        ValueError: the value is not one of the three, naming the ``option`` or variable.
    """
    source = f"the {option} option"
    if value is None:
        value, source = os.environ.get(variable, default) or default, variable
    if value not in _MODES:
        raise ValueError(f"{source} is {value!r}; use one of {', '.join(_MODES)}")
    return value  # type: ignore[return-value]


def watch_recording(
    mode: NondeterminismMode, module: str | None = None
) -> Callable[[], None] | None:
    """Start watching the run the caller's code is starting, in ``mode``; returns what
    stops it (safe to call more than once), or None when there is nothing to watch.

    The agent's modules are the package of ``module`` (the entry's, when the recorder
    drives it), else of the code that started the run: the first caller outside this
    package. A run the project's own code starts (a fork) is not watched: its agent's
    code is not the starter.
    """
    if mode == "off":
        return None
    module = module or _caller_module()
    if module is None or (module.startswith("agent_blackbox.") and not _is_example(module)):
        return None
    on_read = _fail if mode == "fail" else _warn
    guard = NondeterminismGuard([agent_package(module)], on_read=on_read)
    guard.__enter__()
    once = threading.Lock()

    def stop() -> None:
        if once.acquire(blocking=False):  # the first caller stops it; never released
            guard.__exit__(None, None, None)

    return stop


def _caller_module() -> str | None:
    frame: FrameType | None = sys._getframe(1)
    while frame is not None:
        name = frame.f_globals.get("__name__")
        if isinstance(name, str) and not name.startswith(_OWN_PREFIX):
            return name
        frame = frame.f_back
    return None


def _is_example(module: str) -> bool:
    return module == _EXAMPLES or module.startswith(_EXAMPLES + ".")


def agent_package(module: str) -> str:
    """The agent's modules, judged from one of them: its package (the module itself
    when it is a package, top-level, or directly inside ``agent_blackbox``)."""
    loaded = sys.modules.get(module)
    if loaded is not None and hasattr(loaded, "__path__"):
        return module
    parent = module.rpartition(".")[0]
    return module if parent in ("", "agent_blackbox") else parent


def _warn(read: NondeterministicRead) -> None:
    warnings.warn_explicit(read.advice(), NondeterminismWarning, read.file, read.line)


def _fail(read: NondeterministicRead) -> None:
    raise UnrecordedNondeterminism(read.advice())
