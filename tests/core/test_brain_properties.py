"""Hypothesis stateful tests: random sequences of facts and settings, the invariants of
docs/policy.md §3 after every step.

A minimal host model carries out the actions (one timer slot and a runtime context) so the
invariants about timers, prompts and dropped messages can be checked too. The facts include
the v2 ones: retry hints (honoured or not), the chain deadline, the retry budget, streamed
output, credential switches, retry now and a cancelled prompt; v3 adds the chain's deadline
timer (``deadline_passed``, aborting an attempt in flight) and a first request refused at rest.
"""

from hypothesis import settings, strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from support import examples

from fsm.core.brain import (AbortAttempt, ArmDeadline, CancelBackoff, CheckCompaction, ContinueTurn,
                            CreditRetryBudget, DropFailedMessage, Emit, EmitTurnEnd,
                            PromptMayReturn, RecordCooldown, RetryBrain, ReturnRetryToken,
                            StartBackoff, TurnFacts)
from fsm.core.classify import Classification
from fsm.core.messages import AssistantMessage
from fsm.core.settings import BudgetSettings, RetrySettings

KINDS = {
    "retryable": ("error", "retryable"),
    "fatal": ("error", "fatal"),
    "overflow": ("error", "context_overflow"),
    "success": ("stop", "none"),
    "aborted": ("aborted", "none"),
}


class BrainMachine(RuleBasedStateMachine):
    @initialize(max_retries=st.integers(0, 4), enabled=st.booleans(),
                hints=st.sampled_from(["ignore", "honor"]), deadline=st.sampled_from([None, 30, 5000]),
                after=st.sampled_from(["retry", "stop"]), budget=st.booleans())
    def setup(self, max_retries, enabled, hints, deadline, after, budget):
        self.settings = dict(enabled=enabled, max_retries=max_retries, base_delay_ms=10,
                             retry_hints=hints, max_hint_wait_ms=1000, max_elapsed_ms=deadline,
                             after_output=after, budget=BudgetSettings() if budget else None)
        self.brain = RetryBrain(RetrySettings(**self.settings), random=lambda: 0.3)
        self.now = 1_000_000
        self.events = []
        self.timer = None          # the one pending timer id (host side)
        self.timer_due = None      # when it fires (ms)
        self.context = []          # runtime context
        self.open_chain = None     # chain id with a start and no end yet
        self.chain_max = None
        self.continues = 0
        self.releases = 0
        self.refused_at_rest = 0
        self.last_hint = None
        self.deadline = None       # (chain id, due ms) of the armed deadline timer (host side)
        self.aborted_attempts = 0

    # -------------------------------------------------------------- host
    def perform(self, actions):
        for a in actions:
            if isinstance(a, Emit):
                self.check_event(a.event)
            elif isinstance(a, StartBackoff):
                assert self.timer is None, "two backoff timers at once"
                self.timer = a.timer_id
                self.timer_due = self.now + a.delay_ms
                if self.settings["retry_hints"] == "honor" and self.last_hint is not None \
                        and self.last_hint <= 1000:
                    assert a.delay_ms >= self.last_hint, "a retry inside a hint it honours"
            elif isinstance(a, CancelBackoff):
                assert self.timer == a.timer_id
                self.timer = None
            elif isinstance(a, DropFailedMessage):
                assert self.context and self.context[-1] is a.message
                assert a.message.stop_reason == "error", "only a failed message is dropped"
                self.context.pop()
            elif isinstance(a, ContinueTurn):
                self.continues += 1
            elif isinstance(a, ArmDeadline):
                assert self.deadline is None or self.deadline[0] != a.chain_id
                self.deadline = (a.chain_id, self.now + a.delay_ms)
            elif isinstance(a, AbortAttempt):
                assert self.brain.state == "exhausted", "an attempt aborted outside a deadline end"
                self.aborted_attempts += 1
            elif isinstance(a, PromptMayReturn):
                self.releases += 1
                assert a is actions[-1] or all(isinstance(b, (RecordCooldown, ReturnRetryToken))
                                               for b in actions[actions.index(a) + 1:])
            else:
                assert isinstance(a, (CheckCompaction, EmitTurnEnd, RecordCooldown,
                                      ReturnRetryToken, CreditRetryBudget))

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
                # Only a refusal at rest ends without a start: maxRetries = 0, a policy guard,
                # or a first request refused without sending (§13.7).
                assert event["attempt"] == 0 and event["success"] is False
                assert event["endReason"] in ("exhausted", "output_streamed", "hint_too_long",
                                              "deadline", "budget")
                self.refused_at_rest += 1
            else:
                assert event.get("chainId") == self.open_chain
                self.open_chain = None

    # -------------------------------------------------------------- facts
    @rule(kind=st.sampled_from(sorted(KINDS)), hint=st.sampled_from([None, 5, 500, 5000]),
          streamed=st.booleans(), budget_ok=st.booleans(), switched=st.booleans(),
          usage=st.booleans(), elapsed=st.integers(0, 3000))
    def turn_ends(self, kind, hint, streamed, budget_ok, switched, usage, elapsed):
        if self.brain.state == "backing_off":
            return  # the session never runs a turn during a backoff
        self.now += elapsed
        stop, k = KINDS[kind]
        msg = AssistantMessage(stop, error_message=None if stop == "stop" else f"{kind} error")
        self.context.append(msg)
        self.brain_attempt_before = self.brain.attempt
        self.last_hint = hint if k == "retryable" and not (usage and switched) else None
        facts = TurnFacts(now_ms=self.now, output_streamed=streamed, budget_allows=budget_ok,
                          credential_switched=switched, credential_count=3 if usage else 1)
        cls = Classification(k, "t", usage_limit=usage, retry_hint_ms=hint)
        actions = self.brain.turn_ended(msg, classification=cls, facts=facts)
        self.perform(actions)
        may_return = [a for a in actions if isinstance(a, PromptMayReturn)]
        assert len(may_return) == (0 if self.brain.is_retrying else 1), \
            "a turn's end says 'prompt may return' exactly when it leaves the brain at rest"

    @rule(stale=st.booleans())
    def timer_fires(self, stale):
        if self.timer is None and not stale:
            return
        timer_id = self.brain.timer_id - 1 if stale else self.timer
        if not stale:
            self.timer = None
            self.now = max(self.now, self.timer_due)
        before = self.continues
        self.perform(self.brain.backoff_elapsed(timer_id))
        if stale:
            assert self.continues == before, "a stale timer continued the turn"

    @rule(stale=st.booleans())
    def deadline_fires(self, stale):
        if self.deadline is None:
            return
        chain, due = self.deadline
        self.deadline = None
        was = self.brain.state
        ends_before = sum(1 for e in self.events if e["type"] == "auto_retry_end")
        self.now = max(self.now, due)
        self.perform(self.brain.deadline_passed(chain - 1 if stale else chain))
        ends = sum(1 for e in self.events if e["type"] == "auto_retry_end")
        if stale or chain != self.brain.chain_id or was not in ("backing_off", "continuing"):
            assert ends == ends_before and self.brain.state == was
        else:
            assert self.brain.state == "exhausted" and ends == ends_before + 1
            assert self.events[-1]["endReason"] == "deadline"

    @rule(wait=st.sampled_from([0, 5000, 10**8]), usage=st.booleans())
    def request_refused(self, wait, usage):
        was = self.brain.state
        self.perform(self.brain.request_refused(wait, usage_limit=usage, now_ms=self.now))
        if was in ("backing_off", "continuing"):
            assert self.brain.state == was
        else:
            assert self.brain.state == "exhausted" and self.events[-1]["attempt"] == 0

    @rule()
    def abort_retry(self):
        self.perform(self.brain.abort_retry())

    @rule()
    def retry_now(self):
        was_backing_off = self.brain.state == "backing_off"
        before = self.continues
        self.perform(self.brain.retry_now())
        assert self.continues == before + (1 if was_backing_off else 0)

    @rule()
    def prompt_cancelled(self):
        in_chain = self.brain.is_retrying
        self.perform(self.brain.prompt_cancelled())
        assert not self.brain.is_retrying
        assert self.brain.state == ("cancelled" if in_chain else self.brain.state)

    @rule()
    def continue_fails(self):
        self.perform(self.brain.continue_failed("rejected"))

    @rule(enabled=st.booleans())
    def toggle(self, enabled):
        self.brain.set_enabled(enabled)

    @rule(n=st.integers(0, 4))
    def change_max(self, n):
        self.settings.update(enabled=self.brain.settings.enabled, max_retries=n)
        self.brain.update_settings(RetrySettings(**self.settings))

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
    def starts_and_ends_pair_up(self):
        starts = sum(1 for e in self.events if e["type"] == "auto_retry_start" and e["attempt"] == 1)
        ends = [e for e in self.events if e["type"] == "auto_retry_end"]
        chained_ends = sum(1 for e in ends if e["attempt"] > 0)
        assert chained_ends == starts - (1 if self.open_chain is not None else 0)
        assert len(ends) == chained_ends + self.refused_at_rest

    @invariant()
    def prompt_may_return_once_per_end_or_turn_at_rest(self):
        ends = sum(1 for e in self.events if e["type"] == "auto_retry_end")
        assert self.releases >= ends


TestBrainMachine = BrainMachine.TestCase
TestBrainMachine.settings = settings(max_examples=examples(300), stateful_step_count=40, deadline=None)
