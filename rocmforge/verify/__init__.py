"""Verify: what the wheels contain, and whether they run.

``inspect`` lists the GPU code objects inside shared objects and wheels; ``checks`` installs the
wheelhouse into a fresh venv and runs ``probe`` there (``nox -s verify``); ``node`` checks a node
against a wheelhouse before installing; ``rebuild`` builds a wheel again from its provenance and
compares the two.
"""
