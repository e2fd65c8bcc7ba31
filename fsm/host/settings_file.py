"""Reading a settings file: the shell's side of :class:`~fsm.core.settings.RetrySettings`.

The core reads no file (``docs/architecture.md``); :func:`load_settings` reads and parses one
and hands the JSON to :meth:`RetrySettings.from_json`; it is also the top-level
``fsm.load_settings(path)``.

Refused (``docs/policy.md`` §8b.10), each with a :class:`~fsm.core.settings.SettingsError`
naming the path or the key: a path that is not a regular file (a FIFO, a device such as
``/dev/zero``, a folder), a file over :data:`MAX_SETTINGS_BYTES`, text that is not UTF-8 JSON,
JSON nested too deeply, a key given twice in one object (``{"maxRetries": -5, "maxRetries": 1}``
would otherwise load as 1; the error names the key) and, through the value checks, an integer
too long to convert (named by its key).
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Any

from fsm.core.settings import RetrySettings, SettingsError

__all__ = ["MAX_SETTINGS_BYTES", "load_settings", "read_settings_file"]


def load_settings(path: str | Path, cls: type[RetrySettings] = RetrySettings) -> RetrySettings:
    """The :class:`RetrySettings` of the settings file at ``path`` (``cls`` for a subclass).
    Raises :class:`SettingsError` as the module docstring says."""
    return cls.from_json(read_settings_file(path))


def read_settings_file(path: str | Path) -> Any:
    """The parsed JSON of the settings file at ``path`` (integers too long to convert stand as
    placeholders the value checks name). Raises :class:`SettingsError` for a file refused."""
    return _parse_settings(path, _read_settings_file(path))


MAX_SETTINGS_BYTES = 1 << 20
"""The largest settings file :func:`load_settings` reads, in bytes (1 MiB)."""

_MAX_INT_DIGITS = 4300  # Python's default int/str conversion limit (sys.get_int_max_str_digits)


class _HugeInt:
    """Stands for a JSON integer too long to convert, so the value check names its key."""

    __slots__ = ("digits",)

    def __init__(self, digits: int) -> None:
        self.digits = digits

    def __repr__(self) -> str:
        return f"<an integer of {self.digits} digits>"


def _parse_int(text: str) -> int | _HugeInt:
    digits = len(text.lstrip("-"))
    return int(text) if digits <= _MAX_INT_DIGITS else _HugeInt(digits)


class _Object(dict):
    """A JSON object that remembers the keys it was given more than once."""

    __slots__ = ("duplicates",)


def _object_pairs(pairs: list[tuple[str, Any]]) -> _Object:
    obj = _Object()
    obj.duplicates = []
    for key, value in pairs:
        if key in obj and key not in obj.duplicates:
            obj.duplicates.append(key)
        obj[key] = value
    return obj


def _first_duplicate(data: Any) -> str | None:
    """The dotted path of the first key given twice, e.g. ``retry.maxRetries``."""
    stack: list[tuple[Any, str]] = [(data, "")]
    while stack:
        value, path = stack.pop()
        if isinstance(value, _Object):
            if value.duplicates:
                return path + value.duplicates[0]
            stack.extend((v, f"{path}{k}.") for k, v in reversed(list(value.items())))
        elif isinstance(value, list):
            stack.extend((v, path) for v in reversed(value))
    return None


def _read_settings_file(path: str | Path) -> bytes:
    """The bytes of a regular file of at most MAX_SETTINGS_BYTES, without ever blocking on it."""
    def refuse(why: str) -> SettingsError:
        return SettingsError("", str(path), f"a readable settings file ({why})")

    try:
        # O_NONBLOCK: opening a FIFO must not wait for a writer; it is refused just below.
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        raise refuse(f"cannot open it: {exc.strerror or exc}") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            kind = ("a folder" if stat.S_ISDIR(info.st_mode) else "a FIFO" if stat.S_ISFIFO(info.st_mode)
                    else "a device" if stat.S_ISCHR(info.st_mode) or stat.S_ISBLK(info.st_mode)
                    else "a socket" if stat.S_ISSOCK(info.st_mode) else "not a file")
            raise refuse(f"it is {kind}, not a regular file")
        chunks, size = [], 0
        while size <= MAX_SETTINGS_BYTES:
            chunk = os.read(fd, MAX_SETTINGS_BYTES + 1 - size)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
    except OSError as exc:
        raise refuse(f"cannot read it: {exc.strerror or exc}") from None
    finally:
        os.close(fd)
    if size > MAX_SETTINGS_BYTES:
        raise refuse(f"larger than {MAX_SETTINGS_BYTES} bytes")
    return b"".join(chunks)


def _parse_settings(path: str | Path, raw: bytes) -> Any:
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise SettingsError("", str(path), f"a readable UTF-8 settings file ({exc})") from None
    try:
        data = json.loads(text, object_pairs_hook=_object_pairs, parse_int=_parse_int)
    except RecursionError:
        raise SettingsError("", str(path), "JSON that is not nested too deeply") from None
    except ValueError as exc:
        raise SettingsError("", str(path), f"valid JSON ({exc})") from None
    duplicate = _first_duplicate(data)
    if duplicate is not None:
        raise SettingsError("", str(path), f"each key once per object, but {duplicate!r} is given "
                                           "more than once (which value is meant?)")
    return data
