"""Helpers shared by the test packages (tiny models built in-process, never downloaded)."""
