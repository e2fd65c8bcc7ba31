"""The terminal chat: a prompt_toolkit application around one :class:`~fsm.host.session.AgentSession`.

Screen, bottom to top: a status line (model, retry on/off, state), the input line, an
activity line (the retry loader ``Retrying (1/3) in 2s… (esc to cancel, enter to retry now)``
counting down, or a working spinner), and the unfinished line of the answer being streamed. Finished lines (the
user's messages, the answer, errors, ``Retry failed after …``) are printed above the
application, into the terminal's scrollback.

All decisions about what shows and which Esc handler is bound live in
:class:`fsm.tui.view.ChatView`; this module only wires keys, timers and printing to it.
"""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any

from fsm._extras import require

require("prompt_toolkit", extra="tui", feature="the terminal front end (python -m fsm chat)")

from prompt_toolkit.application import Application
from prompt_toolkit.buffer import Buffer
from prompt_toolkit.filters import Condition
from prompt_toolkit.formatted_text import FormattedText
from prompt_toolkit.input import Input
from prompt_toolkit.key_binding import KeyBindings
from prompt_toolkit.keys import Keys
from prompt_toolkit.layout import ConditionalContainer, HSplit, Layout, Window
from prompt_toolkit.layout.controls import BufferControl, FormattedTextControl
from prompt_toolkit.layout.processors import BeforeInput
from prompt_toolkit.output import Output
from prompt_toolkit.shortcuts import print_formatted_text
from prompt_toolkit.styles import Style

from fsm.tui.view import ENTER_RETRY_NOW, ESC_ABORT_RETRY, ChatView, Line, rest_label

TICK_S = 0.1
"""Redraw period while something moves on screen (the countdown, the spinner)."""

KEY_TIMEOUT_S = 0.05
"""How long a lone Esc waits for the rest of an escape sequence (prompt_toolkit's default,
0.5 s, makes cancelling a backoff feel sluggish)."""

ABORT_GRACE_S = 3.0
"""How long quitting waits for a running turn to stop before leaving anyway."""

STYLE = Style.from_dict({
    "user": "bold",
    "error": "ansired",
    "retry_failed": "ansired bold",
    "retry_ok": "ansigreen",
    "discarded": "ansibrightblack italic",
    "aborted": "ansiyellow",
    "info": "ansibrightblack",
    "loader": "ansiyellow",
    "working": "ansicyan",
    "prompt": "bold ansigreen",
    "status": "reverse",
})

HELP_LINES = (
    "Commands:",
    "  /retry on | /retry off   switch automatic retry (a pending backoff still runs; Esc cancels it)",
    "  /retry                   show whether automatic retry is on",
    "  /state                   print the session state",
    "  /help                    this help",
    "  /quit                    leave (also Ctrl-C, or Ctrl-D on an empty line)",
    "Esc aborts the running turn, or cancels the retry while the loader counts down;",
    "Enter on an empty line retries at once while the loader counts down.",
    "A message typed while a turn or a retry chain is active is queued as a follow-up.",
)


class _ScreenLogHandler(logging.Handler):
    """Log records (the session's warnings, Python warnings) as lines above the application:
    the default handler would write to stderr across the screen."""

    def __init__(self, chat: "ChatApp", level: str | int) -> None:
        super().__init__(level)
        self.chat = chat
        from fsm.core.redact import ScrubbingFilter
        self.addFilter(ScrubbingFilter())  # no secret on the screen either

    def emit(self, record: logging.LogRecord) -> None:
        try:
            text = (record.getMessage().splitlines() or [""])[0]
            if record.exc_info and record.exc_info[1] is not None:
                from fsm.core.text import safe_error_text
                text += f" ({safe_error_text(f'{type(record.exc_info[1]).__name__}: {record.exc_info[1]}', limit_bytes=1024)})"
            self.chat.print_lines([Line(f"{record.levelname.lower()}: {text}", "error")])
        except Exception:  # a log line must never take the application down
            self.handleError(record)


LOGGERS = ("fsm", "py.warnings")


class ChatApp:
    """The chat application for ``session`` (an :class:`~fsm.host.session.AgentSession`).

    ``input``/``output`` are prompt_toolkit's (default: the process's terminal); ``banner`` are
    lines printed before the application starts. :meth:`run` returns the exit status (0).
    """

    def __init__(self, session: Any, *, banner: tuple[str, ...] = (), view: ChatView | None = None,
                 log_level: str | int = logging.WARNING, input: Input | None = None,
                 output: Output | None = None) -> None:
        self.session = session
        self.view = view or ChatView(model=getattr(session.provider, "model", ""),
                                     retry_enabled=session.auto_retry_enabled)
        self.banner = banner
        self.log_level = log_level
        self._tasks: set[asyncio.Task] = set()
        self._quitting = False
        self.input_buffer = Buffer(multiline=False, accept_handler=self._accept)
        self.app: Application[int] = Application(
            layout=self._layout(), key_bindings=self._key_bindings(), style=STYLE,
            full_screen=False, erase_when_done=True, input=input, output=output)
        self.app.ttimeoutlen = KEY_TIMEOUT_S
        self.app.timeoutlen = KEY_TIMEOUT_S

    # ------------------------------------------------------------------ screen
    def _layout(self) -> Layout:
        view = self.view
        tail = Window(FormattedTextControl(lambda: [("", view.stream_tail)]), wrap_lines=True,
                      dont_extend_height=True)
        activity = Window(FormattedTextControl(self._activity_fragments), height=1)
        self._input_window = Window(
            BufferControl(self.input_buffer, input_processors=[BeforeInput("> ", style="class:prompt")]),
            wrap_lines=True, dont_extend_height=True)
        status = Window(FormattedTextControl(lambda: [("", " " + view.status_text())]), height=1,
                        style="class:status")
        return Layout(HSplit([
            ConditionalContainer(tail, filter=Condition(lambda: bool(view.stream_tail))),
            ConditionalContainer(activity, filter=Condition(lambda: view.activity_text() is not None)),
            self._input_window,
            status,
        ]), focused_element=self._input_window)

    def _activity_fragments(self) -> FormattedText:
        text = self.view.activity_text() or ""
        return FormattedText([("class:loader" if self.view.loader_visible else "class:working", text)])

    def print_lines(self, lines: list[Line]) -> None:
        """Print ``lines`` above the application (or plainly when it is not running)."""
        if not lines:
            return
        fragments: list[tuple[str, str]] = []
        for line in lines:
            fragments += [(f"class:{line.kind}", line.text), ("", "\n")]
        # While the application runs, print_formatted_text erases it, prints, and redraws it.
        print_formatted_text(FormattedText(fragments), end="", style=STYLE, output=self.app.output)

    def info(self, *texts: str) -> None:
        self.print_lines([Line(t, "info") for t in texts])

    # ------------------------------------------------------------------ events
    def on_event(self, event: dict[str, Any]) -> None:
        """Session listener: update the view, print what it returns, redraw."""
        self.print_lines(self.view.handle(event))
        if self.app.is_running:
            self.app.invalidate()

    async def _ticker(self) -> None:
        while True:
            await asyncio.sleep(TICK_S)
            if self.view.needs_ticks:
                self.app.invalidate()

    # ------------------------------------------------------------------ keys
    def _key_bindings(self) -> KeyBindings:
        kb = KeyBindings()

        # Not eager: Esc is also the prefix of the Meta-key bindings (Esc b, …); with
        # KEY_TIMEOUT_S a lone Esc still fires within a tenth of a second.
        @kb.add("escape")
        def _esc(event: Any) -> None:
            self.on_escape()

        # Ctrl-C arrives as a key in raw mode, and as SIGINT while a line is being printed
        # above the application (the terminal is in cooked mode then): both leave.
        @kb.add("c-c")
        @kb.add(Keys.SIGINT)
        def _ctrl_c(event: Any) -> None:
            self.quit()

        @kb.add("c-d")
        def _ctrl_d(event: Any) -> None:
            if self.input_buffer.text:
                self.input_buffer.delete(1)
            else:
                self.quit()

        return kb

    def on_escape(self) -> None:
        """Run the Esc handler the view says is bound now."""
        if self.view.esc_action == ESC_ABORT_RETRY:
            self.session.abort_retry()
        elif self.session.is_streaming:
            self._spawn(self.session.abort())

    def quit(self) -> None:
        """Leave: cancel any backoff, stop a running turn, then exit (a second press: at once)."""
        if self._quitting or not self.app.is_running:
            if self.app.is_running and not self.app.future.done():
                self.app.exit(result=0)
            return
        self._quitting = True
        self._spawn(self._shutdown())

    async def _shutdown(self) -> None:
        try:
            if self.session.is_retrying or self.session.is_streaming:
                await asyncio.wait_for(self.session.abort(), ABORT_GRACE_S)
        except (asyncio.TimeoutError, Exception):  # leaving anyway: nothing to report to
            pass
        finally:
            if self.app.is_running and not self.app.future.done():
                self.app.exit(result=0)

    # ------------------------------------------------------------------ input
    def _accept(self, buffer: Buffer) -> bool:
        text = buffer.text.strip()
        if text:
            self.handle_line(text)
        else:
            self.on_empty_enter()
        return False  # clear the input line

    def on_empty_enter(self) -> None:
        """Enter on an empty input line: retry now during a backoff, else nothing."""
        if self.view.enter_action == ENTER_RETRY_NOW:
            self.session.retry_now()

    def handle_line(self, text: str) -> None:
        """One line the user entered: a ``/command`` or a message."""
        if text.startswith("/"):
            self._command(text)
        else:
            self._spawn(self._send(text))

    def _command(self, text: str) -> None:
        name, _, arg = text.partition(" ")
        arg = arg.strip().lower()
        self.print_lines([Line(f"> {text}", "user")])
        if name == "/retry":
            if arg in ("on", "off"):
                self.session.set_auto_retry_enabled(arg == "on")
                self.view.retry_enabled = self.session.auto_retry_enabled
                extra = ""
                if arg == "off" and self.session.is_retrying:
                    extra = " (the pending backoff still runs; Esc cancels it)"
                self.info(f"Auto-retry {'on' if self.view.retry_enabled else 'off'}{extra}")
            elif not arg:
                self.info(f"Auto-retry is {'on' if self.session.auto_retry_enabled else 'off'}")
            else:
                self.print_lines([Line(f"Usage: /retry on | /retry off (got {arg!r})", "error")])
        elif name == "/state":
            from fsm.rpc.dispatch import session_state
            state = session_state(self.session)
            if self.session.is_retrying or self.session.is_streaming:
                label = self.view.state_label
            else:
                label = rest_label(state["retryState"])
            self.info(f"status: {label}",
                      *json.dumps(state, indent=2, ensure_ascii=False).splitlines())
        elif name in ("/quit", "/exit"):
            self.quit()
        elif name == "/help":
            self.info(*HELP_LINES)
        else:
            self.print_lines([Line(f"Unknown command {name}; /help lists the commands", "error")])
        self.app.invalidate()

    async def _send(self, text: str) -> None:
        # The busy check and prompt()'s own check run in the same step: no await between them,
        # so a message can never start a second turn next to a running one or a backoff.
        if self.session.is_busy:
            if self.session.is_retrying:
                self.info("Queued as a follow-up: it goes with the next attempt, after the "
                          "backoff (which is not shortened)")
            else:
                self.info("Queued as a follow-up: it is sent when the running turn ends")
        try:
            await self.session.prompt(text, streaming_behavior="follow_up")
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            self.print_lines([Line(f"prompt failed: {type(exc).__name__}: {exc}", "error")])

    def _spawn(self, coro: Any) -> asyncio.Task:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    # ------------------------------------------------------------------ run
    async def run(self) -> int:
        """Run until the user leaves; returns the exit status (0)."""
        unsubscribe = self.session.subscribe(self.on_event)
        for line in self.banner:
            self.info(line)
        handler = _ScreenLogHandler(self, self.log_level)
        saved = []
        logging.captureWarnings(True)
        for name in LOGGERS:
            logger = logging.getLogger(name)
            saved.append((logger, logger.propagate, logger.level))
            logger.addHandler(handler)
            logger.propagate = False
            if logger.getEffectiveLevel() > handler.level:
                logger.setLevel(handler.level)

        def pre_run() -> None:
            self.app.create_background_task(self._ticker())

        try:
            result = await self.app.run_async(pre_run=pre_run)
        finally:
            # Whatever is still running (a turn, a backoff) ends here; prompt() cancels its
            # chain on cancellation, so no timer outlives the application.
            for task in list(self._tasks):
                task.cancel()
            if self._tasks:
                await asyncio.gather(*self._tasks, return_exceptions=True)
            if self.session.is_retrying:
                self.session.abort_retry()
            unsubscribe()
            for logger, propagate, level in saved:
                logger.removeHandler(handler)
                logger.propagate = propagate
                logger.setLevel(level)
            logging.captureWarnings(False)
        return int(result or 0)
