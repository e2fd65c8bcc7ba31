"""Integrations where harness authors already are (OpenTelemetry, and the others as they land)."""
