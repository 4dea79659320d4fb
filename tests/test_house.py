"""The shape of the house (issue 18): what can be imported without the engine, and no import cycles."""

from __future__ import annotations

import ast
import graphlib
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "speechctl"

# Job and result types, the engine's request types, the Family interface and every family's
# prompt builder, and admission's checks of a request against an engine's limits: a client that
# only builds or validates requests never pays for torch or vLLM.
LIGHT_MODULES = [
    "speechctl.jobs",
    "speechctl.engine.requests",
    "speechctl.engine.admission",
    "speechctl.models.family",
    "speechctl.models.families",
    "speechctl.models.prompting",
    "speechctl.models.encoder_decoder_prompts",
    *(f"speechctl.models.{family}.prompts" for family in ("generic", "higgs", "csm", "dia", "musicgen", "valle")),
]


@pytest.mark.parametrize("module", LIGHT_MODULES)
def test_module_imports_without_torch_or_vllm(module):
    code = (
        f"import sys, importlib; importlib.import_module({module!r});"
        "heavy = [m for m in ('torch', 'vllm', 'transformers') if m in sys.modules]; assert not heavy, heavy"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-2000:]


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _import_graph() -> dict[str, set[str]]:
    """speechctl's modules and the speechctl modules each imports, from any import statement
    (module level or inside a function: a deferred import still ties the two files together)."""
    files = {_module_name(p): p for p in PACKAGE.rglob("*.py")}

    def owner(name: str) -> str | None:  # `from speechctl.a import b`: b may be a module or a name
        while name and name not in files:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {}
    for name, path in files.items():
        package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
        targets: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets.update(a.name for a in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = ".".join(package[: len(package) - node.level + 1] + [node.module or ""]) if node.level else node.module
                base = (base or "").rstrip(".")
                targets.add(base)
                targets.update(f"{base}.{a.name}" for a in node.names)
        graph[name] = {o for t in targets if t.split(".")[0] == "speechctl" and (o := owner(t)) and o != name}
    return graph


def test_no_import_cycles():
    graph = _import_graph()
    assert "speechctl.engine.engine" in graph and graph["speechctl.api"], "the graph found no imports"
    try:
        tuple(graphlib.TopologicalSorter(graph).static_order())
    except graphlib.CycleError as e:
        pytest.fail(f"import cycle: {' -> '.join(e.args[1])}")
