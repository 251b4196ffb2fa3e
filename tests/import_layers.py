"""The layers of ``probe/`` and a checker of its import graph (used by tests/test_layers.py).

Data flows one way: a task source makes tasks, the builder makes prompts, the model stage runs and probes them,
the runner writes records, the analysis reads records, the report reads the analysis. A module may import from its
own layer and from any layer below it, never from a layer above, and no two modules may import each other, directly
or round a longer circle. Every import counts: at module level, inside a function, under ``TYPE_CHECKING`` (a lazy
import is still a dependency, and a type-only one still ties the two modules' designs together).

LAYERS is the one table to read: bottom first. A name is a module or a package directly under ``probe/`` (a package
covers everything in it); ``__init__`` is ``probe/__init__.py``. A new module under ``probe/`` must be placed here
(the test names it).
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    # value types, errors, the dataclass codec, the probe's options, the generic registry, number formatting,
    # library shims, run-folder paths and the record formats every later stage reads and writes
    ("base", ("errors", "codec", "probe_options", "registry", "types", "formatting", "compat", "runfolder", "records")),
    # task sources and their families, the intervention type, and the experiment definition that names them
    ("task", ("tasks", "interventions", "config")),
    # each family's scorer, registered for it (scoring knows the tasks; the tasks do not know how they are scored)
    ("scoring", ("scoring",)),
    # ICE prompts: segments, distractors, filler, tokenisation with exact spans
    ("prompt", ("prompts",)),
    # model cards and loading, generation backends, the attention engine (interventions applied in attention)
    ("model", ("loading", "gguf_chunks", "backends", "attention")),
    # the runner: prompts through a model into a run folder's records; another tool's trial file into one
    ("records", ("runner", "records_import")),
    # statistics over a run folder's records, and a run folder read back as one object
    ("analysis", ("analysis", "loaded_run")),
    # HTML / Markdown reports, figures, one prompt's attention shown
    ("report", ("report", "prompt_view")),
    # what a user calls: the Python API, the command line
    ("entry", ("api", "cli", "__init__")),
)

# Imports (importer, imported) allowed to close a circle while it is being cut (none today). An entry whose import
# is gone, or no longer closes a circle, fails the test: take it out of this list.
PENDING: frozenset[tuple[str, str]] = frozenset({
})


@dataclass(frozen=True)
class Import:
    """One import statement of one module: where it is and what it names."""

    importer: str  # dotted module name, e.g. probe.tasks.cogniload
    imported: str  # the dotted module it resolves to
    path: Path  # relative to the root the package was read from
    line: int


def module_names(root: Path, package: str) -> dict[str, Path]:
    """Dotted name -> file, for every ``.py`` file of ``root / package`` (a package's ``__init__`` is its name)."""
    out: dict[str, Path] = {}
    for path in sorted((root / package).rglob("*.py")):
        parts = list(path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def _resolve(name: str, modules: dict[str, Path]) -> str | None:
    """The longest module prefix of ``name`` (``probe.tasks.get_source`` -> ``probe.tasks``)."""
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


def imports(root: Path, package: str = "probe") -> list[Import]:
    """Every import inside ``package`` of another of its modules, at any depth of the syntax tree."""
    modules = module_names(root, package)
    found: list[Import] = []
    for name, path in modules.items():
        here = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = here.split(".")[: len(here.split(".")) - node.level + 1]
                    origin = ".".join(base + ([node.module] if node.module else []))
                else:
                    origin = node.module or ""
                # `from pkg import sub` names the submodule; `from pkg import name` the package itself
                targets = [f"{origin}.{a.name}" for a in node.names]
            else:
                continue
            for t in targets:
                target = _resolve(t, modules)
                if target is not None and target != name:
                    found.append(Import(name, target, path.relative_to(root), node.lineno))
    return found


def unit(module: str) -> str:
    """The LAYERS name covering a module: ``probe.tasks.jsonl`` -> ``tasks``, ``probe`` -> ``__init__``."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def unplaced(root: Path, package: str = "probe",
             layers: tuple[tuple[str, tuple[str, ...]], ...] = LAYERS) -> list[str]:
    """One message per module or package under ``package`` that no layer names."""
    placed = {u for _, units in layers for u in units}
    return sorted({f"{path.relative_to(root)}: '{unit(name)}' is in no layer; place it in LAYERS "
                   "(tests/import_layers.py)" for name, path in module_names(root, package).items()
                   if unit(name) not in placed})


def layer_violations(found: list[Import], layers: tuple[tuple[str, tuple[str, ...]], ...] = LAYERS) -> list[str]:
    """One message per import of a higher layer than the importer's, naming file, line and the rule."""
    rank = {u: (i, layer) for i, (layer, units) in enumerate(layers) for u in units}
    out: list[str] = []
    for imp in found:
        a, b = rank.get(unit(imp.importer)), rank.get(unit(imp.imported))
        if a is not None and b is not None and b[0] > a[0]:
            out.append(f"{imp.path}:{imp.line}: {imp.importer} ({a[1]} layer) imports {imp.imported} ({b[1]} layer): "
                       "a layer may import only its own and lower layers (tests/import_layers.py)")
    return sorted(set(out))


def cycles(found: list[Import]) -> list[list[str]]:
    """The import circles between modules: each strongly connected set of two or more, sorted."""
    graph: dict[str, set[str]] = {}
    for imp in found:
        graph.setdefault(imp.importer, set()).add(imp.imported)
        graph.setdefault(imp.imported, set())
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:  # Tarjan's algorithm; the graph has a few hundred nodes, recursion is fine
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                out.append(sorted(group))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(out)


def cycle_messages(found: list[Import], pending: frozenset[tuple[str, str]] = PENDING) -> list[str]:
    """One message per import circle not made only of ``pending`` edges, naming each import in it."""
    out = []
    for group in cycles([i for i in found if (i.importer, i.imported) not in pending]):
        members = set(group)
        lines = sorted({f"  {i.path}:{i.line}: {i.importer} imports {i.imported}" for i in found
                        if i.importer in members and i.imported in members})
        out.append("import circle between " + ", ".join(group) + "; make one side not import the other:\n"
                   + "\n".join(lines))
    return out


def stale_pending(found: list[Import], pending: frozenset[tuple[str, str]] = PENDING) -> list[str]:
    """PENDING entries that no import makes any more, or whose import no longer closes a circle."""
    edges = {(i.importer, i.imported) for i in found}
    circle_of = {m: n for n, group in enumerate(cycles(found)) for m in group}
    out = []
    for a, b in sorted(pending):
        if (a, b) not in edges:
            out.append(f"{a} -> {b}: no such import any more; remove it from PENDING (tests/import_layers.py)")
        elif circle_of.get(a) is None or circle_of.get(a) != circle_of.get(b):
            out.append(f"{a} -> {b}: closes no import circle any more; remove it from PENDING (tests/import_layers.py)")
    return out
