"""Hosts of the brain: the clock, the agent session, the runner around one call, the session log and the credential stores."""
