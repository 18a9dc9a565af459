"""The package's layers, checked from its own imports: no module imports one above it, and the
import graph has no cycle. The simulator covers every step of the model's step list."""
import ast
from pathlib import Path

PKG = Path(__file__).resolve().parents[1] / "lora_moe_lab"
# bottom to top; a module may import its own layer or any layer below it
LAYERS = [{"runtime", "config", "provenance"}, {"kernels"}, {"ops"}, {"model"}, {"instruments"}, {"sim"},
          {"ui"}, {"nb"}, {"audit"}]  # audit.py: the priced audit's face (recorders' audit + sim's replay estimate)


def _module(path: Path) -> str:
    rel = path.relative_to(PKG.parent).with_suffix("")
    parts = list(rel.parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _layer(mod: str) -> int | None:
    top = mod.split(".")[1] if "." in mod else None
    for i, names in enumerate(LAYERS):
        if top in names:
            return i
    return None  # the package's own __init__


def _imports(path: Path, text: str | None = None) -> set[str]:
    mod = _module(path)
    pkg = mod if path.name == "__init__.py" else mod.rsplit(".", 1)[0]
    out = set()
    for node in ast.walk(ast.parse(path.read_text() if text is None else text)):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = pkg.split(".")
                base = base[:len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target.startswith("lora_moe_lab"):
                out.add(target)
                out |= {f"{target}.{a.name}" for a in node.names}
        elif isinstance(node, ast.Import):
            out |= {a.name for a in node.names if a.name.startswith("lora_moe_lab")}
        elif isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant):
            # importlib.import_module("lora_moe_lab.x") / __import__("lora_moe_lab.x"): an edge too
            f = node.func
            name = f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", "")
            arg = node.args[0].value
            if name in ("import_module", "__import__") and isinstance(arg, str) and arg.startswith("lora_moe_lab"):
                out.add(arg)
    files = {_module(p) for p in PKG.rglob("*.py")}
    return {t for t in out if t in files and t != mod}


def _graph() -> dict[str, set[str]]:
    return {_module(p): _imports(p) for p in PKG.rglob("*.py")}


def test_imports_point_down_only():
    upward = []
    for mod, deps in _graph().items():
        lm = _layer(mod)
        if lm is None:
            continue
        for d in deps:
            ld = _layer(d)
            if ld is not None and ld > lm:
                upward.append(f"{mod} -> {d}")
    assert not upward, "upward imports: " + ", ".join(sorted(upward))


INSTRUMENTS = "lora_moe_lab.instruments"
HALVES = ("recorders", "analysers")


def test_instruments_are_recorders_or_analysers_and_analysers_never_import_recorders():
    """instruments/ has two halves: recorders (measure on a device, drive a run) and analysers (read
    recordings and traces, compute). A recorder may import an analyser (a sweep reads its recording,
    the prefill driver computes a trace's idle time); an analyser never imports a recorder."""
    graph = _graph()
    loose = [m for m in graph if m.startswith(INSTRUMENTS + ".") and m.split(".")[2] not in HALVES]
    assert not loose, "instruments modules outside recorders/ and analysers/: " + ", ".join(sorted(loose))
    up = [f"{m} -> {d}" for m, deps in graph.items() if m.startswith(f"{INSTRUMENTS}.analysers")
          for d in deps if d.startswith(f"{INSTRUMENTS}.recorders")]
    assert not up, "analysers importing recorders: " + ", ".join(sorted(up))


def test_no_import_cycles():
    g = {m: {d for d in deps if not d.endswith("__init__")} for m, deps in _graph().items()}
    state: dict[str, int] = {}
    cycles = []

    def visit(m, stack):
        state[m] = 1
        for d in g.get(m, ()):
            if d == "lora_moe_lab" or (d in g and g[d] and m.startswith(d + ".")):
                continue  # a module importing its own package's __init__ re-exports
            if state.get(d) == 1:
                cycles.append(" -> ".join(stack[stack.index(d):] + [d]))
            elif d in g and not state.get(d):
                visit(d, stack + [d])
        state[m] = 2

    for m in g:
        if not state.get(m):
            visit(m, [m])
    assert not cycles, "import cycles: " + "; ".join(cycles)


def test_simulator_costs_every_step_of_the_model():
    from lora_moe_lab.config import get_shape
    from lora_moe_lab.model.spec import MOE_LAYER_STEPS
    from lora_moe_lab.sim import layer_spec
    from lora_moe_lab.sim.cost import _step_costs

    names = [s.name for s in MOE_LAYER_STEPS]
    assert set(_step_costs(16, 8, 64, 32, 8, 2, 16, 2)) == set(names)
    ops = [o[0] for o in layer_spec(get_shape("tiny"), 16, "launch_always", active=0.5) if o[1] == "kernel"]
    assert ops == names  # the simulator issues the model's steps in the model's order


# --- scripts/: the top of the house --------------------------------------------------------------
SCRIPTS = PKG.parent / "scripts"


def _script_imports(path: Path) -> set[str]:
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and not node.level:
            out.add(node.module or "")
        elif isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
    return out


def test_scripts_reach_the_package_through_public_modules_only():
    """No script imports another script (no chain, no cycle: the harness is in the package), none
    edits sys.path (scripts/gpu_check.py, the GPU check run before any install, is the exception),
    and every package module a script imports is public (no _private module)."""
    names = {p.stem for p in SCRIPTS.glob("*.py")}
    for p in sorted(SCRIPTS.glob("*.py")):
        imps = _script_imports(p)
        assert not (imps & names), (p.name, imps & names)
        for m in (m for m in imps if m.startswith("lora_moe_lab")):
            assert not any(part.startswith("_") for part in m.split(".")), (p.name, m)
        if p.name != "gpu_check.py":
            assert "sys.path.insert" not in p.read_text() and "sys.path.append" not in p.read_text(), p.name


def test_studies_import_the_library_and_never_edit_the_path():
    """A study (studies/<name>/: its recording scripts, readers, findings tests) reaches the library through its
    public modules and never edits sys.path; it does not import scripts/ (the tools)."""
    for p in sorted((PKG.parent / "studies").rglob("*.py")):
        imps = _script_imports(p)
        assert not any(m.split(".")[0] == "scripts" for m in imps), p
        for m in (m for m in imps if m.startswith("lora_moe_lab")):
            assert not any(part.startswith("_") for part in m.split(".")), (p, m)
        assert "sys.path.insert" not in p.read_text() and "sys.path.append" not in p.read_text(), p


def test_the_package_never_imports_a_script_or_a_study():
    """studies/ (each study's recording, reader, block and findings) imports the library, never the reverse;
    nor does the library name a study's module by string (importlib)."""
    for p in PKG.rglob("*.py"):
        assert not any(m.split(".")[0] in ("scripts", "studies") for m in _script_imports(p)), p
        assert "import_module(\"studies" not in p.read_text() and "import_module('studies" not in p.read_text(), p


def test_an_importlib_edge_is_an_edge():
    """The graph above reads importlib.import_module("lora_moe_lab...") calls too (an import by name that points
    up, or closes a circle, is caught like a plain import)."""
    probe = 'import importlib\nimportlib.import_module("lora_moe_lab.nb.runner")\n'
    assert "lora_moe_lab.nb.runner" in _imports(PKG / "sim" / "probe.py", text=probe)
