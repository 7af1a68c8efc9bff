"""One setting and how it is read: from the first of three layers with a value, a flag of the
command line (`use_flag`), the environment variable, the default; parsed when it is read,
a bad value a UsageError naming the variable. `Catalog` declares settings by kind (number,
size, flag, ...); orchestrator/settings.py holds every one (see there why not pydantic)."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any, Generic, Literal, TypeVar

from orchestrator.errors import UsageError

T = TypeVar("T")
Source = Literal["default", "environment", "flag"]
"""Where a value came from (`orchestrator config` shows it)."""
FLAG_ON = ("1", "true", "yes", "on")
FLAG_OFF = ("0", "false", "no", "off")
_SIZE_UNITS = {"": 1, "b": 1, "k": 1024, "m": 1024**2, "g": 1024**3, "t": 1024**4}


class Setting(Generic[T]):
    """One variable: its `name`; `kind`, what a value is, in words (the docs' type column and
    the error's "must be ..."; `short`, when the docs say it shorter); its `default` (as the
    docs word it: `shown`, when it is worked out on this machine by `compute`, when read);
    its `doc`; and `parse`, which turns its text into the value (ValueError: not a valid
    one). A plain class, not a dataclass: the model is built at every import."""

    __slots__ = ("compute", "default", "doc", "kind", "name", "parse", "section", "short", "shown")

    def __init__(
        self, name: str, kind: str, default: T, doc: str, parse: Callable[[str], T], *,
        shown: str = "", short: str = "", compute: Callable[[], T] | None = None,
    ) -> None:  # fmt: skip
        self.name, self.kind, self.default, self.doc, self.parse = name, kind, default, doc, parse
        self.shown, self.short, self.compute = shown, short, compute
        self.section = ""

    def __repr__(self) -> str:
        return f"Setting({self.name!r})"

    def given(self) -> tuple[str, Source, str]:
        """The text of the first layer holding one ("" when none does: the default), that
        layer, and the flag that gave it ("" unless a flag did). Blank text is unset."""
        if self.name in _flags:
            raw, flag = _flags[self.name]
            return raw, "flag", flag
        raw = os.environ.get(self.name, "").strip()
        return raw, ("environment" if raw else "default"), ""

    def get(self) -> T:
        """The value now: read at each call, so a change at run time counts at once, and a
        bad value fails only what reads it."""
        raw, _, _ = self.given()
        if not raw:
            return self.compute() if self.compute is not None else self.default
        try:
            return self.parse(raw)
        except ValueError:
            raise self.refused(self.kind) from None

    def refused(self, want: str) -> UsageError:
        """The error saying this setting's value must be `want` (also for a caller's own
        check, such as a bound that depends on another setting)."""
        return UsageError(f"{self.name} must be {want}, got {self.given()[0]!r}")


_flags: dict[str, tuple[str, str]] = {}
"""What flags gave this process, by variable: (text, flag)."""


def use_flag(setting: Setting[Any], raw: str, flag: str) -> None:
    """Let `setting` take `raw`, given on the command line as `flag`, over its variable, for
    the rest of this process ("" : its default, whatever the variable says)."""
    _flags[setting.name] = (raw.strip(), flag)


def clear_flags() -> None:
    """Forget every flag's value: the variables and defaults count again."""
    _flags.clear()


def child_environ() -> dict[str, str]:
    """The environment for a process of ours (a guardian): this one's, each flag's value in
    place of its variable, so that it works with what this process works with."""
    env = dict(os.environ)
    for name, (raw, _) in _flags.items():
        if raw:
            env[name] = raw
        else:
            env.pop(name, None)
    return env


def checked(parse: Callable[[str], T], valid: Callable[[T], bool]) -> Callable[[str], T]:
    """`parse`, refusing (ValueError) a value that is not `valid`."""

    def check(raw: str) -> T:
        value = parse(raw)
        if not valid(value):
            raise ValueError(raw)
        return value

    return check


def size_bytes(raw: str) -> int:
    """A positive size in bytes, written as 512m, 2g, 1.5G or 1048576."""
    unit = raw[-1].lower() if raw[-1].isalpha() else ""
    if unit not in _SIZE_UNITS:
        raise ValueError(raw)
    value = float(raw[: -1 if unit else None]) * _SIZE_UNITS[unit]
    if not 0 < value < 2**63:  # also inf and nan
        raise ValueError(raw)
    return int(value)


def items(raw: str, sep: str = ",") -> tuple[str, ...]:
    """The non-blank parts of a list, stripped."""
    return tuple(part.strip() for part in raw.split(sep) if part.strip())


class Catalog:
    """Settings declared by kind, in sections, in the order the docs list them."""

    def __init__(self) -> None:
        self.every: list[Setting[Any]] = []
        self.sections: dict[str, str] = {}
        """Each section's title, and what its settings are about."""

    def section(self, title: str, about: str) -> None:
        """The settings declared from now on are about `about`."""
        self.sections[title] = about

    def add(self, setting: Setting[T]) -> Setting[T]:
        """`setting`, in the current section."""
        setting.section = list(self.sections)[-1]
        self.every.append(setting)
        return setting

    def number(
        self, name: str, default: float, doc: str, *, unit: str = "seconds", **more: Any
    ) -> Setting[float]:
        ok = checked(float, lambda v: 0 < v < float("inf"))
        return self.add(Setting(name, f"a positive number of {unit}", default, doc, ok, **more))

    def whole(
        self, name: str, default: int, doc: str, *, unit: str = "bytes", low: int = 1,
        high: int = 2**63, **more: Any,
    ) -> Setting[int]:  # fmt: skip
        ok = checked(int, lambda v: low <= v <= high)
        kind = f"a whole number of {unit} ({low} to {high})"
        short = f"a whole number of {unit}" if high == 2**63 else ""
        return self.add(Setting(name, kind, default, doc, ok, short=short, **more))

    def size(self, name: str, default: int, doc: str, **more: Any) -> Setting[int]:
        kind = "a size like 512m, 16g or 1048576"
        return self.add(Setting(name, kind, default, doc, size_bytes, **more))

    def flag(self, name: str, default: bool, doc: str) -> Setting[bool]:
        kind = f"one of {', '.join(FLAG_ON)} (on) or {', '.join(FLAG_OFF)} (off)"
        ok = checked(str.lower, lambda v: v in FLAG_ON + FLAG_OFF)

        def on(raw: str) -> bool:
            return ok(raw) in FLAG_ON

        return self.add(Setting(name, kind, default, doc, on, short="on or off"))

    def choice(self, name: str, default: str, choices: tuple[str, ...], doc: str) -> Setting[str]:
        ok = checked(str, lambda v: v in choices)
        return self.add(Setting(name, f"one of {', '.join(choices)}", default, doc, ok))

    def text(self, name: str, kind: str, doc: str, *, default: str = "") -> Setting[str]:
        return self.add(Setting(name, kind, default, doc, str))

    def names(self, name: str, kind: str, doc: str) -> Setting[tuple[str, ...]]:
        return self.add(Setting(name, kind, (), doc, items))
