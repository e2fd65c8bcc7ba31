"""The core reads no clock and no time zone (docs/architecture.md): its decisions under a wall
clock in the wrong year and a machine zone far from UTC are those of a UTC machine on time.
"""

import json
import os
import subprocess
import sys
import textwrap

import support

NOW_MS = 1_781_870_400_000  # 2026-06-19 12:00:00 UTC, the host's time passed as a fact

SCRIPT = textwrap.dedent(r'''
    import json, sys, time
    wrong = float(sys.argv[1])
    if wrong:  # the machine's clock is wrong; the host's now_ms is not
        time.time = lambda: wrong
        time.time_ns = lambda: int(wrong * 1e9)
    time.tzset()
    from fsm.core.brain import RetryBrain, TurnFacts
    from fsm.core.messages import AssistantMessage
    from fsm.core.settings import RetrySettings

    NOW = int(sys.argv[2])
    CASES = [
        ("retry-after date 30 s ahead", dict(status=429, error_message="429 Too Many Requests",
            headers={"retry-after": "Fri, 19 Jun 2026 12:00:30 GMT"})),
        ("epoch reset header", dict(status=429, error_message="429 Too Many Requests",
            headers={"x-ratelimit-reset": str(NOW // 1000 + 45)})),
        ("RFC 3339 reset header", dict(status=429, error_message="429 Too Many Requests",
            headers={"x-ratelimit-reset-requests": "2026-06-19T12:01:00Z"})),
        ("relative hint", dict(error_message="429 Rate limit reached. Please try again in 6.379s.")),
        ("zone-less reset time", dict(error_message="429 usage limit reached, resets 3pm")),
        ("plain overload", dict(error_message="529 Overloaded")),
    ]
    out = {}
    for name, fields in CASES:
        message = AssistantMessage("error", timestamp_ms=NOW, **fields)
        brain = RetryBrain(RetrySettings(retry_hints="honor", max_hint_wait_ms=86_400_000),
                           random=lambda: 0.5)
        actions = brain.turn_ended(message, facts=TurnFacts(now_ms=NOW))
        events = [dict(a.event) for a in actions if type(a).__name__ == "Emit"]
        out[name] = {"actions": [type(a).__name__ for a in actions], "events": events,
                     "hint": events[0].get("retryHintMs") if events else None}
    print(json.dumps(out, sort_keys=True))
''')


def decisions(wall_s: float, tz: str) -> dict:
    env = dict(support.env(), TZ=tz)
    done = subprocess.run([sys.executable, "-c", SCRIPT, repr(wall_s), str(NOW_MS)], env=env,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_decisions_are_the_same_under_a_wrong_wall_clock_and_a_far_time_zone():
    """Classification, hints, retryAt and actions depend on the host's now_ms only."""
    on_time = decisions(0, "UTC")
    wrong = decisions(946_684_800.0, "Pacific/Kiritimati")  # 2000-01-01, UTC+14
    assert wrong == on_time
    assert on_time["retry-after date 30 s ahead"]["hint"] == 30_000
    start = on_time["retry-after date 30 s ahead"]["events"][0]
    assert start["retryAt"] == NOW_MS + start["delayMs"]
    assert on_time["zone-less reset time"]["hint"] == 3 * 3_600_000  # 3pm UTC, three hours on
