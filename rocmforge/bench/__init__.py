"""Bench: the wheelhouse measured on this GPU against its peak.

``runner`` drives the measurements (``nox -s bench``); ``worker`` runs inside the measured venv;
``peaks`` holds each GPU's datasheet peaks; ``report`` writes the tables and plots.
"""
