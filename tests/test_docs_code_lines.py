"""Every line of a fenced code block in docs/ shows whole at common window widths.

The site's content column holds about 88 characters of code at 800 px and up
(docs/stylesheets/extra.css); a longer line scrolls sideways and cuts off its end, often the
comment that explains it. Pages that include benchmark results (`--8<--`) include Markdown
tables and lists, not code blocks, so the Markdown sources are what the site shows.
"""

import pathlib
import re

DOCS = pathlib.Path(__file__).resolve().parents[1] / "docs"
ROOT = DOCS.parent
MAX_LINE = 88
FENCE = re.compile(r"^\s*(```|~~~)")


def long_code_lines(text: str) -> list[tuple[int, int]]:
    """Return (line number, length) of each code-block line in `text` over MAX_LINE."""
    found = []
    fence = None
    for number, line in enumerate(text.splitlines(), start=1):
        opening = FENCE.match(line)
        if fence is None:
            if opening:
                fence = opening.group(1)
        elif line.strip() == fence:
            fence = None
        elif len(line) > MAX_LINE:
            found.append((number, len(line)))
    return found


def test_long_code_lines_are_found():
    text = "x\n```python\nshort\n" + "y" * 89 + "\n```\n" + "z" * 100 + "\n"
    assert long_code_lines(text) == [(4, 89)]


def test_docs_code_lines_fit():
    too_long = [
        f"{page.relative_to(ROOT)}:{number}: {length} characters"
        for page in sorted(DOCS.rglob("*.md"))
        for number, length in long_code_lines(page.read_text())
    ]
    assert not too_long, (
        f"code-block lines longer than {MAX_LINE} characters scroll sideways on the site; "
        "wrap them (move a trailing comment above its line, break a long call):\n"
        + "\n".join(too_long)
    )
