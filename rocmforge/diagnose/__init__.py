"""Diagnose: the cause of a failed build or run, found in its log.

``engine`` reads a log against ``rules.toml`` (signals, fatal errors and facts, each with an
example line) and proposes a retry plan for the categories that have one.
"""
