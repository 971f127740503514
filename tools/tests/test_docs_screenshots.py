import argparse
import stat
import sys
import urllib.request
from pathlib import Path

import docs_screenshots
import pytest

# Stands in for Chromium: writes the screenshot it is asked for, and for `--dump-dom` prints
# the measurement the page script would leave (OVERFLOW set: one code block too wide).
FAKE_CHROMIUM = """#!{python}
import os, sys
for arg in sys.argv[1:]:
    if arg.startswith("--screenshot="):
        with open(arg.split("=", 1)[1], "wb") as png:
            png.write(b"PNG")
if "--dump-dom" in sys.argv:
    wide = '[{{"overflow": 40, "text": "x = 1  # a comment &amp; more"}}]'
    print("<pre>MEASURE" + (wide if os.environ.get("OVERFLOW") else "[]") + "END</pre>")
"""


@pytest.fixture
def site(tmp_path: Path) -> Path:
    folder = tmp_path / "site"
    (folder / "nn" / "attention").mkdir(parents=True)
    (folder / "index.html").write_text("<html><body><p>home</p></body></html>")
    (folder / "nn" / "attention" / "index.html").write_text("<html><body>nn</body></html>")
    return folder


@pytest.fixture
def fake_chromium(tmp_path: Path) -> Path:
    path = tmp_path / "fake-chromium"
    path.write_text(FAKE_CHROMIUM.format(python=sys.executable))
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return path


def test_defaults() -> None:
    args = docs_screenshots.parse_args([])
    assert args.site == Path("site")
    assert args.out == Path("site-screenshots")
    assert args.widths == [1400, 800]
    assert args.chromium is None


def test_widths_are_parsed_and_checked() -> None:
    assert docs_screenshots.parse_widths("1200,600") == [1200, 600]
    for bad in ("", "wide", "1400,-1", "0"):
        with pytest.raises(argparse.ArgumentTypeError, match="such as 1400,800"):
            docs_screenshots.parse_widths(bad)
    with pytest.raises(SystemExit):
        docs_screenshots.parse_args(["--widths", "wide"])


def test_skips_without_chromium(site: Path, tmp_path: Path, monkeypatch, capsys) -> None:
    monkeypatch.setattr(docs_screenshots.shutil, "which", lambda name: None)
    out = tmp_path / "shots"
    assert docs_screenshots.main([str(site), "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert printed.startswith("docs screenshots skipped: Chromium is not installed")
    assert printed.count("\n") == 1
    assert not out.exists()


def test_refuses_a_folder_without_a_site(tmp_path: Path, capsys) -> None:
    assert docs_screenshots.main([str(tmp_path)]) == 2
    assert "run `mkdocs build` first" in capsys.readouterr().err


def test_refuses_a_missing_chromium_named_explicitly(site: Path, capsys) -> None:
    assert docs_screenshots.main([str(site), "--chromium", "/no/such/chromium"]) == 2
    assert "--chromium /no/such/chromium: no such executable" in capsys.readouterr().err


def test_serves_the_site_and_adds_the_measurement_only_when_asked(site: Path) -> None:
    with docs_screenshots.serve(site) as base:
        plain = urllib.request.urlopen(base).read()
        measured = urllib.request.urlopen(base + "nn/attention/?measure").read()
    assert plain == (site / "index.html").read_bytes()
    assert b"docs-screenshots-measure" in measured
    assert measured.index(b"<script>") < measured.index(b"</body>")


def test_screenshots_each_page_at_each_width(site, fake_chromium, tmp_path, capsys) -> None:
    out = tmp_path / "shots"
    argv = [str(site), "--out", str(out), "--chromium", str(fake_chromium)]
    assert docs_screenshots.main([*argv, "--widths", "1400,800"]) == 0
    names = {f"{page}-{width}.png" for page in docs_screenshots.PAGES for width in (1400, 800)}
    assert {path.name for path in out.iterdir()} == names
    assert "10 screenshots" in capsys.readouterr().out


def test_fails_naming_a_code_block_that_scrolls(site, fake_chromium, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("OVERFLOW", "1")
    argv = [str(site), "--out", str(tmp_path / "shots"), "--chromium", str(fake_chromium)]
    assert docs_screenshots.main([*argv, "--widths", "1400,400"]) == 1
    err = capsys.readouterr().err
    # Checked at 1400 px only: phones scroll code blocks by design.
    assert err.count("sideways at 1400 px") == len(docs_screenshots.PAGES)
    assert "at 400 px" not in err
    assert "home page: a code block scrolls 40 px" in err
    assert "'x = 1  # a comment & more'" in err
