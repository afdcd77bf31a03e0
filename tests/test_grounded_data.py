"""perf/grounded_data.py: pairing two releases' files, the shipped sample, pinned checksums (no network)."""

from __future__ import annotations

import hashlib
import io
import re
import tarfile
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from perf import grounded_data as gd
from tests.conftest import SHARED_DATA

VOCAB_DIR = SHARED_DATA / "vocab"
LLAMA3 = VOCAB_DIR / "ggml-vocab-llama-bpe.gguf"
needs_llama3 = pytest.mark.skipif(not LLAMA3.is_file(), reason=f"{LLAMA3} not found (set LOOKUPDEC_DATA)")

CORE_OLD = 'def greet(name):\n    return "Hello " + name\n\n\ndef part():\n    return 1\n'
CORE_NEW = 'def greet(name: str) -> str:\n    return f"Hello {name}"\n\n\ndef part():\n    return 1\n'

OLD: dict[str, str | bytes] = {
    "src/demo/core.py": CORE_OLD,
    "src/demo/same.py": "x = 1\n",
    "src/demo/gone.py": "old only\n",
    "docs/conf.py": "project = 'demo'\nrelease = '1.0'\n",
    "docs/usage.rst": "Usage\n=====\n\nCall ``greet``.\n",
    "docs/guide/intro.md": "# Intro\n\nVersion 1.0.\n",
    "docs/logo.svg": "<svg>1.0</svg>\n",
    "docs/latin1.txt": "caf\xe9 1.0\n".encode("latin-1"),
    "README.md": "# demo\n\nSays hello.\n",
    "CHANGES.rst": "1.0\n---\n\n- First.\n",
    "examples/README.md": "Examples for 1.0.\n",
    "setup.cfg": "[metadata]\nversion = 1.0\n",
    "PKG-INFO": "Version: 1.0\n",
}
NEW: dict[str, str | bytes] = {
    **{k: v for k, v in OLD.items() if k != "src/demo/gone.py"},
    "src/demo/core.py": CORE_NEW,
    "src/demo/added.py": "new only\n",
    "docs/conf.py": "project = 'demo'\nrelease = '1.1'\n",
    "docs/usage.rst": "Usage\n=====\n\nCall ``greet`` with a name.\n",
    "docs/guide/intro.md": "# Intro\n\nVersion 1.1.\n",
    "docs/logo.svg": "<svg>1.1</svg>\n",
    "docs/latin1.txt": "caf\xe9 1.1\n".encode("latin-1"),
    "README.md": "# demo\n\nSays hello, typed.\n",
    "CHANGES.rst": "1.1\n---\n\n- Typed.\n\n1.0\n---\n\n- First.\n",
    "examples/README.md": "Examples for 1.1.\n",
    "setup.cfg": "[metadata]\nversion = 1.1\n",
    "PKG-INFO": "Version: 1.1\n",
}

EXPECTED = [
    ("code", "docs/conf.py"),
    ("code", "src/demo/core.py"),
    ("docs", "CHANGES.rst"),
    ("docs", "README.md"),
    ("docs", "docs/guide/intro.md"),
    ("docs", "docs/usage.rst"),
]


def make_sdist(directory: Path, top: str, files: dict[str, str | bytes]) -> Path:
    """A ``.tar.gz`` like an sdist: every file under ``top/``, plus a folder entry and a symlink."""
    path = directory / f"{top}.tar.gz"
    with tarfile.open(path, "w:gz") as tar:
        folder = tarfile.TarInfo(top)
        folder.type = tarfile.DIRTYPE
        tar.addfile(folder)
        for name, content in sorted(files.items()):
            data = content.encode() if isinstance(content, str) else content
            info = tarfile.TarInfo(f"{top}/{name}")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        link = tarfile.TarInfo(f"{top}/src/demo/link.py")
        link.type = tarfile.SYMTYPE
        link.linkname = "core.py"
        tar.addfile(link)
    return path


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@pytest.fixture
def sdists(tmp_path: Path) -> tuple[Path, Path]:
    folder = tmp_path / "work" / "sdists"
    folder.mkdir(parents=True)
    return make_sdist(folder, "demo-1.0", OLD), make_sdist(folder, "demo-1.1", NEW)


def demo_release(old: Path, new: Path) -> gd.Release:
    return gd.Release(
        "demo",
        "1.0",
        "1.1",
        sha256(old.read_bytes()),
        sha256(new.read_bytes()),
        f"https://example.invalid/{old.name}",
        f"https://example.invalid/{new.name}",
    )


def no_download(url: str, dest: Path) -> None:
    raise AssertionError(f"the test tried to download {url}")


# --- pairing -------------------------------------------------------------------------------------


def test_pairing(sdists: tuple[Path, Path]) -> None:
    old, new = (gd.read_sdist(p) for p in sdists)
    assert "src/demo/link.py" not in old  # links are not files
    assert old["docs/latin1.txt"] == OLD["docs/latin1.txt"]
    pairs, dropped = gd.pair_files("demo", "1.0", "1.1", old, new)
    assert [(p.kind, p.path) for p in pairs] == EXPECTED
    assert [(d.kind, d.path, d.reason) for d in dropped] == [("docs", "docs/latin1.txt", "not UTF-8")]
    core = pairs[1]
    assert (core.package, core.old_version, core.new_version) == ("demo", "1.0", "1.1")
    assert (core.old, core.new) == (CORE_OLD, CORE_NEW)
    head = "Update src/demo/core.py from demo 1.0 to 1.1. Reply with the whole new file.\n\n"
    assert core.instruction == head
    assert core.prompt_text == head + CORE_OLD
    readme = pairs[3]
    assert readme.instruction == "Revise README.md from demo 1.0 for 1.1. Reply with the whole new document.\n\n"


@pytest.mark.parametrize(
    ("path", "kind"),
    [
        ("setup.py", "code"),
        ("src/pkg/mod.py", "code"),
        ("docs/conf.py", "code"),
        ("README", "docs"),
        ("README.rst", "docs"),
        ("Readme.md", "docs"),
        ("CHANGES", "docs"),
        ("CHANGELOG.md", "docs"),
        ("HISTORY.md", "docs"),
        ("docs/index.rst", "docs"),
        ("docs/a/b/c.md", "docs"),
        ("docs/requirements.txt", "docs"),
        ("examples/README.md", None),
        ("doc/index.rst", None),
        ("docs/_static/style.css", None),
        ("src/pkg/data.json", None),
        ("LICENSE", None),
        ("PKG-INFO", None),
        ("mod.pyi", None),
    ],
)
def test_classify(path: str, kind: str | None) -> None:
    assert gd.classify(path) == kind


def test_read_sdist_error(tmp_path: Path) -> None:
    bad = tmp_path / "broken-1.0.tar.gz"
    bad.write_bytes(b"not a tar file")
    with pytest.raises(gd.GroundedDataError, match=re.escape("broken-1.0.tar.gz")):
        gd.read_sdist(bad)


# --- checksums and downloads ---------------------------------------------------------------------


def test_checksum_mismatch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    sdist = gd.Sdist("demo", "1.0", "https://example.invalid/p/demo-1.0.tar.gz", sha256(b"pinned"))
    monkeypatch.setattr(gd, "_download", lambda url, dest: dest.write_bytes(b"tampered"))
    with pytest.raises(gd.ChecksumError) as info:
        gd.fetch_sdist(sdist, tmp_path, progress=False)
    message = str(info.value)
    assert str(tmp_path / "demo-1.0.tar.gz") in message
    assert sdist.url in message and sdist.sha256 in message and sha256(b"tampered") in message
    assert list(tmp_path.iterdir()) == []  # neither the file nor its .part kept


def test_existing_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    sdist = gd.Sdist("demo", "1.0", "https://example.invalid/p/demo-1.0.tar.gz", sha256(b"pinned"))
    dest = tmp_path / "demo-1.0.tar.gz"
    dest.write_bytes(b"pinned")
    monkeypatch.setattr(gd, "_download", no_download)
    assert gd.fetch_sdist(sdist, tmp_path, progress=False) == dest  # the right digest: not downloaded
    dest.write_bytes(b"stale")
    monkeypatch.setattr(gd, "_download", lambda url, dest: dest.write_bytes(b"pinned"))
    assert gd.fetch_sdist(sdist, tmp_path, progress=False) == dest  # another digest: downloaded again
    assert dest.read_bytes() == b"pinned"


def test_network_failure(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def offline(url: str, timeout: float) -> None:
        raise urllib.error.URLError("no route to host")

    monkeypatch.setattr(urllib.request, "urlopen", offline)
    sdist = gd.Sdist("demo", "1.0", "https://example.invalid/p/demo-1.0.tar.gz", sha256(b"pinned"))
    with pytest.raises(
        gd.GroundedDataError, match=re.escape("cannot download https://example.invalid/p/demo-1.0.tar.gz")
    ):
        gd.fetch_sdist(sdist, tmp_path, progress=False)
    assert list(tmp_path.iterdir()) == []


def test_pinned_table() -> None:
    assert len(gd.RELEASES) >= 8
    names = [s.filename for r in gd.RELEASES for s in (r.old, r.new)]
    assert len(set(names)) == len(names)
    for r in gd.RELEASES:
        assert r.old_version != r.new_version
        for s in (r.old, r.new):
            assert re.fullmatch("[0-9a-f]{64}", s.sha256), s
            assert s.url.startswith("https://files.pythonhosted.org/packages/"), s
            assert s.filename.lower() == f"{r.package}-{s.version}.tar.gz", s


def test_cli_missing_vocab(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    missing = tmp_path / "no-such-vocab.gguf"
    assert gd.main(["--work", str(tmp_path / "w"), "--vocab", str(missing), "--quiet"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: vocabulary not found") and str(missing) in err
    assert "Traceback" not in err


# --- building (tokenizing, the cache) ------------------------------------------------------------


@needs_llama3
def test_build_offline(sdists: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(gd, "_download", no_download)  # the sdists are there with the pinned digests
    work = sdists[0].parents[1]
    releases = (demo_release(*sdists),)
    data = gd.build_dataset(work, LLAMA3, 16384, progress=False, releases=releases)
    assert not data.from_cache
    assert [(p.kind, p.path) for p in data.pairs] == EXPECTED
    assert [(d.path, d.reason) for d in data.dropped] == [("docs/latin1.txt", "not UTF-8")]
    tok = gd._tokenizer(LLAMA3)
    core = data.pairs[1]
    head = "Update src/demo/core.py from demo 1.0 to 1.1. Reply with the whole new file.\n\n"
    assert core.prompt == tok.encode(head + CORE_OLD, add_special=True, parse_special=False).tolist()
    assert core.output == tok.encode(CORE_NEW, add_special=False, parse_special=False).tolist()
    assert core.prompt[0] == tok.bos_id and core.output[0] != tok.bos_id
    assert "demo" in data.summary()

    # The replay set "code": the new files of the code pairs, in the dataset's order (docs and
    # files only in one release are not in it).
    def ids(text: str | bytes) -> list[int]:
        assert isinstance(text, str)
        return list(tok.encode(text, add_special=False, parse_special=False).tolist())

    code = gd.code_tokens(work, LLAMA3, progress=False, releases=releases)
    assert code == ids(NEW["docs/conf.py"]) + ids(CORE_NEW)

    again = gd.build_dataset(work, LLAMA3, 16384, progress=False, releases=releases)
    assert again.from_cache and again.pairs == data.pairs and again.dropped == data.dropped
    assert (work / "grounded-ggml-vocab-llama-bpe-16384.json").is_file()

    # A limit between the smallest and the largest pair drops the larger ones, counted as "too long".
    sizes = sorted(len(p.prompt) + len(p.output) for p in data.pairs)
    limit = sizes[len(sizes) // 2]
    small = gd.build_dataset(work, LLAMA3, limit, progress=False, releases=releases)
    assert [p for p in data.pairs if len(p.prompt) + len(p.output) <= limit] == list(small.pairs)
    too_long = [d for d in small.dropped if d.reason == "too long"]
    assert len(too_long) == len(data.pairs) - len(small.pairs) > 0
    assert all(d.prompt_tokens + d.output_tokens > limit for d in too_long)


# --- the shipped sample --------------------------------------------------------------------------


def test_sample_layout() -> None:
    doc = gd.sample_document()
    assert gd.SAMPLE_FILE.stat().st_size < 40_000
    assert doc["instructions"] == dict(gd.INSTRUCTIONS)
    assert [p["kind"] for p in doc["pairs"]] == ["code", "code", "docs"]
    pinned = {(r.package, r.old_version, r.new_version) for r in gd.RELEASES}
    for entry in doc["pairs"]:
        assert (entry["package"], entry["old_version"], entry["new_version"]) in pinned
        assert entry["instruction"] == gd.instruction(
            entry["kind"], entry["package"], entry["path"], entry["old_version"], entry["new_version"]
        )
        assert entry["old"] != entry["new"]
        assert len(entry["prompt"]) + len(entry["output"]) <= doc["max_tokens"]
    assert [(p.kind, p.package, p.path, p.prompt, p.output) for p in gd.load_sample()] == [
        (e["kind"], e["package"], e["path"], e["prompt"], e["output"]) for e in doc["pairs"]
    ]


def test_sample_ids() -> None:
    doc = gd.sample_document()
    vocab = VOCAB_DIR / doc["vocab"]
    if not vocab.is_file():
        pytest.skip(f"{vocab} not found (set LOOKUPDEC_DATA)")
    tok = gd._tokenizer(vocab)
    for entry in doc["pairs"]:
        prompt = tok.encode(entry["instruction"] + entry["old"], add_special=True, parse_special=False)
        assert prompt.tolist() == entry["prompt"], entry["path"]
        output = tok.encode(entry["new"], add_special=False, parse_special=False)
        assert output.tolist() == entry["output"], entry["path"]
