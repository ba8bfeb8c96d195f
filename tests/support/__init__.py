"""Helpers shared by several test modules (launching the commands, runs made once per test session)."""
