"""The README and CONTRIBUTING stay short and their links work.

`make test-docs` builds the site (docs/, mkdocs.yml) with `mkdocs build --strict`, which checks
every link and anchor between the pages of docs/. README.md and CONTRIBUTING.md live outside
docs/, so this file checks theirs: every relative link names an existing file, and every #anchor
a heading of its target, with GitHub's heading ids (where these files are read). It also checks
that each page's headings get the same id from GitHub and from MkDocs, so an anchor that works on
the site works on GitHub too. Text only: no mkdocs, no kvlib import.
"""

from __future__ import annotations

import re
import unicodedata
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
DOCS = REPO / "docs"
CHECKED = ["README.md", "CONTRIBUTING.md"]
README_MAX_LINES = 250

FENCE = re.compile(r"^(```|~~~).*?^\1[^\n]*$", re.M | re.S)
CODE_SPAN = re.compile(r"(`+)(?:(?!\1).)+?\1", re.S)
LINK = re.compile(r"!?\[((?:[^\[\]]|\[[^\]]*\])*)\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
HEADING = re.compile(r"^(#{1,6})[ \t]+(.+?)[ \t#]*$", re.M)
EXTERNAL = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")  # http:, https:, mailto:, ...


def prose(text: str) -> str:
    """The text with fenced code blocks and code spans blanked out (links there are not links)."""
    text = FENCE.sub(lambda m: "\n" * m.group(0).count("\n"), text)
    return CODE_SPAN.sub(lambda m: " " * len(m.group(0)), text)


def heading_text(raw: str) -> str:
    """A heading as rendered: link targets, backticks and emphasis markers dropped."""
    raw = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", raw)
    return raw.replace("`", "").replace("**", "").replace("*", "")


def github_slug(text: str) -> str:
    """GitHub's heading id: lower case, punctuation dropped, each space a hyphen."""
    return re.sub(r"[^\w\- ]", "", text.strip().lower()).replace(" ", "-")


def mkdocs_slug(text: str) -> str:
    """Python-Markdown's toc id (MkDocs' default): ASCII only, punctuation dropped, runs of
    spaces and hyphens one hyphen."""
    text = unicodedata.normalize("NFKD", text).encode("ascii", "ignore").decode("ascii")
    text = re.sub(r"[^\w\s-]", "", text).strip().lower()
    return re.sub(r"[-\s]+", "-", text)


def headings(path: Path) -> list[str]:
    """The rendered text of every heading outside code blocks."""
    text = FENCE.sub("", path.read_text(encoding="utf-8"))
    return [heading_text(m.group(2)) for m in HEADING.finditer(text)]


def github_anchors(path: Path) -> set[str]:
    """The ids GitHub gives the headings of path (a repeated id gets -1, -2, ...)."""
    seen: dict[str, int] = {}
    out = set()
    for h in headings(path):
        slug = github_slug(h)
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        out.add(slug if n == 0 else f"{slug}-{n}")
    return out


def links(path: Path) -> list[tuple[int, str]]:
    """(line, target) of every link and image in path's prose."""
    text = prose(path.read_text(encoding="utf-8"))
    return [(text.count("\n", 0, m.start()) + 1, m.group(2)) for m in LINK.finditer(text)]


def problems(path: Path) -> list[str]:
    out = []
    for line, target in links(path):
        if EXTERNAL.match(target):
            continue
        where = f"{path.relative_to(REPO)}:{line}: {target}"
        file_part, _, anchor = target.partition("#")
        dest = (path.parent / file_part).resolve() if file_part else path
        if not dest.exists():
            out.append(f"{where}: no such file")
            continue
        if anchor:
            if dest.suffix != ".md":
                out.append(f"{where}: an anchor into a file that is not Markdown")
            elif anchor not in github_anchors(dest):
                out.append(f"{where}: no heading with id #{anchor} in {dest.relative_to(REPO)}")
    return out


@pytest.mark.parametrize("name", CHECKED)
def test_relative_links_and_anchors_resolve(name):
    path = REPO / name
    assert path.exists(), f"{name} is missing"
    assert links(path), f"{name} has no links: the parser lost them"
    assert not problems(path), "\n".join(problems(path))


def test_readme_is_short():
    lines = (REPO / "README.md").read_text(encoding="utf-8").count("\n")
    assert lines <= README_MAX_LINES, (
        f"README.md has {lines} lines (at most {README_MAX_LINES}): move the detail to a page of docs/")


def test_headings_have_the_same_id_on_github_and_on_the_site():
    """An anchor MkDocs validates must also work on GitHub, and no page repeats a heading."""
    pages = sorted(DOCS.rglob("*.md"))
    assert pages, "docs/ has no pages"
    bad = []
    for page in pages:
        ids = [github_slug(h) for h in headings(page)]
        bad += [f"{page.relative_to(REPO)}: {h!r} is #{github_slug(h)} on GitHub, #{mkdocs_slug(h)} on the site"
                for h in headings(page) if github_slug(h) != mkdocs_slug(h)]
        bad += [f"{page.relative_to(REPO)}: heading id #{i} twice" for i in sorted({i for i in ids if ids.count(i) > 1})]
    assert not bad, "\n".join(bad)


def test_the_checker_catches_what_it_should(tmp_path):
    """A broken file, a broken anchor and a link inside code: the first two found, the third not."""
    (tmp_path / "a.md").write_text("# Title: one `x`\n\n## Two — three\n", encoding="utf-8")
    doc = tmp_path / "doc.md"
    doc.write_text("[ok](a.md#title-one-x) [ok2](a.md#two--three) [bad](a.md#nope) [gone](b.md)\n"
                   "`[code](c.md)`\n\n```\n[fenced](d.md)\n```\n", encoding="utf-8")
    global REPO
    saved, REPO = REPO, tmp_path
    try:
        found = problems(doc)
    finally:
        REPO = saved
    assert [p.split(": ")[1] for p in found] == ["a.md#nope", "b.md"]
    assert mkdocs_slug("Two — three") == "two-three" != github_slug("Two — three")
