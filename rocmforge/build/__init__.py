"""Build: from a prepared checkout to a wheel in the wheelhouse.

``doctor`` checks the host against the pins (``nox -s toolchain``); ``environment`` is the pure
function from config and host facts to a build's variables; ``recipes/`` holds what differs per
package; ``package`` runs a package session; ``log`` runs its steps with progress and a full
log; ``compile_cache`` puts ccache or sccache in front of the compilers; ``wheelfile``,
``contract`` and ``provenance`` fix up a built wheel; ``wheelhouse`` publishes it with its index;
``install`` and ``publish`` serve the wheelhouse to users.
"""
