"""Benchmarks: ``grid`` (every algorithm x seed on one env), ``suite`` (``python -m turnrl bench --suite``:
a suite defined as data, resumable), ``report`` and ``stats`` (intervals and tests over seeds,
``special`` functions for them), ``credit_lab`` (credit estimators against exact values on small
MDPs) and ``record`` (a measured result with the command, commit and machine that gave it: the
files under docs/results/ that the docs' tables are built from)."""
