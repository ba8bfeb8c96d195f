"""Helpers shared by several test modules: launching the commands, runs and folders made once per test session,
the gloo process-group harness (imported by tests, never collected as tests)."""
