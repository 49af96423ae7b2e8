"""The command line's help: plain text, as argparse prints it."""

from __future__ import annotations

import pytest

from rocmforge.cli import COMMANDS, build_parser


@pytest.mark.parametrize("command", [None, *COMMANDS])
def test_help_has_no_raw_markup(command, capsys):
    # The top-level --help printed the module docstring's ``python -m rocmforge`` verbatim.
    argv = ["--help"] if command is None else [command, "--help"]
    with pytest.raises(SystemExit):
        build_parser(command).parse_args(argv)
    text = capsys.readouterr().out
    assert text.startswith("usage: python -m rocmforge")
    assert "`" not in text, text
