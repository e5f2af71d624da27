"""Every command line's --help: a whole description, and every option's default."""

from __future__ import annotations

import importlib

import pytest

COMMANDS = [("trainers.gbdt", "rabit-gbdt"), ("trainers.kmeans", "rabit-kmeans"),
            ("trainers.linear", "rabit-linear"), ("trainers.mlp", "rabit-mlp"),
            ("rabit_py.launcher", "rabit-run")]


def help_text(module: str, capsys) -> str:
    with pytest.raises(SystemExit) as ended:
        importlib.import_module(module).main(["--help"])
    assert ended.value.code == 0
    return capsys.readouterr().out


@pytest.mark.parametrize("module, prog", COMMANDS)
def test_help_has_a_whole_description_and_every_default(module, prog, capsys):
    text = help_text(module, capsys)
    assert text.startswith(f"usage: {prog}"), text
    description = text.split("\n\n")[1]
    # The first paragraph of the docstring, whole: it ends a sentence.
    assert description.rstrip().endswith("."), description
    options = text.split("options:\n", 1)[1]
    entries = [e for e in options.split("\n  -") if e.strip()]
    # Options that take a value show their default; a switch's "(default:
    # False)" says nothing (issue 28), nor does "(default: None)".
    takes_value = [e for e in entries[1:] if len(e.split()) > 1 and e.split()[1].isupper()]
    missing = [e.split()[0] for e in takes_value if "default" not in e
               and e.split()[0] not in ("-train",)]          # required
    assert "(default: None)" not in text, text
    assert not missing, f"{prog}: options without their default: {missing}"
