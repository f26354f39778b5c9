"""nanovllm's modules import one another without cycles: imports run one way, and what two modules both need
sits in a module below both. Every import counts, at module level, under TYPE_CHECKING or inside a function,
so that a cycle cannot hide behind an import deferred to run time."""

import ast
from pathlib import Path

import nanovllm


def modules_of(package_dir: Path) -> dict[str, Path]:
    """Dotted name -> file, for every module of the package in `package_dir` (a package by its own name)."""
    modules = {}
    for path in sorted(package_dir.rglob("*.py")):
        parts = path.relative_to(package_dir.parent).with_suffix("").parts
        modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return modules


def imported_modules(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The package's modules that module `name` imports anywhere in its file (`from a import b` imports a.b
    where that is a module, else a)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(_known(alias.name, modules) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                base = f"{anchor}.{base}" if base else anchor
            for alias in node.names:
                submodule = f"{base}.{alias.name}"
                found.add(submodule if submodule in modules else _known(base, modules))
    return found - {None, name}


def _known(dotted: str, modules: dict[str, Path]) -> str | None:
    """The longest prefix of `dotted` that is one of the package's modules (None: it imports from outside)."""
    while dotted and dotted not in modules:
        dotted = dotted.rpartition(".")[0]
    return dotted or None


def import_cycles(package_dir: Path) -> list[tuple[str, ...]]:
    """The groups of modules that import one another in a cycle (strongly connected components of the import
    graph with more than one module), each sorted, in sorted order."""
    modules = modules_of(package_dir)
    graph = {name: imported_modules(name, path, modules) for name, path in modules.items()}
    return sorted(tuple(sorted(group)) for group in _strongly_connected(graph) if len(group) > 1)


def _strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's strongly connected components, iteratively (no recursion limit on deep import chains)."""
    index, low, on_stack, stack, groups = {}, {}, set(), [], []
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is None:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    group = []
                    while not group or group[-1] != node:
                        group.append(stack.pop())
                        on_stack.discard(group[-1])
                    groups.append(group)
            elif child not in index:
                index[child] = low[child] = len(index)
                stack.append(child)
                on_stack.add(child)
                work.append((child, iter(sorted(graph[child]))))
            elif child in on_stack:
                low[node] = min(low[node], index[child])
    return groups


def test_nanovllm_has_no_import_cycles():
    assert import_cycles(Path(nanovllm.__file__).parent) == []


def write_package(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root / "pkg"


def test_a_cycle_through_a_deferred_or_type_checking_import_is_found(tmp_path):
    package = write_package(
        tmp_path,
        {
            "pkg/__init__.py": "",
            "pkg/interface.py": "def make():\n    from pkg.impl import Impl\n    return Impl()\n",
            "pkg/impl.py": "from pkg.interface import make\nfrom . import helpers\n",
            "pkg/helpers.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .sub.deep import X\n",
            "pkg/sub/__init__.py": "",
            "pkg/sub/deep.py": "import pkg.helpers\nimport os\n",
            "pkg/leaf.py": "from pkg import interface\n",
        },
    )
    assert import_cycles(package) == [("pkg.helpers", "pkg.sub.deep"), ("pkg.impl", "pkg.interface")]


def test_modules_that_import_one_way_have_no_cycle(tmp_path):
    package = write_package(
        tmp_path,
        {
            "pkg/__init__.py": "from pkg.top import run\n",
            "pkg/top.py": "from pkg.low import helper\nfrom pkg import low\n",
            "pkg/low.py": "import json\n",
        },
    )
    assert import_cycles(package) == []
