"""Sources: pinned and patched checkouts, the lock, derived pins, the air-gapped export.

``checkout`` prepares a package's tree from a git mirror, an archive, a PyPI sdist or the ROCm
install (``python -m rocmforge checkout``, ``nox -s lock``); ``git`` runs git; ``patches``
applies and writes patch files; ``lock`` reads, renders and compares ``rocmforge.lock.toml``;
``pins`` derives a stack from a vLLM release; ``export`` writes what an offline build needs.
"""
