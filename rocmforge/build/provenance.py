"""Provenance: what a wheel was built from, and where and when it was built.

Two records, split by whether they shape the wheel's bytes:

- inside the wheel, ``<name>.dist-info/rocmforge.json``: only what determines the bytes (source,
  patches, recipe options, flags, archs, toolchain versions, the dependencies' sha256,
  ``SOURCE_DATE_EPOCH``). Two builders with the same inputs write the same record, so their
  wheels can be byte-identical (``python -m rocmforge rebuild-check`` checks that);
- next to the wheel in the wheelhouse, ``<wheel>.intoto.json``: an in-toto Statement v1 with a
  SLSA provenance v1 predicate whose subject is the wheel (file name and sha256). It adds what
  differs from builder to builder: host, start and finish time, retries, compile-cache
  statistics, parallelism. With ``build.signing_key`` (an OpenSSH private key, e.g. ed25519)
  it is wrapped in a DSSE envelope signed with ``ssh-keygen -Y sign``; no network involved.

Read both back from a wheel file (the statement is found next to it) or an installed
distribution (the record only)::

    python -m rocmforge provenance wheelhouse/torch-2.13.0+rocm7.2-*.whl
    python -m rocmforge provenance torch            # the installed distribution
"""

from __future__ import annotations

import argparse
import base64
import json
import platform
import subprocess
import tempfile
import textwrap
import time
import zipfile
from collections.abc import Mapping
from importlib import metadata
from pathlib import Path

from rocmforge import __version__
from rocmforge.build.wheelfile import read_member
from rocmforge.errors import UserError
from rocmforge.fsutil import atomic_write, refuse_special

FILENAME = "rocmforge.json"
STATEMENT_SUFFIX = ".intoto.json"  # <wheel file name> + this, next to the wheel
STATEMENT_TYPE = "https://in-toto.io/Statement/v1"
PREDICATE_TYPE = "https://slsa.dev/provenance/v1"
# The build type names the meaning of externalParameters: the rocmforge.json record.
BUILD_TYPE = "https://rocmforge.invalid/provenance/wheel-build/v1"
PAYLOAD_TYPE = "application/vnd.in-toto+json"  # DSSE payload type of an in-toto statement
SIGNATURE_NAMESPACE = "rocmforge-provenance"  # ssh-keygen -Y ... -n: what the key signs


def read(target: str) -> dict:
    """Provenance of a wheel file (path) or of an installed distribution (name)."""
    if target.endswith(".whl"):
        path = Path(target)
        refuse_special(path, "a wheel file")
        if not path.is_file():
            raise UserError(f"{target}: no such wheel; list the wheelhouse with `ls wheelhouse`")
        try:
            data = read_member(path, FILENAME)
        except (zipfile.BadZipFile, ValueError, OSError) as exc:  # truncated download, not a wheel
            raise UserError(f"{target}: not a readable wheel ({exc}); download or build it again") from None
    else:
        try:
            text = metadata.distribution(target).read_text(FILENAME)
        except metadata.PackageNotFoundError:
            raise UserError(f"{target}: not installed here; give a wheel path instead") from None
        data = text.encode() if text is not None else None
    if data is None:
        raise UserError(f"{target}: has no {FILENAME}; it was not built by rocmforge")
    try:
        return json.loads(data)
    except ValueError:  # JSONDecodeError and UnicodeDecodeError: a damaged record
        raise UserError(
            f"{target}: its {FILENAME} is not valid JSON; the wheel is damaged, rebuild it"
        ) from None


def record_bytes(record: Mapping) -> bytes:
    """The bytes of ``rocmforge.json``: sorted keys, so equal records are equal files."""
    return (json.dumps(record, indent=2, sort_keys=True) + "\n").encode()


# ----------------------------------------------------------------------------- statement


def statement_path(wheel: str | Path) -> Path:
    """Where the provenance statement of ``wheel`` lives: next to it, ``<wheel>.intoto.json``."""
    wheel = Path(wheel)
    return wheel.with_name(wheel.name + STATEMENT_SUFFIX)


def rfc3339(seconds: float) -> str:
    """``2026-12-01T12:53:10Z``: the timestamp form SLSA uses."""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(seconds))


def statement(
    wheel_filename: str,
    sha256: str,
    record: Mapping,
    *,
    started: float,
    finished: float,
    internal: Mapping | None = None,
    byproducts: list[dict] | None = None,
) -> dict:
    """The in-toto Statement v1 (SLSA provenance v1 predicate) of one built wheel.

    ``record`` (the wheel's ``rocmforge.json``) is the external parameters: everything that
    determines the bytes. ``internal`` holds settings that do not (parallelism);
    ``byproducts`` what the run produced besides the wheel (retries, cache statistics).
    """
    host = platform.node() or "unknown-host"
    return {
        "_type": STATEMENT_TYPE,
        "subject": [{"name": wheel_filename, "digest": {"sha256": sha256}}],
        "predicateType": PREDICATE_TYPE,
        "predicate": {
            "buildDefinition": {
                "buildType": BUILD_TYPE,
                "externalParameters": dict(record),
                "internalParameters": dict(internal or {}),
                "resolvedDependencies": resolved_dependencies(record),
            },
            "runDetails": {
                "builder": {
                    "id": f"https://rocmforge.invalid/builder/{host}",
                    "version": {"rocmforge": __version__},
                },
                "metadata": {
                    "invocationId": f"{host}/{record.get('package')}/{int(started)}",
                    "startedOn": rfc3339(started),
                    "finishedOn": rfc3339(finished),
                },
                "byproducts": list(byproducts or []),
            },
        },
    }


def resolved_dependencies(record: Mapping) -> list[dict]:
    """SLSA ResourceDescriptors of the record's inputs: source, submodules, patches, wheels."""
    src = record.get("source") or {}
    found = []
    if src.get("commit"):
        found.append({"uri": f"git+{src.get('url')}@{src['commit']}", "digest": {"gitCommit": src["commit"]}})
    elif src.get("sha256"):
        found.append({"uri": src.get("url") or src.get("requirement"), "digest": {"sha256": src["sha256"]}})
    for path, commit in sorted((src.get("submodules") or {}).items()):
        found.append({"name": f"submodule {path}", "digest": {"gitCommit": commit}})
    for patch in record.get("patches") or []:
        found.append({"name": f"patch {patch['file']}", "digest": {"sha256": patch["sha256"]}})
    for dep, sha in sorted((record.get("dependencies") or {}).items()):
        found.append({"name": f"wheel of {dep}", "digest": {"sha256": sha}})
    return found


def write_statement(wheel: Path, stmt: dict, *, signing_key: Path | None) -> Path:
    """Write ``stmt`` next to ``wheel`` (staged beside it, published with it): plain JSON, or a
    DSSE envelope signed with ``signing_key``."""
    payload = json.dumps(stmt, indent=2, sort_keys=True).encode()
    if signing_key is not None:
        payload = json.dumps(sign(payload, signing_key), indent=2).encode()
    return atomic_write(statement_path(wheel), payload + b"\n")


def read_statement(wheel: str | Path) -> tuple[dict, dict | None] | None:
    """The statement next to ``wheel`` and its DSSE envelope (None when unsigned); None if absent."""
    path = statement_path(wheel)
    if not path.is_file():
        return None
    try:
        doc = json.loads(path.read_bytes())
        if "payloadType" in doc:
            return json.loads(base64.b64decode(doc["payload"])), doc
        return doc, None
    except (ValueError, KeyError, TypeError):
        raise UserError(
            f"{path}: not a valid provenance statement; rebuild the wheel to write it again"
        ) from None


# ----------------------------------------------------------------------------- signatures


def _pae(payload_type: str, payload: bytes) -> bytes:
    """DSSE's pre-authentication encoding: what is really signed (type and body, with lengths)."""
    kind = payload_type.encode()
    return b"DSSEv1 %d %s %d %s" % (len(kind), kind, len(payload), payload)


def _ssh_keygen(args: list[str], *, data: bytes, what: str) -> subprocess.CompletedProcess:
    try:
        proc = subprocess.run(["ssh-keygen", *args], input=data, capture_output=True)
    except FileNotFoundError:
        raise UserError(f"{what}: ssh-keygen is not installed (apt install openssh-client)") from None
    return proc


def sign(payload: bytes, key: Path) -> dict:
    """A DSSE envelope of ``payload`` signed by the OpenSSH private key ``key`` (no agent, no network)."""
    what = f"build.signing_key {key}"
    proc = _ssh_keygen(
        ["-Y", "sign", "-q", "-f", str(key), "-n", SIGNATURE_NAMESPACE],
        data=_pae(PAYLOAD_TYPE, payload),
        what=what,
    )
    if proc.returncode != 0 or b"BEGIN SSH SIGNATURE" not in proc.stdout:
        reason = (proc.stderr.decode(errors="replace").strip().splitlines() or ["no signature written"])[-1]
        raise UserError(f"{what}: cannot sign ({reason}); use a key without a passphrase, made by ssh-keygen")
    armored = proc.stdout.decode().strip().splitlines()
    blob = "".join(line for line in armored if not line.startswith("-----"))
    fingerprint = _ssh_keygen(["-l", "-f", str(key)], data=b"", what=what).stdout.decode().split()
    return {
        "payloadType": PAYLOAD_TYPE,
        "payload": base64.b64encode(payload).decode(),
        "signatures": [{"keyid": fingerprint[1] if len(fingerprint) > 1 else "", "sig": blob}],
    }


def check_signature(envelope: Mapping, allowed_signers: Path | None = None) -> str:
    """One line about the envelope's signature: valid and by which key, or why not.

    Without ``allowed_signers`` only the signature's integrity is checked (``ssh-keygen -Y
    check-novalidate``); with it (an ssh allowed_signers file) the key must also be trusted
    for the ``rocmforge-provenance`` namespace.
    """
    payload = base64.b64decode(envelope["payload"])
    data = _pae(envelope["payloadType"], payload)
    lines = []
    for sig in envelope.get("signatures") or []:
        armored = "-----BEGIN SSH SIGNATURE-----\n{}\n-----END SSH SIGNATURE-----\n".format(
            "\n".join(textwrap.wrap(sig["sig"], 70))
        )
        with tempfile.NamedTemporaryFile("w", suffix=".sig") as fh:
            fh.write(armored)
            fh.flush()
            if allowed_signers is None:
                args = ["-Y", "check-novalidate", "-n", SIGNATURE_NAMESPACE, "-s", fh.name]
            else:
                principal = (
                    _ssh_keygen(
                        ["-Y", "find-principals", "-f", str(allowed_signers), "-s", fh.name],
                        data=b"",
                        what="verify",
                    )
                    .stdout.decode()
                    .strip()
                    .splitlines()
                )
                if not principal:
                    lines.append(f"signature by {sig.get('keyid')}: key not in {allowed_signers}")
                    continue
                args = [
                    "-Y",
                    "verify",
                    "-f",
                    str(allowed_signers),
                    "-I",
                    principal[0],
                    "-n",
                    SIGNATURE_NAMESPACE,
                    "-s",
                    fh.name,
                ]
            proc = _ssh_keygen(args, data=data, what="verify")
        state = "valid" if proc.returncode == 0 else "INVALID"
        lines.append(f"signature by {sig.get('keyid')}: {state}")
    return "; ".join(lines) or "no signatures"


# ----------------------------------------------------------------------------- command line


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """CLI: ``python -m rocmforge provenance WHEEL_OR_DIST``."""
    parser.add_argument("target", help="a .whl file or the name of an installed distribution")
    parser.add_argument(
        "--allowed-signers",
        type=Path,
        metavar="FILE",
        help="ssh allowed_signers file: also require the statement's key to be trusted",
    )


def main(args: argparse.Namespace) -> int:
    """Print the record (what the bytes come from) and, for a wheel file, its provenance
    statement (where and when it was built) as one JSON object on stdout."""
    doc: dict = {"record": read(args.target)}
    if args.target.endswith(".whl"):
        found = read_statement(args.target)
        if found is None:
            doc["statement"] = None
            doc["signature"] = f"no {Path(args.target).name}{STATEMENT_SUFFIX} next to the wheel"
        else:
            stmt, envelope = found
            doc["statement"] = stmt
            doc["signature"] = check_signature(envelope, args.allowed_signers) if envelope else "unsigned"
    print(json.dumps(doc, indent=2, sort_keys=True))
    return 0
