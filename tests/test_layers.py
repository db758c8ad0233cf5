"""The package layers of pipeline_lib, read from the source (every import, module level or inside a
function): no import cycle between packages, and a stage package (data, train, evaluate, export)
imports no other stage package and not the registry (pipeline_lib.stages): stages share code through
model/, runtime/, storage/ and config/ only; config/ imports nothing of ours but storage/."""
from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1] / "pipeline_lib"
STAGE_PACKAGES = ("data", "train", "evaluate", "export")


def _package_of(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if parts[0] == "pipeline_lib" and len(parts) > 1 else None


def imports(module_level_only: bool = False) -> dict[str, set[tuple[str, str]]]:
    """package -> {(imported package or module, importing file)} for imports between pipeline_lib parts."""
    edges: dict[str, set[tuple[str, str]]] = defaultdict(set)
    for path in ROOT.rglob("*.py"):
        rel = path.relative_to(ROOT.parent).with_suffix("")
        module = ".".join(rel.parts[:-1] if rel.name == "__init__" else rel.parts)
        package_parts = module.split(".") if rel.name == "__init__" else module.split(".")[:-1]
        source = _package_of(module) or module
        tree = ast.parse(path.read_text(encoding="utf-8"))
        nodes = tree.body if module_level_only else ast.walk(tree)
        for node in nodes:
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package_parts[:len(package_parts) - node.level + 1]
                    targets = [".".join(base + ([node.module] if node.module else []))]
                else:
                    targets = [node.module or ""]
            else:
                continue
            for target in targets:
                pkg = _package_of(target)
                if pkg and pkg != source:
                    edges[source].add((pkg, str(path.relative_to(ROOT.parent))))
    return edges


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}

    def visit(node, stack):
        state[node] = 1
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt):] + [nxt] if nxt in stack else [node, nxt]
            if nxt not in state:
                found = visit(nxt, stack + [nxt])
                if found:
                    return found
        state[node] = 2
        return None

    for start in sorted(graph):
        if start not in state:
            found = visit(start, [start])
            if found:
                return found
    return None


def test_no_import_cycle_between_packages():
    # every import counts, the lazy ones inside functions too: a lazy import is still a dependency
    graph = {src: {pkg for pkg, _ in found} for src, found in imports().items()}
    assert _cycle(graph) is None, f"import cycle between pipeline_lib packages: {' -> '.join(_cycle(graph))}"


def test_config_is_a_leaf_that_imports_only_storage():
    """config/ is read by everything, so it may use storage's path and URI helpers and nothing else of
    ours; what needs a stage's code or reads files is in checks/ (or the stage itself)."""
    assert sorted(f"{where} imports pipeline_lib.{pkg}" for pkg, where in imports()["config"] if pkg != "storage") == []


def test_the_cycle_finder_finds_a_cycle():
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None


def _forbidden(stage: str) -> list[str]:
    return sorted(f"{where} imports pipeline_lib.{pkg}" for pkg, where in imports()[stage]
                  if pkg in STAGE_PACKAGES or pkg == "stages")


@pytest.mark.parametrize("stage", STAGE_PACKAGES)
def test_stage_package_imports_no_other_stage_nor_the_registry(stage):
    assert _forbidden(stage) == []


def test_evaluate_and_export_do_not_import_each_other():
    edges = imports()
    assert not [w for pkg, w in edges["evaluate"] if pkg == "export"]
    assert not [w for pkg, w in edges["export"] if pkg == "evaluate"]


def test_only_storage_branches_on_the_uri_scheme_or_talks_to_boto3():
    """Callers ask the store (store.remote, open_range, glob, storage.is_absolute), not the URI."""
    offenders = []
    for path in ROOT.rglob("*.py"):
        if path.relative_to(ROOT).parts[0] == "storage":
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                names = [node.module or ""] + [a.name for a in node.names]
            if any(n.split(".")[0] in ("boto3", "botocore") or n in ("is_s3", "split_s3") for n in names):
                offenders.append(str(path.relative_to(ROOT.parent)))
    assert offenders == []
