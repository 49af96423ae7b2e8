"""``python -m rocmforge pins --from-vllm VERSION|SDIST|DIR``: the stack a vLLM release validates.

vLLM's ROCm images build their stack from source in one Dockerfile whose ``ARG`` lines pin every
member: ``docker/Dockerfile.rocm_72_base`` since 0.33.0 (ROCm 7.2; ``Dockerfile.rocm_base`` then
installs AMD's prebuilt wheels instead), ``docker/Dockerfile.rocm_base`` in 0.27-0.32 (the one
with ``ARG PYTORCH_BRANCH``). This reads that file out of the release's sdist (downloaded from
pip's index and checked against the sha256 the index lists), an sdist file, or an unpacked tree,
and prints the pins; ``--write CONFIG`` puts them into a config in place, keeping every other
line and comment, each written line marked ``# from vLLM X docker/Dockerfile...``.

JSON (``--json``; other tools read it, keep it stable)::

    {"vllm": "0.33.0", "dockerfile": "docker/Dockerfile.rocm_72_base", "rocm": "7.2.3",
     "python": "3.12", "arch": ["gfx90a", ...],
     "packages": {"pytorch": {"url": "https://github.com/ROCm/pytorch.git", "rev": "733fca1"},
                  "triton": {...}, "torchvision": {...}, "torchaudio": {...},
                  "flash_attn": {...}, "aiter": {...}, "mori": {...}}}

``rev`` is exactly what the Dockerfile writes (a tag, or a commit, often abbreviated); a member
the Dockerfile does not pin is absent from ``packages``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import tarfile
import zipfile
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from packaging.version import InvalidVersion, Version

from rocmforge.errors import UserError
from rocmforge.fsutil import atomic_write, file_lock, file_sha256

# Where the source build lives, newest layout first; rocm_base counts only when it builds
# PyTorch itself (0.33's rocm_base installs prebuilt torch wheels from AMD's index).
DOCKERFILES = ("docker/Dockerfile.rocm_72_base", "docker/Dockerfile.rocm_base")
SOURCE_BUILD_MARKER = "PYTORCH_BRANCH"
# Config package name -> the Dockerfile's ARG prefix (<PREFIX>_REPO, <PREFIX>_BRANCH).
MEMBERS = {
    "pytorch": "PYTORCH",
    "triton": "TRITON",
    "torchvision": "PYTORCH_VISION",
    "torchaudio": "PYTORCH_AUDIO",
    "flash_attn": "FA",
    "aiter": "AITER",
    "mori": "MORI",
}
REQUIRED_MEMBERS = ("pytorch", "triton")
_ASSIGN_RE = re.compile(r"^\s*(ARG|ENV)\s+([A-Za-z_][A-Za-z0-9_]*)(?:=|\s+)?(.*)$")
_HEX_RE = re.compile(r"[0-9a-f]{7,40}")
# "release/2.13 as of 09/17": the branch a pinned commit was taken from.
_BRANCH_NOTE_RE = re.compile(r"^([\w./-]+)\s+as of\b")
_TAG_VERSION_RE = re.compile(r"^v?(\d+\.\d+\.\d+(?:\.post\d+)?)$")
_BRANCH_VERSION_RE = re.compile(r"(?:^|/)(\d+)\.(\d+)(?:\.x)?$")


@dataclass(frozen=True)
class Member:
    """One pinned member: repository, rev as written, and the Dockerfile's note on that line."""

    url: str
    rev: str
    note: str = ""  # e.g. "release/2.13 as of 09/17"

    @property
    def branch(self) -> str | None:
        """The branch the note names for a pinned commit, if it names one."""
        m = _BRANCH_NOTE_RE.match(self.note)
        return m.group(1) if m else None


@dataclass(frozen=True)
class Stack:
    """What one vLLM release's Dockerfile pins."""

    vllm: str | None
    dockerfile: str
    rocm: str | None
    python: str | None
    arch: tuple[str, ...]
    packages: dict[str, Member] = field(default_factory=dict)
    sdist_sha256: str | None = None  # of the sdist read, when it was one (not for a directory)

    def to_json(self) -> dict:
        """The stable JSON shape (module docstring)."""
        return {
            "vllm": self.vllm,
            "dockerfile": self.dockerfile,
            "rocm": self.rocm,
            "python": self.python,
            "arch": list(self.arch),
            "packages": {name: {"url": m.url, "rev": m.rev} for name, m in self.packages.items()},
        }

    @property
    def origin(self) -> str:
        """The comment ``--write`` puts on each line it writes."""
        return f"from vLLM {self.vllm or '(unknown version)'} {self.dockerfile}"


# ------------------------------------------------------------------------------ reading


def parse_dockerfile(text: str) -> dict[str, tuple[str, str]]:
    """``NAME -> (value, note)`` of every ``ARG``/``ENV`` with a value; the first one wins.

    ``ARG X="a" # note`` -> ``("a", "note")``. A later bare ``ARG X`` (re-declaring it inside a
    stage) keeps the global default, as Docker does.
    """
    found: dict[str, tuple[str, str]] = {}
    for line in text.splitlines():
        m = _ASSIGN_RE.match(line)
        if not m or not m.group(3).strip():
            continue
        rest = m.group(3).strip()
        if rest[0] in "\"'":
            end = rest.find(rest[0], 1)
            value, tail = (rest[1:end], rest[end + 1 :]) if end > 0 else (rest[1:], "")
        else:
            value, _, tail = rest.partition(" ")
        note = tail.strip().removeprefix("#").strip()
        if value and m.group(2) not in found:
            found[m.group(2)] = (value, note)
    return found


def stack_from_files(files: dict[str, str], vllm: str | None, *, where: str) -> Stack:
    """The stack from ``docker/...`` file texts (relative path -> text) of one release."""
    chosen = None
    for name in DOCKERFILES:
        text = files.get(name)
        if text is None:
            continue
        if name.endswith("rocm_72_base") or re.search(rf"^\s*ARG\s+{SOURCE_BUILD_MARKER}\b", text, re.M):
            chosen = name
            break
    if chosen is None:
        present = [n for n in DOCKERFILES if n in files]
        seen = f"; it has {', '.join(present)} without ARG {SOURCE_BUILD_MARKER}" if present else ""
        raise UserError(
            f"{where}: unrecognised layout: looked for {DOCKERFILES[0]}, else a {DOCKERFILES[1]} with "
            f"ARG {SOURCE_BUILD_MARKER} (the Dockerfile that builds PyTorch from source){seen}"
        )
    args = parse_dockerfile(files[chosen])
    packages = {}
    for name, prefix in MEMBERS.items():
        repo, rev = args.get(f"{prefix}_REPO"), args.get(f"{prefix}_BRANCH")
        if repo and rev:
            packages[name] = Member(url=repo[0], rev=rev[0], note=rev[1])
        elif name in REQUIRED_MEMBERS:
            raise UserError(
                f"{where}: {chosen} has no ARG {prefix}_REPO / {prefix}_BRANCH; unrecognised layout"
            )
    image = args.get("BASE_IMAGE", ("", ""))[0]
    rocm = re.search(r":(\d+(?:\.\d+)+)", image)
    arch = args.get("PYTORCH_ROCM_ARCH", ("", ""))[0]
    return Stack(
        vllm=vllm,
        dockerfile=chosen,
        rocm=rocm.group(1) if rocm else None,
        python=args.get("PYTHON_VERSION", (None, ""))[0],
        arch=tuple(a for a in arch.split(";") if a),
        packages=packages,
    )


def _sdist_members(path: Path) -> tuple[dict[str, str], str | None]:
    """The Dockerfiles and the version (PKG-INFO) inside an sdist archive."""
    wanted = {*DOCKERFILES, "PKG-INFO"}
    texts: dict[str, str] = {}
    try:
        if zipfile.is_zipfile(path):
            with zipfile.ZipFile(path) as zf:
                for name in zf.namelist():
                    rel = str(PurePosixPath(*PurePosixPath(name).parts[1:]))
                    if rel in wanted:
                        texts[rel] = zf.read(name).decode("utf-8", "replace")
        else:
            with tarfile.open(path) as tf:
                for info in tf:
                    rel = str(PurePosixPath(*PurePosixPath(info.name).parts[1:]))
                    if rel in wanted and info.isfile() and rel not in texts:
                        texts[rel] = tf.extractfile(info).read().decode("utf-8", "replace")
    except (tarfile.TarError, zipfile.BadZipFile, EOFError, OSError) as exc:
        reason = str(exc).splitlines()[0].rstrip(":")  # tarfile lists every method it tried
        raise UserError(
            f"{path}: not a readable sdist ({reason}); give a vLLM .tar.gz, a directory or a version"
        ) from None
    return texts, _pkg_info_version(texts.get("PKG-INFO"))


def _pkg_info_version(text: str | None) -> str | None:
    m = re.search(r"^Version:\s*(\S+)", text or "", re.M)
    return m.group(1) if m else None


def _directory_files(root: Path) -> tuple[dict[str, str], str | None]:
    texts = {n: (root / n).read_text(errors="replace") for n in DOCKERFILES if (root / n).is_file()}
    pkg_info = root / "PKG-INFO"
    return texts, _pkg_info_version(pkg_info.read_text(errors="replace") if pkg_info.is_file() else None)


def download_sdist(version: str, cache: Path) -> tuple[Path, str]:
    """vLLM ``version``'s sdist from pip's index, checked against the sha256 the index lists."""
    from rocmforge.sources import archives

    found = archives.find_sdist("vllm", version, what=f"vllm {version}")
    if found is None:
        raise UserError(f"--from-vllm {version}: no sdist of vllm {version} on {archives.pip_index_url()}")
    filename, url, sha256 = found
    if not sha256:
        raise UserError(
            f"--from-vllm {version}: the index lists {filename} without a sha256, so the download cannot be "
            "checked; download it yourself and pass the file"
        )
    return archives.fetch_archive(cache, url, filename, sha256, what=f"vllm {version}"), sha256


def read_stack(spec: str, *, cache: Path) -> Stack:
    """The stack of ``spec``: a vLLM version (downloaded), an sdist file, or an unpacked tree."""
    path = Path(spec).expanduser()
    sha256 = None
    if path.is_dir():
        files, version = _directory_files(path)
    elif path.is_file():
        files, version = _sdist_members(path)
        sha256 = file_sha256(path)
    else:
        try:
            Version(spec)
        except InvalidVersion:
            raise UserError(
                f"--from-vllm {spec}: not a vLLM version (e.g. 0.33.0), an sdist file or a directory"
            ) from None
        archive, sha256 = download_sdist(spec, cache)
        files, version = _sdist_members(archive)
    stack = stack_from_files(files, version, where=f"vLLM {version or spec}")
    return Stack(**{**stack.__dict__, "sdist_sha256": sha256})


# ------------------------------------------------------------------------------ --write


@dataclass
class _Table:
    """One ``[header]`` of a TOML file as line numbers: where it starts and ends."""

    start: int  # index of the header line
    end: int  # index after its last line


def _tables(lines: list[str]) -> dict[str, _Table]:
    heads = [
        (i, m.group(1).strip()) for i, ln in enumerate(lines) if (m := re.match(r"^\s*\[([^\[\]]+)\]", ln))
    ]
    out = {}
    for k, (i, name) in enumerate(heads):
        end = heads[k + 1][0] if k + 1 < len(heads) else len(lines)
        # Double-bracket headers ([[...]]) end a table too.
        for j in range(i + 1, end):
            if lines[j].lstrip().startswith("[["):
                end = j
                break
        out.setdefault(name, _Table(i, end))
    return out


def _key_line(lines: list[str], table: _Table, key: str) -> int | None:
    for i in range(table.start + 1, table.end):
        if re.match(rf"^\s*{re.escape(key)}\s*=", lines[i]):
            return i
    return None


def _value(line: str) -> str | None:
    m = re.match(r'^\s*[\w-]+\s*=\s*"([^"]*)"', line)
    return m.group(1) if m else None


def _line(indent: str, key: str, value: str, comment: str | None) -> str:
    assignment = f'{indent}{key} = "{value}"'
    if comment is None:
        return assignment
    return f"{assignment}{' ' * max(40 - len(assignment), 2)}# {comment}"


class _Editor:
    """Line-based edits of one TOML file: set or remove ``key = "value"`` lines of a table."""

    def __init__(self, text: str):
        self.lines = text.splitlines()
        self.changed: list[str] = []

    def get(self, table: str, key: str) -> str | None:
        t = _tables(self.lines).get(table)
        i = None if t is None else _key_line(self.lines, t, key)
        return None if i is None else _value(self.lines[i])

    def set(self, table: str, key: str, value: str, comment: str | None) -> None:
        t = _tables(self.lines)[table]
        i = _key_line(self.lines, t, key)
        if i is None:
            # After the table's last key line, before trailing blank lines and comments.
            at = t.start + 1
            for j in range(t.start + 1, t.end):
                if re.match(r"^\s*[\w-]+\s*=", self.lines[j]):
                    at = j + 1
            self.lines.insert(at, _line("", key, value, comment))
            self.changed.append(f"{table}.{key} = {value!r}")
            return
        old = self.lines[i]
        if _value(old) == value and (comment is None or f"# {comment}" in old):
            return
        indent = re.match(r"^\s*", old).group(0)
        keep = None if comment is not None else _trailing_comment(old)
        self.lines[i] = _line(indent, key, value, comment if comment is not None else keep)
        self.changed.append(f"{table}.{key} = {value!r}")

    def remove(self, table: str, key: str) -> None:
        t = _tables(self.lines)[table]
        i = _key_line(self.lines, t, key)
        if i is not None:
            del self.lines[i]
            self.changed.append(f"{table}.{key} removed")

    def text(self) -> str:
        return "\n".join(self.lines) + "\n"


def _trailing_comment(line: str) -> str | None:
    m = re.search(r'"\s*#\s*(.*)$', line)
    return m.group(1) if m else None


def _derived_version(rev: str, current: str | None) -> str | None:
    """The package version a rev implies: a tag's own, or X.Y.0 for a release/X.Y branch when the
    configured version is of another X.Y; None to leave the version alone."""
    if m := _TAG_VERSION_RE.match(rev):
        return m.group(1)
    m = _BRANCH_VERSION_RE.search(rev)
    if m and current:
        try:
            if Version(current).release[:2] != (int(m.group(1)), int(m.group(2))):
                return f"{m.group(1)}.{m.group(2)}.0"
        except InvalidVersion:
            return None
    return None


def write_pins(text: str, stack: Stack) -> tuple[str, list[str], list[str]]:
    """``text`` (a config) with ``stack``'s pins; (new text, what changed, what was skipped)."""
    ed = _Editor(text)
    tables = _tables(ed.lines)
    skipped = []
    for name, member in stack.packages.items():
        source = f"packages.{name}.source"
        if source not in tables:
            skipped.append(f"{name} (no [{source}] table)")
            continue
        if ed.get(source, "kind") != "git":
            skipped.append(f"{name} (not a git source)")
            continue
        old_rev, old_commit = ed.get(source, "rev"), ed.get(source, "commit")
        if _HEX_RE.fullmatch(member.rev):
            # A pinned commit: keep a longer configured id of the same commit (it says more).
            same = old_commit and (old_commit.startswith(member.rev) or member.rev.startswith(old_commit))
            commit = old_commit if same and len(old_commit) >= len(member.rev) else member.rev
            rev = member.branch or member.rev
        else:
            rev, commit = member.rev, old_commit if old_rev == member.rev else None
        ed.set(source, "url", member.url, None)
        ed.set(source, "rev", rev, stack.origin)
        if commit:
            ed.set(source, "commit", commit, stack.origin)
        else:
            ed.remove(source, "commit")  # it named a commit of the old rev
        version = _derived_version(rev, ed.get(f"packages.{name}", "version"))
        if version and ed.get(f"packages.{name}", "version") not in (None, version):
            ed.set(f"packages.{name}", "version", version, stack.origin)
    if stack.rocm and ed.get("toolchain", "rocm_version") is not None:
        series = ".".join(stack.rocm.split(".")[:2])  # 7.2.3 -> 7.2: the doctor's minimum
        ed.set("toolchain", "rocm_version", series, stack.origin)
    vllm_source = "packages.vllm.source"
    if stack.vllm and stack.sdist_sha256 and vllm_source in tables and ed.get(vllm_source, "kind") == "pypi":
        ed.set(vllm_source, "version", stack.vllm, None)
        ed.set(vllm_source, "sha256", stack.sdist_sha256, None)
        if ed.get("packages.vllm", "version") is not None:
            ed.set("packages.vllm", "version", stack.vllm, None)
    return ed.text(), ed.changed, skipped


# ------------------------------------------------------------------------------ command line


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """``python -m rocmforge pins --from-vllm VERSION|SDIST|DIR [--json] [--write CONFIG]``."""
    parser.add_argument(
        "--from-vllm",
        required=True,
        metavar="VERSION|SDIST|DIR",
        help="a vLLM release (its sdist is downloaded and checked), an sdist file, or an unpacked tree",
    )
    parser.add_argument("--json", action="store_true", help="print the stack as JSON (stable shape)")
    parser.add_argument("--write", metavar="CONFIG", type=Path, help="update this config's pins in place")


def _cache_dir() -> Path:
    from rocmforge.config import config_path, default_cache_dir, load_config

    if config_path().is_file():
        return load_config().build.cache_dir
    return Path(default_cache_dir(os.environ)).expanduser()


def main(args: argparse.Namespace) -> int:
    """Print (and with ``--write`` apply) the stack a vLLM release pins."""
    if args.write is not None and not args.write.is_file():
        raise UserError(f"--write {args.write}: no such config file; give the path of a build_config.toml")
    stack = read_stack(args.from_vllm, cache=_cache_dir())
    if args.json:
        print(json.dumps(stack.to_json(), indent=2))
    else:
        print(
            f"vLLM {stack.vllm or '?'}: {stack.dockerfile} (ROCm {stack.rocm or '?'}, "
            f"Python {stack.python or '?'})"
        )
        print(f"arch: {';'.join(stack.arch) or '?'}")
        for name, m in stack.packages.items():
            note = f"  ({m.note})" if m.note else ""
            print(f"{name:<12} {m.rev:<14} {m.url}{note}")
    if args.write is not None:
        _write(args.write, stack)
    return 0


def _write(config: Path, stack: Stack) -> None:
    from rocmforge.config import tomllib

    with file_lock(config.with_name(f".{config.name}.lock"), what=f"writing {config.name}"):
        text, changed, skipped = write_pins(config.read_text(), stack)
        try:
            packages = tomllib.loads(text).get("packages", {})
        except tomllib.TOMLDecodeError as exc:  # a layout the line editor got wrong: write nothing
            raise UserError(
                f"--write {config}: the edited file would not be valid TOML ({exc}); unchanged"
            ) from None
        if changed:
            atomic_write(config, text)
    done = f": {'; '.join(changed)}" if changed else ", already up to date"
    print(f"{config}: {len(changed)} change(s){done}", file=sys.stderr)
    for what in skipped:
        print(f"{config}: skipped {what}", file=sys.stderr)
    commits = {name: packages.get(name, {}).get("source", {}).get("commit") for name in stack.packages}
    short = sorted(f"{name} {c}" for name, c in commits.items() if c and len(c) < 40)
    if changed and short:
        print(
            f"{config}: abbreviated commits ({', '.join(short)}) are resolved to full ids at the next "
            "checkout (`python -m rocmforge checkout`) and recorded in the lock (`nox -s lock`)",
            file=sys.stderr,
        )
