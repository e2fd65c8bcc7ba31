"""Hypothesis stateful tests: random sequences of facts, SPEC §3 invariants after every step.

A minimal host model carries out the actions (one timer slot, a runtime context and a
persisted log) so the invariants about timers and history can be checked too.
"""

from hypothesis import settings, strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from fsm.brain import (CancelBackoff, CheckCompaction, ContinueTurn, DropFailedMessage, Emit,
                       ReleaseWaiters, RetryBrain, StartBackoff)
from fsm.classify import Classification
from fsm.messages import AssistantMessage
from fsm.settings import RetrySettings

KINDS = {
    "retryable": ("error", "retryable"),
    "fatal": ("error", "fatal"),
    "overflow": ("error", "context_overflow"),
    "success": ("stop", "none"),
    "aborted": ("aborted", "none"),
}


class BrainMachine(RuleBasedStateMachine):
    @initialize(max_retries=st.integers(0, 4), enabled=st.booleans())
    def setup(self, max_retries, enabled):
        self.brain = RetryBrain(RetrySettings(enabled=enabled, max_retries=max_retries,
                                              base_delay_ms=10), random=lambda: 0.3)
        self.events = []
        self.timer = None          # the one pending timer id (host side)
        self.context = []          # runtime context
        self.log = []              # persisted history
        self.open_chain = None     # chain id with a start and no end yet
        self.chain_max = None
        self.last_actions = []
        self.continues = 0
        self.releases = 0

    # -------------------------------------------------------------- host
    def perform(self, actions):
        self.last_actions = actions
        for a in actions:
            if isinstance(a, Emit):
                self.check_event(a.event)
            elif isinstance(a, StartBackoff):
                assert self.timer is None, "two backoff timers at once"
                self.timer = a.timer_id
            elif isinstance(a, CancelBackoff):
                assert self.timer == a.timer_id
                self.timer = None
            elif isinstance(a, DropFailedMessage):
                assert self.context and self.context[-1] is a.message
                self.context.pop()
            elif isinstance(a, ContinueTurn):
                self.continues += 1
            elif isinstance(a, ReleaseWaiters):
                self.releases += 1
            else:
                assert isinstance(a, CheckCompaction)

    def check_event(self, event):
        self.events.append(event)
        if event["type"] == "auto_retry_start":
            if event["attempt"] == 1:
                assert self.open_chain is None, "a new chain started before the old one ended"
                self.open_chain = event["chainId"]
                self.chain_max = event["maxAttempts"]
            else:
                assert self.open_chain == event["chainId"]
                assert event["attempt"] == self.brain_attempt_before + 1
            assert 1 <= event["attempt"] <= event["maxAttempts"] == self.chain_max
        else:
            if self.open_chain is None:
                # Only the seed's maxRetries = 0 case may end without a start.
                assert event["attempt"] == 0 and event["success"] is False
            else:
                assert event.get("chainId") == self.open_chain
                self.open_chain = None

    # -------------------------------------------------------------- facts
    @rule(kind=st.sampled_from(sorted(KINDS)))
    def turn_ends(self, kind):
        if self.brain.state == "backing_off":
            return  # the session never runs a turn during a backoff
        stop, k = KINDS[kind]
        msg = AssistantMessage(stop, error_message=None if stop == "stop" else f"{kind} error")
        self.context.append(msg)
        self.log.append(msg)
        self.brain_attempt_before = self.brain.attempt
        self.perform(self.brain.turn_ended(msg, classification=Classification(k, "t")))

    @rule(stale=st.booleans())
    def timer_fires(self, stale):
        if self.timer is None and not stale:
            return
        timer_id = self.brain.timer_id - 1 if stale else self.timer
        if not stale:
            self.timer = None
        before = self.continues
        self.perform(self.brain.backoff_elapsed(timer_id))
        if stale:
            assert self.continues == before, "a stale timer continued the turn"

    @rule()
    def abort_retry(self):
        self.perform(self.brain.abort_retry())

    @rule()
    def continue_fails(self):
        self.perform(self.brain.continue_failed("rejected"))

    @rule(enabled=st.booleans())
    def toggle(self, enabled):
        self.brain.set_enabled(enabled)

    @rule(n=st.integers(0, 4))
    def change_max(self, n):
        self.brain.update_settings(RetrySettings(enabled=self.brain.settings.enabled, max_retries=n,
                                                 base_delay_ms=10))

    # -------------------------------------------------------------- invariants
    @invariant()
    def attempt_bounds(self):
        if self.brain.is_retrying:
            assert 1 <= self.brain.attempt <= self.brain.max_attempts
            assert self.open_chain is not None
        else:
            assert self.brain.attempt == 0
            assert self.open_chain is None, "chain left open after the brain went to rest"

    @invariant()
    def one_timer_only_while_backing_off(self):
        assert (self.timer is not None) == (self.brain.state == "backing_off")

    @invariant()
    def history_keeps_everything(self):
        assert all(m in self.log for m in self.context)
        assert len(self.log) >= len(self.context)

    @invariant()
    def starts_and_ends_pair_up(self):
        starts = sum(1 for e in self.events if e["type"] == "auto_retry_start" and e["attempt"] == 1)
        ends = [e for e in self.events if e["type"] == "auto_retry_end"]
        chained_ends = sum(1 for e in ends if e["attempt"] > 0)
        assert chained_ends == starts - (1 if self.open_chain is not None else 0)

    @invariant()
    def waiters_released_once_per_end(self):
        ends = sum(1 for e in self.events if e["type"] == "auto_retry_end")
        assert self.releases == ends


TestBrainMachine = BrainMachine.TestCase
TestBrainMachine.settings = settings(max_examples=300, stateful_step_count=40, deadline=None)
