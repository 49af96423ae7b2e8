"""``python -m rocmforge``: the parts users want on their own (doctor, arch, env, inspect, diagnose, ...).

Each subcommand lives in its own module, which provides ``add_arguments(parser)`` and
``main(args) -> int``. Modules are imported only when their command runs, so ``--help`` and
quick commands stay fast.
"""

from __future__ import annotations

import argparse
import importlib
import os
import signal
import sys

from rocmforge import __version__
from rocmforge.errors import UserError

# Plain text: --help prints it as it is (the module docstring's RST markup showed raw).
DESCRIPTION = "rocmforge's tools on their own: doctor, arch, env, inspect, diagnose, verify, ..."

# command -> (module, one-line help). The CLI contract of these commands is documented in the
# README; other tools parse their --json output, so keep it stable.
COMMANDS: dict[str, tuple[str, str]] = {
    "doctor": ("rocmforge.build.doctor", "check this host for everything a ROCm build needs"),
    "arch": ("rocmforge.arch_detect", "list GPU archs of this machine or of saved tool output"),
    "env": ("rocmforge.build.package", "print the build environment of a package"),
    "inspect": ("rocmforge.verify.inspect", "list the GPU code objects inside .so files and wheels"),
    "verify": (
        "rocmforge.verify.checks",
        "prove an environment runs: archs, libraries, versions, imports, GPU",
    ),
    "diagnose": ("rocmforge.diagnose.engine", "find the cause of a failed build or run in its log"),
    "checkout": (
        "rocmforge.sources.checkout",
        "check out the pinned sources (with patches) into third_party/",
    ),
    "patch": ("rocmforge.sources.patches", "turn your edits in third_party/<pkg> into a new patch file"),
    "check-node": (
        "rocmforge.verify.node",
        "check a node against the wheelhouse's stack.json before installing",
    ),
    "pins": ("rocmforge.sources.pins", "print (or --write into a config) the stack a vLLM release pins"),
    "provenance": ("rocmforge.build.provenance", "print what a wheel (or installed package) was built from"),
    "rebuild-check": ("rocmforge.verify.rebuild", "rebuild a wheel from what it records and compare sha256s"),
    "cache": ("rocmforge.build.compile_cache", "show or zero the compile cache's statistics"),
    "publish": ("rocmforge.build.publish", "publish a nightly's wheelhouses as one index per arch set"),
    "bench": (
        "rocmforge.bench.runner",
        "measure GEMM, bandwidth, Triton and vLLM on this GPU against its peak",
    ),
}


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The top-level parser; only ``command``'s module is imported to define its arguments."""
    parser = argparse.ArgumentParser(prog="python -m rocmforge", description=DESCRIPTION)
    parser.add_argument("--version", action="version", version=f"rocmforge {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, (module, help_text) in COMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        p.set_defaults(_module=module)
        if name == command:
            importlib.import_module(module).add_arguments(p)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run one command; a ``UserError`` becomes one line on stderr and its exit code."""
    argv = sys.argv[1:] if argv is None else argv
    parser = build_parser(next((a for a in argv if not a.startswith("-")), None))
    args = parser.parse_args(argv)
    try:
        code = int(importlib.import_module(args._module).main(args) or 0)
        sys.stdout.flush()  # here, where a closed pipe is caught, not at the interpreter's exit
        return code
    except UserError as exc:
        print(f"rocmforge {args.command}: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # `python -m rocmforge ... | head` stopped reading: nothing went wrong on our side. The
        # interpreter flushes stdout once more at exit; give it somewhere that accepts the bytes.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 128 + signal.SIGPIPE  # what a shell reports for a command a closed pipe stopped
