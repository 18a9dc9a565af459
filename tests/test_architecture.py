"""The package's layers, checked from its own imports: no module imports one above it, and the
import graph has no cycle. The simulator covers every step of the model's step list."""
import ast
import re
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


# --- the package names no recording session and no study's files ------------------------------------------------
# "The library reads recordings only through paths or a catalog it is handed, never by naming a study's files."
DATA = PKG.parent / "data"
STUDY_FOLDERS = sorted(d.name for d in DATA.iterdir() if d.is_dir())  # guards, production, kernels, ...
# a session or run label (expand_run7, fold_s12, ord_n1, wg_s2c), a GPU-tagged file (h200_guards...), a signature
# session
SESSION_LABEL = re.compile(r"\b[a-z]+_(s|run|n)[0-9]+[a-z]?\b|\bh200_\w|signature_s\d")
# DATA joined with a study's folder (DATA / "guards"); the catalog file itself is no study's
DATA_JOIN = re.compile(r"\bDATA\s*/\s*[\"'](%s)\b" % "|".join(map(re.escape, STUDY_FOLDERS)))
# a string in code (not a docstring) holding a path into a study's folder: "guards/x.csv", "data/production/traces"
STUDY_PATH = re.compile(r"(?:^|[^\w/.-])(?:data/)?(?:%s)/[\w*.{-]" % "|".join(map(re.escape, STUDY_FOLDERS)))
def _docstring_nodes(tree) -> set[int]:
    out = set()
    for n in ast.walk(tree):
        if isinstance(n, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and n.body:
            first = n.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value,
                                                                                                      str):
                out.add(id(first.value))
    return out


def _study_names(path: Path, text: str | None = None) -> list[str]:
    """file:line of every session label (code, comments, docstrings), every DATA / "<study>" and every string in
    code naming a path in a study's folder."""
    text, rel = path.read_text() if text is None else text, path.relative_to(PKG.parent)
    out = [f"{rel}:{i}: {line.strip()[:90]}" for i, line in enumerate(text.splitlines(), 1)
           if SESSION_LABEL.search(line) or DATA_JOIN.search(line)]
    tree = ast.parse(text)
    docs = _docstring_nodes(tree)
    out += [f"{rel}:{n.lineno}: a study's path {n.value[:70]!r}" for n in ast.walk(tree)
            if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in docs
            and STUDY_PATH.search(n.value)]
    return out


def test_no_session_label_in_the_package():
    found = [h for p in sorted(PKG.rglob("*.py")) for h in _study_names(p)]
    assert not found, "the package names sessions or a study's files:\n" + "\n".join(found)


def test_the_rule_catches_what_it_is_for():
    probe = PKG / "sim" / "probe.py"  # a name inside the package for the file:line; never written
    for line in ('RUN = "expand_run7"', 'F = DATA / "guards"', 'G = "production/tp2_C16384_gs1.summary.csv"',
                 '# the archived h200_guards.csv', 'x = 1  # fold_s12c lost', 'S = "signature_s1/traces"'):
        found = _study_names(probe, line + "\n")
        assert found and found[0].startswith("lora_moe_lab/sim/probe.py:1: "), line
    # prose naming a folder, the catalog file, a recorder's file pattern: not a study's file
    clean = '"""Reads data/guards/ through the catalog."""\nCAT = DATA / "catalog.json"\nP = "*_guards_s*.csv"\n'
    assert not _study_names(probe, clean)


def test_every_catalog_entry_resolves_to_existing_files():
    from lora_moe_lab.provenance import CATALOG, catalog, catalog_entries

    entries = catalog_entries()
    assert entries, f"{CATALOG} holds no entry"
    for name, e in entries.items():
        got = catalog(name)
        paths = got if isinstance(got, list) else [got]
        assert paths and all(p.exists() for p in paths), name
        assert all(DATA in p.resolve().parents for p in paths), f"{name}: outside data/"
        assert e["what"].strip(), name
