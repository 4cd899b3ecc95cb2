"""The records the control API answers besides the status: runs, profiles, an action's answer.

Each is a frozen dataclass with `to_json` (the JSON of docs/api.md, unchanged) and a strict `from_json` (built by
`strict_fields`): a missing required field, a value of the wrong type, or an unknown kind raises `RecordError`
naming the record, the field and the value, never a silent default (silent defaults once let test fixtures use
event kinds no agent writes). A key this version does not know is ignored: a newer agent may add fields and an
older dashboard must still read its answers (the usual rule for readers; docs/contracts.md). Events are typed in
contract/events.py with the same rules.
"""

from __future__ import annotations

import dataclasses
import functools
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import Enum
from typing import Any


class RecordError(ValueError):
    """A JSON object that is not the record it should be; the message names the record, the field and the value."""

    def __init__(self, record: str, name: str, problem: str):
        super().__init__(f"{record}.{name}: {problem}" if name else f"{record}: {problem}")
        self.record = record
        self.field = name


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _accepts(hint: Any, value: Any) -> tuple[bool, Any]:
    """(whether `value` fits the annotation `hint`, the value as the field holds it: a list read as a tuple)."""
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        for arm in typing.get_args(hint):
            ok, v = _accepts(arm, value)
            if ok:
                return True, v
        return False, value
    if hint is Any:
        return True, value
    if hint is type(None):
        return value is None, value
    if isinstance(hint, type) and issubclass(hint, Enum):
        known = {m.value: m for m in hint}
        return (value in known, known.get(value, value)) if isinstance(value, str) else (False, value)
    if hint is bool:
        return isinstance(value, bool), value
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool), value
    if hint is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool), value
    if hint is str:
        return isinstance(value, str), value
    if origin is tuple or hint is tuple:
        if not isinstance(value, (list, tuple)):
            return False, value
        arm = (typing.get_args(hint) or (Any,))[0]
        checked = [_accepts(arm, x) for x in value]
        return all(ok for ok, _ in checked), tuple(v for _, v in checked)
    if origin is list or hint is list:
        arm = (typing.get_args(hint) or (Any,))[0]
        return isinstance(value, list) and all(_accepts(arm, x)[0] for x in value), value
    if origin is dict or hint is dict:
        return isinstance(value, Mapping), value
    return isinstance(value, hint), value


def _expected(hint: Any) -> str:
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        return " or ".join(_expected(a) for a in typing.get_args(hint))
    if hint is type(None):
        return "null"
    if isinstance(hint, type) and issubclass(hint, Enum):
        return "one of " + ", ".join(str(m.value) for m in hint)
    return {int: "an integer", float: "a number", str: "a string", bool: "true or false"}.get(
        hint, getattr(typing.get_origin(hint) or hint, "__name__", str(hint)))


def strict_fields(cls: type, d: Any, record: str | None = None) -> dict[str, Any]:
    """The keyword arguments of `cls` from the JSON object `d`, each field checked against its annotation.

    Required fields (no default) must be present; present ones must have their type (an enum's value must be one
    of its members); keys `cls` lacks are ignored (a newer writer's fields).
    """
    name = record or cls.__name__
    if not isinstance(d, Mapping):
        raise RecordError(name, "", f"must be a JSON object, not {type(d).__name__} {_short(d)}")
    hints = _hints(cls)
    kw: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        if not f.init:
            continue
        if f.name not in d:
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                raise RecordError(name, f.name, "missing (a required field)")
            continue
        ok, value = _accepts(hints[f.name], d[f.name])
        if not ok:
            raise RecordError(name, f.name, f"expected {_expected(hints[f.name])}, got {_short(d[f.name])}")
        kw[f.name] = value
    return kw


def read_list(cls: Any, items: Any, where: str) -> list[Any]:
    """`cls.from_json` of each object of a JSON list; an error names the item (`events[3].kind: ...`)."""
    if not isinstance(items, list):
        raise RecordError(where, "", f"must be a JSON list, not {type(items).__name__}")
    out = []
    for i, item in enumerate(items):
        try:
            out.append(cls.from_json(item))
        except RecordError as exc:
            raise RecordError(f"{where}[{i}]", exc.field, str(exc).split(": ", 1)[-1]) from None
    return out


@dataclass(frozen=True)
class RunInfo:
    """One run (one server start) as the store and `GET /v1/runs` give it; `summary` only from `StoreReader.run`."""

    id: int
    profile: str | None = None
    argv: list[str] | None = None
    model: str | None = None
    host: str | None = None
    started_ms: int | None = None
    pid: int | None = None
    pid_start_time: float | None = None
    log_path: str | None = None
    simulated: bool | None = None
    flags: dict[str, Any] | None = None  # secret values masked (store/reader.py)
    ready_ms: int | None = None
    vllm_version: str | None = None
    gpu_names: list[str] | None = None
    gpu_count: int | None = None
    ended_ms: int | None = None
    exit_code: int | None = None
    exit_signal: int | None = None
    end_reason: str | None = None
    summary: dict[str, Any] | None = None

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> RunInfo:
        return cls(**strict_fields(cls, d))

    def to_json(self) -> dict[str, Any]:
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        if self.summary is None:
            out.pop("summary")
        return out


@dataclass(frozen=True)
class ProfileInfo:
    """One configured profile as `GET /v1/profiles` lists it (the env's secret values masked by the agent)."""

    name: str
    description: str = ""
    argv: list[str] = field(default_factory=list)
    flags: dict[str, Any] = field(default_factory=dict)
    env: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> ProfileInfo:
        return cls(**strict_fields(cls, d))

    def to_json(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}


@dataclass(frozen=True)
class ProfileList:
    """`GET /v1/profiles`: the profiles and the one the supervisor runs or last ran (`current`)."""

    current: str | None = None
    profiles: tuple[ProfileInfo, ...] = ()

    @property
    def names(self) -> list[str]:
        return [p.name for p in self.profiles]

    def get(self, name: str | None) -> ProfileInfo | None:
        return next((p for p in self.profiles if p.name == name), None)

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> ProfileList:
        if not isinstance(d, Mapping):
            raise RecordError("ProfileList", "", f"must be a JSON object, not {type(d).__name__}")
        current = strict_fields(cls, {"current": d.get("current")}).get("current")
        return cls(current=current, profiles=tuple(read_list(ProfileInfo, d.get("profiles", []), "profiles")))

    def to_json(self) -> dict[str, Any]:
        return {"current": self.current, "profiles": [p.to_json() for p in self.profiles]}


@dataclass(frozen=True)
class ActionAnswer:
    """The 202 answer of a mutating call (POST /v1/start, stop, ...): accepted; progress shows in status/events."""

    accepted: bool
    action: str
    message: str

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> ActionAnswer:
        return cls(**strict_fields(cls, d))

    def to_json(self) -> dict[str, Any]:
        return {"accepted": self.accepted, "action": self.action, "message": self.message}
