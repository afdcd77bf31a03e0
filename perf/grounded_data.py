"""Input-grounded benchmark pairs from real releases of real packages: the output copies the prompt.

Prompt lookup drafting pays off when the text being generated repeats long spans of the prompt.
This module builds prompt -> output pairs where that happens for real, from human-written files:
the same file in two consecutive releases of a widely used pure-Python package, taken from the
source distributions (sdists) on PyPI:

- ``code``: a ``.py`` file present in both releases with different contents. Prompt: the line
  ``Update {path} from {package} {old_version} to {new_version}. Reply with the whole new file.``
  and a blank line, then the old file; output: the new file.
- ``docs``: a changed document present in both releases (a top-level ``README*``, ``CHANGES*``,
  ``CHANGELOG*`` or ``HISTORY*``, or ``docs/**/*.rst|.md|.txt``). Prompt: the line
  ``Revise {path} from {package} {old_version} for {new_version}. Reply with the whole new document.``
  and a blank line, then the old document; output: the new document.

Files are paired by their path below the sdist's top folder. The releases are pinned in
:data:`RELEASES`, each sdist by URL and sha256: every download is checked against the pinned
digest, so a build is reproducible offline once ``WORK/sdists`` holds the 16 files.

Prompts are tokenized with BOS (``add_special=True``), outputs without, neither parsing special
tokens, by lookupdec's own tokenizer (llama.cpp's tokenization) with a GGUF vocabulary (Llama 3's
by default). A pair is kept when its prompt and output together have at most ``--max-tokens``
tokens. The result is cached in ``WORK/grounded-<vocab stem>-<max tokens>.json``; the next build
with the same releases, vocabulary and limit reads it back.

    python -m perf.grounded_data --work /work/grounded                       # build, print the table
    python -m perf.grounded_data --work /work/grounded --vocab qwen2         # another vocabulary
    python -m perf.grounded_data --work /work/grounded --max-tokens 8192
    python -m perf.grounded_data --work /work/grounded --write-sample        # refresh the test sample
    python -m perf grounded-data --work /work/grounded                       # the same, via python -m perf
    python -m perf grounded --work /work/grounded                            # run the drafters on the pairs

From Python::

    from perf.grounded_data import build_pairs
    pairs = build_pairs(Path("/work/grounded"))     # list[Pair]: kind, package, path, prompt, output
"""

from __future__ import annotations

import argparse
import base64
import difflib
import functools
import hashlib
import http.client
import json
import os
import sys
import tarfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Final, Literal, TypedDict, cast

import numpy as np

from perf._cli import positive_int

if TYPE_CHECKING:
    from lookupdec.tokenizer import Tokenizer

REPO: Final = Path(__file__).resolve().parents[1]
"""The checkout this module is in."""

Kind = Literal["code", "docs"]
"""The two kinds of pairs."""

KINDS: Final[tuple[Kind, ...]] = ("code", "docs")
"""The kinds, in the order pairs are sorted."""

INSTRUCTIONS: Final[Mapping[Kind, str]] = {
    "code": "Update {path} from {package} {old_version} to {new_version}. Reply with the whole new file.\n\n",
    "docs": "Revise {path} from {package} {old_version} for {new_version}. Reply with the whole new document.\n\n",
}
"""The instruction line (and blank line) that starts every prompt, per kind (``str.format`` templates)."""

FORMAT: Final = 1
"""Version of the pairing rules and of the cache layout: a cache written by another is rebuilt."""

SAMPLE_FILE: Final = REPO / "tests" / "data" / "grounded-sample.json"
"""The small sample shipped for the tests (see :func:`load_sample`, ``--write-sample``)."""


def _data_dir() -> Path:
    env = os.environ.get("LOOKUPDEC_DATA")
    return Path(env) if env else REPO.parent / "shared" / "data"


VOCAB_DIR: Final = _data_dir() / "vocab"
"""The folder of GGUF vocabularies (``$LOOKUPDEC_DATA/vocab``, else ``../shared/data/vocab``)."""

DEFAULT_VOCAB: Final = VOCAB_DIR / "ggml-vocab-llama-bpe.gguf"
"""Llama 3's vocabulary: the default tokenization."""

DEFAULT_MAX_TOKENS: Final = 16384
"""A pair is kept when ``len(prompt) + len(output)`` is at most this."""

_DOC_NAMES: Final = ("README", "CHANGES", "CHANGELOG", "HISTORY")
_DOC_SUFFIXES: Final = (".rst", ".md", ".txt")
_TIMEOUT: Final = 60.0


class GroundedDataError(Exception):
    """A build cannot go on (download failed, bad archive, missing vocabulary); the message says why."""


class ChecksumError(GroundedDataError):
    """A downloaded sdist's sha256 is not the one pinned in :data:`RELEASES`."""


# --- the pinned releases -------------------------------------------------------------------------


@dataclass(frozen=True)
class Sdist:
    """One pinned source distribution: where to get it and the sha256 it must have."""

    package: str
    version: str
    url: str
    sha256: str

    @property
    def filename(self) -> str:
        """The file name (the last part of the URL), as stored in ``WORK/sdists``."""
        return self.url.rsplit("/", 1)[-1]


@dataclass(frozen=True)
class Release:
    """Two consecutive releases of one package: their versions, sdist digests and URLs."""

    package: str
    old_version: str
    new_version: str
    old_sha256: str
    new_sha256: str
    old_url: str
    new_url: str

    @property
    def old(self) -> Sdist:
        """The older release's sdist."""
        return Sdist(self.package, self.old_version, self.old_url, self.old_sha256)

    @property
    def new(self) -> Sdist:
        """The newer release's sdist."""
        return Sdist(self.package, self.new_version, self.new_url, self.new_sha256)


_PY = "https://files.pythonhosted.org/packages/"

RELEASES: Final[tuple[Release, ...]] = (
    Release(
        "attrs", "24.2.0", "24.3.0",
        "5cfb1b9148b5b086569baec03f20d7b6bf3bcacc9a42bebf87ffaaca362f6346",
        "8f5c07333d543103541ba7be0e2ce16eeee8130cb0b3f9238ab904ce1e85baff",
        _PY + "fc/0f/aafca9af9315aee06a89ffde799a10a582fe8de76c563ee80bbcdc08b3fb/attrs-24.2.0.tar.gz",
        _PY + "48/c8/6260f8ccc11f0917360fc0da435c5c9c7504e3db174d5a12a1494887b045/attrs-24.3.0.tar.gz",
    ),
    Release(
        "click", "8.1.7", "8.1.8",
        "ca9853ad459e787e2192211578cc907e7594e294c7ccc834310722b41b9ca6de",
        "ed53c9d8990d83c2a27deae68e4ee337473f6330c040a31d4225c9574d16096a",
        _PY + "96/d3/f04c7bfcf5c1862a2a5b845c6b2b360488cf47af55dfa79c98f6a6bf98b5/click-8.1.7.tar.gz",
        _PY + "b9/2e/0090cbf739cee7d23781ad4b89a9894a41538e4fcf4c31dcdd705b78eb8b/click-8.1.8.tar.gz",
    ),
    Release(
        "jinja2", "3.1.2", "3.1.3",
        "31351a702a408a9e7595a8fc6150fc3f43bb6bf7e319770cbc0db9df9437e852",
        "ac8bd6544d4bb2c9792bf3a159e80bba8fda7f07e81bc3aed565432d5925ba90",
        _PY + "7a/ff/75c28576a1d900e87eb6335b063fab47a8ef3c8b4d88524c4bf78f670cce/Jinja2-3.1.2.tar.gz",
        _PY + "b2/5e/3a21abf3cd467d7876045335e681d276ac32492febe6d98ad89562d1a7e1/Jinja2-3.1.3.tar.gz",
    ),
    Release(
        "packaging", "24.1", "24.2",
        "026ed72c8ed3fcce5bf8950572258698927fd1dbda10a5e981cdf0ac37f4f002",
        "c228a6dc5e932d346bc5739379109d49e8853dd8223571c7c5b55260edc0b97f",
        _PY + "51/65/50db4dda066951078f0a96cf12f4b9ada6e4b811516bf0262c0f4f7064d4/packaging-24.1.tar.gz",
        _PY + "d0/63/68dbb6eb2de9cb10ee4c9c14a0148804425e13c4fb20d61cce69f53106da/packaging-24.2.tar.gz",
    ),
    Release(
        "requests", "2.32.3", "2.32.4",
        "55365417734eb18255590a9ff9eb97e9e1da868d4ccd6402399eaf68af20a760",
        "27d0316682c8a29834d3264820024b62a36942083d52caf2f14c0591336d3422",
        _PY + "63/70/2bf7780ad2d390a8d301ad0b550f1581eadbd9a20f896afe06353c2a2913/requests-2.32.3.tar.gz",
        _PY + "e1/0a/929373653770d8a0d7ea76c37de6e41f11eb07559b103b1c02cafb3f7cf8/requests-2.32.4.tar.gz",
    ),
    Release(
        "rich", "14.0.0", "14.1.0",
        "82f1bc23a6a21ebca4ae0c45af9bdbc492ed20231dcb63f297d6d1021a9d5725",
        "e497a48b844b0320d45007cdebfeaeed8db2a4f4bcf49f15e455cfc4af11eaa8",
        _PY + "a1/53/830aa4c3066a8ab0ae9a9955976fb770fe9c6102117c8ec4ab3ea62d89e8/rich-14.0.0.tar.gz",
        _PY + "fe/75/af448d8e52bf1d8fa6a9d089ca6c07ff4453d86c65c145d0a300bb073b9b/rich-14.1.0.tar.gz",
    ),
    Release(
        "urllib3", "2.2.1", "2.2.2",
        "d0570876c61ab9e520d776c38acbbb5b05a776d3f9ff98a5c8fd5162a444cf19",
        "dd505485549a7a552833da5e6063639d0d177c04f23bc3864e41e5dc5f612168",
        _PY + "7a/50/7fd50a27caa0652cd4caf224aa87741ea41d3265ad13f010886167cfcc79/urllib3-2.2.1.tar.gz",
        _PY + "43/6d/fa469ae21497ddc8bc93e5877702dca7cb8f911e337aca7452b5724f1bb6/urllib3-2.2.2.tar.gz",
    ),
    Release(
        "werkzeug", "3.1.3", "3.1.4",
        "60723ce945c19328679790e3282cc758aa4a6040e4bb330f53d30fa546d44746",
        "cd3cd98b1b92dc3b7b3995038826c68097dcb16f9baa63abe35f20eafeb9fe5e",
        _PY + "9f/69/83029f1f6300c5fb2471d621ab06f6ec6b3324685a2ce0f9777fd4a8b71e/werkzeug-3.1.3.tar.gz",
        _PY + "45/ea/b0f8eeb287f8df9066e56e831c7824ac6bab645dd6c7a8f4b2d767944f9b/werkzeug-3.1.4.tar.gz",
    ),
)  # fmt: skip
"""The pinned releases: per package, two consecutive releases (patch or minor) with many changed files.

Digests read once from PyPI's JSON API (``https://pypi.org/pypi/PKG/json``, ``digests.sha256`` of the
release's one sdist); the URLs are the files' permanent ``files.pythonhosted.org`` addresses.
"""


# --- records ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Pair:
    """One benchmark pair: token ids of the prompt (instruction + old file, BOS first) and of the output."""

    kind: str
    """``"code"`` or ``"docs"``."""
    package: str
    """The package (as named in :data:`RELEASES`)."""
    path: str
    """The file's path below the sdist's top folder (the same in both releases)."""
    old_version: str
    """The release the prompt's file comes from."""
    new_version: str
    """The release the output's file comes from."""
    prompt: list[int]
    """Token ids of the instruction line and the old file, with BOS."""
    output: list[int]
    """Token ids of the new file, without BOS."""


@dataclass(frozen=True)
class TextPair:
    """A changed file before tokenization: the old and new texts and what they were paired as."""

    kind: Kind
    """``"code"`` or ``"docs"``."""
    package: str
    """The package."""
    path: str
    """The path below the sdist's top folder."""
    old_version: str
    """The older release."""
    new_version: str
    """The newer release."""
    old: str
    """The file in the older release."""
    new: str
    """The file in the newer release."""

    @property
    def instruction(self) -> str:
        """The instruction line (and blank line) the prompt starts with."""
        return instruction(self.kind, self.package, self.path, self.old_version, self.new_version)

    @property
    def prompt_text(self) -> str:
        """The prompt's text: the instruction line, then the old file."""
        return self.instruction + self.old


@dataclass(frozen=True)
class Dropped:
    """A changed file left out of the pairs, and why."""

    kind: str
    """``"code"`` or ``"docs"``."""
    package: str
    """The package."""
    path: str
    """The path below the sdist's top folder."""
    reason: str
    """``"too long"`` (prompt + output over the token limit) or ``"not UTF-8"``."""
    prompt_tokens: int
    """Tokens of the prompt (0 when not tokenized)."""
    output_tokens: int
    """Tokens of the output (0 when not tokenized)."""


@dataclass(frozen=True)
class Dataset:
    """What a build gives: the kept pairs, the dropped files, and how it was made."""

    pairs: tuple[Pair, ...]
    """The kept pairs, by kind (code first), package, path."""
    dropped: tuple[Dropped, ...]
    """The changed files not kept, in the same order."""
    vocab: str
    """The vocabulary's file name."""
    max_tokens: int
    """The token limit the pairs were kept under."""
    build_seconds: float
    """How long the build that made it took (downloads, reading, tokenizing)."""
    from_cache: bool
    """True when it was read back from the cache file."""

    def summary(self) -> str:
        """A table of pairs and tokens per kind and package, with the dropped counts and totals."""
        return _summary(self)


def instruction(kind: str, package: str, path: str, old_version: str, new_version: str) -> str:
    """The instruction line (with its trailing blank line) for a pair of this kind."""
    template = INSTRUCTIONS[_kind(kind)]
    return template.format(path=path, package=package, old_version=old_version, new_version=new_version)


def _kind(kind: str) -> Kind:
    if kind == "code":
        return "code"
    if kind == "docs":
        return "docs"
    raise ValueError(f"unknown kind {kind!r} (expected one of {KINDS})")


def _order(kind: str, package: str, path: str) -> tuple[int, str, str]:
    return (KINDS.index(_kind(kind)), package, path)


# --- downloading ---------------------------------------------------------------------------------


def _log(progress: bool, message: str) -> None:
    if progress:
        print(f"[grounded] {message}", file=sys.stderr, flush=True)


def sha256_of(path: Path) -> str:
    """The hex sha256 of a file."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _download(url: str, dest: Path) -> None:
    """Write what ``url`` serves to ``dest``; :class:`GroundedDataError` naming the URL on failure."""
    try:
        with urllib.request.urlopen(url, timeout=_TIMEOUT) as response, open(dest, "wb") as f:
            while block := response.read(1 << 16):
                f.write(block)
    except urllib.error.HTTPError as e:
        raise GroundedDataError(f"cannot download {url}: HTTP {e.code} {e.reason}") from None
    except urllib.error.URLError as e:
        raise GroundedDataError(
            f"cannot download {url}: {e.reason} (no network? copy the file to {dest.parent})"
        ) from None
    except (OSError, http.client.HTTPException) as e:
        raise GroundedDataError(f"cannot download {url} to {dest}: {e!r}") from None


def fetch_sdist(sdist: Sdist, directory: Path, progress: bool = True) -> Path:
    """``directory / sdist.filename``, downloaded unless already there with the pinned sha256.

    A file there with another digest is downloaded again; a download with another digest is
    removed and raises :class:`ChecksumError` naming the file, the URL and both digests.
    """
    directory.mkdir(parents=True, exist_ok=True)
    dest = directory / sdist.filename
    if dest.is_file():
        if sha256_of(dest) == sdist.sha256:
            return dest
        _log(progress, f"{dest}: sha256 differs from the pinned one, downloading it again")
    _log(progress, f"downloading {sdist.url}")
    part = dest.with_name(dest.name + ".part")
    try:
        _download(sdist.url, part)
        got = sha256_of(part)
        if got != sdist.sha256:
            raise ChecksumError(
                f"{dest}: checksum mismatch for {sdist.package} {sdist.version} downloaded from {sdist.url}: "
                f"sha256 {got}, pinned {sdist.sha256}; the file was not kept"
            )
        os.replace(part, dest)
    finally:
        part.unlink(missing_ok=True)
    return dest


# --- reading and pairing -------------------------------------------------------------------------


def read_sdist(path: Path) -> dict[str, bytes]:
    """The regular files of a ``.tar.gz`` sdist, by path below its top folder (read in memory).

    Members outside a top folder, links and directories are skipped.
    """
    files: dict[str, bytes] = {}
    try:
        with tarfile.open(path, "r:*") as tar:
            for member in tar:
                name = member.name.removeprefix("./")
                if not member.isfile() or "/" not in name:
                    continue
                rel = name.split("/", 1)[1]
                f = tar.extractfile(member)
                if rel and f is not None:
                    files[rel] = f.read()
    except (tarfile.TarError, EOFError, OSError) as e:
        raise GroundedDataError(f"{path}: not a readable sdist (.tar.gz): {e}") from None
    return files


def classify(path: str) -> Kind | None:
    """``"code"`` for a ``.py`` file, ``"docs"`` for a document, ``None`` for anything else.

    Documents: a top-level ``README*``, ``CHANGES*``, ``CHANGELOG*`` or ``HISTORY*`` (any case, any
    extension) and ``docs/**/*.rst|.md|.txt``. ``docs/conf.py`` is code.
    """
    name = path.rsplit("/", 1)[-1]
    if name.endswith(".py"):
        return "code"
    if "/" not in path and name.upper().startswith(_DOC_NAMES):
        return "docs"
    if path.startswith("docs/") and name.lower().endswith(_DOC_SUFFIXES):
        return "docs"
    return None


def pair_files(
    package: str, old_version: str, new_version: str, old: Mapping[str, bytes], new: Mapping[str, bytes]
) -> tuple[list[TextPair], list[Dropped]]:
    """The changed code and docs files present in both releases, in order (kind, path).

    Files in one release only, unchanged files and other kinds of files are left out silently;
    changed files that are not UTF-8 come back as :class:`Dropped` (``"not UTF-8"``).
    """
    pairs: list[TextPair] = []
    dropped: list[Dropped] = []
    for path in sorted(old.keys() & new.keys()):
        kind = classify(path)
        if kind is None or old[path] == new[path]:
            continue
        try:
            a, b = old[path].decode("utf-8"), new[path].decode("utf-8")
        except UnicodeDecodeError:
            dropped.append(Dropped(kind, package, path, "not UTF-8", 0, 0))
            continue
        pairs.append(TextPair(kind, package, path, old_version, new_version, a, b))
    pairs.sort(key=lambda p: _order(p.kind, p.package, p.path))
    dropped.sort(key=lambda d: _order(d.kind, d.package, d.path))
    return pairs, dropped


def release_texts(release: Release, sdists: Path, progress: bool = True) -> tuple[list[TextPair], list[Dropped]]:
    """Download (if needed) and read both sdists of ``release`` and pair their files."""
    old = read_sdist(fetch_sdist(release.old, sdists, progress))
    new = read_sdist(fetch_sdist(release.new, sdists, progress))
    return pair_files(release.package, release.old_version, release.new_version, old, new)


# --- tokenizing ----------------------------------------------------------------------------------


def resolve_vocab(vocab: str | Path) -> Path:
    """The vocabulary file: ``vocab`` as a path, else a file of :data:`VOCAB_DIR` (``qwen2`` works).

    Raises :class:`GroundedDataError` naming the paths tried and the vocabularies there.
    """
    given = Path(vocab)
    tried = [given]
    if not given.is_file() and given.parent == Path("."):
        tried += [VOCAB_DIR / given.name, VOCAB_DIR / f"ggml-vocab-{given.name}.gguf"]
    for path in tried:
        if path.is_file():
            return path
    there = sorted(p.name for p in VOCAB_DIR.glob("*.gguf")) if VOCAB_DIR.is_dir() else []
    hint = f"; {VOCAB_DIR} has: {', '.join(there)}" if there else f" ({VOCAB_DIR} has no .gguf files)"
    raise GroundedDataError(f"vocabulary not found: {', '.join(map(str, tried))}{hint}")


@functools.cache
def _tokenizer(path: Path) -> Tokenizer:
    from lookupdec.tokenizer import UnsupportedVocabError, load_tokenizer

    try:
        return load_tokenizer(path)
    except (OSError, UnsupportedVocabError, ValueError) as e:
        raise GroundedDataError(f"{path}: cannot load the vocabulary: {e}") from None


def tokenize(tok: Tokenizer, text_pair: TextPair) -> Pair:
    """The :class:`Pair` of ``text_pair``: the prompt with BOS, the output without, no special parsing."""
    prompt: list[int] = tok.encode(text_pair.prompt_text, add_special=True, parse_special=False).tolist()
    output: list[int] = tok.encode(text_pair.new, add_special=False, parse_special=False).tolist()
    t = text_pair
    return Pair(t.kind, t.package, t.path, t.old_version, t.new_version, prompt, output)


# --- building and the cache ----------------------------------------------------------------------


def cache_path(work: Path, vocab: Path, max_tokens: int) -> Path:
    """Where a build with this vocabulary and limit is cached: ``work/grounded-<stem>-<max>.json``."""
    return work / f"grounded-{vocab.stem}-{max_tokens}.json"


def _cache_key(vocab: Path, max_tokens: int, releases: Sequence[Release]) -> dict[str, object]:
    import lookupdec

    return {
        "format": FORMAT,
        "lookupdec": lookupdec.__version__,
        "vocab": vocab.name,
        "vocab_sha256": sha256_of(vocab),
        "max_tokens": max_tokens,
        "instructions": dict(INSTRUCTIONS),
        "releases": [asdict(r) for r in releases],
    }


def _ids_to_b64(ids: list[int]) -> str:
    return base64.b64encode(np.asarray(ids, dtype="<i4").tobytes()).decode("ascii")


def _b64_to_ids(text: str) -> list[int]:
    ids: list[int] = np.frombuffer(base64.b64decode(text), dtype="<i4").tolist()
    return ids


def _write_cache(path: Path, key: Mapping[str, object], data: Dataset) -> None:
    doc = {
        "key": key,
        "build_seconds": data.build_seconds,
        "pairs": [{**asdict(p), "prompt": _ids_to_b64(p.prompt), "output": _ids_to_b64(p.output)} for p in data.pairs],
        "dropped": [asdict(d) for d in data.dropped],
    }
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(doc, indent=0), encoding="utf-8")
    os.replace(tmp, path)


def _read_cache(path: Path, key: Mapping[str, object], progress: bool) -> Dataset | None:
    if not path.is_file():
        return None
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
        if doc["key"] != key:
            _log(progress, f"{path} was built from other releases, vocabulary or rules: rebuilding it")
            return None
        pairs = tuple(
            Pair(
                p["kind"], p["package"], p["path"], p["old_version"], p["new_version"],
                _b64_to_ids(p["prompt"]), _b64_to_ids(p["output"]),
            )
            for p in doc["pairs"]
        )  # fmt: skip
        dropped = tuple(Dropped(**d) for d in doc["dropped"])
        seconds = float(doc["build_seconds"])
    except (OSError, ValueError, KeyError, TypeError) as e:
        _log(progress, f"{path} is unreadable ({e}): rebuilding it")
        return None
    return Dataset(pairs, dropped, str(key["vocab"]), int(str(key["max_tokens"])), seconds, True)


def build_dataset(
    work: Path,
    vocab: Path = DEFAULT_VOCAB,
    max_tokens: int = DEFAULT_MAX_TOKENS,
    progress: bool = True,
    *,
    releases: Sequence[Release] = RELEASES,
    rebuild: bool = False,
) -> Dataset:
    """:func:`build_pairs` with the dropped files and the build time (what the CLI prints).

    ``releases`` replaces the pinned table (tests); ``rebuild`` ignores the cache.
    """
    if max_tokens < 1:
        raise GroundedDataError(f"max_tokens must be positive, not {max_tokens}")
    vocab = resolve_vocab(vocab)
    work = Path(work)
    try:
        work.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise GroundedDataError(f"cannot create the work folder {work}: {e}") from None
    key = _cache_key(vocab, max_tokens, releases)
    cache = cache_path(work, vocab, max_tokens)
    if not rebuild and (cached := _read_cache(cache, key, progress)) is not None:
        _log(progress, f"read {len(cached.pairs)} pairs from {cache}")
        return cached

    start = time.perf_counter()
    _log(progress, f"loading {vocab}")
    tok = _tokenizer(vocab)
    pairs: list[Pair] = []
    dropped: list[Dropped] = []
    for release in releases:
        texts, skipped = release_texts(release, work / "sdists", progress)
        dropped += skipped
        _log(
            progress, f"tokenizing {release.package} {release.old_version} -> {release.new_version}: {len(texts)} files"
        )
        for text_pair in texts:
            pair = tokenize(tok, text_pair)
            if len(pair.prompt) + len(pair.output) <= max_tokens:
                pairs.append(pair)
            else:
                dropped.append(
                    Dropped(pair.kind, pair.package, pair.path, "too long", len(pair.prompt), len(pair.output))
                )
    pairs.sort(key=lambda p: _order(p.kind, p.package, p.path))
    dropped.sort(key=lambda d: _order(d.kind, d.package, d.path))
    data = Dataset(tuple(pairs), tuple(dropped), vocab.name, max_tokens, time.perf_counter() - start, False)
    try:
        _write_cache(cache, key, data)
    except OSError as e:
        raise GroundedDataError(f"cannot write the cache {cache}: {e}") from None
    _log(progress, f"wrote {cache}")
    return data


def build_pairs(
    work: Path, vocab: Path = DEFAULT_VOCAB, max_tokens: int = DEFAULT_MAX_TOKENS, progress: bool = True
) -> list[Pair]:
    """The input-grounded pairs of the pinned releases, by kind (code first), package, path.

    Downloads the sdists into ``work/sdists`` (files already there with the pinned sha256 are
    used as they are), pairs their changed files, tokenizes them with ``vocab`` and keeps the
    pairs of at most ``max_tokens`` tokens (prompt + output). The result is cached in
    ``work/grounded-<vocab stem>-<max_tokens>.json`` and read back by the next call. Progress goes
    to stderr unless ``progress=False``. Raises :class:`GroundedDataError` (download, checksum,
    archive or vocabulary problems), naming the file or URL.
    """
    return list(build_dataset(work, vocab, max_tokens, progress).pairs)


def code_tokens(
    work: Path, vocab: Path = DEFAULT_VOCAB, progress: bool = True, *, releases: Sequence[Release] = RELEASES
) -> list[int]:
    """The replay set ``code`` of ``perf policy`` and ``perf.peers``: the new release's file of
    every ``code`` pair, concatenated in the dataset's order (no prompts: the text is replayed,
    as WikiText is). Python written by people, from pinned sdists, none of it in the static
    corpus: the held-out code on which an English corpus in the hybrid history must not hurt.
    Builds (or reads) :func:`build_dataset`'s cache in ``work``.
    """
    data = build_dataset(work, vocab, DEFAULT_MAX_TOKENS, progress, releases=releases)
    return [t for pair in data.pairs if pair.kind == "code" for t in pair.output]


# --- the sample ----------------------------------------------------------------------------------


class SampleEntry(TypedDict):
    """One pair of the sample file: the :class:`Pair` fields and the texts it was tokenized from."""

    kind: str
    package: str
    path: str
    old_version: str
    new_version: str
    prompt: list[int]
    output: list[int]
    instruction: str
    old: str
    new: str


class SampleDocument(TypedDict):
    """The sample file: how its ids were made, and its pairs."""

    description: str
    format: int
    vocab: str
    max_tokens: int
    instructions: dict[str, str]
    tokenization: str
    pairs: list[SampleEntry]


def load_sample(path: Path = SAMPLE_FILE) -> list[Pair]:
    """The small sample shipped in ``tests/data/grounded-sample.json`` (2 code pairs, 1 docs pair).

    Its ids were made with the vocabulary it names (``sample_document(path)["vocab"]``); its texts
    are there too (``old``, ``new``, ``instruction``: :class:`SampleEntry`), so the ids can be
    checked offline.
    """
    return [
        Pair(p["kind"], p["package"], p["path"], p["old_version"], p["new_version"], p["prompt"], p["output"])
        for p in sample_document(path)["pairs"]
    ]


def sample_document(path: Path = SAMPLE_FILE) -> SampleDocument:
    """The sample file, parsed (see :class:`SampleDocument`)."""
    try:
        doc = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise GroundedDataError(f"{path}: cannot read the sample: {e}") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("pairs"), list):
        raise GroundedDataError(f"{path}: not a grounded-data sample (no pairs)")
    return cast(SampleDocument, doc)


def inserted_tokens(pair: Pair) -> int:
    """Output tokens not copied from the prompt (outside :class:`difflib.SequenceMatcher`'s matching blocks)."""
    matcher = difflib.SequenceMatcher(None, pair.prompt, pair.output, autojunk=False)
    return len(pair.output) - sum(block.size for block in matcher.get_matching_blocks())


def choose_sample(pairs: Iterable[Pair], min_tokens: int = 500, max_tokens: int = 1500) -> list[Pair]:
    """2 code pairs (from two packages) and 1 docs pair for the shipped sample.

    The smallest pairs with ``min_tokens..max_tokens`` tokens in all (prompt + output) whose
    output inserts at least 10 tokens and at most half of its tokens: small, but not a version
    bump alone.
    """
    fitting = sorted(
        (
            p
            for p in pairs
            if min_tokens <= len(p.prompt) + len(p.output) <= max_tokens
            and 10 <= inserted_tokens(p) <= len(p.output) // 2
        ),
        key=lambda p: (len(p.prompt) + len(p.output), *_order(p.kind, p.package, p.path)),
    )
    code = [p for p in fitting if p.kind == "code"]
    chosen = code[:1] + [p for p in code if p.package != code[0].package][:1]
    chosen += [p for p in fitting if p.kind == "docs"][:1]
    if [p.kind for p in chosen] != ["code", "code", "docs"]:
        raise GroundedDataError(f"no 2 code + 1 docs pairs of {min_tokens}..{max_tokens} tokens to sample")
    return sorted(chosen, key=lambda p: _order(p.kind, p.package, p.path))


def write_sample(work: Path, data: Dataset, vocab: Path, path: Path = SAMPLE_FILE, progress: bool = True) -> Path:
    """Write the sample chosen by :func:`choose_sample` from ``data`` (texts re-read from ``work/sdists``).

    The texts are tokenized again and must give the built ids (a check of the build itself).
    """
    chosen = choose_sample(data.pairs)
    by_package = {r.package: r for r in RELEASES}
    tok = _tokenizer(resolve_vocab(vocab))
    entries: list[dict[str, object]] = []
    for pair in chosen:
        texts, _ = release_texts(by_package[pair.package], work / "sdists", progress)
        (text_pair,) = [t for t in texts if t.path == pair.path and t.kind == pair.kind]
        if tokenize(tok, text_pair) != pair:
            raise GroundedDataError(f"{pair.package} {pair.path}: tokenizing again gives other ids than the build")
        entries.append(
            {**asdict(pair), "instruction": text_pair.instruction, "old": text_pair.old, "new": text_pair.new}
        )
    head = {
        "description": "perf/grounded_data.py sample: 2 code pairs, 1 docs pair (written by --write-sample)",
        "format": FORMAT,
        "vocab": data.vocab,
        "max_tokens": data.max_tokens,
        "instructions": dict(INSTRUCTIONS),
        "tokenization": "prompt = encode(instruction + old, add_special=True, parse_special=False); "
        "output = encode(new, add_special=False, parse_special=False)",
    }
    lines = ["{"] + [f"  {json.dumps(k)}: {json.dumps(v)}," for k, v in head.items()] + ['  "pairs": [']
    for n, entry in enumerate(entries):
        fields = [f"    {json.dumps(k)}: {json.dumps(v, separators=(',', ':'))}" for k, v in entry.items()]
        lines += ["   {", ",\n".join(fields), "   }" + ("," if n < len(entries) - 1 else "")]
    lines += ["  ]", "}", ""]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines), encoding="utf-8")
    return path


# --- the summary and the CLI ---------------------------------------------------------------------


def _summary(data: Dataset) -> str:
    versions = {r.package: f"{r.old_version} -> {r.new_version}" for r in RELEASES}
    rows: list[tuple[str, ...]] = [
        ("kind", "package", "releases", "pairs", "prompt tok", "output tok", "dropped", "dropped tok")
    ]

    def row(kind: str, package: str, pairs: Sequence[Pair], dropped: Sequence[Dropped]) -> tuple[str, ...]:
        return (
            kind,
            package,
            versions.get(package, ""),
            f"{len(pairs):,}",
            f"{sum(len(p.prompt) for p in pairs):,}",
            f"{sum(len(p.output) for p in pairs):,}",
            f"{len(dropped):,}",
            f"{sum(d.prompt_tokens + d.output_tokens for d in dropped):,}",
        )

    rules: list[int] = []
    for kind in KINDS:
        kp = [p for p in data.pairs if p.kind == kind]
        kd = [d for d in data.dropped if d.kind == kind]
        for package in sorted({p.package for p in kp} | {d.package for d in kd}):
            rows.append(
                row(kind, package, [p for p in kp if p.package == package], [d for d in kd if d.package == package])
            )
        rules.append(len(rows))
        rows.append(row(kind, "(all)", kp, kd))
    rules.append(len(rows))
    rows.append(row("all", "(all)", data.pairs, data.dropped))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]

    def fmt(r: tuple[str, ...]) -> str:
        return "  ".join(c.ljust(w) if i < 3 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths, strict=True)))

    out = [fmt(rows[0]), "  ".join("-" * w for w in widths)]
    for i, r in enumerate(rows[1:], start=1):
        if i in rules:
            out.append("  ".join("-" * w for w in widths))
        out.append(fmt(r))
    reasons: dict[str, int] = {}
    for d in data.dropped:
        reasons[d.reason] = reasons.get(d.reason, 0) + 1
    why = ", ".join(f"{n} {reason}" for reason, n in sorted(reasons.items())) or "none"
    out.append("")
    out.append(f"vocab {data.vocab}, max {data.max_tokens:,} tokens per pair (prompt + output); dropped: {why}")
    return "\n".join(out)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m perf.grounded_data",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--work", type=Path, required=True, help="folder for the sdists (WORK/sdists) and the cache")
    p.add_argument(
        "--vocab",
        default=str(DEFAULT_VOCAB),
        help=f"GGUF vocabulary: a path, a file name of {VOCAB_DIR}, or a short name there such as qwen2 "
        "(default: %(default)s)",
    )
    p.add_argument(
        "--max-tokens",
        type=positive_int,
        default=DEFAULT_MAX_TOKENS,
        help="keep a pair when prompt + output have at most this many tokens (default: %(default)s)",
    )
    p.add_argument(
        "--write-sample",
        action="store_true",
        help=f"also write the test sample (2 code pairs, 1 docs pair) to {SAMPLE_FILE.relative_to(REPO)}",
    )
    p.add_argument("--sample-path", type=Path, default=SAMPLE_FILE, help="where --write-sample writes")
    p.add_argument("--rebuild", action="store_true", help="ignore the cache file and build again")
    p.add_argument("--quiet", action="store_true", help="no progress on stderr")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m perf.grounded_data``: build (or read back) the pairs and print the summary table."""
    args = _parser().parse_args(argv)
    progress = not args.quiet
    start = time.perf_counter()
    try:
        vocab = resolve_vocab(args.vocab)
        data = build_dataset(args.work, vocab, args.max_tokens, progress, rebuild=args.rebuild)
        sample = write_sample(args.work, data, vocab, args.sample_path, progress) if args.write_sample else None
    except GroundedDataError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    elapsed = time.perf_counter() - start
    print(data.summary())
    how = f"read from the cache (built in {data.build_seconds:.1f} s)" if data.from_cache else "built"
    print(f"{how}; this run took {elapsed:.1f} s; cache: {cache_path(args.work, vocab, args.max_tokens)}")
    if sample is not None:
        print(f"sample: {sample} ({sample.stat().st_size:,} bytes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
