"""Imports flow one way: plumbing <- model <- invariants <- ablations/reports; inside ablations/, down its flow of
sub-packages; no modules import each other in a cycle."""

import ast
import importlib.util
import subprocess
import sys
import re
from pathlib import Path

import pytest

from tests.helpers import REPO

PACKAGES = ("plumbing", "model", "invariants", "ablations", "reports")
FORBIDDEN = {
    "plumbing": {"model", "invariants", "ablations", "reports"},
    "model": {"invariants", "ablations", "reports"},
    "invariants": {"ablations", "reports"},
}
# A string naming a module of another package, as an import path would: "invariants.mutants:build", "reports.figures".
NAMED = re.compile(rf"^({'|'.join(PACKAGES)})((?:\.\w+)+(?::\w+)?|:\w+)$")


def module_name(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for package in PACKAGES for p in sorted((REPO / package).rglob("*.py"))}


def resolve(name: str) -> str | None:
    """The project module an import names (a submodule if one exists, else its package), or None if outside."""
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def imports(module: str) -> set[str]:
    """Every project module that `module` imports anywhere (top level, inside functions, under TYPE_CHECKING)."""
    path = MODULES[module]
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found |= {resolve(alias.name) for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            found |= {resolve(f"{base}.{alias.name}") for alias in node.names}
    return found - {None, module}


def named_in_strings(module: str) -> set[str]:
    """Project modules that a string constant in `module` names as an import path (a lazy import by name)."""
    tree = ast.parse(MODULES[module].read_text())
    return {
        resolve(m[0].partition(":")[0])
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and (m := NAMED.match(node.value))
    } - {None}


GRAPH = {module: imports(module) for module in MODULES}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One cycle through each strongly connected group of nodes that import each other (Tarjan's algorithm)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            group = []
            while not group or group[-1] != node:
                group.append(stack.pop())
                on_stack.discard(group[-1])
            if len(group) > 1:
                found.append(sorted(group))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


@pytest.mark.parametrize("lower", sorted(FORBIDDEN))
def test_a_lower_layer_imports_no_higher_one(lower):
    bad = [
        f"{module} -> {target}"
        for module in MODULES
        if module.split(".")[0] == lower
        for target in sorted(GRAPH[module] | named_in_strings(module))
        if target.split(".")[0] in FORBIDDEN[lower]
    ]
    assert not bad, f"{lower}/ must not import {', '.join(sorted(FORBIDDEN[lower]))}: {bad}"


# ablations/'s sub-packages in the order of its flow (its package docstring lists them): each imports only from itself
# and from those before it.
FLOW = ("data", "runs", "scoring", "training", "grid", "studies", "bench")


def stage(module: str) -> int | None:
    """The position in FLOW of the ablations sub-package that holds `module`; None outside them."""
    parts = module.split(".")
    return FLOW.index(parts[1]) if parts[0] == "ablations" and len(parts) > 1 and parts[1] in FLOW else None


def test_ablations_sub_packages_import_only_their_own_and_earlier_stages_of_the_flow():
    bad = [
        f"{module} -> {target}"
        for module in MODULES
        if stage(module) is not None
        for target in sorted(GRAPH[module] | named_in_strings(module))
        if target.split(".")[0] == "ablations"
        and target != "ablations.__main__"  # the SLURM launcher's one exception, held below
        and (stage(target) is None or stage(target) > stage(module))
    ]
    assert not bad, f"ablations/ imports against its flow {' -> '.join(FLOW)}: {bad}"


def test_the_flow_is_written_in_the_ablations_docstring_in_order_and_covers_its_sub_packages():
    import ablations

    listed = re.findall(r"^ {4}(\w+)/ ", ablations.__doc__, re.M)
    on_disk = {p.parent.name for p in (REPO / "ablations").glob("*/__init__.py")}
    assert tuple(listed) == FLOW and set(FLOW) == on_disk


def test_the_flow_rule_sees_an_import_against_it():
    assert stage("ablations.data.bpe") < stage("ablations.training.train") and stage("ablations.__main__") is None


def test_each_property_module_imports_only_the_machinery_never_another_property_module():
    # invariants/properties/: one module per group, each on the engine, measure, subject, cases and tolerances alone,
    # and the machinery beneath them imports no property module (the registry is filled by importing the package).
    properties = {m for m in MODULES if m.startswith("invariants.properties.")}
    beside = [f"{m} -> {t}" for m in sorted(properties) for t in sorted(GRAPH[m]) if t in properties]
    below = [
        f"{m} -> {t}"
        for m in sorted(MODULES)
        if m.startswith("invariants.")
        and not m.startswith("invariants.properties")
        and m not in ("invariants", "invariants.suite", "invariants.__main__", "invariants.killmatrix")
        for t in sorted(GRAPH[m])
        if t.startswith("invariants.properties")
    ]
    assert len(properties) == 12 and not beside and not below, beside + below


def test_the_cpp_kernels_header_and_loader_share_one_folder():
    sources = sorted(p.relative_to(REPO).as_posix() for p in (REPO / "model").rglob("*") if p.suffix in (".cpp", ".h"))
    assert sources and all(s.startswith("model/kernels/") for s in sources)
    assert "model.kernels" in MODULES


def test_no_modules_import_each_other_in_a_cycle():
    # A package's __init__ re-exporting its submodules is not a cycle of dependence: drop the edges into __init__s.
    graph = {m: {t for t in targets if MODULES[t].name != "__init__.py"} for m, targets in GRAPH.items()}
    assert cycles(graph) == []


def test_packages_do_not_import_each_other_in_a_cycle():
    graph = {p: {t.split(".")[0] for m in MODULES if m.split(".")[0] == p for t in GRAPH[m]} - {p} for p in PACKAGES}
    assert cycles(graph) == []


def test_the_walker_sees_a_cycle_and_a_string_import():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert resolve("invariants.mutants") == "invariants.mutants" and resolve("ablations.nope") == "ablations"
    assert NAMED.match("invariants.mutants:build") and not NAMED.match("reports/results") and not NAMED.match("model")


def test_no_library_module_imports_the_command_line():
    # The SLURM launcher alone: each of its jobs re-runs `python -m ablations run ...` on its node.
    importers = sorted(m for m in MODULES if "ablations.__main__" in GRAPH[m] | named_in_strings(m))
    assert importers == ["ablations.grid.slurm"]


RUN_FILES = (
    "config.json",
    "metrics.jsonl",
    "final.json",
    "attempts.json",
    "checkpoint.pt",
    "model.pt",
    "dev_hypotheses.txt",
)


def spelled(module: str, text: str) -> bool:
    """Whether a string in the code of `module` (docstrings aside: they are prose) contains `text`."""
    tree = ast.parse(MODULES[module].read_text())
    docstrings = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef))
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }
    return any(
        isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and text in node.value
        and id(node) not in docstrings
        for node in ast.walk(tree)
    )


@pytest.mark.parametrize("name", RUN_FILES)
def test_a_run_folders_file_is_named_in_one_place(name):
    assert [m for m in MODULES if spelled(m, name)] == ["ablations.runs.folder"]


@pytest.mark.slow
def test_a_module_run_by_its_old_path_names_its_new_one():
    import ablations

    for old, new in ablations.MOVED.items():
        assert importlib.util.find_spec(new) is not None, f"{old} moved to {new}, which does not exist"
    ran = subprocess.run(
        [sys.executable, "-m", "ablations.compare", "--rows", "base"], cwd=REPO, capture_output=True, text=True
    )
    assert (
        ran.returncode == 1 and ran.stderr.strip() == "ablations.compare has moved: python -m ablations.studies.compare"
    )
