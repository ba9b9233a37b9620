"""The import graph of ``src/fedlatent``, read with ``ast`` (nothing imported): no module imports another
in a loop, nothing under ``experiment/`` imports the package face ``fedlatent/__init__.py`` (which imports
``experiment/`` for :func:`fedlatent.run`), and ``experiment/``'s rooms import only the rooms below them
(docs/architecture.md, "Layers")."""
from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "fedlatent"
# experiment/'s rooms: each may import itself and the rooms listed for it, nothing else of experiment/
ROOMS = {"runner": set(), "studies": {"runner"}, "tooling": {"runner"}}


def modules(package: Path) -> dict[str, Path]:
    """Every module of ``package`` by dotted name (a package by its own name, for its ``__init__.py``)."""
    found = {}
    for path in sorted(package.rglob("*.py")):
        parts = list(path.relative_to(package.parent).with_suffix("").parts)
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def _type_checking_only(tree: ast.AST) -> set[int]:
    """The ids of the nodes inside ``if TYPE_CHECKING:`` blocks, which never run."""
    return {id(n) for node in ast.walk(tree) if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)
            for sub in node.body for n in ast.walk(sub)}


def imports(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The package's modules that module ``name`` imports when it runs, inside functions too:
    ``from X import y`` is module ``X.y`` where that is a module, else ``X`` (a package's face)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    skip = _type_checking_only(tree)
    here = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    found: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = ".".join(here[: len(here) - node.level + 1] + [node.module or ""]) if node.level else node.module
            base = (base or "").strip(".")
            for alias in node.names:
                found.add(f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base)
    return {m for m in found if m in known and m != name}


def graph(package: Path) -> dict[str, set[str]]:
    """Module → the modules it imports, without a module's imports of the packages that contain it
    (a package's face importing its children, and a child reading its face, is Python's own pattern)."""
    known = modules(package)
    return {m: {t for t in imports(m, p, known) if not m.startswith(t + ".")} for m, p in known.items()}


def loops(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected groups of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in edges.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def _write(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root / "pkg"


def test_the_checker_finds_a_loop_through_a_function_level_import_and_resolves_from_imports(tmp_path: Path) -> None:
    package = _write(tmp_path, {
        "pkg/__init__.py": "from pkg.a import f\n",
        "pkg/a.py": "from pkg import b\n\ndef f():\n    from pkg.c import g\n",
        "pkg/b.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg.a import f\n",
        "pkg/c.py": "from . import a\nfrom .b import nothing_module\nimport pkg\n",
    })
    edges = graph(package)
    assert edges == {"pkg": {"pkg.a"}, "pkg.a": {"pkg.b", "pkg.c"}, "pkg.b": set(), "pkg.c": {"pkg.a", "pkg.b"}}
    assert loops(edges) == [["pkg.a", "pkg.c"]]
    assert "pkg" in imports("pkg.c", package / "c.py", modules(package))  # the face, seen by the face test


def test_no_module_of_the_package_imports_another_in_a_loop() -> None:
    assert loops(graph(PACKAGE)) == []


def test_nothing_under_experiment_imports_the_package_face() -> None:
    known = modules(PACKAGE)
    upward = [m for m, p in known.items() if m.startswith("fedlatent.experiment") and "fedlatent" in imports(m, p, known)]
    assert upward == []


def test_experiment_lives_in_rooms_that_import_only_the_rooms_below_them() -> None:
    known = modules(PACKAGE)
    rooms = {m: m.split(".")[2] for m in known if m.startswith("fedlatent.experiment.")}
    assert set(rooms.values()) == set(ROOMS)  # every module of experiment/ is in a room
    for m, room in rooms.items():
        tree = ast.parse(known[m].read_text(encoding="utf-8"))
        targets = {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.module}
        targets |= {a.name for node in ast.walk(tree) if isinstance(node, ast.Import) for a in node.names}
        reached = {t.split(".")[2] for t in targets if t.startswith("fedlatent.experiment.")}  # type-only ones too
        assert reached <= {room} | ROOMS[room], f"{m} imports the rooms {sorted(reached - {room} - ROOMS[room])}"


def _every_import(path: Path) -> set[str]:
    """The modules ``path`` names in any import, ``if TYPE_CHECKING:`` blocks included."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found = {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.module}
    return found | {a.name for node in ast.walk(tree) if isinstance(node, ast.Import) for a in node.names}


def test_the_method_types_sit_below_parts_and_programs_type_only_imports_included() -> None:
    """``methods/spec.py`` holds the types that refer to one another (MethodSpec, Part, ClientProgram),
    over ``methods/contexts.py`` (what their hooks read: ClientRound, Upload, the terms' contexts);
    ``parts.py`` and ``program.py`` import them and never each other."""
    methods = PACKAGE / "methods"
    assert not {m for m in _every_import(methods / "contexts.py") if m.startswith("fedlatent.methods")}
    assert {m for m in _every_import(methods / "spec.py") if m.startswith("fedlatent.methods")} == \
        {"fedlatent.methods.contexts"}
    assert "fedlatent.methods.program" not in _every_import(methods / "parts.py")
    assert "fedlatent.methods.parts" not in _every_import(methods / "program.py")
    assert {"fedlatent.methods.spec"} <= _every_import(methods / "parts.py") & _every_import(methods / "program.py")


# the client trainer's rooms (docs/architecture.md, "The trainer's rooms"), in order: each may import
# the rooms before it, none after it
TRAINER = ["rows", "schedule", "batches", "forward", "frozen", "gradients", "weights", "forms", "setup", "step",
           "steps", "finish", "entry"]


def test_the_trainer_rooms_import_only_the_rooms_before_them_and_stay_small() -> None:
    known = modules(PACKAGE)
    prefix = "fedlatent.federated.trainer."
    rooms = sorted(m[len(prefix):] for m in known if m.startswith(prefix))
    assert rooms == sorted(TRAINER)  # every module of the trainer is a room, in the order above
    edges = graph(PACKAGE)
    for i, room in enumerate(TRAINER):
        reached = {t[len(prefix):] for t in edges[prefix + room] if t.startswith(prefix)}
        assert reached <= set(TRAINER[:i]), f"{room} imports {sorted(reached - set(TRAINER[:i]))}"
        tree = ast.parse(known[prefix + room].read_text(encoding="utf-8"))
        assert tree.body and len(known[prefix + room].read_text().splitlines()) <= 400, room
        longest = max((n.end_lineno - n.lineno + 1 for n in ast.walk(tree)  # type: ignore[operator]
                       if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))), default=0)
        assert longest <= 60, f"{room}: a function of {longest} lines"
