"""README is the front door: it links every page of ``docs/``, every link between the pages lands on
a file and a heading that exist, and its test command is the one CI runs."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def anchors(markdown: str) -> set[str]:
    """GitHub's anchors of the headings of ``markdown``: lowercased, punctuation dropped, spaces as
    hyphens, a repeated heading suffixed ``-1``, ``-2``, ... (code blocks skipped)."""
    seen: dict[str, int] = {}
    out = set()
    in_code = False
    for line in markdown.splitlines():
        if line.startswith("```"):
            in_code = not in_code
        heading = None if in_code else re.match(r"^#{1,6} (.+)$", line)
        if heading:
            slug = re.sub(r"[^\w\- ]", "", heading.group(1).lower()).replace(" ", "-")
            out.add(f"{slug}-{seen[slug]}" if slug in seen else slug)
            seen[slug] = seen.get(slug, 0) + 1
    return out


def test_anchors_follow_github_rules():
    text = (
        "# Checkpoints, resume and faults\n## `[job]`\n```\n# not a heading\n```\n## FLOPs and "
        "MFU\n## FLOPs and MFU\n"
    )
    assert anchors(text) == {
        "checkpoints-resume-and-faults",
        "job",
        "flops-and-mfu",
        "flops-and-mfu-1",
    }


def test_readme_links_every_docs_page():
    linked = {target.split("#")[0] for target in LINK.findall((REPO / "README.md").read_text())}
    assert {f"docs/{page.name}" for page in PAGES[1:]} <= linked


@pytest.mark.parametrize("page", PAGES, ids=lambda page: page.relative_to(REPO).as_posix())
def test_every_relative_link_lands_on_a_file_and_heading(page):
    for target in LINK.findall(page.read_text()):
        if re.match(r"^[a-z]+:", target):
            continue
        path, _, anchor = target.partition("#")
        file = (page.parent / path).resolve() if path else page
        assert file.is_file(), f"{page.name}: link {target} names no file"
        if anchor:
            assert anchor in anchors(file.read_text()), (
                f"{page.name}: link {target} names no heading"
            )


def test_readme_test_command_is_the_one_ci_runs():
    readme = (REPO / "README.md").read_text()
    ci_command = (REPO / ".ci" / "run").read_text().strip().splitlines()[-1]
    assert f". .venv/bin/activate && {ci_command}\n" in readme
