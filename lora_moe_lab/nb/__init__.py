"""Notebook support: parameter checks (params) and the runner / report (runner)."""
