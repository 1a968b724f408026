"""The repository's layout: the recipe at the top, experiments/ and plumbing/ below it, and no import cycle
between the project's modules, counting the imports inside functions too (a lazy import is still a cycle).

    python -m pytest -q tests/test_layout.py
"""

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RECIPE = ["model.py", "surgery.py", "train.py", "muon.py", "sample.py", "eval_math.py", "analyze.py", "families.py"]


def project_modules():
    """{dotted name: path} of every python file of the project (the remote code in plumbing/hf/ excepted: it is
    copied into checkpoint directories and imports its neighbours there)."""
    mods = {}
    for path in REPO.rglob("*.py"):
        rel = path.relative_to(REPO)
        if rel.parts[0] in (".venv", "out", "tests", "bench") or rel.parts[:2] == ("plumbing", "hf"):
            continue
        name = ".".join(rel.with_suffix("").parts)
        mods[name.removesuffix(".__init__")] = path
    return mods


def imports(path, mods):
    """The project modules path imports anywhere in it (module level or inside a function)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        else:
            continue
        found |= {n for n in names if n in mods}
    return found


def find_cycle(graph):
    """One cycle of graph ({node: set of nodes}) as a list, or None (depth-first, three colours)."""
    state, stack = {}, []

    def visit(n):
        state[n] = "open"
        stack.append(n)
        for m in sorted(graph[n]):
            if state.get(m) == "open":
                return stack[stack.index(m):] + [m]
            if m not in state and (cycle := visit(m)):
                return cycle
        state[n] = "done"
        stack.pop()
        return None

    for n in sorted(graph):
        if n not in state and (cycle := visit(n)):
            return cycle
    return None


def test_no_import_cycle():
    mods = project_modules()
    graph = {name: imports(path, mods) - {name} for name, path in mods.items()}
    assert find_cycle(graph) is None, " -> ".join(find_cycle(graph))


def test_the_cycle_finder_finds_a_lazy_cycle(tmp_path):
    (tmp_path / "a.py").write_text("import b\n")
    (tmp_path / "b.py").write_text("def f():\n    from a import g\n")
    mods = {"a": tmp_path / "a.py", "b": tmp_path / "b.py"}
    graph = {n: imports(p, mods) - {n} for n, p in mods.items()}
    assert find_cycle(graph) == ["a", "b", "a"]


def test_the_recipe_stands_at_the_top_and_experiments_below():
    for name in RECIPE:
        assert (REPO / name).is_file(), name
    assert (REPO / "data").is_dir()
    for name in ("claims.py", "repeat.py", "claim_plots.py"):
        assert (REPO / "experiments" / name).is_file() and not (REPO / name).exists()


def function_lines(path, name):
    """Lines of the top-level function `name` of a file, its docstring included."""
    node = next(n for n in ast.parse(path.read_text()).body if isinstance(n, ast.FunctionDef) and n.name == name)
    return node.end_lineno - node.lineno + 1


def test_model_py_is_the_model_only():
    # the decode layout (packed projections, transposed weights, numpy's BLAS) lives in plumbing/decode.py
    text = (REPO / "model.py").read_text().lower()
    for word in ("numpy", "blas", "matvec", "packed", "qkv", "gate_up"):
        assert word not in text, f"model.py mentions {word!r}: decode-only code belongs in plumbing/decode.py"


def test_train_reads_as_phases():
    path = REPO / "train.py"
    assert function_lines(path, "train") <= 70
    # one saving rule, asked at both moments a save can happen (at an eval, and between evals after a step)
    calls = [n for n in ast.walk(ast.parse(path.read_text()))
             if isinstance(n, ast.Call) and getattr(n.func, "id", None) == "should_save"]
    assert len(calls) == 2 and "save_due and not bad" not in path.read_text()


def test_readme_teaches_by_commands_early():
    lines = (REPO / "README.md").read_text().splitlines()
    assert len(lines) <= 250
    first_shell = next(i for i, line in enumerate(lines) if line.startswith("```bash"))
    assert first_shell < 60


def test_the_remote_code_restates_none_of_the_model():
    # one copy of the model's math: the transformers modeling files import model.py (a copy travels beside them);
    # the raven file defines only the Huginn layout of its tensors (fused Wqkv and MLP, RoPE on interleaved pairs)
    hf = REPO / "plumbing" / "hf"
    tree = lambda name: ast.parse((hf / name).read_text()).body
    defined = lambda body: {n.name for n in body if isinstance(n, (ast.FunctionDef, ast.ClassDef))}
    model = defined(ast.parse((REPO / "model.py").read_text()).body)
    huginn = {"Attention", "MLP", "Block", "apply_rope"}
    for name, layout in (("modeling_nanorecur.py", set()), ("raven_modeling_minimal.py", huginn)):
        body = tree(name)
        assert defined(body) & model == layout, f"{name} restates {sorted(defined(body) & model - layout)} of model.py"
        assert any(isinstance(n, ast.ImportFrom) and n.level == 1 and n.module == "model" for n in body), name
