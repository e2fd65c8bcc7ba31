"""The one scrubbing layer: no credential in any event, log, trace, error or file.

Every text this project writes out goes through :func:`scrub_secrets`: the session's and the
runner's error texts (:func:`fsm.core.text.safe_error_text`, :func:`safe_message`), each RPC
line (:func:`fsm.rpc.protocol.encode_line`), the session log, every log record of a command
(:class:`ScrubbingFilter` on its handlers, DEBUG included: ``httpcore`` dumps response headers
there, ``httpx`` logs the request URL at INFO), the fleet's ``coordinator_unavailable`` reason
and :class:`~fsm.RetryChainError`; an exception an integration re-raises to its
caller is scrubbed in place by :func:`scrub_exception` (its type and causes kept).

What is replaced by :data:`REDACTED`:

- every value listed by the caller (``secrets=``), and every value in the process's registry
  :data:`SECRETS` — what a command or a host was configured with: API keys (``--api-key``,
  ``OPENAI_API_KEY``, a credential store's keys), a Redis password, the credentials inside a
  ``--base-url`` (:func:`url_secrets`). A key of any shape is found by value, also stripped of
  surrounding whitespace, JSON-escaped and percent-encoded;
- without a list, the shapes that are credentials whatever they belong to: ``sk-…`` keys and
  ``Bearer …`` tokens that are long and hold a digit.

URLs are shown with :func:`redact_url`: the password of ``user:password@`` and the values of
credential-like query parameters (``?password=``, ``?key=``, ``?api-key=``, ``?token=``,
``?sig=``…) become ``***``.

Values shorter than :data:`MIN_SECRET_LENGTH` characters are never replaced by value (a
placeholder key ``"x"`` would redact every ``x``). Pure: no clock, file or network.
"""

from __future__ import annotations

import json
import logging
import threading
import urllib.parse
from collections.abc import Mapping
from dataclasses import fields, is_dataclass, replace
import re
from typing import Any, Iterable

__all__ = ["MIN_SECRET_LENGTH", "REDACTED", "SECRETS", "ScrubbingFilter", "SecretSet",
           "contains_secret", "redact_url", "register_secret", "register_url",
           "request_secrets", "scrub_exception", "scrub_secrets", "scrub_value", "url_secrets"]

REDACTED = "[redacted]"
"""What :func:`scrub_secrets` puts where a credential was."""

MIN_SECRET_LENGTH = 8
"""Secrets shorter than this are not replaced by value: a placeholder key such as ``"x"``
would otherwise redact every ``x`` of a text. Real API keys are 20 characters and more."""

URL_MASK = "***"
"""What :func:`redact_url` puts where a password or a credential parameter was."""

# Query parameters that carry a credential: their name holds one of these words
# (``key``, ``api_key``, ``api-key``, ``apikey``, ``access_token``, ``X-Amz-Signature``...).
_CREDENTIAL_PARAM_WORDS = ("key", "token", "secret", "auth", "sig", "password", "passwd",
                           "pwd", "pass", "credential", "session")

# Request headers that carry a credential (their value is a secret of the call).
_CREDENTIAL_HEADERS = ("authorization", "proxy-authorization", "x-api-key", "api-key",
                       "x-goog-api-key", "cookie")


def _forms(value: str) -> set[str]:
    """The spellings of a secret worth looking for: as given, stripped, JSON-escaped (a text
    that quotes it inside JSON), percent-encoded (a URL)."""
    out = set()
    for form in (value, value.strip()):
        if len(form) < MIN_SECRET_LENGTH:
            continue
        out.add(form)
        escaped = json.dumps(form, ensure_ascii=True)[1:-1]
        if escaped != form:
            out.add(escaped)
        quoted = urllib.parse.quote(form, safe="")
        if quoted != form:
            out.add(quoted)
            out.add(urllib.parse.quote_plus(form, safe=""))
    return out


class SecretSet:
    """A thread-safe set of secret values, looked up longest first.

    ``add(*values)`` keeps each ``str`` of at least :data:`MIN_SECRET_LENGTH` characters (in
    the forms :func:`scrub_secrets` looks for); other values are ignored. At most
    ``max_values`` spellings are kept (the oldest are forgotten first: a host still passes its
    own keys as ``secrets=``). Reading (:attr:`values`) takes no lock.
    """

    def __init__(self, max_values: int = 4096) -> None:
        self._lock = threading.Lock()
        self._order: dict[str, None] = {}  # insertion order: the oldest is forgotten first
        self.max_values = max_values
        self.values: tuple[str, ...] = ()
        """The spellings, longest first (a secret that contains another leaves no fragment)."""

    def add(self, *values: Any) -> None:
        new: dict[str, None] = {}  # in the order given: the oldest is forgotten first
        for value in values:
            if isinstance(value, str):
                new.update(dict.fromkeys(sorted(_forms(value))))
        for known in [form for form in new if form in self._order]:
            del new[known]
        if not new:
            return
        with self._lock:
            for form in new:
                self._order[form] = None
            while len(self._order) > self.max_values:
                del self._order[next(iter(self._order))]
            self.values = tuple(sorted(self._order, key=len, reverse=True))

    def add_url(self, url: Any) -> None:
        """Add the credentials inside ``url`` (:func:`url_secrets`)."""
        self.add(*url_secrets(url))

    def clear(self) -> None:
        with self._lock:
            self._order.clear()
            self.values = ()

    def __contains__(self, value: object) -> bool:
        return value in self._order

    def __len__(self) -> int:
        return len(self._order)


SECRETS = SecretSet()
"""The process's registry: what its commands and hosts were configured with. Every
:func:`scrub_secrets` replaces these too. Add with :func:`register_secret` /
:func:`register_url`."""


def register_secret(*values: Any) -> None:
    """Add ``values`` (API keys, passwords) to :data:`SECRETS`; non-strings and values shorter
    than :data:`MIN_SECRET_LENGTH` are ignored."""
    SECRETS.add(*values)


def register_url(url: Any) -> None:
    """Add the credentials inside ``url`` (a ``--base-url``, a Redis URL) to :data:`SECRETS`."""
    SECRETS.add_url(url)


# Shapes of credentials that need no list of secrets: an OpenAI/Anthropic-style key
# (``sk-…``, ``sk-proj-…``, ``sk-ant-api03-…``) and the value of a bearer token. Both must hold
# a digit and be long, so words ("sk-learn", "Bearer tokens", "bearer authentication") stay.
# Each pattern starts with a literal, so the regex engine skips ahead to it: linear and fast
# even on a 10 MB body. The character before the match is checked in Python.
_KEY_SHAPE = re.compile(r"sk-[A-Za-z0-9_-]{16,}")
_URL_IN_TEXT = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://[^\s'\"<>]+")


def _scrub_url(m: re.Match[str]) -> str:
    url = m.group(0)
    for value in sorted(url_secrets(url), key=len, reverse=True):
        url = url.replace(value, REDACTED)
    return url
_BEARER_SHAPES = tuple(re.compile(word + r"(\s+)([A-Za-z0-9._~+/=-]{12,})")
                       for word in ("Bearer", "bearer", "BEARER"))
_ASCII_DIGIT = re.compile(r"[0-9]")
_KEY_CHARS = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-"
_ALNUM = _KEY_CHARS[:-2]


def _looks_random(token: str) -> bool:
    return _ASCII_DIGIT.search(token) is not None


def _starts_a_word(text: str, start: int, word_chars: str) -> bool:
    return start == 0 or text[start - 1] not in word_chars


def _listed(secrets: Iterable[Any]) -> list[str]:
    listed: set[str] = set()
    for secret in secrets:
        if isinstance(secret, str) and len(secret.strip()) >= MIN_SECRET_LENGTH:
            listed |= _forms(secret)
    return sorted(listed, key=len, reverse=True)


def scrub_secrets(text: str, secrets: Iterable[str | None] = ()) -> str:
    """``text`` with every credential replaced by :data:`REDACTED`.

    Replaced: every occurrence of each string of ``secrets`` and of :data:`SECRETS` that has
    at least :data:`MIN_SECRET_LENGTH` characters (also stripped of surrounding whitespace,
    JSON-escaped and percent-encoded); ``None`` and short entries are skipped. Also replaced
    without being listed: ``sk-`` keys of at least 16 more letters, digits, ``-`` or ``_``
    that hold a digit, the token after ``Bearer`` when it has at least 12 token characters
    and a digit (``"Bearer [redacted]"``), and the credentials inside any URL the text names
    (:func:`url_secrets`: ``user:password@``, ``?api_key=``...). Longer secrets are replaced first, so a secret that
    contains another leaves no fragment. Linear in the text per secret; the text itself is
    returned when nothing is replaced. ``TypeError`` when ``text`` is not a ``str``.
    """
    if not isinstance(text, str):
        raise TypeError(f"scrub_secrets expects a str, got {type(text).__name__}")
    values = SECRETS.values
    if secrets:
        listed = _listed(secrets)
        if listed:
            values = tuple(sorted(set(listed).union(values), key=len, reverse=True))
    for value in values:
        if value in text:
            text = text.replace(value, REDACTED)
    if "://" in text:
        text = _URL_IN_TEXT.sub(_scrub_url, text)
    if "sk-" in text:
        text = _KEY_SHAPE.sub(
            lambda m: REDACTED if _looks_random(m.group(0)) and _starts_a_word(m.string, m.start(), _KEY_CHARS)
            else m.group(0), text)
    for shape in _BEARER_SHAPES:
        if shape.pattern[:6] in text:
            text = shape.sub(
                lambda m: m.group(0)[:m.start(2) - m.start()] + REDACTED
                if _looks_random(m.group(2)) and _starts_a_word(m.string, m.start(), _ALNUM)
                else m.group(0), text)
    return text


def contains_secret(text: str, secrets: Iterable[str | None] = ()) -> bool:
    """Whether :func:`scrub_secrets` would change ``text`` (cheap when it would not)."""
    return scrub_secrets(text, secrets) != text


def scrub_value(value: Any, secrets: Iterable[str | None] = (), *, _depth: int = 0) -> Any:
    """``value`` with every string inside it scrubbed (:func:`scrub_secrets`): strings, the
    keys and values of mappings, the items of lists and tuples, the string fields of a frozen
    dataclass (an event, a message). Other values are returned as they are; so is ``value``
    itself (the same object) when nothing inside it changed. Nesting deeper than 100 levels
    is left as it is (JSON from outside is never that deep once parsed by this project)."""
    if isinstance(value, str):
        return scrub_secrets(value, secrets)
    if _depth > 100:
        return value
    secrets = secrets if isinstance(secrets, (tuple, list, set, frozenset)) else tuple(secrets)
    if isinstance(value, Mapping):
        out: dict[Any, Any] = {}
        changed = False
        for k, v in value.items():
            k2 = scrub_value(k, secrets, _depth=_depth + 1)
            v2 = scrub_value(v, secrets, _depth=_depth + 1)
            changed = changed or k2 is not k or v2 is not v
            out[k2] = v2
        return out if changed else value
    if isinstance(value, (list, tuple)):
        items = [scrub_value(v, secrets, _depth=_depth + 1) for v in value]
        if all(a is b for a, b in zip(items, value)):
            return value
        return type(value)(items) if type(value) in (list, tuple) else items
    if is_dataclass(value) and not isinstance(value, type):
        changes = {}
        for f in fields(value):
            if not f.init:
                continue
            old = getattr(value, f.name, None)
            new = scrub_value(old, secrets, _depth=_depth + 1)
            if new is not old:
                changes[f.name] = new
        return replace(value, **changes) if changes else value
    return value


# The C-level text fields of ``OSError`` (``str()`` reads them, not ``args``).
_OSERROR_TEXT = ("errno", "strerror", "filename", "filename2")
_MAX_CHAIN = 32


def scrub_exception(exc: BaseException, secrets: Iterable[str | None] = ()) -> BaseException:
    """``exc`` itself, its text scrubbed in place (:func:`scrub_secrets` with ``secrets``
    plus :data:`SECRETS`), before a host raises or re-raises it: the string items of its
    ``args`` (what ``str(exc)`` shows), its ``__notes__``, its string attributes (``message``
    of the SDKs' errors; ``strerror`` and ``filename`` of an ``OSError``), the strings inside
    its mapping, list and tuple attributes (``body``, the SDKs' parsed error body: a copy,
    set in place of the original when it held a credential), the body of its HTTP
    ``response`` once read (``exc.response.text``, ``.content``; an ``httpx``-shaped response,
    scrubbed in place), and the same for
    every exception on its ``__cause__`` / ``__context__`` chain and inside an exception group
    (at most 32 exceptions), so a printed traceback shows no credential either. The type, the
    traceback, the causes and every non-text attribute (``request``, ``response`` itself) are kept:
    ``except`` clauses and ``exc.__cause__`` work as before. Never raises (a field that
    cannot be set is left as it is)."""
    secrets = tuple(secrets)
    seen: set[int] = set()
    todo: list[BaseException] = [exc]
    while todo and len(seen) < _MAX_CHAIN:
        current = todo.pop()
        if id(current) in seen:
            continue
        seen.add(id(current))
        try:
            _scrub_fields(current, secrets)
        except Exception:  # noqa: BLE001 - a foreign exception: scrub what can be scrubbed
            pass
        todo += [e for e in (current.__context__, current.__cause__) if e is not None]
        todo += [e for e in getattr(current, "exceptions", ()) or ()
                 if isinstance(e, BaseException)]
    return exc


def _scrub_fields(exc: BaseException, secrets: tuple[str | None, ...]) -> None:
    args = scrub_value(exc.args, secrets)
    if args is not exc.args:
        exc.args = args
    notes = getattr(exc, "__notes__", None)
    if isinstance(notes, list):
        notes[:] = [scrub_secrets(n, secrets) if isinstance(n, str) else n for n in notes]
    if isinstance(exc, OSError):
        for name in _OSERROR_TEXT:
            value = getattr(exc, name, None)
            if isinstance(value, str):
                text = scrub_secrets(value, secrets)
                if text != value:
                    setattr(exc, name, text)
    for name, value in list(getattr(exc, "__dict__", {}).items()):
        if name.startswith("__"):
            continue
        if isinstance(value, str):
            clean: Any = scrub_secrets(value, secrets)
            changed = clean != value
        elif isinstance(value, (dict, list, tuple)):  # the SDKs' parsed error ``body``
            clean = scrub_value(value, secrets)
            changed = clean is not value
        else:
            _scrub_read_body(value, secrets)  # ``response``: the HTTP response, body and all
            continue
        if changed:
            try:
                setattr(exc, name, clean)
            except Exception:  # noqa: BLE001 - a read-only property: leave it
                pass


def _scrub_read_body(response: Any, secrets: tuple[str | None, ...]) -> None:
    """Scrub, in place, the body of an HTTP response already read (duck-typed: an ``httpx`` or
    ``httpx2`` ``Response``, whose ``content`` is its ``_content`` bytes and whose ``text`` is
    cached in ``_text``): what ``exc.response.text`` / ``.content`` / ``.json()`` show. A body
    not read, not text in its ``encoding`` (else UTF-8), or any other object: left as it is."""
    content = getattr(response, "_content", None)
    if not isinstance(content, bytes) or not hasattr(response, "status_code"):
        return
    encoding = getattr(response, "encoding", None) or "utf-8"
    try:
        text = content.decode(encoding)
    except (LookupError, UnicodeDecodeError, TypeError):
        return
    clean = scrub_secrets(text, secrets)
    if clean == text:
        return
    response._content = clean.encode(encoding, errors="replace")
    if isinstance(getattr(response, "_text", None), str):
        response._text = clean


def _credential_param(name: str) -> bool:
    lowered = name.lower()
    return any(word in lowered for word in _CREDENTIAL_PARAM_WORDS)


def _split(url: str) -> urllib.parse.SplitResult | None:
    try:
        return urllib.parse.urlsplit(url)
    except ValueError:
        return None


def url_secrets(url: Any) -> tuple[str, ...]:
    """The credentials inside ``url``: the password of ``user:password@`` (and the user name
    when it stands alone, ``https://KEY@host``) and the values of credential-like query
    parameters (``?password=``, ``?key=``, ``?api_key=``, ``?token=``, ``?sig=``...), both as
    written and decoded. ``()`` for anything else, a non-string included."""
    if not isinstance(url, str) or not url:
        return ()
    out: list[str] = []
    parts = _split(url)
    netloc = parts.netloc if parts is not None else ""
    query = parts.query if parts is not None else url.partition("?")[2]
    if "@" in netloc:
        userinfo = netloc.rpartition("@")[0]
        user, colon, password = userinfo.partition(":")
        for raw in ((password,) if colon else (user,)):
            if raw:
                out += [raw, urllib.parse.unquote(raw)]
    for piece in re.split(r"[&;]", query.partition("#")[0]):
        name, eq, raw = piece.partition("=")
        if eq and raw and _credential_param(urllib.parse.unquote_plus(name)):
            out += [raw, urllib.parse.unquote_plus(raw)]
    return tuple(dict.fromkeys(v for v in out if v))


def redact_url(url: str) -> str:
    """``url`` safe to show: the password of ``user:password@`` (a lone ``KEY@`` user name
    too) and the value of every credential-like query parameter replaced by ``***``;
    everything else (scheme, host, port, path, other parameters) kept as written. A text that
    does not parse as a URL gets the same treatment by pattern. ``TypeError`` for a
    non-string."""
    if not isinstance(url, str):
        raise TypeError(f"redact_url expects a str, got {type(url).__name__}")
    # the user information runs to the last "@" before the path (as urllib.parse splits it):
    # a password holding an "@" is masked whole (``u:p@ss@host`` showed ``ss`` before); a
    # text without a scheme (``user:password@host:port``) is masked from its start
    out = re.sub(r"(^|//)([^:/@?#\s]*:)[^/?#\s]*@", r"\1\2" + URL_MASK + "@", url)
    out = re.sub(r"(//)([^:/?#\s]+)@", lambda m: m.group(1) + URL_MASK + "@", out)

    def param(m: re.Match[str]) -> str:
        name = m.group(2)
        return m.group(0) if not _credential_param(urllib.parse.unquote_plus(name)) else (
            f"{m.group(1)}{name}={URL_MASK}")
    return re.sub(r"([?&;])([^=&;#\s]+)=([^&;#\s]*)", param, out)


def _attr(obj: Any, name: str) -> Any:
    """``obj.name``, or None when it is missing or its property raises (``httpx`` errors raise
    ``RuntimeError`` for a ``request`` that was never set)."""
    if obj is None:
        return None
    try:
        return getattr(obj, name, None)
    except Exception:  # noqa: BLE001 - a foreign object's property
        return None


def request_secrets(exc: BaseException | None) -> tuple[str, ...]:
    """The credentials an exception's request carried: the values of its ``authorization``
    (the token after the scheme too), ``x-api-key``, ``api-key``, ``x-goog-api-key`` and
    ``cookie`` headers and the credentials in its URL. Read duck-typed from ``exc.request``
    and ``exc.response.request`` (what ``openai``, ``anthropic``, ``httpx`` errors carry),
    along the chain of causes; ``()`` when there is none. Never raises."""
    out: list[str] = []
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen and len(seen) < 16:
        seen.add(id(exc))
        for request in (_attr(exc, "request"), _attr(_attr(exc, "response"), "request")):
            if request is None:
                continue
            try:
                headers = getattr(request, "headers", None)
                if headers is not None:
                    for name in _CREDENTIAL_HEADERS:
                        value = headers.get(name)
                        if isinstance(value, bytes):
                            value = value.decode("latin-1")
                        if isinstance(value, str) and value:
                            out.append(value)
                            scheme, _, token = value.partition(" ")
                            if token:
                                out.append(token.strip())
                out.extend(url_secrets(str(getattr(request, "url", "") or "")))
            except Exception:  # a foreign object: take what could be read
                continue
        exc = exc.__cause__ or exc.__context__
    return tuple(dict.fromkeys(out))


class ScrubbingFilter(logging.Filter):
    """A logging filter that scrubs every record it passes: the formatted message, the
    exception text and the stack, with :func:`scrub_secrets` (``secrets`` plus
    :data:`SECRETS`), each clipped to ``limit_bytes`` (a 100 MB exception text is not copied
    to stderr). Put it on the handlers, not on a logger: a logger's filter does not see the
    records of its children (``httpcore``, ``httpx``, ``openai``). Never drops a record."""

    def __init__(self, secrets: Iterable[str] = (), limit_bytes: int = 65536) -> None:
        super().__init__()
        self.secrets = tuple(secrets)
        self.limit_bytes = limit_bytes

    def _safe(self, text: str) -> str:
        from fsm.core.text import safe_error_text
        return safe_error_text(text, self.secrets, self.limit_bytes)

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except Exception:  # a bad format string: keep the template, drop the arguments
            message = f"{record.msg} (arguments not shown: they did not fit the message)"
        record.msg, record.args = self._safe(str(message)), None
        if record.exc_info and not record.exc_text:
            record.exc_text = logging.Formatter().formatException(record.exc_info)
        if record.exc_text:
            record.exc_text = self._safe(record.exc_text)
        if record.stack_info:
            record.stack_info = self._safe(record.stack_info)
        return True
