"""The manual builds: `mkdocs build --strict` (mkdocs.yml, docs/) into a temp dir, as a fresh
clone would. Strict: a broken link or anchor between pages, a page left out of the nav or a
missing included file (bench/README.md, config/*.yaml) fails the build."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_mkdocs_build_strict(tmp_path: Path) -> None:
    site = tmp_path / "site"
    env = dict(os.environ, NO_MKDOCS_2_WARNING="1")
    proc = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=110)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    pages = {p.parent.name for p in site.glob("*/index.html")}
    for page in ("configuration", "inputs", "journald", "destination", "delivery", "rotation", "operate",
                 "install", "performance", "benchmarks", "troubleshooting", "development"):
        assert page in pages, f"docs/{page}.md was not built"
    # the included files arrived verbatim
    assert "bench: throughput and latency harness" in (site / "benchmarks" / "index.html").read_text()
    assert "Checkpoints, the disk queue and dead letters live here" in (site / "configuration" / "index.html").read_text()
    assert (site / "search" / "search_index.json").exists()


def test_a_broken_link_fails_the_strict_build(tmp_path: Path) -> None:
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "index.md").write_text("# x\n\n[gone](nowhere.md)\n")
    (tmp_path / "mkdocs.yml").write_text((REPO / "mkdocs.yml").read_text().split("\nnav:")[0] + "\nnav:\n  - x: index.md\n")
    env = dict(os.environ, NO_MKDOCS_2_WARNING="1")
    proc = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=110)
    assert proc.returncode != 0 and "nowhere.md" in proc.stdout + proc.stderr
