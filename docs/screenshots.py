"""Screenshots of one object's section of the built API reference, in headless Chromium.

`make docs-screenshots` runs it after `make docs`: it copies the page of the object (the
Accelerator by default) keeping only that object's section, has Chromium render it into one tall
image, then cuts the image into tiles of a screen's height (with Pillow, when installed) so that each
method's parameters and examples can be looked at:

    python docs/screenshots.py --site site --out site-screenshots --name cadence.Accelerator

Chromium: `apt-get install chromium` (or set CHROMIUM to its path).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
from pathlib import Path

TILE_HEIGHT = 2000
WIDTH = 1280


def section_only(html: str, name: str) -> str:
    """The page with its article holding only the section of `name` (from its anchor to the next
    object's anchor)."""
    anchor = f'<a id="{name}"></a>'
    start = html.index(anchor)
    start = html.rfind("<p>", 0, start) if html[start - 3 : start] == "<p>" else start
    following = html.find('<a id="cadence.', start + len(anchor) + 3)
    body_start = html.index(">", html.index("<article")) + 1
    body_end = html.index("</article>", start)
    end = body_end if following == -1 else following
    if html[end - 3 : end] == "<p>":
        end -= 3
    page = html[:body_start] + html[start:end] + html[body_end:]
    # No footer: the image ends where the section ends (its blank rest is cut off).
    return page.replace("</head>", "<style>.md-footer{display:none}</style></head>", 1)


def find_chromium() -> str:
    """The Chromium executable: $CHROMIUM, else the first of the usual names on PATH."""
    for candidate in (os.environ.get("CHROMIUM"), "chromium", "chromium-browser", "google-chrome"):
        if candidate and shutil.which(candidate):
            return shutil.which(candidate)
    raise SystemExit("No Chromium found: apt-get install chromium, or set CHROMIUM=/path/to/it.")


def screenshot(page: Path, image: Path, height: int) -> None:
    """Render `page` in a headless Chromium window `height` pixels tall into `image`."""
    subprocess.run(
        [
            find_chromium(),
            "--headless",
            "--no-sandbox",  # Chromium refuses to run as root with its sandbox
            "--disable-gpu",
            "--hide-scrollbars",
            "--virtual-time-budget=3000",  # let the theme's scripts finish before the capture
            f"--window-size={WIDTH},{height}",
            f"--screenshot={image}",
            page.resolve().as_uri(),
        ],
        check=True,
        capture_output=True,
        timeout=300,
    )


def tiles(image: Path, out: Path, stem: str) -> list[Path]:
    """Cut `image` into screen-high tiles (its blank bottom dropped); the image itself without Pillow."""
    try:
        from PIL import Image, ImageChops
    except ImportError:
        return [image]
    Image.MAX_IMAGE_PIXELS = None
    whole = Image.open(image).convert("RGB")
    box = ImageChops.difference(whole, Image.new("RGB", whole.size, "white")).getbbox()
    bottom = box[3] + 40 if box else whole.size[1]
    written = []
    for number, top in enumerate(range(0, bottom, TILE_HEIGHT), 1):
        path = out / f"{stem}-{number:02d}.png"
        whole.crop((0, top, WIDTH, min(top + TILE_HEIGHT, bottom))).save(path)
        written.append(path)
    image.unlink()
    return written


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--site", default="site", help="the built site (mkdocs build)")
    parser.add_argument("--out", default="site-screenshots", help="where the images go")
    parser.add_argument("--name", default="cadence.Accelerator", help="the object to show")
    parser.add_argument("--page", default="reference/cadence/index.html", help="its page")
    parser.add_argument("--height", type=int, default=40000, help="the tall window's height")
    args = parser.parse_args()
    page = Path(args.site) / args.page
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    trimmed = page.with_name("_screenshot.html")  # beside the page, so its links and styles resolve
    trimmed.write_text(section_only(page.read_text(), args.name))
    try:
        whole = out / f"{args.name}.png"
        screenshot(trimmed, whole, args.height)
    finally:
        trimmed.unlink()
    for path in tiles(whole, out, args.name):
        print(path)


if __name__ == "__main__":
    main()
