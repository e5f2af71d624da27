"""What every command line of rabit_py shares: its help formatter."""

from __future__ import annotations

import argparse

__all__ = ["HelpFormatter"]


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """argparse's formatter that shows defaults, where a default says
    something: not None, not a switch's False, and not when the help text
    already says it (it printed "(default 0) (default: 0)" and "(default:
    None)")."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if (action.default is None or action.default is False
                or action.default == argparse.SUPPRESS or "default" in text
                or not action.option_strings):
            return text
        return super()._get_help_string(action) or text
