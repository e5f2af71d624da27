"""Every ``Note [name]`` that the code or the docs refer to is written once,
in the one format: a line ``# Note [name]`` at the start of a docstring or
comment block of a source file (GHC's habit, which STYLE.md takes)."""

import re
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SOURCES = ["rabit_py", "trainers", "scripts", "tests"]
DEFINITION = re.compile(r"^\s*#\s*Note \[([^\]]+)\]\s*$", re.MULTILINE)
REFERENCE = re.compile(r"Note \[([^\]]+)\]")


def files():
    for folder in SOURCES:
        yield from (p for p in (ROOT / folder).rglob("*.py") if p != Path(__file__))
    yield ROOT / "README.md"
    yield from (ROOT / "docs").rglob("*.md")


def one_line(name: str) -> str:
    """A reference's name as written across lines of a comment or docstring."""
    return re.sub(r"\s*\n\s*#?\s*", " ", name)


def test_every_note_referred_to_is_defined_exactly_once():
    defined = Counter()
    referred = {}
    for path in files():
        text = path.read_text()
        defined.update(DEFINITION.findall(text))
        for name in REFERENCE.findall(text):
            referred.setdefault(one_line(name), path.relative_to(ROOT))
    twice = sorted(name for name, count in defined.items() if count > 1)
    assert not twice, f"notes defined more than once: {twice}"
    missing = {name: str(path) for name, path in referred.items() if name not in defined}
    assert not missing, f"notes referred to but never written as '# Note [name]': {missing}"
    assert len(defined) > 30, "the checker lost its way"


def test_the_checker_tells_definitions_from_references():
    text = '"""x\n\n# Note [a b]\nbody, see Note [c]\n"""\n# Note [d] is not a definition\n'
    assert DEFINITION.findall(text) == ["a b"]
    assert REFERENCE.findall(text) == ["a b", "c", "d"]
    assert one_line("fixed\n    # groups") == one_line("fixed\ngroups") == "fixed groups"
