"""get_state names the original's settings keys that were given and ignored (docs/policy.md §1)."""

from __future__ import annotations

import pytest

from fsm.core.settings import RetrySettings


def test_get_state_lists_the_originals_ignored_keys_and_keeps_them_after_a_toggle():
    """get_state names the original's keys that were ignored (ignoredSettings), also after the
    live set_auto_retry toggle."""
    from fsm.host.session import AgentSession
    from fsm.rpc.dispatch import session_state
    from fsm.testing import ScriptedProvider

    with pytest.warns(UserWarning, match="retry.provider"):
        settings = RetrySettings.from_json({"retry": {"maxRetries": 2, "provider": {"maxRetries": 0}}})
    session = AgentSession(ScriptedProvider(), settings=settings)
    assert session_state(session)["ignoredSettings"] == ["retry.provider"]
    session.set_auto_retry_enabled(False)
    assert session_state(session)["ignoredSettings"] == ["retry.provider"]
    assert session_state(AgentSession(ScriptedProvider()))["ignoredSettings"] == []
