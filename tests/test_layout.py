"""The package's import graph points one way: formats at the bottom, implementations above, tools on top.

Every module of ``lookupdec`` is parsed (not imported) and every import is collected,
including the lazy ones inside functions, so the rules hold for the code as written.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

import lookupdec

PACKAGE = Path(lookupdec.__file__).parent
STDLIB = set(sys.stdlib_module_names) | {"__future__"}

# Modules of the package that import only the standard library (and each other): the
# reference may use them, and ``import lookupdec.reference`` stays free of numpy & co.
STDLIB_LEAVES = {
    "lookupdec._atomic",
    "lookupdec._rawids",  # raw token files without numpy: the replay's lean input (issue 10 item 4)
    "lookupdec._lifecycle",  # the Drafter's request lifecycle, shared by both implementations
    "lookupdec._shared_file",
    "lookupdec._signals",  # SIGTERM cleans up, pool workers leave Ctrl-C to the parent
    "lookupdec._version",
    "lookupdec.errors",
    "lookupdec.result",
    "lookupdec.rules",  # the int32 range, the policies and their option checks: one definition each
    "lookupdec.formats",  # its names are loaded lazily (PEP 562): importing it loads no format module
    "lookupdec.formats.detect",
    "lookupdec.formats.legacy",
    "lookupdec.formats.corpus",  # the hybrid policy's corpus file: the reference reads its ids
    "lookupdec.formats.index_header",  # the index header: parsed and packed here for every reader and writer
}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports_of(path: Path, *, type_checking: bool = False) -> set[str]:
    """Absolute names of every module ``path`` imports, anywhere in the file (TYPE_CHECKING
    blocks excluded unless ``type_checking``)."""
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    type_only: set[int] = set()
    for node in ast.walk(tree):
        guard = isinstance(node, ast.If) and ast.unparse(node.test) in ("TYPE_CHECKING", "typing.TYPE_CHECKING")
        if guard and not type_checking:
            assert isinstance(node, ast.If)
            type_only.update(id(n) for stmt in node.body for n in ast.walk(stmt))
    this = module_name(path)
    package = this if path.name == "__init__.py" else this.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in type_only:
            continue
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            found.add(base)
            # `from lookupdec import fast` imports the submodule lookupdec.fast
            found.update(f"{base}.{alias.name}" for alias in node.names)
    return found


def internal_graph() -> dict[str, set[str]]:
    modules = {module_name(p): p for p in PACKAGE.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        graph[name] = {m for m in imports_of(path) if m in modules and m != name}
    return graph


def external_imports(name: str, *, type_checking: bool = False) -> set[str]:
    modules = {module_name(p): p for p in PACKAGE.rglob("*.py")}
    found = imports_of(modules[name], type_checking=type_checking)
    return {m.partition(".")[0] for m in found if not m.startswith("lookupdec")}


GRAPH = internal_graph()


def ancestors(name: str) -> set[str]:
    """Packages whose ``__init__`` runs when ``name`` is imported (always allowed)."""
    parts = name.split(".")
    return {".".join(parts[:i]) for i in range(1, len(parts))}


def test_graph_is_read() -> None:
    assert "lookupdec.reference.cache" in GRAPH
    assert "lookupdec.formats.legacy" in GRAPH["lookupdec.reference.cache"]
    assert "lookupdec.formats" in GRAPH["lookupdec.cli._pipeline"]  # a lazy import inside a function


def test_no_cycle() -> None:
    # Package __init__ edges to their own children are re-exports, not layering; leave them out.
    edges = {m: {d for d in deps if not d.startswith(m + ".")} for m, deps in GRAPH.items()}
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(m: str) -> None:
        state[m] = 1
        stack.append(m)
        for d in sorted(edges[m]):
            if state.get(d) == 1:
                cycle = [*stack[stack.index(d) :], d]
                pytest.fail("import cycle: " + " -> ".join(cycle))
            if d not in state:
                visit(d)
        stack.pop()
        state[m] = 2

    for m in sorted(edges):
        if m not in state:
            visit(m)


@pytest.mark.parametrize(
    ("src", "dst"), [("lookupdec.fast", "lookupdec.reference"), ("lookupdec.reference", "lookupdec.fast")]
)
def test_no_arrow_between_implementations(src: str, dst: str) -> None:
    bad = [
        (m, d)
        for m, deps in GRAPH.items()
        if m == src or m.startswith(src + ".")
        for d in deps
        if d == dst or d.startswith(dst + ".")
    ]
    assert bad == []


def test_formats_import_no_implementation_or_tool() -> None:
    below = ("lookupdec.formats", "lookupdec.errors", "lookupdec._atomic", "lookupdec.rules")
    for m, deps in GRAPH.items():
        if m.startswith("lookupdec.formats"):
            assert all(d.startswith(below) for d in deps if d not in ancestors(m)), (m, deps)


def test_builder_imports_only_downward() -> None:
    """lookupdec.builder (bounded-memory create/merge) sits on formats and the leaves; no implementation, no tool."""
    # lookupdec.tokens: token-file input, a leaf above errors only (the .npy header checks are shared);
    # lookupdec._rawids: the raw-file size check under it; lookupdec._signals: its pool workers'
    # signals (a stdlib-only leaf).
    below = ("lookupdec.builder", "lookupdec.formats", "lookupdec.errors", "lookupdec._atomic", "lookupdec.tokens",
             "lookupdec._rawids", "lookupdec.rules", "lookupdec._signals")  # fmt: skip
    modules = [m for m in GRAPH if m.startswith("lookupdec.builder")]
    assert "lookupdec.builder._write" in modules and "lookupdec.builder.dask" in modules
    for m in modules:
        assert all(d.startswith(below) for d in GRAPH[m] if d not in ancestors(m)), (m, GRAPH[m])


def test_nothing_imports_the_adapters() -> None:
    """The adapters sit on top: they may import the implementations (the vLLM row loop calls the
    fast path's requests natively), and nothing outside them imports them."""
    assert "lookupdec.fast._request" in GRAPH["lookupdec.adapters._vllm_rows"]
    for m, deps in GRAPH.items():
        if not m.startswith("lookupdec.adapters"):
            assert not any(d.startswith("lookupdec.adapters") for d in deps), (m, deps)


def test_reference_imports_only_stdlib_and_leaves() -> None:
    for m, deps in GRAPH.items():
        if not m.startswith("lookupdec.reference"):
            continue
        assert external_imports(m) <= STDLIB, (m, external_imports(m) - STDLIB)
        for d in deps - ancestors(m):
            assert d.startswith("lookupdec.reference") or d in STDLIB_LEAVES, (m, d)


def test_leaves_import_only_stdlib() -> None:
    # Type-only imports too: the reference is the standard library alone for its type checker
    # as well, on every supported Python (``_typeshed`` is the standard library's own stubs).
    for leaf in STDLIB_LEAVES:
        outside = external_imports(leaf, type_checking=True) - STDLIB - {"_typeshed"}
        assert not outside, (leaf, outside)
        assert GRAPH[leaf] - ancestors(leaf) <= STDLIB_LEAVES, (leaf, GRAPH[leaf])


def test_reference_runs_on_the_standard_library_alone(tmp_path: Path) -> None:
    """On the running interpreter, a fresh process that drafts, replays, merges and writes and
    reads every file the reference handles loads no module outside the standard library."""
    code = f"""
import sys
before = set(sys.modules)
import lookupdec.reference as ref
ctx = ref.NgramCache()
toks = [1, 2, 3, 1, 2, 3, 1, 2, 4] * 20
ctx.update(toks, len(toks))
out = [toks[-1]]
ref.draft(toks, out, 8, 1, 4, ctx, ref.NgramCache(), ref.NgramCache())
ref.replay(toks, 64, 8, ctx)
d = ref.Drafter(policy="hybrid")
req = d.request(toks)
req.propose()
req.extend([5])
req.end()
st = ref.build_static(toks)
st.save({str(tmp_path / "s.bin")!r})
ref.load_static({str(tmp_path / "s.bin")!r})
ctx.save({str(tmp_path / "d.bin")!r})
ref.NgramCache.load({str(tmp_path / "d.bin")!r})
new = sorted(set(sys.modules) - before)
outside = [m for m in new if m.partition(".")[0] not in sys.stdlib_module_names and not m.startswith("lookupdec")]
print(outside)
"""
    env = {**os.environ, "LOOKUPDEC_IMPL": "reference"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_import_reference_loads_no_compiled_library() -> None:
    """What the graph promises, checked at run time in a fresh interpreter."""
    code = (
        "import lookupdec, lookupdec.reference, sys\n"
        "assert lookupdec.IMPLEMENTATION == 'reference', lookupdec.IMPLEMENTATION\n"
        "heavy = sorted(m for m in sys.modules if m.partition('.')[0] in "
        "('numpy', 'fastconstmap', 'librt', 'mypy_extensions', 'lookupdec__mypyc') or m.startswith('lookupdec.fast'))\n"
        "print(heavy)\n"
    )
    env = {**os.environ, "LOOKUPDEC_IMPL": "reference"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_fast_never_hands_foreign_caches_to_the_reference() -> None:
    """fast.draft / fast.replay refuse a reference cache with a TypeError naming the conversion."""
    fast = lookupdec.implementation("fast")
    ref = lookupdec.implementation("reference")
    tokens = [1, 2, 3, 1, 2, 3, 1, 2]
    ref_cache = ref.build_static(tokens)
    with pytest.raises(TypeError, match=r"nc_context must be a lookupdec\.fast\.NgramCache.*from_contents"):
        fast.draft(tokens, [tokens[-1]], 4, 1, 4, ref_cache, fast.NgramCache(), None)
    # (compiled, mypyc's own argument check says it first: "...fast._cache.NgramCache or None object expected")
    with pytest.raises(TypeError, match=r"fast(\._cache)?\.NgramCache"):
        fast.replay(tokens, 4, 2, None, ref_cache)
    with pytest.raises(TypeError, match="nc_static must be"):
        fast.replay(tokens, 4, 2, object())
    # Converted once, the same cache drafts exactly as the reference does with its own.
    converted = fast.NgramCache.from_contents(ref_cache.contents())
    got: list[int] = [tokens[-1]]
    want: list[int] = [tokens[-1]]
    fast.draft(tokens, got, 4, 1, 4, converted, fast.NgramCache(), None)
    ref.draft(tokens, want, 4, 1, 4, ref_cache, ref.NgramCache(), ref.NgramCache())
    assert got == want and len(got) > 1


def test_reference_refuses_formats_it_cannot_read_purely(tmp_path: Path) -> None:
    from lookupdec.errors import CacheFormatError
    from lookupdec.formats import read_as_contents, write_static

    ref = lookupdec.implementation("reference")
    contents = [((1, 2, -1, -1), [(3, 4)])]
    path = tmp_path / "s.lkdc"
    write_static(contents, path, "lookupdec")
    with pytest.raises(CacheFormatError, match=r"s\.lkdc.*legacy format.*read_as_contents"):
        ref.NgramCache.load(path)
    with pytest.raises(CacheFormatError, match="legacy format"):
        ref.load_static(path)
    assert ref.NgramCache.from_contents(read_as_contents(path)).contents() == contents
