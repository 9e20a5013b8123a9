"""The shape the project promises its readers: ``run_ifcl.py`` as the examples write a script (one ``main()`` of
numbered steps, no mutable module state), remote code that carries nothing of the training code, code that ruff
formats throughout, a README whose contents and links resolve, and no file that cites what its users do not have."""

from __future__ import annotations

import ast
import re
import subprocess

import pytest
from conftest import ROOT

DOCUMENTS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), ROOT / "benchmarks" / "README.md"]
REMOTE_CODE = ("modeling_ifcl.py", "configuration_ifcl.py")  # what every published folder carries
MUTATING_METHODS = {"append", "extend", "insert", "update", "setdefault", "pop", "popitem", "clear", "add", "remove"}


def project_files() -> list:
    """The project's files: tracked and new ones git does not ignore (the glob of the source tree without git)."""
    try:
        listed = subprocess.run(
            ["git", "ls-files", "--cached", "--others", "--exclude-standard"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.splitlines()
    except (OSError, subprocess.CalledProcessError):
        listed = [str(path.relative_to(ROOT)) for path in ROOT.rglob("*") if ".venv" not in path.parts]
    return [ROOT / name for name in sorted(listed) if (ROOT / name).is_file()]


def python_files() -> list:
    return [path for path in project_files() if path.suffix == ".py"]


def project_modules() -> set[str]:
    """The names the project's code imports itself by: its top-level modules and packages."""
    names = {path.relative_to(ROOT).parts[0].removesuffix(".py") for path in python_files()}
    return names - {"tests", "benchmarks"} | {"conftest"}


def name_of(node: ast.AST) -> str:
    """``a.b.c`` for a name or attribute chain ("" for anything else)."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return f"{name_of(node.value)}.{node.attr}".strip(".")
    return ""


def test_run_ifcl_is_one_main_of_numbered_steps():
    """As ``run_glue.py`` and ``run_clip.py``: ``main()`` holds the steps, numbered 1, 2, ... in the order they run
    (no other function holds a step), and ``if __name__ == "__main__"`` runs it."""
    source = (ROOT / "run_ifcl.py").read_text(encoding="utf-8")
    tree = ast.parse(source)
    functions = {node.name: node for node in tree.body if isinstance(node, ast.FunctionDef)}
    assert "main" in functions, "run_ifcl.py has no main()"
    lines = source.splitlines()

    def steps(function: ast.FunctionDef) -> list[int]:
        body = lines[function.lineno - 1 : function.end_lineno]
        return [int(match[1]) for line in body if (match := re.match(r"\s*# (\d+)\. ", line))]

    main_steps = steps(functions["main"])
    assert len(main_steps) >= 3 and main_steps == list(range(1, len(main_steps) + 1)), main_steps
    others = {name: steps(function) for name, function in functions.items() if name != "main" and steps(function)}
    assert not others, f"numbered steps outside main(): {others}"
    entry = [node for node in tree.body if isinstance(node, ast.If) and "__main__" in ast.unparse(node.test)]
    called = {node.id for node in ast.walk(entry[0]) if isinstance(node, ast.Name)} if entry else set()
    runs_main = "main" in called or ("cli" in called and "main" in ast.unparse(functions["cli"]))  # ifcl-train's
    assert runs_main, 'run_ifcl.py: if __name__ == "__main__" does not run main()'


def test_run_ifcl_keeps_no_mutable_module_state():
    """Module-level names are constants (UPPER_CASE, or the ``logger``), none an object of the project's classes,
    none rebound, changed in place or given attributes by the code; no ``global`` statement."""
    tree = ast.parse((ROOT / "run_ifcl.py").read_text(encoding="utf-8"))
    project = project_modules()
    project_names = {node.name for node in tree.body if isinstance(node, ast.ClassDef)}
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] in project:
            project_names |= {alias.asname or alias.name for alias in node.names}
        elif isinstance(node, ast.Import):
            project_names |= {alias.asname or alias.name for alias in node.names if alias.name in project}
    module_names = set()
    for node in tree.body:
        if isinstance(node, ast.Assign | ast.AnnAssign) and node.value is not None:
            for target in node.targets if isinstance(node, ast.Assign) else [node.target]:
                assert isinstance(target, ast.Name), f"line {node.lineno}: {ast.unparse(target)}"
                assert target.id.isupper() or target.id == "logger", f"line {node.lineno}: {target.id} is no constant"
                module_names.add(target.id)
            made_by = [name_of(c.func) for c in ast.walk(node.value) if isinstance(c, ast.Call)]
            assert not [name for name in made_by if name.split(".")[0] in project_names], f"line {node.lineno}"
    for node in ast.walk(tree):
        assert not isinstance(node, ast.Global | ast.Nonlocal), f"line {node.lineno}: {ast.unparse(node)}"
        if isinstance(node, ast.Assign | ast.AugAssign | ast.AnnAssign | ast.Delete) and node not in tree.body:
            for target in node.targets if isinstance(node, ast.Assign | ast.Delete) else [node.target]:
                changed = name_of(target.value if isinstance(target, ast.Subscript) else target).split(".")[0]
                assert changed not in module_names, f"line {node.lineno}: {ast.unparse(node)}"
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            if name_of(node.func.value) in module_names and node.func.attr in MUTATING_METHODS:
                raise AssertionError(f"line {node.lineno}: {ast.unparse(node)} changes module state")


@pytest.mark.parametrize("filename", REMOTE_CODE)
def test_the_published_remote_code_imports_nothing_of_the_project(filename):
    """The remote code needs only its neighbour to load and embed, so a published folder runs where the project is
    not installed: it imports nothing of the project, not even inside a function (what training alone needs is in
    ``ifcl/``)."""
    tree = ast.parse((ROOT / filename).read_text(encoding="utf-8"))
    project = project_modules() - {"configuration_ifcl"}
    imports = [node for node in ast.walk(tree) if isinstance(node, ast.Import | ast.ImportFrom)]
    assert imports, f"{filename}: no imports found"
    for node in imports:
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        else:
            names = ["." * node.level + (node.module or "")]
        neighbour = filename == "modeling_ifcl.py" and names in (["configuration_ifcl"], [".configuration_ifcl"])
        own = [name for name in names if name.startswith(".") or name.split(".")[0] in project]
        assert neighbour or not own, f"{filename}:{node.lineno} imports the project's {own}"


def test_every_function_of_the_remote_code_is_reached_from_loading_forward_or_encode():
    """The files every user of a published model downloads and runs hold only what loading, ``forward`` and
    ``encode`` reach: each top-level function and class of the two files is named, directly or through another
    one, by a method of ``IFCLModel`` or ``IFCLConfig`` (the classes transformers loads) or at module level."""
    definitions, bodies = {}, []
    for filename in REMOTE_CODE:
        tree = ast.parse((ROOT / filename).read_text(encoding="utf-8"))
        for node in tree.body:
            if isinstance(node, ast.FunctionDef | ast.ClassDef):
                definitions[node.name] = (filename, node)
                if node.name in ("IFCLModel", "IFCLConfig"):
                    bodies.append(node)
            else:
                bodies.append(node)  # module-level code: constants, imports, registration
    reached, pending = {"IFCLModel", "IFCLConfig"}, list(bodies)
    while pending:
        for node in ast.walk(pending.pop()):
            name = node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else None
            if name in definitions and name not in reached:
                reached.add(name)
                pending.append(definitions[name][1])
    unreached = sorted(f"{definitions[name][0]}: {name}" for name in set(definitions) - reached)
    assert not unreached, f"not reached from loading, forward or encode: {unreached}"


def library_imports() -> tuple[dict[str, set[str]], list[str], list[str]]:
    """The library's modules (the top-level ``.py`` files and ``ifcl/``, read with ``ast``): which library modules
    each imports (at module level or in a function), the underscore names one imports from another, and its imports
    inside functions without a comment that says why (on the line, or on the line of the block above it)."""
    paths = sorted([*ROOT.glob("*.py"), *(ROOT / "ifcl").rglob("*.py")])
    names = {}
    for path in paths:
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        names[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    edges, private, unexplained = {name: set() for name in names}, [], []
    for name, path in names.items():
        source = path.read_text(encoding="utf-8")
        lines, tree = source.splitlines(), ast.parse(source)
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        parents = {child: parent for parent in ast.walk(tree) for child in ast.iter_child_nodes(parent)}
        for node in ast.walk(tree):
            if not isinstance(node, ast.Import | ast.ImportFrom):
                continue
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            else:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1] if node.level else []
                base = ".".join([*anchor, node.module] if node.module else anchor)
                targets = [base, *(f"{base}.{alias.name}" for alias in node.names)]
                if base in names and base != name:
                    private += [f"{name} imports {base}.{a.name}" for a in node.names if re.match(r"_[^_]", a.name)]
            for target in targets:
                while target and target not in names:
                    target = target.rpartition(".")[0]
                if target and target != name:
                    edges[name].add(target)
            up = parents.get(node)
            while up is not None and not isinstance(up, ast.FunctionDef | ast.AsyncFunctionDef):
                up = parents.get(up)
            if up is not None:
                above = next(
                    (line.strip() for line in reversed(lines[: node.lineno - 1]) if not IMPORT_LINE.match(line)), ""
                )
                if "#" not in lines[node.lineno - 1] and not above.startswith("#"):
                    unexplained.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    return edges, private, unexplained


IMPORT_LINE = re.compile(r"\s*(import |from \S+ import |$)")


def test_the_library_is_at_most_14_modules_tall_and_imports_no_private_names():
    """Layers point down and stay short: the longest chain of imports between the library's modules is at most 14
    modules, and no module imports another's underscore names (what two modules share is public)."""
    edges, private, _ = library_imports()

    def tallest(module: str, seen: frozenset) -> list[str]:
        chains = [tallest(other, seen | {other}) for other in edges[module] - seen]
        return [module, *max(chains, key=len, default=[])]

    chain = max((tallest(module, frozenset({module})) for module in edges), key=len)
    assert len(chain) <= 14, " -> ".join(chain)
    assert not private, private


def test_imports_sit_at_the_top_but_optional_extras_and_real_costs_each_with_its_reason():
    """An import inside a function is one of an optional extra or one that defers a real cost, and says which in a
    comment; there are at most 40 of them."""
    edges, _, unexplained = library_imports()
    assert not unexplained, f"in-function imports without their reason: {unexplained}"
    count = 0
    for path in sorted([*ROOT.glob("*.py"), *(ROOT / "ifcl").rglob("*.py")]):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        functions = [node for node in ast.walk(tree) if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)]
        inner = {id(n) for f in functions for n in ast.walk(f) if isinstance(n, ast.Import | ast.ImportFrom)}
        count += len(inner)
    assert count <= 40, count


def test_the_project_imports_of_sentence_transformers_only_what_its_modules_export():
    """Only sentence-transformers' public API, in the project's code, tests and benchmarks alike: every name imported
    from one of its modules is in that module's ``__all__``, and no module or name starts with an underscore."""
    import importlib

    pytest.importorskip("sentence_transformers")
    unexported = []
    for path in python_files():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "sentence_transformers":
                exported = getattr(importlib.import_module(node.module), "__all__", [])
                names = [alias.name for alias in node.names if alias.name not in exported or alias.name[0] == "_"]
            elif isinstance(node, ast.Import):
                names = [alias.name for alias in node.names if alias.name.startswith("sentence_transformers.")]
                names = [name for name in names if any(part.startswith("_") for part in name.split("."))]
            else:
                continue
            if names:
                unexported.append(f"{path.relative_to(ROOT)}:{node.lineno}: {', '.join(names)}")
    assert not unexported, unexported


def test_ruff_formats_everything_no_region_is_left_out():
    marks = ("# fmt" + ": skip", "# fmt" + ": off", "# fmt" + ":skip", "# fmt" + ":off")
    marked = [
        f"{path.relative_to(ROOT)}:{number}"
        for path in python_files()
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if any(mark in line for mark in marks)
    ]
    assert not marked, marked


def test_the_readme_has_contents_whose_entries_are_its_sections():
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    assert "## Contents" in text
    contents = text.split("## Contents", 1)[1].split("\n## ", 1)[0]
    anchors = re.findall(r"\]\(#([^)]+)\)", contents)
    headings = re.findall(r"^## (.+)$", text, flags=re.MULTILINE)
    slugs = {re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-") for heading in headings}
    assert anchors and set(anchors) <= slugs, set(anchors) - slugs
    assert len(anchors) == len(headings) - 1  # every section but the contents themselves


@pytest.mark.parametrize("document", DOCUMENTS, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(document):
    text = document.read_text(encoding="utf-8")
    targets = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text)
    missing = [
        target
        for target in targets
        if "://" not in target and not target.startswith("mailto:") and not (document.parent / target).exists()
    ]
    assert not missing, f"{document.name} links to {missing}"


def test_nothing_cites_files_its_users_do_not_have():
    forbidden = ("SPEC" + ".md", "../" + "shared")
    citing = []
    for path in project_files():
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:  # a binary file
            continue
        if any(word in text for word in forbidden):
            citing.append(str(path.relative_to(ROOT)))
    assert not citing, citing
