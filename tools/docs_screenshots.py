"""Screenshot pages of the built docs site at two widths, and check that code blocks fit.

Usage: python tools/docs_screenshots.py [SITE] [--out FOLDER] [--chromium PATH]
                                        [--widths W,W] [--height H]

Serves SITE (a folder `mkdocs build` wrote, `site/` by default) on 127.0.0.1 and opens a few
pages with headless Chromium: the home page, both migration guides at their name-by-name
tables, an nn page and an API page, each at 1400 and 800 pixels wide. It writes one PNG per
page and width into FOLDER (`site-screenshots/` by default), to look at, and checks every
page at each width from 800 pixels up that no code block scrolls sideways: a code line wider
than the content column fails the run (exit status 1) naming the page and the line. It
builds nothing itself. Where Chromium is not installed it prints one line saying so and
exits 0.
"""

from __future__ import annotations

import argparse
import functools
import html
import http.server
import json
import shutil
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

# Screenshots show the top of each page (headless Chromium draws a page scrolled to an anchor
# wrongly), in a window tall enough to reach the migration guides' first tables.
PAGES = {
    "home": "",
    "coming-from-equinox": "coming-from-equinox/",
    "coming-from-flax-nnx": "coming-from-flax-nnx/",
    "nn-attention": "nn/attention/",
    "api-pytree_nn": "api/pytree_nn/",
}
CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome")
CHROMIUM_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--hide-scrollbars",
)
# Appended to a page served with `?measure`: after the page has laid out, list the code blocks
# wider than their box, so that `--dump-dom` prints the result (no remote protocol needed).
MEASURE_SCRIPT = b"""<script>
addEventListener("load", () => {
  const wide = [...document.querySelectorAll(".md-content pre > code")]
    .filter((code) => code.scrollWidth > code.clientWidth + 1)
    .map((code) => ({
      overflow: code.scrollWidth - code.clientWidth,
      text: code.textContent.split("\\n").reduce((a, b) => (b.length > a.length ? b : a)),
    }));
  const out = document.createElement("pre");
  out.id = "docs-screenshots-measure";
  out.textContent = "MEASURE" + JSON.stringify(wide) + "END";
  document.body.append(out);
});
</script>"""
CHROMIUM_TIMEOUT_S = 60
# From this width up, the content column holds a code line of 88 characters (the limit that
# tests/test_docs_code_lines.py keeps); on phones code blocks scroll, as expected there.
MIN_CHECKED_WIDTH = 800


def find_chromium() -> str | None:
    """Return the Chromium executable on PATH, or None where none is installed."""
    for name in CHROMIUM_NAMES:
        if found := shutil.which(name):
            return found
    return None


class SiteHandler(http.server.SimpleHTTPRequestHandler):
    """Serve the site quietly; a page asked for with `?measure` gets MEASURE_SCRIPT."""

    def do_GET(self) -> None:
        path, _, query = self.path.partition("?")
        if query != "measure":
            super().do_GET()
            return
        file = Path(self.translate_path(path))
        if file.is_dir():
            file = file / "index.html"
        if not file.is_file():
            self.send_error(404)
            return
        body = file.read_bytes().replace(b"</body>", MEASURE_SCRIPT + b"</body>", 1)
        self.send_response(200)
        self.send_header("Content-Type", "text/html; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        """Keep the run's output to what it found."""


@contextmanager
def serve(site: Path) -> Iterator[str]:
    """Serve `site` on a free localhost port for the duration; yield its base URL."""
    handler = functools.partial(SiteHandler, directory=str(site))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()


def run_chromium(chromium: str, width: int, height: int, *args: str) -> str:
    """Run headless Chromium once, with a fresh profile; return what it printed."""
    with tempfile.TemporaryDirectory(prefix="docs-screenshots-") as profile:
        command = [
            chromium,
            *CHROMIUM_FLAGS,
            f"--user-data-dir={profile}",
            f"--window-size={width},{height}",
            *args,
        ]
        result = subprocess.run(
            command, capture_output=True, text=True, timeout=CHROMIUM_TIMEOUT_S, check=False
        )
    if result.returncode != 0:
        raise RuntimeError(
            f"{' '.join(command)} exited with {result.returncode}:\n{result.stderr[-2000:]}"
        )
    return result.stdout


def wide_code_blocks(chromium: str, url: str, width: int, height: int) -> list[dict]:
    """Return the code blocks of the page at `url` that scroll sideways at `width`."""
    dom = run_chromium(chromium, width, height, "--dump-dom", url + "?measure")
    start, end = dom.find("MEASURE["), dom.find("]END")
    if start < 0 or end < 0:
        raise RuntimeError(f"no measurement in the page at {url}: did the page load?")
    # --dump-dom prints the page as HTML: the JSON's quotes and ampersands come back escaped.
    return json.loads(html.unescape(dom[start + len("MEASURE") : end + 1]))


def parse_widths(text: str) -> list[int]:
    """Parse `1400,800` into pixel widths, refusing anything but positive integers."""
    try:
        widths = [int(part) for part in text.split(",")]
    except ValueError:
        widths = []
    if not widths or min(widths) < 1:
        raise argparse.ArgumentTypeError(
            f"expected pixel widths separated by commas, such as 1400,800; got {text!r}"
        )
    return widths


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "site", nargs="?", type=Path, default=Path("site"), help="built site (default: site/)"
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=Path("site-screenshots"),
        help="folder for the PNGs (default: site-screenshots/)",
    )
    parser.add_argument("--chromium", help="Chromium executable (default: found on PATH)")
    parser.add_argument(
        "--widths",
        type=parse_widths,
        default=[1400, 800],
        help="window widths in pixels (default: 1400,800); code blocks are checked from 800 up",
    )
    parser.add_argument(
        "--height", type=int, default=2400, help="window height in pixels (default: 2400)"
    )
    return parser.parse_args(argv)


def screenshot_and_check(chromium: str, args: argparse.Namespace) -> list[str]:
    """Write every page's screenshots; return a line per code block that scrolls sideways."""
    failures = []
    with serve(args.site) as base:
        for name, page in PAGES.items():
            url = base + page
            for width in args.widths:
                png = args.out / f"{name}-{width}.png"
                run_chromium(chromium, width, args.height, f"--screenshot={png}", url)
                if not png.is_file() or png.stat().st_size == 0:
                    raise RuntimeError(f"Chromium wrote no screenshot of {url} to {png}")
                print(f"wrote {png}")
            for width in (w for w in args.widths if w >= MIN_CHECKED_WIDTH):
                for block in wide_code_blocks(chromium, url, width, args.height):
                    failures.append(
                        f"{page or 'home page'}: a code block scrolls {block['overflow']} px "
                        f"sideways at {width} px; its longest line: {block['text'][:80]!r}"
                    )
    return failures


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if not (args.site / "index.html").is_file():
        print(
            f"error: {args.site} holds no built site (no index.html): run `mkdocs build` first",
            file=sys.stderr,
        )
        return 2
    if args.chromium:
        chromium = shutil.which(args.chromium)
        if chromium is None:
            print(f"error: --chromium {args.chromium}: no such executable", file=sys.stderr)
            return 2
    else:
        chromium = find_chromium()
        if chromium is None:
            print("docs screenshots skipped: Chromium is not installed (apt-get install chromium)")
            return 0
    args.out.mkdir(parents=True, exist_ok=True)
    try:
        failures = screenshot_and_check(chromium, args)
    except (RuntimeError, subprocess.TimeoutExpired) as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    if failures:
        print("\n".join(failures), file=sys.stderr)
        print(
            "shorten those lines (docs code lines stay within 88 characters) or widen the "
            "content column (docs/stylesheets/extra.css)",
            file=sys.stderr,
        )
        return 1
    print(f"{len(PAGES) * len(args.widths)} screenshots in {args.out}; code blocks fit")
    return 0


if __name__ == "__main__":
    sys.exit(main())
