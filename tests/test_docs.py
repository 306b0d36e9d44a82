"""The docs cite tests that exist."""

from __future__ import annotations

import ast
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CITED = re.compile(r"`(tests/[\w/]+\.py)::(\w+)`")


def _test_functions(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    return {node.name for node in ast.walk(tree) if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)}


def test_reliability_doc_names_tests_that_exist():
    text = (REPO / "docs" / "reliability.md").read_text()
    cited = CITED.findall(text)
    assert len(cited) > 40
    missing = [
        f"{path}::{name}"
        for path, name in cited
        if not (REPO / path).is_file() or name not in _test_functions(REPO / path)
    ]
    assert missing == []
    rows = [line for line in text.splitlines() if line.startswith("| **")]
    assert all(CITED.search(row) for row in rows), [row[:60] for row in rows if not CITED.search(row)]
