"""Every document a source file names (and every image a Markdown file shows) exists in the
repository, and no file names a path of one machine (issue 17: the facts code points to must be
where a user can read them). Paths are taken from the repository root, or, in a Markdown file,
from the file's own folder (its links)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SOURCES = ("*.py", "*.sh", "*.toml", "*.yaml", "*.yml", "*.md")
DOCUMENT = re.compile(r"(?<![\w{}<>./-])((?:[\w.-]+/)+[\w.-]+\.md)\b")
IMAGE = re.compile(r"!\[[^\]]*\]\(([^)\s]+)\)")
MACHINE_PATH = re.compile(r"(?<![\w.])/(?:work|home|root|Users|opt|tmp/kvgate)/[\w.-]+")


def _tracked() -> list[Path]:
    listed = subprocess.run(
        ["git", "ls-files", *SOURCES], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.split()
    return [ROOT / name for name in listed if (ROOT / name).is_file()]


def test_every_document_named_in_the_sources_exists() -> None:
    missing = sorted(
        f"{path.relative_to(ROOT)}: {name}"
        for path in _tracked()
        for name in DOCUMENT.findall(path.read_text(errors="replace"))
        if not (ROOT / name).exists() and not (path.suffix == ".md" and (path.parent / name).exists())
    )
    assert missing == []


def test_every_image_a_markdown_file_shows_exists() -> None:
    missing = sorted(
        f"{path.relative_to(ROOT)}: {image}"
        for path in _tracked()
        if path.suffix == ".md"
        for image in IMAGE.findall(path.read_text(errors="replace"))
        if "://" not in image and not (path.parent / image).exists()
    )
    assert missing == []


def test_no_source_names_a_path_of_one_machine() -> None:
    found = sorted(
        f"{path.relative_to(ROOT)}: {match}"
        for path in _tracked()
        if path.suffix != ".md" or not path.is_relative_to(ROOT / "bench" / "results")
        for match in MACHINE_PATH.findall(path.read_text(errors="replace"))
    )
    assert found == []


def test_the_patterns_find_what_they_look_for() -> None:
    named = "see docs/architecture.md, principle 1; and README.md"
    assert DOCUMENT.findall(named) == ["docs/architecture.md"]
    assert IMAGE.findall("![p90 TTFT](lora-mix.png) and ![x](https://example.com/a.png)") == [
        "lora-mix.png", "https://example.com/a.png"]
    machine = "/".join(("", "work", "shared", "x.json"))  # not spelled out: this file is scanned too
    assert MACHINE_PATH.findall(f'CALIBRATION = Path("{machine}")') == [machine.rsplit("/", 1)[0]]
