"""Wheel files: parse names, read metadata, and rewrite a wheel with its RECORD kept honest.

A rewrite is the one way rocmforge changes a built wheel: metadata edits (dropping a
``Requires-Dist``), extra ``.dist-info`` files (provenance) and a local version label. Every
member's hash and size in ``RECORD`` is recomputed, so pip and uv install the result without
complaint.

:func:`rewrite_wheel` is also the last writer of every wheel rocmforge publishes, and it writes
deterministically: members in a fixed order (package files by name, then ``.dist-info``, RECORD
last), one timestamp for all (``SOURCE_DATE_EPOCH`` of the source), normalised permissions and
no zip extras. The same members give the same bytes on any machine, at any path, at any time,
which is what lets ``python -m rocmforge rebuild-check`` compare sha256s. A step that changes a
wheel after the build (a repair tool) should finish with ``rewrite_wheel(wheel, wheel.parent,
epoch=...)`` so the published bytes stay reproducible.
"""

from __future__ import annotations

import base64
import csv
import hashlib
import io
import os
import re
import tempfile
import time
import zipfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from email.message import Message
from email.parser import Parser
from pathlib import Path

from packaging.utils import canonicalize_name, parse_wheel_filename

# The earliest time a zip entry can hold (1980-01-01T00:00:00Z); older epochs are clamped to it.
ZIP_EPOCH_MIN = 315532800


@dataclass(frozen=True)
class WheelName:
    """The parts of a wheel file name that matter to an index."""

    project: str  # canonical name, e.g. "pytorch-triton-rocm"
    version: str  # as written in the file name, local label included
    filename: str


def wheel_name(path: str | os.PathLike[str]) -> WheelName:
    """Parse ``path``'s file name (``name-version(-build)?-py-abi-plat.whl``)."""
    filename = Path(path).name
    name, version, _build, _tags = parse_wheel_filename(filename)
    return WheelName(project=str(name), version=str(version), filename=filename)


def dist_info_dir(zf: zipfile.ZipFile) -> str:
    """The ``.dist-info`` directory name inside an open wheel."""
    for member in zf.namelist():
        top = member.split("/", 1)[0]
        if top.endswith(".dist-info") and member.endswith("/METADATA") and member.count("/") == 1:
            return top
    raise ValueError(f"{zf.filename}: no .dist-info/METADATA in wheel")


def read_metadata(path: str | os.PathLike[str]) -> Message:
    """The wheel's METADATA as an email message (``msg.get_all('Requires-Dist')``)."""
    with zipfile.ZipFile(path) as zf:
        text = zf.read(f"{dist_info_dir(zf)}/METADATA").decode()
    return Parser().parsestr(text)


def read_member(path: str | os.PathLike[str], name: str) -> bytes | None:
    """Bytes of ``<dist-info>/name`` inside the wheel, or None when absent."""
    with zipfile.ZipFile(path) as zf:
        try:
            return zf.read(f"{dist_info_dir(zf)}/{name}")
        except KeyError:
            return None


def drop_requirements(metadata: Message, projects: set[str]) -> list[str]:
    """Remove ``Requires-Dist`` lines naming any of ``projects``; return the removed lines."""
    from packaging.requirements import Requirement

    wanted = {canonicalize_name(p) for p in projects}
    kept, dropped = [], []
    for line in metadata.get_all("Requires-Dist") or []:
        (dropped if canonicalize_name(Requirement(line).name) in wanted else kept).append(line)
    del metadata["Requires-Dist"]
    for line in kept:
        metadata["Requires-Dist"] = line
    return dropped


def pin_requirements(metadata: Message, pins: Mapping[str, str]) -> list[str]:
    """Make ``Requires-Dist`` name each project of ``pins`` at exactly its version.

    An existing line keeps its extras and marker and gets ``==version`` as its only specifier;
    a project not named yet gets a new line. Lines of optional extras are left alone. Returns
    the lines this wrote (empty when the build already pinned everything exactly).
    """
    from packaging.requirements import Requirement
    from packaging.specifiers import SpecifierSet

    wanted = {canonicalize_name(p): v for p, v in pins.items()}
    seen: set[str] = set()
    lines, written = [], []
    for line in metadata.get_all("Requires-Dist") or []:
        req = Requirement(line)
        name = canonicalize_name(req.name)
        if name not in wanted or (req.marker is not None and "extra" in str(req.marker)):
            lines.append(line)
            continue
        seen.add(name)
        exact = SpecifierSet(f"=={wanted[name]}")
        if req.specifier != exact:
            req.specifier = exact
            line = str(req)
            written.append(line)
        lines.append(line)
    for name, version in wanted.items():
        if name not in seen:
            lines.append(f"{name}=={version}")
            written.append(lines[-1])
    del metadata["Requires-Dist"]
    for line in lines:
        metadata["Requires-Dist"] = line
    return written


def with_local_label(version: str, label: str) -> str:
    """``version`` with the local label ``label`` (``2.13.0`` + ``rocm7.2`` -> ``2.13.0+rocm7.2``)."""
    public, _, local = version.partition("+")
    if local == label or local.endswith(f".{label}"):
        return version
    return f"{public}+{local}.{label}" if local else f"{public}+{label}"


def rewrite_wheel(
    src: str | os.PathLike[str],
    dest_dir: str | os.PathLike[str],
    *,
    edit_metadata: Callable[[Message], object] | None = None,
    add_files: dict[str, bytes] | None = None,
    version: str | None = None,
    replace_files: dict[str, Path] | None = None,
    epoch: int | None = None,
) -> Path:
    """Write a changed copy of wheel ``src`` into ``dest_dir`` and return its path.

    ``edit_metadata`` changes METADATA in place; ``add_files`` maps names inside ``.dist-info``
    to contents; ``version`` renames the wheel, its ``.dist-info`` directory and the METADATA
    ``Version``; ``replace_files`` maps member names to files on disk whose bytes replace
    them (an ELF member patchelf rewrote). RECORD is regenerated from the final members.
    Members are streamed, so a multi-gigabyte wheel does not have to fit in memory.
    ``dest_dir`` may be ``src``'s own directory: the result replaces ``src`` atomically.

    The output is deterministic (see the module docstring): every member gets the time
    ``epoch`` (seconds since 1970, e.g. ``SOURCE_DATE_EPOCH``; default 1980-01-01, the zip
    minimum), mode 0644 or 0755 (executable when any x bit was set in ``src``).
    """
    src, dest_dir = Path(src), Path(dest_dir)
    name = wheel_name(src)
    new_version = version or name.version
    old_ver, new_ver = _escape_version(name.version), _escape_version(new_version)
    target = dest_dir / name.filename.replace(f"-{old_ver}-", f"-{new_ver}-", 1)
    stamp = zip_date_time(epoch)
    dest_dir.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=dest_dir)
    os.close(fd)
    try:
        with zipfile.ZipFile(src) as zf, zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as dst:
            old_info = dist_info_dir(zf)
            new_info = f"{old_info[: -len('.dist-info')].rsplit('-', 1)[0]}-{new_ver}.dist-info"
            metadata = Parser().parsestr(zf.read(f"{old_info}/METADATA").decode())
            if edit_metadata:
                edit_metadata(metadata)
            if version:
                metadata.replace_header("Version", new_version)
            extra = {f"{new_info}/{k}": v for k, v in (add_files or {}).items()}
            extra[f"{new_info}/METADATA"] = metadata.as_string().encode()
            copied = {}
            for info in zf.infolist():
                arcname = info.filename
                if arcname.startswith(f"{old_info}/"):
                    arcname = new_info + arcname[len(old_info) :]
                if info.is_dir() or arcname == f"{new_info}/RECORD" or arcname in extra:
                    continue
                copied[arcname] = info
            rows = []
            for arcname in sorted([*copied, *extra], key=lambda n: (n.startswith(f"{new_info}/"), n)):
                if arcname in extra:
                    data = extra[arcname]
                    dst.writestr(_member_info(arcname, stamp, executable=False), data)
                    rows.append(_record_row(arcname, hashlib.sha256(data), len(data)))
                    continue
                old = copied[arcname]
                info = _member_info(arcname, stamp, executable=bool((old.external_attr >> 16) & 0o111))
                info.file_size = old.file_size  # decides zip64 up front, as the source did
                digest, size = hashlib.sha256(), 0
                source = replace_files.get(old.filename) if replace_files else None
                if source:  # its size decides zip64 instead of the member's it replaces
                    info.file_size = Path(source).stat().st_size
                opened = open(source, "rb") if source else zf.open(old)  # noqa: SIM115
                with opened as fin, dst.open(info, "w") as fout:
                    for chunk in iter(lambda: fin.read(1 << 20), b""):
                        digest.update(chunk)
                        size += len(chunk)
                        fout.write(chunk)
                rows.append(_record_row(arcname, digest, size))
            buf = io.StringIO()
            csv.writer(buf, lineterminator="\n").writerows([*rows, (f"{new_info}/RECORD", "", "")])
            dst.writestr(_member_info(f"{new_info}/RECORD", stamp, executable=False), buf.getvalue())
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return target


def zip_date_time(epoch: int | None) -> tuple[int, int, int, int, int, int]:
    """The zip timestamp (UTC) of ``epoch`` seconds, clamped to the zip format's 1980 minimum.

    Zip stores even seconds only, so an odd epoch is rounded down, as every zip tool does.
    """
    seconds = ZIP_EPOCH_MIN if epoch is None else max(int(epoch), ZIP_EPOCH_MIN)
    return time.gmtime(seconds)[:6]


def _member_info(arcname: str, stamp: tuple, *, executable: bool) -> zipfile.ZipInfo:
    """A ZipInfo that depends on nothing but its arguments (no host, umask or clock)."""
    info = zipfile.ZipInfo(arcname, date_time=stamp)
    info.compress_type = zipfile.ZIP_DEFLATED
    info.create_system = 3  # Unix, so the mode bits below are honoured by installers
    info.external_attr = (0o100755 if executable else 0o100644) << 16
    return info


def _record_row(arcname: str, digest, size: int) -> tuple[str, str, str]:
    b64 = base64.urlsafe_b64encode(digest.digest()).rstrip(b"=").decode()
    return (arcname, f"sha256={b64}", str(size))


def _escape_version(version: str) -> str:
    # Wheel file names and .dist-info directories use '_' for any '-' in the version.
    return re.sub(r"[^\w\d.+]+", "_", version)
