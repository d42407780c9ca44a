# SPDX-License-Identifier: Apache-2.0
"""The package's layering, checked statically (no vLLM import, no engine; seconds).

1. The import graph of `vllm_omni` has no cycles.
2. No module imports a module of a higher layer (`LAYERS`, bottom to top).
3. No model names (every registered family's `words`) in the code outside the model-family
   folders (`vllm_omni/models/<family>/`): the generic layers must not know which models exist.
4. No family imports another family: a family folder imports only itself, the shared modules
   beside the families (`vllm_omni/models/<shared>`) and the layers below; so do the tests of a
   family (`tests/models/<family>/`).

What counts as an import edge, for 1 and 2: every `import` / `from ... import` of a `vllm_omni`
module anywhere in a module (module level, inside functions, inside `try`), relative imports
resolved, a package's `__init__` importing its own submodules included; `from vllm_omni.x import
y` is an edge to `vllm_omni.x.y` when that is a module, else to `vllm_omni.x`. Not edges: imports
under `if TYPE_CHECKING:` (never run), and `importlib.import_module(<computed name>)`, how the
model-family registry and the package's lazy `__getattr__` exports load modules on demand (a
literal `importlib.import_module("vllm_omni.x")` is an edge: it is a plain import by another
spelling).
"""

from __future__ import annotations

import ast
import io
import re
import tokenize
from collections import deque
from dataclasses import dataclass
from functools import cache
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKAGE = "vllm_omni"
PACKAGE_DIR = REPO / PACKAGE

# Bottom to top. A module belongs to the layer of the longest prefix that matches it (a prefix
# matches itself and its submodules; the bare package name matches only `vllm_omni/__init__.py`),
# so `vllm_omni.config.model_source` is a foundation although `vllm_omni.config` is above.
# A module may import modules of its own layer and of the layers below it.
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    (
        "foundations",
        (
            "vllm_omni.logger",
            "vllm_omni.errors",
            "vllm_omni.registry",
            "vllm_omni.meta_modules",
            "vllm_omni.platform",
            "vllm_omni.outputs",
            "vllm_omni.video_file",
            "vllm_omni.audio_file",
            "vllm_omni.config.model_source",
            "vllm_omni",  # the package itself: its version; its exports load lazily
        ),
    ),
    # The tiny models' cache and shared builder parts (the families' builders are theirs).
    ("testing", ("vllm_omni.testing",)),
    # Worker hooks (the protocol, the hidden-state capture) below CPP, whose step timer is one;
    # the worker that runs them all above both.
    ("worker", ("vllm_omni.worker",)),
    ("cpp", ("vllm_omni.cpp",)),  # chunked pipeline parallel: scheduler, worker hook, cost model
    ("omni worker", ("vllm_omni.worker.omni_worker",)),
    ("executor", ("vllm_omni.executor",)),
    # `platform.cpu_defaults` is the platform policy behind patch 2: besides its pure planning
    # functions it turns `distributed_executor_backend="ray"` into `executor.cpu_ray`'s
    # CPURayExecutor (tests/platform/test_cpu_defaults.py), so it sits above the executors.
    ("patches", ("vllm_omni._patches", "vllm_omni.plugin", "vllm_omni.platform.cpu_defaults")),
    ("diffusion", ("vllm_omni.diffusion",)),
    ("config", ("vllm_omni.config",)),
    ("engine", ("vllm_omni.engine",)),
    ("entrypoints", ("vllm_omni.entrypoints",)),
    # The model families plug into every layer below, so they sit on top.
    ("top", ("vllm_omni.models", "vllm_omni.demo")),
]

MODEL_FREE = (
    "vllm_omni/engine",
    "vllm_omni/diffusion",
    "vllm_omni/worker",
    "vllm_omni/entrypoints",
    "vllm_omni/config",
    "vllm_omni/executor",
    "vllm_omni/platform",
    "vllm_omni/cpp",
    "vllm_omni/testing",
    "vllm_omni/plugin.py",
    "vllm_omni/_patches.py",
)
# (path relative to the repo, exact token text) pairs that may stay, each with the reason: names
# that belong to vLLM or diffusers, not to us. Keep it short.
MODEL_WORD_ALLOWED: dict[tuple[str, str], str] = {}


# ------------------------------------------------------------------------------ the modules


@dataclass(frozen=True)
class Edge:
    source: str
    target: str
    line: int


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


@cache
def modules() -> dict[str, Path]:
    """Every module of the package: dotted name -> file."""
    return {_module_name(p): p for p in sorted(PACKAGE_DIR.rglob("*.py"))}


def _rel(path: Path) -> str:
    return path.relative_to(REPO).as_posix()


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _is_import_module_call(node: ast.Call) -> bool:
    f = node.func
    return (isinstance(f, ast.Attribute) and f.attr == "import_module") or (
        isinstance(f, ast.Name) and f.id == "import_module"
    )


class _ImportCollector(ast.NodeVisitor):
    """The `vllm_omni` modules one module imports, as (dotted name as written, line) pairs;
    `from X import a, b` gives X.a and X.b (resolved to modules later)."""

    def __init__(self, module: str, is_package: bool):
        self.module = module
        self.is_package = is_package
        self.found: list[tuple[str, str | None, int]] = []  # (module, imported name, line)

    def visit_If(self, node: ast.If) -> None:
        if _is_type_checking(node.test):
            for child in node.orelse:  # `else:` of `if TYPE_CHECKING:` runs
                self.visit(child)
            return
        self.generic_visit(node)

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            self.found.append((alias.name, None, node.lineno))

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        base = node.module or ""
        if node.level:
            package = self.module.split(".")
            if not self.is_package:
                package.pop()
            package = package[: len(package) - (node.level - 1)]
            base = ".".join(package + ([base] if base else []))
        for alias in node.names:
            self.found.append((base, alias.name, node.lineno))

    def visit_Call(self, node: ast.Call) -> None:
        if (
            _is_import_module_call(node)
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
        ):
            self.found.append((node.args[0].value, None, node.lineno))
        self.generic_visit(node)


def _resolve(name: str) -> str | None:
    """The module of the package that importing `name` names: itself, else its longest prefix
    that is a module (None when `name` is outside the package)."""
    if name != PACKAGE and not name.startswith(PACKAGE + "."):
        return None
    known = modules()
    while name not in known:
        name = name.rpartition(".")[0]
    return name


@cache
def _parsed(module: str) -> ast.Module:
    path = modules()[module]
    return ast.parse(path.read_text(), filename=str(path))


@cache
def edges() -> tuple[tuple[Edge, ...], tuple[str, ...]]:
    """Every import edge between two distinct modules of the package, and the imports that name
    a `vllm_omni` module that does not exist (`path:line: name`)."""
    known = modules()
    found: list[Edge] = []
    missing: list[str] = []
    for module, path in known.items():
        collector = _ImportCollector(module, path.name == "__init__.py")
        collector.visit(_parsed(module))
        for base, name, line in collector.found:
            full = f"{base}.{name}" if name and name != "*" else base
            target = full if full in known else _resolve(base)
            if target is None:
                continue
            if base not in known:
                missing.append(f"{_rel(path)}:{line}: {base}")
            if target != module:
                found.append(Edge(module, target, line))
    return tuple(found), tuple(missing)


def _graph() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {m: set() for m in modules()}
    for e in edges()[0]:
        graph[e.source].add(e.target)
    return graph


def _where(source: str, target: str) -> str:
    lines = sorted({e.line for e in edges()[0] if (e.source, e.target) == (source, target)})
    return f"{_rel(modules()[source])}:{','.join(map(str, lines))}"


# ---------------------------------------------------------------------------------- cycles


def strongly_connected_components(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's algorithm, iterative (no recursion limit)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    components: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                components.append(sorted(component))
    return components


def _shortest_path(graph: dict[str, set[str]], start: str, goal: str, within: set[str]):
    previous: dict[str, str | None] = {start: None}
    queue = deque([start])
    while queue:
        node = queue.popleft()
        if node == goal:
            path = [node]
            while previous[path[-1]] is not None:
                path.append(previous[path[-1]])
            return path[::-1]
        for child in sorted(graph[node] & within):
            if child not in previous:
                previous[child] = node
                queue.append(child)
    raise AssertionError(f"no path {start} -> {goal} inside its component")


def cycles_covering(graph: dict[str, set[str]], component: list[str]) -> list[list[str]]:
    """Short cycles of one component that together use every edge inside it: cutting any one
    edge of each listed cycle is what it takes to break the component up."""
    within = set(component)
    covered: set[tuple[str, str]] = set()
    cycles = []
    for source in component:
        for target in sorted(graph[source] & within):
            if (source, target) in covered:
                continue
            cycle = [source] + _shortest_path(graph, target, source, within)
            covered.update(zip(cycle, cycle[1:]))
            cycles.append(cycle)
    return cycles


def test_import_graph_has_no_cycles():
    graph = _graph()
    report = []
    for component in strongly_connected_components(graph):
        if len(component) < 2:
            continue
        for cycle in cycles_covering(graph, component):
            report.append(" -> ".join(cycle))
            report.extend(f"    {a} -> {b}  ({_where(a, b)})" for a, b in zip(cycle, cycle[1:]))
    assert not report, "import cycles in vllm_omni:\n" + "\n".join(report)


def test_every_internal_import_names_a_module():
    # Otherwise an edge would silently go to the module's parent (a file moved, an import not).
    missing = sorted(set(edges()[1]))
    assert not missing, "imports of vllm_omni modules that do not exist:\n" + "\n".join(missing)


# ---------------------------------------------------------------------------------- layers


def layer_of(module: str) -> int | None:
    """The index in LAYERS of the longest prefix of `module`, None if none matches."""
    matches = [
        (len(prefix), i)
        for i, (_, prefixes) in enumerate(LAYERS)
        for prefix in prefixes
        if module == prefix or (prefix != PACKAGE and module.startswith(prefix + "."))
    ]
    return max(matches)[1] if matches else None


def test_every_module_has_a_layer():
    unplaced = [m for m in modules() if layer_of(m) is None]
    assert not unplaced, (
        "modules in no layer: add them (or a package above them) to the layer they belong to "
        "in LAYERS, tests/test_layering.py:\n" + "\n".join(unplaced)
    )


def test_no_module_imports_a_higher_layer():
    violations = []
    for e in sorted(set(edges()[0]), key=lambda e: (e.source, e.target, e.line)):
        source, target = layer_of(e.source), layer_of(e.target)
        if source is None or target is None or target <= source:
            continue  # unplaced modules: test_every_module_has_a_layer
        violations.append(
            f"{e.source} (layer {LAYERS[source][0]}) imports {e.target} "
            f"(layer {LAYERS[target][0]}, above)  [{_rel(modules()[e.source])}:{e.line}]"
        )
    assert not violations, "upward imports (layers in LAYERS, bottom to top):\n" + "\n".join(
        violations
    )


# ------------------------------------------------------------------------- families apart

FAMILY_ROOTS = (f"{PACKAGE}.models.", "tests.models.")


@cache
def family_folders() -> frozenset[str]:
    """The folders under vllm_omni/models/ that hold families (the registry's `FAMILY_PACKAGES`
    up to their first dot); the other modules there are shared by families."""
    from vllm_omni.registry import FAMILY_PACKAGES

    return frozenset(package.split(".")[0] for package in FAMILY_PACKAGES)


def family_of(module: str, folders: frozenset[str]) -> str | None:
    """The family folder a module (of the package or of the tests) belongs to, if any."""
    for root in FAMILY_ROOTS:
        if module.startswith(root):
            folder = module[len(root) :].split(".")[0]
            return folder if folder in folders else None
    return None


def family_violations(imports: list[Edge], folders: frozenset[str]) -> list[str]:
    """The imports, of package or test modules, that reach from one family into another."""
    found = []
    for e in imports:
        source, target = family_of(e.source, folders), family_of(e.target, folders)
        if source is not None and target is not None and source != target:
            found.append(f"{e.source} (family {source}) imports {e.target}  [line {e.line}]")
    return found


def _test_imports() -> list[Edge]:
    """The imports of the family test folders (tests/models/<family>/), as written."""
    found = []
    for path in sorted((REPO / "tests" / "models").rglob("*.py")):
        module = _module_name(path)
        collector = _ImportCollector(module, path.name == "__init__.py")
        collector.visit(ast.parse(path.read_text(), filename=str(path)))
        found += [Edge(module, f"{b}.{n}" if n else b, line) for b, n, line in collector.found]
    return found


def test_no_family_imports_another_family():
    folders = family_folders()
    violations = family_violations(list(edges()[0]) + _test_imports(), folders)
    assert not violations, (
        "imports from one model family into another (move what they share into a shared module "
        "under vllm_omni/models/ or tests/helpers/, named for what it is):\n"
        + "\n".join(violations)
    )


def test_a_planted_family_import_fails():
    folders = frozenset({"wan", "qwen_image"})
    planted = [
        Edge("vllm_omni.models.wan.runner", "vllm_omni.models.qwen_image.runner", 3),
        Edge("tests.models.wan.test_wan", "tests.models.qwen_image.edit.test_edit", 9),
        Edge("vllm_omni.models.wan.runner", "vllm_omni.models.talker_common", 4),  # shared
        Edge("vllm_omni.models.qwen_image.edit.runner", "vllm_omni.models.qwen_image.runner", 5),
    ]
    assert family_violations(planted, folders) == [
        "vllm_omni.models.wan.runner (family wan) imports vllm_omni.models.qwen_image.runner  "
        "[line 3]",
        "tests.models.wan.test_wan (family wan) imports tests.models.qwen_image.edit.test_edit  "
        "[line 9]",
    ]


# ----------------------------------------------------------------------------- model names


@cache
def model_words() -> tuple[str, ...]:
    """The model names the registered families declare (`ModelFamily.words`): they must appear
    only under vllm_omni/models/ (identifiers and string literals; comments and docstrings may
    name models)."""
    from vllm_omni.registry import families

    return tuple(sorted({word for family in families().values() for word in family.words}))


def word_pattern(words: tuple[str, ...]) -> re.Pattern:
    """A model word inside a token, in any case, standing as a word of its own: not inside a
    longer lower-case word ("wan" is not in "allowances"), but at a camel-case hump
    ("MyWanModel"), before digits ("Wan2") and in plural ("voices")."""
    alternatives = "|".join(f"(?i:{re.escape(w)})" for w in words)
    return re.compile(f"(?:(?<![a-z])|(?<=[a-z])(?=[A-Z]))(?:{alternatives})s?(?![a-z])")


@cache
def _model_word() -> re.Pattern:
    return word_pattern(model_words())


def test_every_specific_family_declares_its_words():
    from vllm_omni.registry import PLAIN_LM, families

    # The families of any model of a kind: plain LMs, and pipelines no family claims.
    generic = {n for n, f in families().items() if f.serves_pipeline is not None} | {PLAIN_LM}
    silent = [n for n, f in families().items() if not f.words and n not in generic]
    assert not silent, f"families with no model words (ModelFamily.words): {silent}"
    assert {"wan", "qwen", "talker"} <= set(model_words())


def test_the_word_pattern_finds_names_not_letters():
    pattern = word_pattern(("wan", "voice"))
    found = ["WanPipeline", "MyWanModel", "wan2_2", "'Wan2.2'", "voices", "VOICE_ID", "a_wan"]
    missed = ["allowances", "swan", "wanted", "invoice"]
    assert all(pattern.search(t) for t in found), [t for t in found if not pattern.search(t)]
    assert not any(pattern.search(t) for t in missed), [t for t in missed if pattern.search(t)]


_NOT_CODE = {
    tokenize.COMMENT,
    tokenize.NL,
    tokenize.NEWLINE,
    tokenize.INDENT,
    tokenize.DEDENT,
    tokenize.ENCODING,
    tokenize.ENDMARKER,
}


def _documentation_spans(tree: ast.Module) -> list[tuple[tuple[int, int], tuple[int, int]]]:
    """Where the docstrings are: a string statement first in a module, class or function body,
    and (PEP 257's attribute docstrings) a string statement right after an assignment. Both are
    documentation, read by no code."""
    spans = []
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if not isinstance(body, list):
            continue
        for i, statement in enumerate(body):
            is_string = (
                isinstance(statement, ast.Expr)
                and isinstance(statement.value, ast.Constant)
                and isinstance(statement.value.value, str)
            )
            documents = isinstance(
                node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)
            ) and (i == 0 or isinstance(body[i - 1], (ast.Assign, ast.AnnAssign)))
            if is_string and documents:
                spans.append(
                    (
                        (statement.lineno, statement.col_offset),
                        (statement.end_lineno, statement.end_col_offset),
                    )
                )
    return spans


def _model_free_files() -> list[Path]:
    files = []
    for entry in MODEL_FREE:
        path = REPO / entry
        files.extend(
            sorted(path.rglob("*.py")) if path.is_dir() else [path] if path.exists() else []
        )
    return files


def model_words_in(path: Path) -> list[tuple[int, str]]:
    """(line, token) for every code token of `path` (identifier, string literal, ...) that
    contains a model name; comments and docstrings are skipped."""
    source = path.read_text()
    spans = _documentation_spans(ast.parse(source, filename=str(path)))
    hits = []
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type in _NOT_CODE or not _model_word().search(token.string):
            continue
        if any(start <= token.start and token.end <= end for start, end in spans):
            continue
        hits.append((token.start[0], token.string))
    return hits


def _shown(token: str) -> str:
    """The token, long string literals cut to the part around the first model name."""
    if len(token) <= 80:
        return token
    match = _model_word().search(token)
    start = max(0, match.start() - 30)
    return ("..." if start else "") + token[start : start + 70] + "..."


def test_no_model_names_outside_the_model_folders():
    hits = []
    for path in _model_free_files():
        for line, token in model_words_in(path):
            if (_rel(path), token) not in MODEL_WORD_ALLOWED:
                hits.append(f"{_rel(path)}:{line}: {_shown(token)}")
    assert not hits, (
        f"model names ({', '.join(model_words())}) in code outside vllm_omni/models/<family>/ "
        "(move the model-specific code into its family folder):\n" + "\n".join(hits)
    )


def test_allowed_model_words_are_still_used():
    # An entry of MODEL_WORD_ALLOWED whose token is gone is stale: remove it.
    present = {(_rel(p), t) for p in _model_free_files() for _, t in model_words_in(p)}
    assert set(MODEL_WORD_ALLOWED) <= present, sorted(set(MODEL_WORD_ALLOWED) - present)


# ---------------------------------------------------------------------- the checks themselves


def _edges_of(sources: dict[str, str]) -> set[tuple[str, str]]:
    """Edges of a made-up package, given as {module: source}, with the same collector."""
    found = set()
    for module, source in sources.items():
        collector = _ImportCollector(module, module.endswith(".pkg"))
        collector.visit(ast.parse(source))
        found.update((module, f"{b}.{n}" if n else b) for b, n, _ in collector.found)
    return found


def test_collector_sees_what_runs_and_skips_what_does_not():
    source = (
        "from typing import TYPE_CHECKING\n"
        "import vllm_omni.a\n"
        "from . import sibling\n"
        "from ..up import thing\n"
        "if TYPE_CHECKING:\n"
        "    import vllm_omni.never\n"
        "else:\n"
        "    import vllm_omni.otherwise\n"
        "def f(name):\n"
        "    from vllm_omni.late import x\n"
        "    importlib.import_module(f'vllm_omni.{name}')\n"
        "    importlib.import_module('vllm_omni.literal')\n"
    )
    assert _edges_of({"vllm_omni.sub.mod": source}) == {
        ("vllm_omni.sub.mod", name)
        for name in (
            "typing.TYPE_CHECKING",
            "vllm_omni.a",
            "vllm_omni.sub.sibling",
            "vllm_omni.up.thing",
            "vllm_omni.otherwise",
            "vllm_omni.late.x",
            "vllm_omni.literal",
        )
    }
    # In a package's __init__, `from . import x` is its own submodule.
    assert _edges_of({"vllm_omni.pkg": "from . import x\n"}) == {
        ("vllm_omni.pkg", "vllm_omni.pkg.x")
    }


def test_cycle_finder():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": set(), "e": {"e"}}
    assert sorted(strongly_connected_components(graph)) == [["a", "b", "c"], ["d"], ["e"]]
    assert cycles_covering(graph, ["a", "b", "c"]) == [["a", "b", "c", "a"]]
    two = {"a": {"b", "c"}, "b": {"a"}, "c": {"a"}}
    assert cycles_covering(two, ["a", "b", "c"]) == [["a", "b", "a"], ["a", "c", "a"]]


def test_a_planted_model_word_fails(tmp_path):
    path = tmp_path / "m.py"
    path.write_text('PIPELINE = "WanPipeline"\nallowances = talker_id = 1\n')
    assert model_words_in(path) == [(1, '"WanPipeline"'), (2, "talker_id")]


def test_model_word_scan_skips_comments_and_docstrings(tmp_path):
    path = tmp_path / "m.py"
    path.write_text(
        '"""Qwen docstring."""\n'
        "# a Talker comment\n"
        "X = 1\n"
        '"""Attribute docstring about the thinker."""\n'
        "def f():\n"
        '    """Code2Wav."""\n'
        "    return 'voice', talker_id  # qwen\n"
    )
    assert model_words_in(path) == [(7, "'voice'"), (7, "talker_id")]


def test_layers_match_as_documented():
    # The bare package matches only its __init__; the longest prefix wins.
    assert LAYERS[layer_of("vllm_omni")][0] == "foundations"
    assert layer_of("vllm_omni.nowhere") is None
    assert LAYERS[layer_of("vllm_omni.registry")][0] == "foundations"
    assert LAYERS[layer_of("vllm_omni.models.qwen_image.graph")][0] == "top"
    assert LAYERS[layer_of("vllm_omni.config.model_source")][0] == "foundations"
    assert LAYERS[layer_of("vllm_omni.config.stage_config")][0] == "config"
    assert LAYERS[layer_of("vllm_omni.platform.cpu_dtype")][0] == "foundations"
