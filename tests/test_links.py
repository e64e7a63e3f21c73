"""Every relative link in README.md and in benchmarks/results/*.md resolves to a file in the repository, and every
results file is linked from README.md.

Links are Markdown's inline links and images, `[text](target)` and `![alt](target)`, outside code spans and fenced
code blocks. Web links (http, https, mailto) and links to an anchor of the same page (`#...`) are not checked; a
`#fragment` after a path is dropped. A target resolves relative to the file that holds the link, and must be a file
inside the repository."""

import glob
import os
import re

import pytest
from conftest import ROOT

FENCE = re.compile(r"^(```|~~~).*?^\1", re.MULTILINE | re.DOTALL)
CODE_SPAN = re.compile(r"(`+).+?\1", re.DOTALL)
LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\[\]]*\])*\]\(\s*(<[^>]*>|[^)\s]*)(?:\s+[\"'(][^)]*)?\)")
EXTERNAL = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")  # http:, https:, mailto:, ...

DOCUMENTS = ["README.md"] + sorted(
    os.path.relpath(path, ROOT) for path in glob.glob(os.path.join(ROOT, "benchmarks", "results", "*.md"))
)


def link_targets(markdown: str) -> list[str]:
    """The targets of the inline links and images of a Markdown text, code blocks and code spans left out."""
    text = CODE_SPAN.sub("", FENCE.sub("", markdown))
    return [match.group(1).strip("<>") for match in LINK.finditer(text)]


def broken_links(document: str, root: str = ROOT) -> list[str]:
    """The relative link targets of `document` (a path under `root`) that are not a file inside `root`."""
    with open(os.path.join(root, document), encoding="utf-8") as f:
        targets = link_targets(f.read())
    broken = []
    for target in targets:
        if EXTERNAL.match(target) or target.startswith("#"):
            continue
        path = target.split("#", 1)[0]
        resolved = os.path.realpath(os.path.join(root, os.path.dirname(document), path))
        inside = resolved.startswith(os.path.realpath(root) + os.sep)
        if not path or not inside or not os.path.isfile(resolved):
            broken.append(target)
    return broken


def test_the_documents_are_found():
    assert "README.md" in DOCUMENTS and len(DOCUMENTS) > 1


@pytest.mark.parametrize("document", DOCUMENTS)
def test_every_relative_link_resolves(document):
    broken = broken_links(document)
    assert not broken, f"{document}: links that resolve to no file in the repository: {', '.join(broken)}"


def test_every_results_file_is_linked_from_the_readme():
    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
        linked = {os.path.normpath(target.split("#", 1)[0]) for target in link_targets(f.read())}
    unlinked = [document for document in DOCUMENTS[1:] if os.path.normpath(document) not in linked]
    assert not unlinked, f"results files not linked from README.md: {', '.join(unlinked)}"


def test_a_broken_link_is_caught(tmp_path):
    """The check itself: a missing file, a link out of the repository and a missing image fail; web links, anchors,
    fragments, titles, code and existing files pass."""
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "there.md").write_text("x")
    (tmp_path / "docs" / "plot.png").write_text("x")
    (tmp_path / "outside.md").write_text("x")
    (tmp_path / "docs" / "page.md").write_text(
        '[ok](there.md) [ok](there.md#a-section) [title](there.md "a title") ![ok](plot.png) [ok](#local)\n'
        "[web](https://example.org/x.md) `[code](missing-in-code.md)`\n"
        "```\n[fenced](missing-in-fence.md)\n```\n"
        "[gone](missing.md) ![gone](missing.png) [up](../outside.md) [out](../../elsewhere/NOTES.md)\n"
    )
    assert broken_links("docs/page.md", root=str(tmp_path)) == ["missing.md", "missing.png", "../../elsewhere/NOTES.md"]
