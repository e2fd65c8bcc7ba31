"""Hosts that cannot act on a setting refuse it with a SettingsError naming the key, instead of
accepting and ignoring it (docs/integrations.md, "Settings each integration honours" and the one
table)."""

from __future__ import annotations

import pytest

from fsm.core.settings import SettingsError
from fsm.integrations.httpx2 import AsyncRetryTransport, RetryTransport
from fsm.integrations.langchain import RetryBrainMiddleware
from fsm.integrations.pydantic_ai import RetryBrainCapability
from fsm.integrations.tenacity import BrainStrategy

TIMEOUTS = [{"firstTokenTimeoutMs": 200}, {"idleTimeoutMs": 200}, {"attemptTimeoutMs": 300}]
FALLBACK = {"fallbackModels": ["m2"]}
HOSTS = {"AsyncRetryTransport": AsyncRetryTransport, "RetryTransport": RetryTransport,
         "BrainStrategy": BrainStrategy, "RetryBrainMiddleware": RetryBrainMiddleware,
         "RetryBrainCapability": RetryBrainCapability}


ACTS_ON_ATTEMPT_TIMEOUT = ("AsyncRetryTransport", "RetryTransport")
"""The transports time an attempt (docs/integrations.md, the one table)."""


@pytest.mark.parametrize("host", HOSTS)
@pytest.mark.parametrize("setting", TIMEOUTS, ids=lambda s: next(iter(s)))
def test_every_integration_refuses_an_attempt_timeout_it_cannot_enforce(host, setting):
    """A stall or attempt timeout given to an integration that cannot enforce it raises
    SettingsError naming the key; the transports take attemptTimeoutMs."""
    make = HOSTS[host]
    if host in ACTS_ON_ATTEMPT_TIMEOUT and "attemptTimeoutMs" in setting:
        assert make(settings=setting).settings.attempt_timeout_ms == 300
        return
    with pytest.raises(SettingsError, match=f"retry.{next(iter(setting))}"):
        make(settings=setting) if "Transport" in host else make(setting)


@pytest.mark.parametrize("host", ["BrainStrategy", "RetryBrainCapability"])
def test_hosts_that_cannot_switch_the_model_refuse_fallback_models(host):
    """fallbackModels on a host that cannot switch the model raises SettingsError naming it."""
    make = HOSTS[host]
    with pytest.raises(SettingsError, match="retry.fallbackModels"):
        make(settings=FALLBACK) if "Transport" in host else make(FALLBACK)


def test_the_langchain_middleware_keeps_fallback_models():
    """The LangChain middleware switches models: fallbackModels is accepted."""
    assert RetryBrainMiddleware(FALLBACK).settings.fallback_models == ("m2",)


@pytest.mark.parametrize("host", ["AsyncRetryTransport", "RetryTransport"])
def test_the_transports_keep_fallback_models(host):
    """The transports rewrite the JSON body's model: fallbackModels is accepted."""
    assert HOSTS[host](settings=FALLBACK).settings.fallback_models == ("m2",)


@pytest.mark.parametrize("host", HOSTS)
def test_the_resilient_profiles_watchdog_is_left_out_not_refused(host):
    """The resilient profile's idleTimeoutMs (not the user's) is dropped, as in the runner."""
    make = HOSTS[host]
    settings = {"profile": "resilient"}
    made = make(settings=settings) if "Transport" in host else make(settings)
    assert made.settings.idle_timeout_ms is None and made.settings.profile == "resilient"
