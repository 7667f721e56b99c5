"""Runs a plan stage by stage through a backend's worker sessions."""
