"""The packages' architecture, read from their imports (issue 14).

The graph is every import statement of ``trionsq`` and ``fakensq`` that runs:
module level, inside functions and methods alike (a late import is still an
arrow).  Imports under ``if TYPE_CHECKING:`` and modules named in string
annotations (``"fakensq.testing.cluster.Cluster"``) are arrows of another kind,
*typing* arrows: they run nothing, so they may close a circle, but a part that
names another in its annotations depends on it all the same, so the layer rules
count them.  On the graph: no circles (of run-time arrows), ``trionsq`` never
imports ``fakensq``, the sans-IO core imports no I/O, fakensq's parts depend on
each other one way only, and no daemon names the machinery that drives it.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("trionsq", "fakensq")


@dataclass(frozen=True)
class Arrow:
    source: str
    target: str
    line: int
    #: an import under ``if TYPE_CHECKING:`` or a string annotation: runs nothing
    typing: bool = False

    def __str__(self) -> str:
        path = module_path(self.source).relative_to(ROOT)
        kind = ", for typing" if self.typing else ""
        return f"{self.source} -> {self.target} ({path}:{self.line}{kind})"


@cache
def modules() -> dict[str, Path]:
    """Every module of the packages, by dotted name (a package by its own name)."""
    found: dict[str, Path] = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            found[".".join(parts)] = path
    return found


def module_path(name: str) -> Path:
    return modules()[name]


def _is_type_checking(test: ast.expr) -> bool:
    if isinstance(test, ast.Name):
        return test.id == "TYPE_CHECKING"
    return isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"


def _imports(
    tree: ast.AST, typing: bool = False
) -> Iterator[tuple[ast.Import | ast.ImportFrom, bool]]:
    """Every import statement, with whether it is for typing only (in the body
    of an ``if TYPE_CHECKING:``; its ``else:`` branch runs)."""
    for child in ast.iter_child_nodes(tree):
        if isinstance(child, ast.Import | ast.ImportFrom):
            yield child, typing
        elif isinstance(child, ast.If) and _is_type_checking(child.test):
            for node in child.body:
                yield from _imports(ast.Module(body=[node], type_ignores=[]), True)
            for node in child.orelse:
                yield from _imports(ast.Module(body=[node], type_ignores=[]), typing)
        else:
            yield from _imports(child, typing)


def _run_time_imports(tree: ast.AST) -> Iterator[ast.Import | ast.ImportFrom]:
    """The import statements that run: all but the bodies of ``if TYPE_CHECKING:``."""
    return (node for node, typing in _imports(tree) if not typing)


def _annotations(tree: ast.AST) -> Iterator[ast.expr]:
    """Every annotation: of arguments, returns and annotated assignments."""
    for node in ast.walk(tree):
        if isinstance(node, ast.arg | ast.AnnAssign) and node.annotation is not None:
            yield node.annotation
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.returns:
            yield node.returns


def _string_annotation_targets(tree: ast.AST) -> Iterator[tuple[str, int]]:
    """The dotted names of the packages' modules that string annotations spell
    out (``"fakensq.testing.cluster.Cluster"``), with their lines."""
    for annotation in _annotations(tree):
        for node in ast.walk(annotation):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                for word in re.findall(r"[A-Za-z_][\w.]*", node.value):
                    if word.split(".")[0] in PACKAGES:
                        yield word, node.lineno


def _targets(name: str, node: ast.Import | ast.ImportFrom) -> Iterator[str]:
    """The modules of the packages that ``node``, in module ``name``, imports."""
    known = modules()
    if isinstance(node, ast.Import):
        candidates = [alias.name for alias in node.names]
    else:
        if node.level:
            is_package = module_path(name).name == "__init__.py"
            base = name.split(".") if is_package else name.split(".")[:-1]
            base = base[: len(base) - (node.level - 1)]
            source = ".".join([*base, *([node.module] if node.module else [])])
        else:
            source = node.module or ""
        # ``from package import module`` imports the module itself.
        candidates = [
            f"{source}.{alias.name}" if f"{source}.{alias.name}" in known else source
            for alias in node.names
        ]
    for candidate in candidates:
        # ``import a.b.c`` of something not in the packages: its closest known parent.
        while candidate and candidate not in known:
            candidate = candidate.rpartition(".")[0]
        if candidate and candidate != name:
            yield candidate


def _closest_module(dotted: str) -> str | None:
    known = modules()
    while dotted and dotted not in known:
        dotted = dotted.rpartition(".")[0]
    return dotted or None


def _arrows_of(name: str, tree: ast.AST) -> Iterator[Arrow]:
    """The arrows out of module ``name``, whose source is ``tree``."""
    for node, typing in _imports(tree):
        for target in _targets(name, node):
            yield Arrow(name, target, node.lineno, typing)
    for dotted, line in _string_annotation_targets(tree):
        target = _closest_module(dotted)
        if target is not None and target != name:
            yield Arrow(name, target, line, typing=True)


@cache
def all_arrows() -> tuple[Arrow, ...]:
    """Every arrow: run-time imports, typing-only imports, string annotations."""
    found: list[Arrow] = []
    for name, path in modules().items():
        found += _arrows_of(name, ast.parse(path.read_text(), str(path)))
    return tuple(found)


@cache
def arrows() -> tuple[Arrow, ...]:
    """The run-time arrows (what circles are made of)."""
    return tuple(a for a in all_arrows() if not a.typing)


def circles() -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    graph: dict[str, set[str]] = {name: set() for name in modules()}
    for arrow in arrows():
        graph[arrow.source].add(arrow.target)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(graph[node]):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def within(name: str, package: str) -> bool:
    return name == package or name.startswith(package + ".")


def front_door(name: str) -> bool:
    """``python -m fakensq.nsqd`` and the like: a package's ``__main__`` runs its
    command, so it stands above the package, with the command line."""
    return name.endswith(".__main__")


def violations(sources: str | tuple[str, ...], forbidden: Iterable[str]) -> list[str]:
    """The arrows (typing ones too) from modules in ``sources`` to modules in
    ``forbidden``."""
    if isinstance(sources, str):
        sources = (sources,)
    forbidden = tuple(forbidden)
    return sorted(
        {
            str(arrow)
            for arrow in all_arrows()
            if any(within(arrow.source, s) for s in sources)
            and not front_door(arrow.source)
            and any(within(arrow.target, f) for f in forbidden)
        }
    )


# --- the graph itself -----------------------------------------------------------


def test_the_graph_is_read() -> None:
    """Guards the rules below against an empty graph passing them all."""
    assert len(modules()) > 100
    pairs = {(a.source, a.target) for a in arrows()}
    assert ("fakensq.nsqd.node", "fakensq.nsqd.channel") in pairs
    assert ("trionsq.consumer", "trionsq.connection") in pairs
    # A late import (inside a function) is an arrow; one under TYPE_CHECKING is not.
    late = ast.parse("def f():\n    from . import x\n")
    typing_only = ast.parse("if TYPE_CHECKING:\n    from . import y\nelse:\n    from . import z\n")
    assert [n.names[0].name for n in _run_time_imports(late)] == ["x"]
    assert [n.names[0].name for n in _run_time_imports(typing_only)] == ["z"]
    # ... but the typing-only import is an arrow of its own kind, as is a
    # string annotation naming a module, and the layer rules see both.
    assert [(n.names[0].name, t) for n, t in _imports(typing_only)] == [("y", True), ("z", False)]
    spelled = ast.parse('def f(c: "fakensq.testing.cluster.Cluster") -> None: ...')
    assert [d for d, _ in _string_annotation_targets(spelled)] == [
        "fakensq.testing.cluster.Cluster"
    ]
    typing_pairs = {(a.source, a.target) for a in all_arrows() if a.typing}
    assert ("fakensq.nsqd.stats", "fakensq.nsqd.node") in typing_pairs


def test_no_import_circles() -> None:
    found = circles()
    described = [
        " <-> ".join(c)
        + "\n    "
        + "\n    ".join(str(a) for a in arrows() if a.source in c and a.target in c)
        for c in found
    ]
    assert not found, "import circles:\n" + "\n".join(described)


# --- trionsq --------------------------------------------------------------------


def test_trionsq_imports_nothing_of_fakensq() -> None:
    assert violations("trionsq", ["fakensq"]) == []


def test_the_protocol_core_is_sans_io() -> None:
    """trionsq.protocol: no sockets, no Trio, nothing of the client around it."""
    allowed_stdlib_or_codecs = {
        "__future__", "collections", "dataclasses", "enum", "json", "re", "struct",
        "typing", "unicodedata", "zlib", "snappy", "cramjam", "functools", "itertools",
        "abc", "string",
    }  # fmt: skip
    outside = []
    for name, path in modules().items():
        if not within(name, "trionsq.protocol"):
            continue
        for node in _run_time_imports(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level:
                continue
            roots = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else [node.module or ""]
            )
            for root in roots:
                top = root.split(".")[0]
                if top == "trionsq" and within(root, "trionsq.protocol"):
                    continue
                if top not in allowed_stdlib_or_codecs:
                    outside.append(f"{name}:{node.lineno} imports {root}")
    assert outside == []


#: trionsq's client parts, bottom to top: the core client (everything of
#: ``trionsq`` outside these packages) knows nothing of the machinery that hosts
#: it on a thread, nor of the front ends built on that; the hosting machinery
#: knows nothing of the front ends.
TRIONSQ_ABOVE_THE_CORE = ("trionsq.hosting", "trionsq.blocking", "trionsq.aio", "trionsq.spark")


def test_the_core_client_never_imports_what_hosts_it() -> None:
    core = tuple(
        name
        for name in modules()
        if within(name, "trionsq")
        and name != "trionsq"
        and not any(within(name, above) for above in TRIONSQ_ABOVE_THE_CORE)
        and not within(name, "trionsq.tools")
        and name != "trionsq.cli"
    )
    assert violations(core, TRIONSQ_ABOVE_THE_CORE) == []


def test_the_hosting_machinery_never_imports_the_front_ends() -> None:
    assert violations("trionsq.hosting", ["trionsq.blocking", "trionsq.aio", "trionsq.spark"]) == []


# --- fakensq's parts, bottom to top ---------------------------------------------

#: fakensq's parts, each allowed to import only the parts listed for it (and
#: itself, and trionsq's sans-IO core and helpers).
LAYERS: dict[str, tuple[str, ...]] = {
    "fakensq.version": (),
    "fakensq.golang": ("fakensq.version",),
    "fakensq.serving": (),
    "fakensq.faultkinds": (),
    "fakensq.http": ("fakensq.golang", "fakensq.version"),
    "fakensq.lookupd": ("fakensq.http", "fakensq.golang", "fakensq.version", "fakensq.serving"),
    "fakensq.nsqd": (
        "fakensq.lookupd.protocol",
        "fakensq.http",
        "fakensq.golang",
        "fakensq.version",
        "fakensq.serving",
    ),
    "fakensq.admin": (
        "fakensq.faultkinds",
        "fakensq.http",
        "fakensq.golang",
        "fakensq.version",
        "fakensq.serving",
    ),
}

#: What no daemon imports: the machinery that drives them, and the front doors.
ABOVE_THE_DAEMONS = (
    "fakensq.testing",
    "fakensq.cli",
    "fakensq.pytest_plugin",
    "fakensq.demo",
    "fakensq.simulation",
    "fakensq.faults",
    "fakensq.threaded",
)


@pytest.mark.parametrize("part", sorted(LAYERS))
def test_each_part_imports_only_the_parts_below_it(part: str) -> None:
    allowed = (part, *LAYERS[part])
    others = sorted(
        {
            str(arrow)
            for arrow in all_arrows()
            if within(arrow.source, part)
            and not front_door(arrow.source)
            and within(arrow.target, "fakensq")
            and arrow.target != "fakensq"
            and not any(within(arrow.target, a) for a in allowed)
        }
    )
    assert others == []


#: The daemons and the parts they are made of: none of them knows the test
#: machinery that drives them, not even in an annotation.
DAEMONS = (
    "fakensq.nsqd",
    "fakensq.lookupd",
    "fakensq.admin",
    "fakensq.http",
    "fakensq.golang",
    "fakensq.serving",
    "fakensq.faultkinds",
    "fakensq.version",
)


@pytest.mark.parametrize("daemon", DAEMONS)
def test_the_daemons_never_import_what_drives_them(daemon: str) -> None:
    assert violations(daemon, ABOVE_THE_DAEMONS) == []


def test_the_rules_see_typing_imports() -> None:
    """A daemon importing the test machinery under ``if TYPE_CHECKING:`` (as the
    admin once did for its Cluster) or naming it in a string annotation breaks
    the rule as a run-time import would."""
    sneaky = ast.parse(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n"
        "    from ..testing.cluster import Cluster\n"
        "def admin(faults: 'fakensq.testing.faults.Faults') -> None: ...\n"
    )
    found = [
        (a.target, a.line, a.typing)
        for a in _arrows_of("fakensq.admin.server", sneaky)
        if any(within(a.target, f) for f in ABOVE_THE_DAEMONS)
    ]
    assert found == [("fakensq.testing.cluster", 3, True), ("fakensq.testing.faults", 4, True)]


def test_the_test_machinery_never_imports_the_command_line() -> None:
    assert violations("fakensq.testing", ["fakensq.cli", "fakensq.pytest_plugin"]) == []


@pytest.mark.parametrize(
    "inner",
    [
        "fakensq.nsqd.channel",
        "fakensq.nsqd.topic",
        "fakensq.nsqd.client",
        "fakensq.nsqd.message",
        "fakensq.nsqd.diskqueue",
    ],
)
def test_inner_objects_do_not_import_the_node_that_owns_them(inner: str) -> None:
    """Not even for annotations: they are given what they need (the protocols of
    fakensq.nsqd.owner), so they can be built and tested without a node."""
    tree = ast.parse(module_path(inner).read_text())
    named = [
        f"{inner}:{node.lineno}"
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[-1] == "node"
    ]
    assert named == []


def test_old_public_paths_are_thin_re_exports() -> None:
    """fakensq.simulation, .faults, .threaded: names only, no code of their own."""
    for old in ("fakensq.simulation", "fakensq.faults", "fakensq.threaded"):
        tree = ast.parse(module_path(old).read_text())
        kinds = {type(node).__name__ for node in tree.body}
        assert kinds <= {"Expr", "ImportFrom", "Assign"}, (old, kinds)


# --- objects keep their insides; modules stay short (issue 28) ---

#: The reaches into a private name another module defines that the packages
#: may make, each (file, expression), at most five: outside internals with no
#: public way in, each with a fallback where it is read.  Every other path
#: past a public API is a named internal API of the module that owns it.
ALLOWED_REACHES = {
    # Trio's own test of checkpoint_if_cancelled(), read directly on every
    # message's answer (AttributeError: the public call instead).
    ("trionsq/message.py", "_current_task()._cancel_status"),
    # Trio's idle worker threads, retired after a fork (ImportError or
    # AttributeError: left alone).
    ("trionsq/aio/guest.py", "THREAD_CACHE._idle_workers"),
    # CPython's only view of other threads' frames, for the pprof goroutine
    # page (missing: no frames).
    ("fakensq/http/pprof.py", "sys._current_frames"),
}
MAX_REACHES = 5
MAX_MODULE_LINES = 800


def _defined_in(tree: ast.AST) -> set[str]:
    """The names a module defines: functions, classes, attributes it assigns
    (or declares), names it binds, arguments, slots."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
            names.add(node.attr)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        elif isinstance(node, ast.arg):
            names.add(node.arg)
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
        elif isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "__slots__" for t in node.targets
        ):
            names.update(
                e.value
                for e in getattr(node.value, "elts", [])
                if isinstance(e, ast.Constant) and isinstance(e.value, str)
            )
    return names


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def private_reaches() -> set[tuple[str, str]]:
    """Every ``x._name`` on anything but ``self``, ``cls`` or ``super()`` whose
    ``_name`` the module does not define itself, and every ``from m import
    _name`` (the count of /work/notes' private_reaches.py, the issue's)."""
    found: set[tuple[str, str]] = set()
    for path in modules().values():
        tree = ast.parse(path.read_text())
        defined = _defined_in(tree)
        where = str(path.relative_to(ROOT))
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and _private(node.attr):
                base = node.value
                if isinstance(base, ast.Name) and base.id in ("self", "cls"):
                    continue
                if (
                    isinstance(base, ast.Call)
                    and isinstance(base.func, ast.Name)
                    and base.func.id == "super"
                ):
                    continue
                if node.attr not in defined:
                    found.add((where, ast.unparse(node)))
            elif isinstance(node, ast.ImportFrom):
                for alias in node.names:
                    if _private(alias.name):
                        found.add((where, f"from {node.module} import {alias.name}"))
    return found


def test_no_module_reaches_into_another_ones_private_names() -> None:
    found = private_reaches()
    assert sorted(found - ALLOWED_REACHES) == [], "name them as the owner's internal API"
    assert sorted(ALLOWED_REACHES - found) == [], "gone: take them off ALLOWED_REACHES"
    assert len(ALLOWED_REACHES) <= MAX_REACHES


def test_the_reach_check_sees_a_reach() -> None:
    tree = ast.parse(
        "import m\nclass A:\n    _own = 1\ndef f(a):\n    return a._own, a._other, m._x\n"
    )
    defined = _defined_in(tree)
    reached = [
        n.attr
        for n in ast.walk(tree)
        if isinstance(n, ast.Attribute) and _private(n.attr) and n.attr not in defined
    ]
    assert reached == ["_other", "_x"]


def test_no_package_module_is_longer_than_a_reader_holds() -> None:
    long = {
        str(path.relative_to(ROOT)): lines
        for path in modules().values()
        if (lines := len(path.read_text().splitlines())) > MAX_MODULE_LINES
    }
    assert long == {}, f"cut them along their concepts (at most {MAX_MODULE_LINES} lines)"
