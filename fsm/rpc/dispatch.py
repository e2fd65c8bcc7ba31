"""RPC command dispatch: :class:`RpcServer` serves parsed commands on one agent session.

The answers have pi's shapes (so its own client works unchanged), with this
project's additions as extra fields only:

- ``get_state`` → :func:`session_state`: every key of pi's ``RpcSessionState`` with
  the same type (``model`` an object with ``id`` and ``provider``, ``thinkingLevel``,
  ``steeringMode``, ``followUpMode``, ``pendingMessageCount``, ...) plus ``autoRetryEnabled``,
  ``isRetrying``, ``retryAttempt``, ``retryState``, ``retrySettings`` (D8 in
  ``docs/policy.md``).
- ``get_messages`` → ``{"messages": [...]}``, the runtime context (what the next request
  carries: a failed attempt that was retried is not in it), as :func:`message_json`.
- ``steer`` / ``follow_up`` queue a message, busy or idle, and never start a turn: while busy
  it is delivered with the next turn (never shortening a backoff); while idle it waits for
  the next ``prompt``, which sends it first, in the same request (as the original does).
- ``retry_now`` ends a backoff at once; outside a backoff it is ignored (success, like
  ``abort_retry``).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Callable

from fsm.rpc.protocol import Command, CommandError, LineTooLong, parse_command, response

__all__ = ["RpcServer", "message_json", "session_state"]

log = logging.getLogger("fsm.rpc")


class RpcServer:
    """Serves the protocol's commands on ``session``, writing through ``output``.

    Events of the session are forwarded as they are emitted (synchronously, so they keep
    their order relative to responses). Call :meth:`handle` for each input line; it never
    raises for bad input and never waits for a turn, so ``get_state`` is answered at any time.
    """

    def __init__(self, session: Any, output: Any, *, session_file: str | Path | None = None,
                 base_url: str | None = None,
                 input_ended: Callable[[], bool] | None = None) -> None:
        self.session = session
        # Whether the client has closed its input (EOF read, or its writer hung up with lines
        # still unread): a prompt waiting behind an abort is then refused, not started.
        self._input_ended = input_ended or (lambda: False)
        self.output = output
        self.session_file = None if session_file is None else str(session_file)
        self.base_url = base_url
        self._tasks: set[Any] = set()
        self._control: Any = None  # the last abort (and prompts queued behind it)
        self._held: list[dict[str, Any]] = []  # events held back while a prompt is answered
        self._holding = 0
        self._answered: set[Any] = set()
        self._stopping = False  # set by shutdown(): prompts not started yet are refused
        self._unsubscribe = session.subscribe(self._on_event)

    def _on_event(self, event: dict[str, Any]) -> None:
        if self._holding:
            self._held.append(event)
        else:
            self.output.send(event)

    def _respond(self, cmd: Command, success: bool = True, *, data: Any = None,
                 error: str | None = None) -> None:
        self.output.send(response(cmd.type, success, data=data, error=error, id=cmd.id,
                                  has_id=cmd.has_id))

    def _spawn(self, coro: Any) -> Any:
        import asyncio
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._task_done)
        return task

    def _task_done(self, task: Any) -> None:
        self._tasks.discard(task)
        if task in self._answered:  # its failure went back to the client as the response
            self._answered.discard(task)
            return
        if not task.cancelled() and task.exception() is not None:
            exc = task.exception()
            log.error("background task failed: %s", exc, exc_info=exc)

    async def handle(self, line: bytes | LineTooLong) -> None:
        """Parse and serve one input line (bad input gets an error response)."""
        parsed = parse_command(line)
        if parsed is None:
            return
        if isinstance(parsed, CommandError):
            self.output.send(parsed.response())
            return
        try:
            await getattr(self, "_cmd_" + parsed.type)(parsed)
        except Exception as exc:  # a command must never take the server down
            log.exception("command %s failed", parsed.type)
            self._respond(parsed, False, error=f"{parsed.type} failed: {type(exc).__name__}: {exc}")

    async def _cmd_get_state(self, cmd: Command) -> None:
        self._respond(cmd, data=session_state(self.session, session_file=self.session_file,
                                              base_url=self.base_url))

    async def _cmd_get_messages(self, cmd: Command) -> None:
        provider = _provider_name(self.session)
        self._respond(cmd, data={"messages": [message_json(m, provider=provider, api=_api_name(self.session))
                                              for m in self.session.messages]})

    async def _cmd_get_last_assistant_text(self, cmd: Command) -> None:
        text = None
        for message in reversed(self.session.messages):
            if getattr(message, "role", None) == "assistant":
                text = message.text or None
                break
        self._respond(cmd, data={"text": text})

    async def _cmd_steer(self, cmd: Command) -> None:
        await self._queue_behind_abort(cmd, "steer", start=False)

    async def _cmd_follow_up(self, cmd: Command) -> None:
        await self._queue_behind_abort(cmd, "follow_up", start=False)

    async def _cmd_retry_now(self, cmd: Command) -> None:
        self.session.retry_now()
        self._respond(cmd)

    async def _cmd_set_auto_retry(self, cmd: Command) -> None:
        self.session.set_auto_retry_enabled(cmd.fields["enabled"])
        self._respond(cmd)

    async def _cmd_abort_retry(self, cmd: Command) -> None:
        self.session.abort_retry()
        self._respond(cmd)

    async def _cmd_abort(self, cmd: Command) -> None:
        # The response comes when the turn has stopped; other commands are served meanwhile,
        # and a prompt sent after the abort waits for it (see _cmd_prompt).
        previous = self._control

        async def run() -> None:
            await _settle(previous)
            try:
                await self.session.abort()
            except Exception as exc:
                log.exception("abort failed")
                self._respond(cmd, False, error=f"abort failed: {type(exc).__name__}: {exc}")
            else:
                self._respond(cmd)
        self._control = self._spawn(run())

    async def _cmd_prompt(self, cmd: Command) -> None:
        await self._queue_behind_abort(cmd, cmd.fields.get("streamingBehavior"))

    async def _queue_behind_abort(self, cmd: Command, behavior: str | None, *,
                                  start: bool = True) -> None:
        """Run a ``prompt`` (``start``) or queue a ``steer`` / ``follow_up`` message (never a
        turn of its own, busy or idle, as in the original), after an abort still in progress."""
        go = self._start_prompt if start else self._queue_message
        previous = self._control
        if previous is not None and not previous.done():
            async def run() -> None:
                await _settle(previous)
                if self._stopping or self._input_ended():
                    # The input ended (or SIGTERM) while this prompt waited for an abort: the
                    # client is gone, so no new turn (and no request to the model) is started.
                    self._respond(cmd, False, error=f"{cmd.type} not sent: the server is shutting down")
                    return
                await go(cmd, behavior)
            self._control = self._spawn(run())
            return
        await go(cmd, behavior)

    async def _queue_message(self, cmd: Command, behavior: str | None) -> None:
        try:
            self.session.queue_message(cmd.fields["message"], behavior or "follow_up")
        except (TypeError, ValueError) as exc:
            self._respond(cmd, False, error=str(exc))
        else:
            self._respond(cmd)

    async def _start_prompt(self, cmd: Command, behavior: str | None) -> None:
        import asyncio
        # One loop tick runs prompt() up to its first real wait: by then it has either refused
        # (busy, bad input), queued the message, or started the turn. The turn goes on in the
        # background; the response does not wait for it. As in pi, the response
        # comes before the turn's first events (agent_start, the user's message_end): they are
        # held back for that tick, in order, and written right after it.
        self._holding += 1
        try:
            task = self._spawn(self.session.prompt(cmd.fields["message"], streaming_behavior=behavior))
            await asyncio.sleep(0)
            if task.done() and not task.cancelled() and task.exception() is not None:
                exc = task.exception()
                self._answered.add(task)
                error = str(exc) or type(exc).__name__
                from fsm.host.session import SessionBusyError
                if isinstance(exc, SessionBusyError):
                    error += ' (over RPC: add "streamingBehavior": "steer" or "followUp")'
                self._respond(cmd, False, error=error)
            else:
                self._respond(cmd)
        finally:
            self._holding -= 1
            if not self._holding:
                held, self._held = self._held, []
                for event in held:
                    self.output.send(event)

    async def shutdown(self, grace_s: float = 0.8) -> None:
        """Cancel any backoff, stop a running turn, wait (bounded) for the prompt tasks, close
        the session. Events emitted meanwhile (the ``auto_retry_end`` of a cancelled chain) are
        still written if stdout is open."""
        import asyncio
        loop = asyncio.get_running_loop()
        deadline = loop.time() + grace_s
        self._stopping = True
        session = self.session
        try:
            if session.is_retrying:
                session.abort_retry()
            await asyncio.wait_for(session.abort(), max(0.05, deadline - loop.time()))
        except (asyncio.TimeoutError, Exception) as exc:
            log.warning("shutdown: abort did not finish cleanly: %r", exc)
        pending = [t for t in self._tasks if not t.done()]
        if pending:
            _, still = await asyncio.wait(pending, timeout=max(0.05, deadline - loop.time()))
            for task in still:
                task.cancel()
            if still:
                await asyncio.wait(still, timeout=0.2)
        try:
            await asyncio.wait_for(session.close(), 0.5)
        except (asyncio.TimeoutError, Exception) as exc:
            log.warning("shutdown: session.close() did not finish cleanly: %r", exc)
        self._unsubscribe()


async def _settle(task: Any) -> None:
    """Wait for ``task`` (if any), whatever its outcome."""
    import asyncio
    if task is None or task.done():
        return
    try:
        await asyncio.shield(task)
    except BaseException:  # its own handler reports its failure; we only wait for it
        if asyncio.current_task().cancelling():  # type: ignore[union-attr]
            raise


# ---------------------------------------------------------------------------------- shapes
_ZERO_COST = {"input": 0, "output": 0, "cacheRead": 0, "cacheWrite": 0}
QUEUE_MODE = "all"
"""``steeringMode`` / ``followUpMode``: queued messages all go out with the next turn."""


def _provider_name(session: Any) -> str:
    return str(getattr(session.provider, "name", "") or "")


def _api_name(session: Any) -> str:
    """pi's ``Model.api`` of the session's provider: ``"anthropic-messages"`` for the
    Anthropic Messages API, ``"openai-completions"`` otherwise (a provider may say its own)."""
    return str(getattr(session.provider, "api", "") or "openai-completions")


def _public_url(url: str) -> str:
    """``url`` without credentials: a password in it and the query string (``?api-key=…``)
    are replaced by ``***``, so ``get_state`` never echoes a secret."""
    import urllib.parse
    try:
        parts = urllib.parse.urlsplit(url)
    except ValueError:
        return "***"
    netloc = parts.netloc
    if "@" in netloc:
        user, _, host = netloc.rpartition("@")
        netloc = f"{user.split(':', 1)[0]}:***@{host}" if ":" in user else f"***@{host}"
    return urllib.parse.urlunsplit((parts.scheme, netloc, parts.path, "***" if parts.query else "", ""))


def model_json(session: Any, *, base_url: str | None = None) -> dict[str, Any]:
    """The ``model`` object of ``get_state``, in pi's ``Model`` shape.

    ``id`` and ``provider`` come from the session's provider; ``contextWindow`` from the
    session (0: unknown); ``maxTokens`` 0 (not set: the endpoint's default); no cost is known.
    """
    model_id = str(getattr(session.provider, "model", "") or "")
    return {"id": model_id, "name": model_id, "api": _api_name(session),
            "provider": _provider_name(session), "baseUrl": _public_url(base_url or ""), "reasoning": False,
            "input": ["text"], "cost": dict(_ZERO_COST), "contextWindow": session.context_window,
            "maxTokens": 0}


def session_state(session: Any, *, session_file: str | None = None,
                  base_url: str | None = None) -> dict[str, Any]:
    """The ``get_state`` data, read from the session's public properties.

    Keys of pi's ``RpcSessionState`` (same types): ``model`` (object),
    ``thinkingLevel`` (``"off"``), ``isStreaming``, ``isCompacting`` (false: no compaction
    runs inside this session), ``steeringMode`` / ``followUpMode`` (``"all"``), ``sessionFile``
    (only when a log is written, as there), ``sessionId``, ``autoCompactionEnabled``,
    ``messageCount``, ``pendingMessageCount``. Added here: ``autoRetryEnabled``, ``isRetrying``
    (true from a chain's ``auto_retry_start`` to its ``auto_retry_end``: during each backoff and
    each retried attempt, as the original's; docs/rpc.md), ``retryAttempt``, ``retryState``, ``retrySettings``, ``ignoredSettings`` (the original's
    settings keys given and ignored, e.g. ``["retry.provider"]``; docs/policy.md §1) and
    ``queuedMessageCount`` (the same number as ``pendingMessageCount``, under its earlier name).
    """
    queued = len(session.queued_messages)
    state: dict[str, Any] = {
        "model": model_json(session, base_url=base_url),
        "thinkingLevel": "off",
        "isStreaming": session.is_streaming,
        "isCompacting": False,
        "steeringMode": QUEUE_MODE,
        "followUpMode": QUEUE_MODE,
    }
    if session_file is not None:
        state["sessionFile"] = session_file
    state.update({
        "sessionId": session.session_id,
        "autoCompactionEnabled": session.compaction_hook is not None,
        "messageCount": len(session.messages),
        "pendingMessageCount": queued,
        "autoRetryEnabled": session.auto_retry_enabled,
        "isRetrying": session.is_retrying,
        "retryAttempt": session.retry_attempt,
        "retryState": session.brain.state,
        "retrySettings": session.settings.to_json(),
        "ignoredSettings": list(session.settings.ignored_keys),
        "queuedMessageCount": queued,
    })
    return state


def message_json(message: Any, *, provider: str = "", api: str = "openai-completions") -> dict[str, Any]:
    """One message of the runtime context in pi's ``AgentMessage`` shape.

    A user message: ``{role, content: [{type: "text", text}], timestamp}``. An assistant
    message adds to :meth:`~fsm.core.messages.AssistantMessage.to_json` what pi's carries:
    ``api``, ``provider``, and ``usage`` with ``totalTokens`` and a zero ``cost``.
    """
    out = dict(message.to_json())
    if out.get("role") != "assistant":
        return out
    usage = dict(out.get("usage") or {"input": 0, "output": 0, "cacheRead": 0, "cacheWrite": 0})
    usage.setdefault("totalTokens", sum(v for k, v in usage.items()
                                        if k in ("input", "output", "cacheRead", "cacheWrite")))
    usage.setdefault("cost", dict(_ZERO_COST, total=0))
    out["usage"] = usage
    out.setdefault("api", api)
    out.setdefault("provider", provider)
    out.setdefault("model", "")
    return out
