"""Every relative link in README.md, CONTRIBUTING.md, the results index (benchmarks/results/README.md) and every
results file resolves to a file in the repository; the index links every file of its folder; and every results file
that the code cites (a comment or docstring of a top-level script or of benchmarks/*.py) exists.

Links are Markdown's inline links and images, `[text](target)` and `![alt](target)`, outside code spans and fenced
code blocks. Web links (http, https, mailto) and links to an anchor of the same page (`#...`) are not checked; a
`#fragment` after a path is dropped. A target resolves relative to the file that holds the link, and must be a file
inside the repository.

A citation in the code is a path `benchmarks/results/<name>.md` (or `.png`), and the names listed right after it with
commas or "and", as in `(benchmarks/results/a.md, b.md)`; a name may hold a `*` (`continuous_fresh_*.md`), which must
match at least one file."""

import glob
import os
import re

import pytest
from conftest import ROOT

FENCE = re.compile(r"^(```|~~~).*?^\1", re.MULTILINE | re.DOTALL)
CODE_SPAN = re.compile(r"(`+).+?\1", re.DOTALL)
LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\[\]]*\])*\]\(\s*(<[^>]*>|[^)\s]*)(?:\s+[\"'(][^)]*)?\)")
EXTERNAL = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")  # http:, https:, mailto:, ...

RESULTS = os.path.join("benchmarks", "results")
INDEX = os.path.join(RESULTS, "README.md")
DOCUMENTS = ["README.md", "CONTRIBUTING.md"] + sorted(
    os.path.relpath(path, ROOT) for path in glob.glob(os.path.join(ROOT, RESULTS, "*.md"))
)
CODE = sorted(
    os.path.relpath(path, ROOT)
    for pattern in ("ppo_*.py", "ppg_*.py", os.path.join("benchmarks", "*.py"))
    for path in glob.glob(os.path.join(ROOT, pattern))
)

NAME = r"[\w*.-]+\.(?:md|png)"
# a path into the results folder, then the names that follow it in the same list: ", b.md", " and c.md", a name on
# the next line of a comment ("#  c.md")
CITATION = re.compile(rf"benchmarks/results/({NAME})((?:\s*(?:,|\band\b)\s*(?:#\s*)?(?:and\s+)?{NAME})*)")
LISTED = re.compile(NAME)


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


def cited_results(code: str) -> list[str]:
    """The results files a piece of code names: each `benchmarks/results/<name>` and the names listed after it."""
    names = []
    for match in CITATION.finditer(code):
        names.append(match.group(1))
        names.extend(LISTED.findall(match.group(2)))
    return names


def missing_citations(path: str, root: str = ROOT) -> list[str]:
    """The results files that the code file `path` (under `root`) cites and that `root`'s results folder lacks."""
    with open(os.path.join(root, path), encoding="utf-8") as f:
        names = cited_results(f.read())
    return [name for name in names if not glob.glob(os.path.join(root, RESULTS, name))]


def index_links(root: str = ROOT) -> set[str]:
    """The files of the results folder that its index links, by name."""
    with open(os.path.join(root, INDEX), encoding="utf-8") as f:
        targets = link_targets(f.read())
    return {os.path.normpath(target.split("#", 1)[0]) for target in targets if not EXTERNAL.match(target)}


def test_the_documents_are_found():
    assert {"README.md", "CONTRIBUTING.md", INDEX} <= set(DOCUMENTS) and len(DOCUMENTS) > 3
    assert "ppo_fsmn_cartpole.py" in CODE and os.path.join("benchmarks", "run.py") in CODE


@pytest.mark.parametrize("document", DOCUMENTS)
def test_every_relative_link_resolves(document):
    broken = broken_links(document)
    assert not broken, f"{document}: links that resolve to no file in the repository: {', '.join(broken)}"


@pytest.mark.parametrize("path", CODE)
def test_every_results_file_cited_in_the_code_exists(path):
    missing = missing_citations(path)
    assert not missing, f"{path} cites results files that {RESULTS}/ does not hold: {', '.join(missing)}"


def test_every_results_file_is_linked_from_the_index():
    linked = index_links()
    results = [doc for doc in DOCUMENTS if os.path.dirname(doc) == RESULTS and doc != INDEX]
    unlinked = [doc for doc in results if os.path.basename(doc) not in linked]
    assert not unlinked, f"results files not linked from {INDEX}: {', '.join(unlinked)}"


def test_the_index_lists_every_file_in_the_folder():
    files = set(os.listdir(os.path.join(ROOT, RESULTS))) - {"README.md"}
    unlisted = sorted(files - index_links())
    assert not unlisted, f"files of {RESULTS}/ that {INDEX} does not list: {', '.join(unlisted)}"


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


def test_a_missing_citation_is_caught(tmp_path):
    """The citation check itself: a cited name, the names listed after it (over a line break, in a docstring or a
    comment), a glob and a trailing full stop are read; placeholders (`<name>.md`) and names without the folder's
    path are not citations."""
    (tmp_path / "benchmarks" / "results").mkdir(parents=True)
    for name in ("here.md", "plot.png", "fresh_a.md"):
        (tmp_path / "benchmarks" / "results" / name).write_text("x")
    (tmp_path / "script.py").write_text(
        '"""Results: README.md and benchmarks/results/here.md, fresh_*.md,\ngone_one.md."""\n'
        "# see benchmarks/results/plot.png and gone_two.md\n"
        "# benchmarks/results/<name>.md is written by --results\n"
        "x = 1  # (benchmarks/results/gone_three.md,\n#  gone_four.md) sps_<pair>.md other.md\n"
    )
    assert cited_results((tmp_path / "script.py").read_text()) == [
        "here.md",
        "fresh_*.md",
        "gone_one.md",
        "plot.png",
        "gone_two.md",
        "gone_three.md",
        "gone_four.md",
    ]
    gone = ["gone_one.md", "gone_two.md", "gone_three.md", "gone_four.md"]
    assert missing_citations("script.py", root=str(tmp_path)) == gone
