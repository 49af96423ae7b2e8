"""Sources: pinned and patched checkouts, the lock, derived pins, the air-gapped export.

``checkout`` turns a package's pin into a patched tree (``python -m rocmforge checkout``,
``nox -s lock``), filled from the per-user cache: ``mirrors`` (git mirrors and submodules, an
export's bundles) and ``archives`` (sdists from the index, URLs, ROCm trees), which share
``cache`` (retries, lock waits, tree swaps); ``git`` runs git; ``patches`` applies and writes
patch files; ``lock`` reads, renders and compares ``rocmforge.lock.toml``; ``pins`` derives a
stack from a vLLM release; ``export`` writes what an offline build needs.
"""
