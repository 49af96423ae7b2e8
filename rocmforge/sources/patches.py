"""Our fixes on top of upstream: ``patches/<pkg>/NNNN-short-name.patch``, listed in the config.

Each entry records file, sha256, reason, upstream link, an optional version range and an
optional ``workdir`` (a submodule to apply it in)::

    [[packages.vllm.patches]]
    file = "0001-rocm-arch-list-errors.patch"
    sha256 = "..."
    reason = "say which PYTORCH_ROCM_ARCH entries vLLM drops"

The whole series is first tried on a scratch index (``git apply --cached``, nothing in the
tree changes), so a patch that no longer applies stops the run with the patch, the file and
the hunk named, and the tree as it was. Only then is the tree reset and the series applied for
real: plain diffs with ``git apply`` (atomic), ``git format-patch`` files with ``git am --3way``;
each becomes one commit, so ``git log`` lists our patches and ``git diff`` shows a user's own
edits. A patch that upstream already contains (it applies in reverse) is skipped with a note.

``python -m rocmforge patch PKG SHORT-NAME --reason TEXT`` turns edits made in
``third_party/<pkg>`` into the next numbered patch file and prints its config entry.
"""

from __future__ import annotations

import argparse
import json
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path

from packaging.specifiers import SpecifierSet
from packaging.version import InvalidVersion, Version

from rocmforge.config import Config, Package, load_config
from rocmforge.console import console
from rocmforge.errors import UserError
from rocmforge.fsutil import atomic_write, file_sha256
from rocmforge.sources import git

_FORMAT_PATCH_RE = re.compile(rb"^From [0-9a-f]{40} ")
_FAILED_RE = re.compile(r"patch failed: (.+):(\d+)$", re.MULTILINE)
_FILE_ERROR_RE = re.compile(
    r"error: (.+?): (does not exist in index|No such file or directory|already exists in index)"
)


@dataclass(frozen=True)
class Selected:
    """A patch that applies to this version, its file verified against the config's sha256."""

    key: str  # dotted config key, e.g. packages.vllm.patches[0]
    file: str
    path: Path
    sha256: str
    workdir: str  # "" = the tree root, else a submodule path
    format_patch: bool


@dataclass(frozen=True)
class Step:
    """What the dry run decided for one patch."""

    patch: Selected
    already_applied: bool


def patches_dir(cfg: Config, package: str) -> Path:
    """``patches/<package>/`` next to the config file."""
    return cfg.root / "patches" / package


def select(cfg: Config, pkg: Package, version: str | None) -> list[Selected]:
    """The configured patches that apply to ``version``, each file present and matching its sha256."""
    chosen = []
    for i, p in enumerate(pkg.patches):
        key = f"packages.{pkg.name}.patches[{i}]"
        if p.versions:
            try:
                v = Version(version or "")
            except InvalidVersion:
                raise UserError(
                    f"{key}.versions: {pkg.name} has no usable version ({version!r}) to compare with; "
                    f"set packages.{pkg.name}.version"
                ) from None
            if not SpecifierSet(p.versions).contains(v, prereleases=True):
                console.print(f"{pkg.name}: {p.file} is for versions {p.versions}, not {version}; skipped")
                continue
        path = patches_dir(cfg, pkg.name) / p.file
        if not path.is_file():
            raise UserError(f"{key}.file: {path} does not exist; restore the file or remove the entry")
        actual = file_sha256(path)
        if actual != p.sha256:
            raise UserError(
                f"{path.name}: sha256 is {actual} but {key}.sha256 says {p.sha256}; "
                "if you changed the patch on purpose, put the new sha256 in the config"
            )
        head = path.read_bytes()[:64]
        chosen.append(
            Selected(
                key=key,
                file=p.file,
                path=path,
                sha256=actual,
                workdir=(p.workdir or "").strip("/"),
                format_patch=bool(_FORMAT_PATCH_RE.match(head)),
            )
        )
    return chosen


def dry_run(selected: list[Selected], repos: dict[str, tuple[Path, str]]) -> list[Step]:
    """Try the series on scratch indexes of ``repos`` ({workdir: (git dir, commit)}); touches no tree.

    Raises a one-line ``UserError`` naming the patch, file and hunk of the first patch that
    neither applies nor is already applied.
    """
    steps = []
    with tempfile.TemporaryDirectory(prefix="rocmforge-patches-") as tmp:
        indexes: dict[str, str] = {}  # workdir -> its scratch index file
        for s in selected:
            if s.workdir not in repos:
                known = ", ".join(repr(w) for w in sorted(repos) if w) or "none"
                raise UserError(
                    f"{s.key}.workdir: {s.workdir!r} is not a submodule of the tree (submodules: {known})"
                )
            git_dir, commit = repos[s.workdir]
            if s.workdir not in indexes:
                indexes[s.workdir] = str(Path(tmp) / f"index-{len(indexes)}")
                git.run(["read-tree", commit], git_dir=git_dir, env={"GIT_INDEX_FILE": indexes[s.workdir]})
            env = {"GIT_INDEX_FILE": indexes[s.workdir]}
            three_way = ["--3way"] if s.format_patch else []
            forward = git.run(
                ["apply", "--cached", *three_way, str(s.path)], git_dir=git_dir, env=env, check=False
            )
            if forward.returncode == 0:
                steps.append(Step(s, already_applied=False))
                continue
            reverse = git.run(
                ["apply", "--cached", "--reverse", "--check", str(s.path)],
                git_dir=git_dir,
                env=env,
                check=False,
            )
            if reverse.returncode == 0:
                console.print(
                    f"{s.file}: already in the source (applies in reverse); skipped - consider dropping it"
                )
                steps.append(Step(s, already_applied=True))
                continue
            raise UserError(describe_failure(s, forward.stderr))
    return steps


def describe_failure(s: Selected, stderr: str) -> str:
    """One line naming the patch, the file and the hunk that git could not apply."""
    where = f" in {s.workdir}" if s.workdir else ""
    m = _FAILED_RE.search(stderr)
    if m:
        file, line = m.group(1), int(m.group(2))
        hunk = _hunk_at(s.path, file, line)
        return (
            f"{s.file} no longer applies{where}: {file}, {hunk} does not match the source; "
            f"refresh the patch or drop it ({s.key})"
        )
    m = _FILE_ERROR_RE.search(stderr)
    if m:
        problem = f"{m.group(1)} {m.group(2).lower()}"
        return f"{s.file} no longer applies{where}: {problem}; refresh the patch or drop it ({s.key})"
    return f"{s.file} does not apply{where}: {git.last_line(stderr)} ({s.key})"


def _hunk_at(patch: Path, file: str, line: int) -> str:
    """'hunk #N (@@ ... @@)' for the hunk of ``file`` starting at old ``line``."""
    current, number = None, 0
    for text in patch.read_text(errors="replace").splitlines():
        if text.startswith("+++ "):
            current = text[4:].split("\t")[0].removeprefix("b/")
            number = 0
        elif text.startswith("--- ") and text[4:].startswith("a/"):
            current = text[6:].split("\t")[0]
            number = 0
        elif text.startswith("@@") and current == file:
            number += 1
            m = re.match(r"@@ -(\d+)", text)
            if m and int(m.group(1)) == line:
                return f"hunk #{number} ({text.split(' @@')[0]} @@)"
    return f"the hunk at line {line}"


def apply(steps: list[Step], tree: Path) -> list[Selected]:
    """Apply the dry-run series to ``tree`` (freshly reset); each patch becomes one commit."""
    in_effect = []
    for step in steps:
        s = step.patch
        in_effect.append(s)
        if step.already_applied:
            continue
        where = tree / s.workdir if s.workdir else tree
        if s.format_patch:
            proc = git.run(["am", "-q", "--3way", str(s.path)], cwd=where, check=False)
            if proc.returncode != 0:
                git.run(["am", "--abort"], cwd=where, check=False)
                raise UserError(describe_failure(s, proc.stderr))
        else:
            proc = git.run(["apply", str(s.path)], cwd=where, check=False)
            if proc.returncode != 0:
                raise UserError(describe_failure(s, proc.stderr))
            git.run(["add", "--all", "--force", "."], cwd=where)
            git.run(["commit", "-q", "--no-verify", "-m", f"rocmforge patch {s.file}"], cwd=where)
        console.print(f"{tree.name}: applied {s.file}")
    return in_effect


def new_patch(
    cfg: Config,
    package: str,
    short_name: str,
    *,
    reason: str,
    upstream: str | None = None,
    workdir: str | None = None,
) -> tuple[Path, str]:
    """Turn the edits in ``third_party/<package>[/workdir]`` into the next patch file.

    Returns the new file and the TOML entry to paste into the config. The checkout itself is
    left as it is (with the edits staged); adding the entry re-applies the series on a clean tree.
    """
    cfg.package(package)
    tree = cfg.build.third_party / package
    where = tree / workdir if workdir else tree
    if not git.is_work_tree(where):
        raise UserError(f"{where} is not a checkout; run `python -m rocmforge checkout {package}` first")
    git.run(["add", "--all", "."], cwd=where)
    diff = git.run(["diff", "--cached", "--binary", "--no-color", "--no-ext-diff", "HEAD"], cwd=where).stdout
    if not diff.strip():
        raise UserError(f"no edits in {where} (compared with the checked-out source and its patches)")
    slug = re.sub(r"[^a-z0-9]+", "-", short_name.lower()).strip("-")
    if not slug:
        raise UserError(f"patch name {short_name!r}: use letters and digits, e.g. 'fix-rocm-arch-check'")
    directory = patches_dir(cfg, package)
    numbers = [int(p.name[:4]) for p in directory.glob("[0-9][0-9][0-9][0-9]-*.patch")]
    path = directory / f"{max(numbers, default=0) + 1:04d}-{slug}.patch"
    # git apply ignores text before the first "diff --git", so the patch can say why it exists.
    header = f"{reason}\n" + (f"Upstream: {upstream}\n" if upstream else "") + "\n"
    atomic_write(path, header + diff)
    lines = [
        f"[[packages.{package}.patches]]",
        f'file = "{path.name}"',
        f'sha256 = "{file_sha256(path)}"',
        f"reason = {_toml_string(reason)}",
    ]
    if upstream:
        lines.append(f"upstream = {_toml_string(upstream)}")
    if workdir:
        lines.append(f"workdir = {_toml_string(workdir)}")
    return path, "\n".join(lines) + "\n"


def _toml_string(text: str) -> str:
    # JSON's escapes (\n, \t, \", \\, \uXXXX) are all valid in a TOML basic string; a bare newline
    # or control character is not, and a --reason of two lines made the printed entry unloadable.
    return json.dumps(text, ensure_ascii=False).replace("\x7f", "\\u007f")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """``python -m rocmforge patch PKG NAME --reason TEXT [--upstream URL] [--workdir SUBMODULE]``."""
    parser.add_argument("package", help="package whose third_party/<package> holds your edits")
    parser.add_argument("name", help="short name, e.g. fix-rocm-arch-check (becomes NNNN-name.patch)")
    parser.add_argument("--reason", required=True, help="why the patch exists (goes into the config)")
    parser.add_argument("--upstream", help="link to the upstream issue or pull request")
    parser.add_argument("--workdir", help="submodule path inside the tree, if the edits are there")


def main(args: argparse.Namespace) -> int:
    """Write the patch file and print its config entry."""
    cfg = load_config()
    path, entry = new_patch(
        cfg, args.package, args.name, reason=args.reason, upstream=args.upstream, workdir=args.workdir
    )
    console.print(f"wrote {path}; add this to {cfg.path.name}:")
    print(entry, end="")
    return 0
