"""What the ``rpc``, ``chat`` and ``demo`` commands share: the settings loader, the flags of a
session (where its log goes, the credential store), and one builder of a session with its log
and transition trace.

.. skip: next "a shape of a front end's start: args and provider are the front end's"

::

    settings = load_settings(args.settings, prog="fsm rpc")          # SettingsError when bad
    parts = open_session(provider, settings=settings, log_path=session_path(args, session_id),
                         trace_file=args.trace)                         # OSError when unwritable
    ...
    await parts.aclose()                                                # session, log, trace
"""

from __future__ import annotations

import argparse
import logging
import os
import re
import stat
import sys
import uuid
from dataclasses import dataclass
from pathlib import Path
from collections.abc import Mapping
from typing import Any, Callable

from fsm.host.session_files import SessionParts, file_kind as _kind, open_session

__all__ = [
    "InputFileError", "MAX_INPUT_BYTES", "check_input_file", "open_input", "read_input",
    "StartupError", "configure_logging", "load_host_options", "register_configured_secrets",
    "DEFAULT_SESSION_DIR", "SessionParts", "add_session_arguments", "load_coordinator",
    "load_credentials", "load_settings", "open_session", "session_path", "check_configured_api_key",
    "check_base_url", "output_file_problem", "write_output_file",
]

DEFAULT_SESSION_DIR = os.path.join(".fsm", "sessions")
"""Where session logs go by default, relative to the working folder (``--session-dir``)."""


MAX_INPUT_BYTES = 64 << 20
"""What a command reads of one input file at most (a script, a settings file's second look,
an old declaration): 64 MiB. Streams read line by line (traces, ``classify --jsonl``) are
bounded per line instead."""


class InputFileError(ValueError):
    """An input file a command refuses: not a regular file (a FIFO, a device, a folder, a
    socket), or larger than the bound. ``str()`` names the file and the problem."""


def open_input(path: str | os.PathLike, *, what: str = "input file") -> Any:
    """``path`` opened for reading in binary mode, or :class:`InputFileError` at once when it
    is not a regular file: the open never blocks (``O_NONBLOCK``: a FIFO without a writer
    would wait forever) and ``/dev/zero`` is refused before a byte is read. ``OSError`` when
    it cannot be opened (missing, no permission)."""
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)
    fd = os.open(path, flags)
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise InputFileError(f"{what} {os.fspath(path)} is {_kind(mode)}, not a file")
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def check_input_file(path: str | os.PathLike, *, what: str = "input file") -> None:
    """:class:`InputFileError` when ``path`` exists and is not a regular file (checked
    without blocking); a missing file is left to the reader's own message."""
    try:
        open_input(path, what=what).close()
    except FileNotFoundError:
        pass


def read_input(path: str | os.PathLike, *, what: str = "input file",
               limit_bytes: int = MAX_INPUT_BYTES) -> bytes:
    """The bytes of the regular file ``path``, at most ``limit_bytes``
    (:data:`MAX_INPUT_BYTES`): :class:`InputFileError` for a FIFO, a device, a folder or a
    bigger file, ``OSError`` when it cannot be read. ``"-"`` reads standard input, bounded
    the same way."""
    if os.fspath(path) == "-":
        data = sys.stdin.buffer.read(limit_bytes + 1)
    else:
        with open_input(path, what=what) as fh:
            data = fh.read(limit_bytes + 1)
    if len(data) > limit_bytes:
        raise InputFileError(f"{what} {os.fspath(path)} is larger than {limit_bytes} bytes")
    return data


def output_file_problem(path: str | os.PathLike, *, what: str) -> str | None:
    """Why the output file ``path`` cannot be written, checked before a command's work starts
    (without opening it: a FIFO without a reader would block): an existing FIFO, device,
    folder or socket (``/dev/full`` is refused here, not after the work), a missing folder,
    no permission. None when it can be written. ``what`` names it (``"--json"``)."""
    path = os.fspath(path)
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        mode = None
    except OSError as exc:
        return f"{what} {path}: {exc.strerror or exc}"
    if mode is not None and not stat.S_ISREG(mode):
        return f"{what} {path} is {_kind(mode)}, not a file"
    parent = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(parent):
        return f"{what} {path}: the folder {parent} does not exist"
    if (mode is not None and not os.access(path, os.W_OK)) or (mode is None and not os.access(parent, os.W_OK)):
        return f"{what} {path} cannot be written (permission denied)"
    return None


def write_output_file(path: str | os.PathLike, text: str) -> None:
    """Write ``text`` (UTF-8) to ``path`` whole or not at all: into a temporary file beside it,
    then renamed over it, so a full disk or any other write error leaves neither a partial
    file nor a temporary one (and an older ``path`` untouched). The file gets the mode a new
    file would (or the old file's). Raises ``OSError`` (say ``ENOSPC``) after cleaning up."""
    import tempfile

    target = os.path.realpath(os.fspath(path))
    try:
        mode = stat.S_IMODE(os.stat(target).st_mode)
    except FileNotFoundError:
        umask = os.umask(0)
        os.umask(umask)
        mode = 0o666 & ~umask
    fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(target)}.", suffix=".tmp",
                               dir=os.path.dirname(target))
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
        os.chmod(tmp, mode)
        os.replace(tmp, target)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def _clip(text: str, limit: int) -> str:
    """``text`` cut to ``limit`` characters (a 50 MB key is named, not copied to stderr)."""
    return text if len(text) <= limit else text[:limit - 1] + "…"


def load_settings(path: str | None, *, prog: str,
                  warn: Callable[[str], Any] | None = None):  # -> RetrySettings
    """The retry settings of ``path`` (the defaults when None), for every command.

    Warnings (the original's own keys inside ``retry``) and the top-level keys this project does
    not use (pi's settings file carries many) are reported through ``warn`` as one line
    each, prefixed ``"<prog>: settings <path>: "`` (default: printed to stderr). A file with no
    ``retry`` group gives the defaults. Raises :class:`~fsm.core.settings.SettingsError` naming
    the key and value, or the file, when it is bad (an unknown key at any depth, a near-miss of
    the ``retry`` group: :meth:`~fsm.core.settings.RetrySettings.from_json`).
    """
    import warnings

    from fsm.core.settings import RetrySettings, SettingsError
    from fsm.host.settings_file import load_settings as load_settings_file

    if path is None:
        return RetrySettings()
    if warn is None:
        def warn(line: str) -> None:
            print(line, file=sys.stderr, flush=True)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            # a file shared with other programs may have no retry group: the defaults
            settings = load_settings_file(path, RetrySettings, require_retry=False)
        except RecursionError:
            raise SettingsError("", path, "a settings file, not JSON nested this deeply") from None
    for w in caught:  # the original's own keys; other programs' groups (RetrySettings.from_json)
        warn(f"{prog}: settings {path}: {_clip(str(w.message), 300)}")
    return settings


def add_session_arguments(p: argparse.ArgumentParser) -> None:
    """``--session-dir DIR`` / ``--session-file PATH`` / ``--no-session``, ``--credentials FILE``,
    ``--redis URL`` and ``--trace FILE`` (the flags of :func:`open_session`)."""
    where = p.add_mutually_exclusive_group()
    where.add_argument("--session-dir", default=None, metavar="DIR",
                       help="write the session log to DIR/<session id>.jsonl "
                            f"(default: {DEFAULT_SESSION_DIR} under the working folder)")
    where.add_argument("--session-file", default=None, metavar="PATH",
                       help="append the session log to PATH instead ('{id}' is replaced by the "
                            "session id)")
    where.add_argument("--no-session", action="store_true", help="do not write a session log")
    p.add_argument("--credentials", default=None, metavar="FILE",
                   help="JSON-file credential store ({\"providers\": {NAME: {\"keys\": [...]}}}, "
                        "NAME as --provider): a usage limit blocks the key in use and the next "
                        "one is tried; shared safely by concurrent processes")
    p.add_argument("--redis", default=None, metavar="URL",
                   help="share cooldowns, the retry budget and the pacer with other sessions through this "
                        "coordinator (redis://HOST:PORT/DB for one Redis, "
                        "redis+cluster://HOST:PORT,HOST:PORT for a Redis Cluster, or memory: for "
                        "this process only; see docs/fleet.md); default: none")
    p.add_argument("--trace", default=None, metavar="FILE",
                   help="write the retry machine's transition trace here (python -m fsm audit FILE)")


def session_path(args: argparse.Namespace, session_id: str) -> Path | None:
    """Where the session log of ``args`` goes (None with ``--no-session``)."""
    if getattr(args, "no_session", False):
        return None
    if getattr(args, "session_file", None):
        return Path(args.session_file.replace("{id}", session_id))
    return Path(getattr(args, "session_dir", None) or DEFAULT_SESSION_DIR) / f"{session_id}.jsonl"


def load_credentials(path: str | None):  # -> CredentialStore | None
    """The credential store of ``--credentials FILE`` (None without the flag).

    Raises ``ValueError`` naming the file when it is not a valid store, ``OSError`` when it
    cannot be created or read.
    """
    if path is None:
        return None
    from fsm.host.credentials import JsonFileCredentialStore
    return JsonFileCredentialStore(path)


def load_coordinator(url: str | None):  # -> Coordinator | None
    """The shared coordinator of ``--redis URL`` (None without the flag), built by
    :func:`fsm.fleet.coordinator_from_url`. Raises ``ValueError`` naming the URL (its password
    hidden) when it is not one."""
    if url is None:
        return None
    from fsm.fleet import coordinator_from_url
    return coordinator_from_url(url)


def configure_logging(level: int | str, fmt: str, *, stream: Any = None) -> None:
    """Send log records of ``level`` and above to ``stream`` (default stderr) in ``fmt``, as
    ``logging.basicConfig`` does (a root logger that has handlers already keeps them), and put
    every handler of the root logger behind the scrubbing layer
    (:class:`fsm.core.redact.ScrubbingFilter`: registered secrets and key shapes become
    ``[redacted]``, DEBUG's header dumps included, each record clipped to 64 KiB)."""
    from fsm.core.redact import ScrubbingFilter
    logging.basicConfig(stream=sys.stderr if stream is None else stream, level=level, format=fmt)
    for handler in logging.getLogger().handlers:
        if not any(isinstance(f, ScrubbingFilter) for f in handler.filters):
            handler.addFilter(ScrubbingFilter())


def register_configured_secrets(args: argparse.Namespace,
                                environ: Any = None) -> None:
    """Add what a command was configured with to the process's secrets
    (:data:`fsm.core.redact.SECRETS`), so that no output shows them: ``--api-key``, the
    provider's key variables, the credentials inside ``--base-url`` / ``OPENAI_BASE_URL`` and
    ``--redis`` (``user:password@``, ``?password=``, ``?key=``...)."""
    from fsm.core.redact import register_secret, register_url
    environ = os.environ if environ is None else environ
    register_secret(getattr(args, "api_key", None), environ.get("OPENAI_API_KEY"),
                    environ.get("ANTHROPIC_API_KEY"))
    for url in (getattr(args, "base_url", None), environ.get("OPENAI_BASE_URL"),
                environ.get("ANTHROPIC_BASE_URL"), getattr(args, "redis", None)):
        register_url(url)


class StartupError(ValueError):
    """A command-line option a host cannot start with; ``str()`` is the message to print."""


def load_host_options(args: argparse.Namespace, *, prog: str) -> tuple[Any, Any, Any]:
    """The checks and loads that ``rpc`` and ``chat`` share, in order: the configured API key
    (refused without echoing it), ``--base-url``, ``--settings``, ``--redis`` and
    ``--credentials`` (last: it may create the store's file and lock, so nothing is created
    when another option is refused).

    Returns ``(settings, credentials, coordinator)``; raises :class:`StartupError` naming the
    option and the problem (nothing is left half-opened).
    """
    from fsm.core.settings import SettingsError
    from fsm.core.text import ApiKeyError
    register_configured_secrets(args)
    try:  # a key that cannot go into a header would leak into every error text
        check_configured_api_key(args.api_key)
    except ApiKeyError as exc:
        raise StartupError(str(exc)) from None
    check_base_url(getattr(args, "base_url", None))
    try:
        settings = load_settings(args.settings, prog=prog)
    except SettingsError as exc:
        raise StartupError(f"bad settings file {args.settings}: {exc}") from None
    try:  # before the credential store, which may create its file and lock
        coordinator = load_coordinator(args.redis)
    except (OSError, ValueError, ImportError) as exc:
        raise StartupError(f"bad --redis: {_without_userinfo(str(exc), args.redis)}") from None
    try:
        credentials = load_credentials(args.credentials)
    except (OSError, ValueError) as exc:
        raise StartupError(f"bad credentials file {args.credentials}: {exc}") from None
    return settings, credentials, coordinator


def check_base_url(url: str | None) -> None:
    """:class:`StartupError` naming ``--base-url`` (its credentials hidden) unless it is None or
    an ``http://`` / ``https://`` URL with a host and, if any, a port 0..65535 (``http://[::1``
    would otherwise end in the URL parser's traceback)."""
    if url is None:
        return
    from urllib.parse import urlsplit

    from fsm.core.redact import redact_url
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - raises ValueError for a port that is not one
        problem = ("expected an http:// or https:// URL" if parts.scheme not in ("http", "https")
                   else "no host" if not parts.hostname else None)
    except ValueError as exc:
        problem = str(exc)
    if problem:
        raise StartupError(f"bad --base-url {_clip(redact_url(url), 200)!r}: {problem}")


def _without_userinfo(text: str, url: Any) -> str:
    """``text`` (a URL parser's error) without any piece of ``url``'s user information: a
    password holding an unencoded ``#``, ``?`` or ``/`` is split there by the parsers, so the
    scrubbing layer cannot recognise it and a fragment ("Port could not be cast to integer
    value as 's3cr3t'") would be printed. Every piece between those characters is replaced,
    however short; a hint to percent-encode follows when that happened."""
    if not isinstance(url, str) or "://" not in url or "@" not in url:
        return text
    userinfo = url.split("://", 1)[1].rpartition("@")[0]
    pieces = sorted({p for p in re.split(r"[:#?/@]", userinfo) if p}, key=len, reverse=True)
    hidden = text
    for piece in pieces:
        hidden = hidden.replace(piece, "[redacted]")
    if hidden != text or any(c in userinfo for c in "#?/"):
        hidden += " (a password with '#', '?' or '/' must be percent-encoded in the URL: %23, %3F, %2F)"
    return hidden


def check_configured_api_key(cli_value: str | None, *, flag: str = "--api-key",
                             env_name: str = "OPENAI_API_KEY",
                             environ: Mapping[str, str] | None = None) -> None:
    """The start-up check of a command that takes ``--api-key`` or an environment variable.

    Checks (:func:`check_api_key`) the key the provider will use: ``cli_value`` when given
    (named ``flag``), else a non-empty ``environ[env_name]`` (default ``os.environ``; an empty
    variable is ignored, as the provider ignores it). Raises :class:`ApiKeyError` naming the
    source and the problem, never the key; print ``str(exc)`` and exit 2.
    """
    from fsm.core.text import check_api_key
    if cli_value is not None:
        check_api_key(cli_value, flag)
        return
    value = (os.environ if environ is None else environ).get(env_name)
    if value:
        check_api_key(value, env_name)
