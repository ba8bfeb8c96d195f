"""Helpers shared by several test packages (imported by tests, never collected as tests)."""
