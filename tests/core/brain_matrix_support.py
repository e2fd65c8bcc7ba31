"""The brain matrix's cases: every state × trigger × first failing guard, and how to build and
fire each through the public brain (docs/policy.md §3, §8b.1). The matrix test checks them
against its hand-written table; the audit tours them (tests share helpers through support
modules, docs/architecture.md "The layers")."""

from fsm.core.brain import RetryBrain, TurnFacts
from fsm.core.classify import Classification
from fsm.core.messages import AssistantMessage
from fsm.core.settings import BudgetSettings, RetrySettings

STATES = ["idle", "backing_off", "continuing", "succeeded", "exhausted", "cancelled"]
REST = {"idle", "succeeded", "exhausted", "cancelled"}
TURNS = {"turn_failed_retryable": ("error", "retryable"), "turn_failed_fatal": ("error", "fatal"),
         "turn_overflowed": ("error", "context_overflow"), "turn_succeeded": ("stop", "none"),
         "turn_aborted": ("aborted", "none")}
OTHERS = ["backoff_elapsed", "stale_timer", "budget_recheck", "retry_cancelled", "continue_failed",
          "retry_requested", "prompt_cancelled", "deadline_passed", "request_refused"]
# For a retryable failure: which guard fails first (None: they all pass); "fallback_due" and
# "budget_waits" are the guards that pass into their own row.
FAILS = [None, "retry_enabled", "has_retries_left", "replay_safe", "fallback_due",
         "hint_within_wait", "within_deadline", "budget_allows", "budget_waits"]
NOW = 1_800_000_000_000


def setup(state, fails):
    """A brain in ``state`` and the facts/classification that make ``fails`` the first failing guard."""
    kw = dict(base_delay_ms=100, retry_hints="honor", max_hint_wait_ms=10_000,
              after_output="stop", max_elapsed_ms=60_000, budget=BudgetSettings())
    hint, facts = None, dict(now_ms=NOW)
    chain_start = NOW - 1000
    if fails == "retry_enabled":
        kw["enabled"] = False
    if fails == "has_retries_left":
        kw["max_retries"] = 0 if state in REST else 3
    if fails == "replay_safe":
        facts["output_streamed"] = True
    if fails == "hint_within_wait":
        hint = 20_000
    if fails == "within_deadline":
        chain_start = NOW - 59_950  # the 100 ms backoff would go out 50 ms after the deadline
        if state in REST:
            kw["max_elapsed_ms"] = 50
    if fails == "budget_allows":
        facts["budget_allows"] = False
    if fails == "budget_waits":
        facts["budget_allows"] = False
        facts["budget_slot_ms"] = 500
    if fails == "fallback_due":
        kw["fallback_models"] = ("backup",)
        kw["fallback_after"] = 1
        hint = 20_000  # a fallback skips the hint check, as a credential switch does
    settings = RetrySettings(**kw)
    attempt = 3 if fails == "has_retries_left" else 1
    brain = RetryBrain.in_state(state, settings=settings, attempt=attempt, max_attempts=3,
                                chain_id=4, timer_id=7, chain_start_ms=chain_start, random=lambda: 0.5)
    return brain, hint, TurnFacts(**facts)


def fire(brain, trigger, hint, facts):
    if trigger in TURNS:
        stop, kind = TURNS[trigger]
        msg = AssistantMessage(stop, error_message="boom" if stop != "stop" else None)
        family = "overloaded" if kind == "retryable" else ""
        return brain.turn_ended(msg, classification=Classification(kind, "test.rule", retry_hint_ms=hint,
                                                                   family=family),
                                facts=facts)
    if trigger == "backoff_elapsed":
        return brain.backoff_elapsed(brain.timer_id)
    if trigger == "budget_recheck":
        return brain.backoff_elapsed(brain.timer_id, TurnFacts(budget_allows=False, budget_slot_ms=300))
    if trigger == "deadline_passed":
        return brain.deadline_passed()
    if trigger == "request_refused":
        return brain.request_refused(120_000, now_ms=NOW)
    if trigger == "stale_timer":
        return brain.backoff_elapsed(brain.timer_id - 1)
    if trigger == "retry_cancelled":
        return brain.abort_retry()
    if trigger == "retry_requested":
        return brain.retry_now()
    if trigger == "prompt_cancelled":
        return brain.prompt_cancelled()
    return brain.continue_failed("continue rejected")


CASES = ([(s, "turn_failed_retryable", f) for s in STATES for f in FAILS]
         + [(s, t, None) for s in STATES for t in list(TURNS)[1:] + OTHERS])
