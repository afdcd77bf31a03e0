"""The two implementations have one API: the same public names, methods and signatures.

``lookupdec.fast`` mirrors ``lookupdec.reference`` module by module (``cache`` is ``_cache``,
``history`` is ``_history``, ...). This file checks it from the objects themselves (compiled
or not), and checks the shared constants have the same values, so an API change made to one
implementation and not the other fails here, not in a user's code.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import lookupdec.fast as fast
import lookupdec.reference as ref

# Names only the fast path has: the mapped files and the streaming merge of legacy files.
FAST_ONLY = {"CorpusIndex", "StaticIndex", "merge_legacy_files"}
# reference module -> the fast module that mirrors it
MIRRORS = {
    "cache": "_cache",
    "draft": "_draft",
    "replay": "_replay",
    "history": "_history",
    "hybrid": "_hybrid",
    "files": "_legacy",
    "drafter": "drafter",
}


def test_every_reference_module_has_its_fast_mirror() -> None:
    ref_dir = Path(ref.__file__).parent
    modules = {p.stem for p in ref_dir.glob("*.py") if p.stem != "__init__"}
    assert modules == set(MIRRORS), "a reference module without a mirror in fast/: add it to both and to MIRRORS"
    for name in MIRRORS.values():
        importlib.import_module(f"lookupdec.fast.{name}")


def test_public_names() -> None:
    import lookupdec

    assert set(ref.__all__) <= set(fast.__all__)
    assert set(fast.__all__) - set(ref.__all__) == FAST_ONLY
    # the package exports the implementations' shared names (and its own two)
    assert set(lookupdec.__all__) == set(ref.__all__) | {"__version__", "implementation"}


Param = tuple[str, str, str]


def params(fn: Callable[..., Any]) -> list[Param]:
    """Names, kinds and defaults of ``fn``'s parameters; ``self`` of either kind is the same."""
    out = []
    for p in inspect.signature(fn).parameters.values():
        kind = "self" if p.name == "self" else p.kind.name
        out.append((p.name, kind, "-" if p.default is inspect.Parameter.empty else repr(p.default)))
    return out


def source_params(cls: type, method: str) -> list[Param]:
    """``cls.method``'s parameters read from the source it was compiled from, defaults evaluated
    in its module: mypyc gives a native class's ``__init__`` no signature (``*args, **kwargs``),
    nor a method whose default is a named constant."""
    module = importlib.import_module(cls.__module__)
    assert module.__file__ is not None
    compiled = Path(module.__file__)  # _cache.cpython-311-x86_64-linux-gnu.so: its source is beside it
    source = compiled.with_name(compiled.name.split(".")[0] + ".py").read_text(encoding="utf-8")
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ClassDef) and node.name == cls.__name__:
            for item in node.body:
                if isinstance(item, ast.FunctionDef) and item.name == method:
                    args = item.args
                    assert not args.kwonlyargs and not args.posonlyargs, "extend source_params"
                    defaults = [None] * (len(args.args) - len(args.defaults)) + list(args.defaults)
                    return [
                        (
                            a.arg,
                            "self" if a.arg == "self" else "POSITIONAL_OR_KEYWORD",
                            "-" if d is None else repr(eval(ast.unparse(d), vars(module))),
                        )
                        for a, d in zip(args.args, defaults, strict=True)
                    ]
            return [("self", "self", "-")]  # no __init__ of its own
    raise AssertionError(f"no class {cls.__name__} in {module.__file__}")


def method_params(cls: type, method: str) -> list[Param]:
    """``cls.method``'s parameters, from the object where it has a signature, else from its source."""
    try:
        sig = params(getattr(cls, method))
    except ValueError:
        return source_params(cls, method)
    if sig[1:] == [("args", "VAR_POSITIONAL", "-"), ("kwargs", "VAR_KEYWORD", "-")]:
        return source_params(cls, method)
    return sig


def public_methods(cls: type) -> set[str]:
    """Public callables of ``cls`` (methods, class and static methods); a native class's
    attribute descriptors are data, not API."""
    out = set()
    for name, value in inspect.getmembers(cls):
        if name.startswith("_") or inspect.isdatadescriptor(value) or inspect.ismemberdescriptor(value):
            continue
        if callable(value):
            out.add(name)
    return out


@pytest.mark.parametrize("name", sorted(set(ref.__all__)))
def test_same_signatures(name: str) -> None:
    a, b = getattr(ref, name), getattr(fast, name)
    if name in ("COMPILED", "IMPLEMENTATION"):  # which implementation: the one name that differs by design
        assert type(a) is type(b)
    elif inspect.isclass(a):
        assert inspect.isclass(b)
        ma, mb = public_methods(a), public_methods(b)
        assert ma == mb, f"{name}: reference only {ma - mb}, fast only {mb - ma}"
        for m in sorted(ma | {"__init__"}):
            assert method_params(a, m) == method_params(b, m), f"{name}.{m}"
    elif callable(a):
        assert params(a) == params(b), name
    else:
        assert a == b, name


@pytest.mark.parametrize("mirror", sorted(MIRRORS.items()))
def test_shared_constants_have_the_same_values(mirror: tuple[str, str]) -> None:
    a = importlib.import_module(f"lookupdec.reference.{mirror[0]}")
    b = importlib.import_module(f"lookupdec.fast.{mirror[1]}")
    shared = {n for n in vars(a) if n.isupper() and not n.startswith("_")} & set(vars(b))

    def plain(v: Any) -> Any:  # a tuple in the reference is a vec in the fast path
        return v if isinstance(v, int | float | str) else list(v)

    for n in sorted(shared):
        assert plain(getattr(a, n)) == plain(getattr(b, n)), n


def random_history(impl: Any, rng: random.Random, with_corpus: bool) -> tuple[Any, list[int]]:
    """A history of a few requests over a small vocabulary (many repeats), maybe with a corpus."""
    h = impl.SuffixHistory(max_tokens=400)
    if with_corpus:
        corpus = [rng.randrange(6) if rng.random() > 0.05 else -1 for _ in range(300)]
        h.add_corpus(corpus)
    last: list[int] = []
    for _ in range(rng.randrange(1, 5)):
        h.add_separator()
        last = [rng.randrange(6) for _ in range(rng.randrange(1, 150))]
        h.extend(last)
    return h, last


@pytest.mark.parametrize("seed", range(40))
def test_history_queries_equal_the_reference(seed: int) -> None:
    """SuffixHistory's public queries (candidates, query_token, token_at) agree, evictions and a corpus included."""
    rng = random.Random(seed)
    with_corpus = seed % 2 == 1
    state = rng.getstate()
    hr, last = random_history(ref, rng, with_corpus)
    rng.setstate(state)
    hf, _ = random_history(fast, rng, with_corpus)
    assert hf.tokens() == hr.tokens()
    for _ in range(20):
        drafted = [rng.randrange(6) for _ in range(rng.randrange(0, 4))]
        request = [rng.randrange(6) for _ in range(rng.randrange(0, 6))] if rng.random() < 0.3 else None
        k = rng.choice([1, 2, 32])
        assert hf.candidates(drafted, k, request) == hr.candidates(drafted, k, request), (drafted, k, request)
        for j in range(8):
            assert hf.query_token(drafted, j, request) == hr.query_token(drafted, j, request)
    base = 1 << 40
    for p in [0, 1, len(last), len(hr.tokens()), 10**6, base, base + 5, base + 299, base + 300, base + 10**6]:
        assert hf.token_at(p) == hr.token_at(p), p
