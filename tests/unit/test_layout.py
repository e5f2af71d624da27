"""The package's layering (DESIGN.md, "Tiers"): no import cycle among
rabit_py's modules or packages, imports only down a tier, private modules
used only inside their package, features on the public API only.

Imports inside functions count too (they are cycles put off, not removed).
An import of ``a.b`` is an edge to ``a.b`` only, as in import-linter's graph:
that Python runs ``a/__init__.py`` first is not counted.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path
from typing import Dict, List, Set

PACKAGE = Path(__file__).resolve().parents[2] / "rabit_py"


def module_names() -> Dict[str, Path]:
    names = {}
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        names[".".join(parts)] = path
    return names


def imports_of(name: str, path: Path, modules: Set[str]) -> Set[str]:
    """The rabit_py modules that module ``name`` imports, anywhere in it."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[:len(base) - (node.level - 1)]
                origin = ".".join(base + ([node.module] if node.module else []))
            else:
                origin = node.module or ""
            # "from a import b": the submodule a.b if there is one, else a.
            targets = [f"{origin}.{alias.name}" if f"{origin}.{alias.name}" in modules
                       else origin for alias in node.names]
        else:
            continue
        found.update(t for t in targets if t in modules and t != name)
    return found


def find_cycle(graph: Dict[str, Set[str]]) -> List[str]:
    """One import cycle as a list of modules (first == last), or []."""
    state: Dict[str, int] = {}          # 1: on the current path, 2: done
    path: List[str] = []

    def visit(node: str) -> List[str]:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state:
                cycle = visit(nxt)
                if cycle:
                    return cycle
        path.pop()
        state[node] = 2
        return []

    for start in sorted(graph):
        if start not in state:
            cycle = visit(start)
            if cycle:
                return cycle
    return []


def test_the_checker_finds_a_cycle():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": set()}) == []


def test_no_import_cycle_among_rabit_py_modules():
    modules = module_names()
    graph = {name: imports_of(name, path, set(modules)) for name, path in modules.items()}
    assert "rabit_py.engine.base" in graph["rabit_py.api"], "the checker lost its way"
    cycle = find_cycle(graph)
    assert not cycle, "import cycle: " + " -> ".join(cycle)


# ---------------------------------------------------------------- tiers
# DESIGN.md, "Tiers": the tier of each part of the package (longest prefix
# wins). import-linter's "layers" contract is the model: a module may import
# its own tier or a lower one, never a higher one.
TIERS = {
    "rabit_py.errors": 0, "rabit_py.config": 0, "rabit_py.ops": 0, "rabit_py.extras": 0,
    "rabit_py._version": 0, "rabit_py._status": 0, "rabit_py._arrays": 0, "rabit_py.cli": 0,
    "rabit_py._unpickle": 0, "rabit_py._servers": 0, "rabit_py._spawn": 0,
    "rabit_py.engine": 1, "rabit_py.gpu": 1, "rabit_py.launcher": 1,
    "rabit_py.api": 2, "rabit_py": 2,
    "rabit_py.collective": 3, "rabit_py.rabit": 3, "rabit_py.mpi4py": 3,
    "rabit_py.ddp": 3, "rabit_py.torch": 3, "rabit_py.kvstore": 3, "rabit_py.xgboost": 3,
}

# Inside the engine, layers too: the call path (every other engine module)
# never imports the robust engine's parts; ``engine.create`` (the package's
# __init__) is above them all.
ENGINE_LAYERS = [
    ("rabit_py.engine",),                                   # create()
    ("rabit_py.engine.mock",),
    ("rabit_py.engine.robust",),
    ("rabit_py.engine.recovery",),
]

# What a device-transport package may import (DESIGN.md: gpu imports
# engine.base and T0 only).
GPU_MAY_IMPORT_FROM_ENGINE = {"rabit_py.engine.base"}

# Imports of another package's private module, each named with its reason;
# at most one (the issue that set these rules).
ALLOWED_PRIVATE = {}        # type: Dict[Tuple[str, str], str]


def part_of(name: str, table: Dict[str, int]) -> str:
    """The entry of ``table`` that ``name`` belongs to (the longest prefix)."""
    parts = name.split(".")
    for i in range(len(parts), 0, -1):
        prefix = ".".join(parts[:i])
        if prefix in table:
            return prefix
    raise KeyError(f"{name} has no tier: add it to TIERS (DESIGN.md, 'Tiers')")


def tier_of(name: str) -> int:
    return TIERS[part_of(name, TIERS)]


def is_private(name: str) -> bool:
    return name.rpartition(".")[2].startswith("_") and not name.endswith("__")


def home_of(private: str) -> str:
    """The package whose modules may import the private module ``private``."""
    return private.rpartition(".")[0]


def unit_of(name: str) -> str:
    """The unit of the package-level cycle check: a top-level module, or a
    top-level subpackage with everything under it."""
    return ".".join(name.split(".")[:2])


def engine_layer(name: str) -> int:
    """The layer of an engine module (0: the top); the call path is last."""
    best = len(ENGINE_LAYERS)
    for index, prefixes in enumerate(ENGINE_LAYERS):
        for prefix in prefixes:
            if name == prefix or (prefix != "rabit_py.engine" and name.startswith(prefix + ".")):
                best = index
    return best


def violations(graph: Dict[str, Set[str]]) -> List[str]:
    """Every broken rule of DESIGN.md's tiers in an import graph, one line each."""
    found = []
    for importer, targets in sorted(graph.items()):
        for target in sorted(targets):
            edge = f"{importer} imports {target}"
            if tier_of(target) > tier_of(importer):
                found.append(f"{edge}: T{tier_of(importer)} importing T{tier_of(target)} "
                             f"(imports point down a tier, never up)")
            if is_private(target) and home_of(target) != "rabit_py":    # not a T0 contract
                home = home_of(target)
                if not (importer == home or importer.startswith(home + ".")) and \
                        (importer, target) not in ALLOWED_PRIVATE:
                    found.append(f"{edge}: a private module of {home} imported from outside it")
            if tier_of(importer) == 3 and tier_of(target) == 1:
                found.append(f"{edge}: a feature (T3) reaching into T1; use the public API")
            if importer.startswith("rabit_py.engine") and target.startswith("rabit_py.engine") \
                    and engine_layer(target) < engine_layer(importer):
                found.append(f"{edge}: the engine's lower layer importing a higher one "
                             f"(the call path never imports robust, mock or recovery)")
            if importer.startswith("rabit_py.gpu") and target.startswith("rabit_py.engine") \
                    and target not in GPU_MAY_IMPORT_FROM_ENGINE:
                found.append(f"{edge}: the device transports use engine.base only")
            if importer.startswith("rabit_py.engine") and unit_of(target) in (
                    "rabit_py.gpu", "rabit_py.launcher"):
                found.append(f"{edge}: the engine never imports another T1 package "
                             f"(device transports are given to engine.create)")
    return found


def package_graph(graph: Dict[str, Set[str]]) -> Dict[str, Set[str]]:
    units: Dict[str, Set[str]] = {}
    for importer, targets in graph.items():
        units.setdefault(unit_of(importer), set())
        for target in targets:
            units.setdefault(unit_of(target), set())
            if unit_of(target) != unit_of(importer):
                units[unit_of(importer)].add(unit_of(target))
    return units


def real_graph() -> Dict[str, Set[str]]:
    modules = module_names()
    return {name: imports_of(name, path, set(modules)) for name, path in modules.items()}


def test_every_module_has_a_tier():
    for name in real_graph():
        tier_of(name)


def test_the_checker_finds_each_kind_of_broken_rule():
    broken = {
        "rabit_py.engine.mpi": {"rabit_py.api", "rabit_py.engine.recovery._cache",
                                "rabit_py.gpu._transports"},
        "rabit_py.kvstore": {"rabit_py.engine.base"},
        "rabit_py.gpu._nccl": {"rabit_py.engine.mpi"},
        "rabit_py.launcher._setup": {"rabit_py.engine._store"},
    }
    lines = "\n".join(violations(broken))
    assert "rabit_py.engine.mpi imports rabit_py.api: T1 importing T2" in lines
    assert "rabit_py.engine.mpi imports rabit_py.engine.recovery._cache: a private module" in lines
    assert "the call path never imports" in lines
    assert "rabit_py.engine.mpi imports rabit_py.gpu._transports" in lines
    assert "rabit_py.kvstore imports rabit_py.engine.base: a feature (T3)" in lines
    assert "rabit_py.gpu._nccl imports rabit_py.engine.mpi: the device transports" in lines
    assert "rabit_py.launcher._setup imports rabit_py.engine._store: a private module" in lines
    fine = {"rabit_py.kvstore": {"rabit_py._arrays", "rabit_py.api", "rabit_py.ddp.bucket"},
            "rabit_py.engine.robust": {"rabit_py.engine.recovery", "rabit_py.engine._frame"},
            "rabit_py.engine.recovery._repair": {"rabit_py.engine._control"}}
    assert violations(fine) == []
    assert find_cycle(package_graph({"rabit_py.engine.x": {"rabit_py.gpu.y"},
                                     "rabit_py.gpu.y": {"rabit_py.engine.base"}})) == \
        ["rabit_py.engine", "rabit_py.gpu", "rabit_py.engine"]


def test_imports_follow_the_tiers():
    lines = violations(real_graph())
    assert not lines, "broken layering rules (DESIGN.md, 'Tiers'):\n" + "\n".join(lines)


def test_no_import_cycle_among_packages():
    cycle = find_cycle(package_graph(real_graph()))
    assert not cycle, "package-level import cycle: " + " -> ".join(cycle)


def test_cross_package_private_imports_are_named_and_at_most_one():
    assert len(ALLOWED_PRIVATE) <= 1
    graph = real_graph()
    for (importer, target), reason in ALLOWED_PRIVATE.items():
        assert target in graph[importer], f"{importer} no longer imports {target}: drop it"
        assert reason


def test_the_top_level_holds_the_core_contracts_and_drop_ins_only():
    top = sorted(p.stem for p in PACKAGE.glob("*.py"))
    assert top == ["__init__", "_arrays", "_servers", "_spawn", "_status", "_unpickle", "_version", "api", "cli",
                   "collective", "config", "errors", "extras", "mpi4py", "ops", "rabit"], top


def frame_writes(text: str) -> List[str]:
    """Assignments to a call frame's numbering (``x.frame.seqno = ...``,
    ``frame.version += 1``, in tuple targets too) in a module's source."""
    found = []
    for node in ast.walk(ast.parse(text)):
        targets = (node.targets if isinstance(node, ast.Assign)
                   else [node.target] if isinstance(node, (ast.AugAssign, ast.AnnAssign)) else [])
        for target in targets:
            for part in (target.elts if isinstance(target, ast.Tuple) else [target]):
                if isinstance(part, ast.Attribute) and part.attr in FRAME_NUMBERING and (
                        isinstance(part.value, ast.Name) and part.value.id == "frame"
                        or isinstance(part.value, ast.Attribute) and part.value.attr == "frame"):
                    found.append(f"{part.attr} (line {node.lineno})")
    return found


FRAME_NUMBERING = {"version", "seqno", "membership", "token"}


def test_the_checker_finds_writes_to_the_frame_numbering():
    text = ("self.frame.seqno = 3\nframe.version += 1\nself.frame.version, x = 0, 1\n"
            "y = self.frame.seqno\nself.seqno = 2\n")
    assert frame_writes(text) == ["seqno (line 1)", "version (line 2)", "version (line 3)"]


def test_only_the_call_frame_writes_the_call_numbering():
    writes = {str(path.relative_to(PACKAGE)): frame_writes(path.read_text())
              for path in PACKAGE.rglob("*.py") if path.name != "_frame.py"}
    writes = {name: found for name, found in writes.items() if found}
    assert not writes, f"the call frame owns version, seqno and membership: {writes}"


def test_features_use_the_facade_by_its_public_names():
    reaching = {}
    for name, path in module_names().items():
        if tier_of(name) == 3:
            found = re.findall(r"\bapi\._\w+", path.read_text())
            if found:
                reaching[name] = sorted(set(found))
    assert not reaching, f"features reaching into the facade's private names: {reaching}"
