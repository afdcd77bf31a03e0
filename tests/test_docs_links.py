"""Every relative link of the project's Markdown pages resolves: to a file that exists and, for a
``#fragment``, to a heading of that file (the anchors GitHub gives headings).

A round of edits once dropped a heading that seven links pointed to (``#input-grounded-drafting``);
nothing failed, and the links went nowhere until a later round noticed.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = sorted([ROOT / "README.md", ROOT / "perf" / "README.md", *(ROOT / "docs").glob("*.md")])
IN_SOURCE_TREE = (ROOT / "lookupdec" / "__init__.py").exists()
"""False where the tests run on a copy next to an installed wheel (.ci/test_installed.py): that
copy holds only the pages whose examples run, so links between the pages cannot resolve there."""
LINK = re.compile(r"\]\(([^)\s]*)\)")
HEADING = re.compile(r"^#{1,6} (.*?)\s*#*\s*$")
FENCE = re.compile(r"^\s*(```|~~~)")


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, every character but letters, digits, spaces,
    hyphens and underscores dropped, spaces as hyphens."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    """The anchors of ``page``'s headings (outside code blocks), a repeated one as GitHub numbers it."""
    seen: dict[str, int] = {}
    out: set[str] = set()
    in_code = False
    for line in page.read_text(encoding="utf-8").splitlines():
        if FENCE.match(line):
            in_code = not in_code
            continue
        m = HEADING.match(line)
        if in_code or not m:
            continue
        base = slug(m.group(1))
        n = seen.get(base, 0)
        seen[base] = n + 1
        out.add(base if n == 0 else f"{base}-{n}")
    return out


def links(page: Path) -> list[str]:
    """The link targets of ``page`` outside code blocks."""
    out: list[str] = []
    in_code = False
    for line in page.read_text(encoding="utf-8").splitlines():
        if FENCE.match(line):
            in_code = not in_code
        elif not in_code:
            out += LINK.findall(line)
    return out


def test_slug_follows_github() -> None:
    assert slug("Drafting policies: tokens per step") == "drafting-policies-tokens-per-step"
    assert slug("Building and merging: `lookupdec create` and `lookupdec merge`") == (
        "building-and-merging-lookupdec-create-and-lookupdec-merge"
    )
    assert slug("k = 32, and a plan (issue 23, 2026-12-06)") == "k--32-and-a-plan-issue-23-2026-12-06"


def test_repeated_headings_are_numbered(tmp_path: Path) -> None:
    page = tmp_path / "p.md"
    page.write_text("# Peers\n\n```sh\n# not a heading\n```\n\n## Peers\n", encoding="utf-8")
    assert anchors(page) == {"peers", "peers-1"}


@pytest.mark.skipif(not IN_SOURCE_TREE, reason="the pages are checked in the source tree, not in the installed copy")
@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(page: Path) -> None:
    broken: list[str] = []
    for target in links(page):
        if re.match(r"[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto: ...
            continue
        path, _, fragment = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            broken.append(f"{target}: no such file")
        elif fragment and dest.suffix == ".md" and fragment not in anchors(dest):
            broken.append(f"{target}: no such heading in {dest.relative_to(ROOT)}")
    assert not broken, broken
