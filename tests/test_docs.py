"""The documentation: the site builds in strict mode, README.md stays a short front door with
the two quick-start commands, and relative links in README.md and docs/ name files that exist.

The build is one ``mkdocs build --strict`` (a few seconds: mkdocstrings reads the sources
statically, nothing is imported or compiled), so a broken link or anchor inside the site, a
missing page or a docstring the parser cannot read fails here rather than on a docs host.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
MAX_README_LINES = 120
QUICK_START = [
    "pip install -e . && metarl run experiments/value_distance_cartpole.toml",
    'pip install -e ".[dev]" && python3 -m pytest',
]

FENCE = re.compile(r"^(```|~~~).*?^\1[^\n]*$", re.MULTILINE | re.DOTALL)
INLINE_CODE = re.compile(r"`[^`\n]*`")
HTML_COMMENT = re.compile(r"<!--.*?-->", re.DOTALL)
LINK = re.compile(r"\[[^\]\n]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")


def test_site_builds_in_strict_mode(tmp_path):
    site = tmp_path / "site"
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    result = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert (site / "index.html").is_file()
    assert (site / "getting-started" / "index.html").is_file()
    api_page = site / "reference" / "kinds" / "index.html"
    assert api_page.is_file()
    assert "load_experiment" in api_page.read_text(encoding="utf-8")


def test_readme_is_short_and_holds_the_two_quick_start_commands():
    text = README.read_text(encoding="utf-8")
    lines = text.splitlines()
    assert len(lines) <= MAX_README_LINES, (
        f"README.md has {len(lines)} lines; keep it under {MAX_README_LINES} and move "
        "details to docs/"
    )
    start = lines.index("## Quick start")
    fence = next(i for i in range(start, len(lines)) if lines[i].startswith("```"))
    end = next(i for i in range(fence + 1, len(lines)) if lines[i].startswith("```"))
    commands = [line.strip() for line in lines[fence + 1:end] if line.strip()]
    assert commands == QUICK_START
    assert (ROOT / "experiments" / "value_distance_cartpole.toml").is_file()


def _relative_links(path: Path) -> list[str]:
    text = path.read_text(encoding="utf-8")
    for pattern in (FENCE, HTML_COMMENT, INLINE_CODE):
        text = pattern.sub("code", text)
    targets = []
    for target in LINK.findall(text):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.IGNORECASE) or target.startswith("#"):
            continue  # http(s), mailto, ... and anchors within the page
        targets.append(target)
    return targets


def test_relative_links_point_to_existing_files():
    pages = [README, *sorted(DOCS.rglob("*.md"))]
    broken = []
    for page in pages:
        for target in _relative_links(page):
            path = target.split("#", 1)[0].split("?", 1)[0]
            if not (page.parent / path).exists():
                broken.append(f"{page.relative_to(ROOT)}: {target}")
    assert not broken, "links to files that do not exist:\n" + "\n".join(broken)
