"""retry-fsm: the retry brain of an LLM agent session.

The lifecycle is declared once (:mod:`fsm.lifecycle`), classified errors come from
:mod:`fsm.classify`, and :class:`fsm.brain.RetryBrain` turns facts into actions for a host such
as :class:`fsm.session.AgentSession`.
"""

__version__ = "0.1.0"
