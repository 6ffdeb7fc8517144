"""docs/benchmarks.md and the README's headline table are what
benchmarks/make_benchmarks_doc.py writes from benchmarks/results/."""

import pathlib
import re

from benchmarks import make_benchmarks_doc as doc

ROOT = pathlib.Path(__file__).resolve().parents[1]


def test_benchmarks_doc_is_generated():
    assert doc.DOC.read_text() == doc.benchmarks_doc(), (
        "docs/benchmarks.md is stale: python benchmarks/make_benchmarks_doc.py")


def test_readme_table_is_generated():
    text = doc.README.read_text()
    assert doc.readme_with_table(text) == text, (
        "README.md's headline table is stale: "
        "python benchmarks/make_benchmarks_doc.py")


def test_every_headline_file_exists_and_is_linked():
    for h in doc.HEADLINES:
        assert (doc.RESULTS / h.path).is_file(), h.path
    links = re.findall(r"\]\(\.\./benchmarks/results/([^)]+)\)",
                       doc.DOC.read_text())
    assert links and all((doc.RESULTS / p).is_file() for p in links)


def test_readme_is_a_users_readme():
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= 200
    assert max(map(len, lines)) <= 200
