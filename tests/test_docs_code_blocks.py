"""Every Python code block in README.md and docs/ runs (a page's blocks share a namespace)."""

import pathlib
import re

import pytest

DOCS = pathlib.Path(__file__).resolve().parents[1] / "docs"
BLOCK = re.compile(r"^```python\n(.*?)^```", re.MULTILINE | re.DOTALL)
ROOT = DOCS.parent
PAGES = sorted(p for p in [ROOT / "README.md", *DOCS.rglob("*.md")] if BLOCK.search(p.read_text()))


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_page_code_blocks_run(page):
    namespace: dict = {"__name__": f"docs_{page.stem}"}
    for number, block in enumerate(BLOCK.findall(page.read_text()), start=1):
        code = compile(block, f"{page.relative_to(ROOT)} (block {number})", "exec")
        exec(code, namespace)
