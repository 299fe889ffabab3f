"""The manual: the configuration reference names exactly the keys the loader accepts, the
documented example configs load, every relative link in README.md and docs/*.md resolves (files
and #anchors), the README keeps its first two commands, and the manual describes the software
rather than the rounds that measured it (their reports are bench/history/, outside the manual;
docs/performance.md is one page). The site build itself
(`mkdocs build --strict`) is tests/component/test_docs_site.py.
"""

from __future__ import annotations

import base64
import re
import unicodedata
from pathlib import Path

import pytest

from shipper import config_values
from shipper.config import load_config, load_config_text

REPO = Path(__file__).resolve().parents[2]
DOCS = REPO / "docs"
CONFIG_SOURCES = tuple(sorted(p.name for p in (REPO / "shipper").glob("config*.py")))   # the loader and its parts
# pages other branches bring at merge (containers: issue 16, state: issue 19); a link to one is
# checked as soon as the file exists
PENDING_PAGES = {"docs/containers.md", "docs/state.md"}

# configs that together take every branch of the loader (url vs hosts vs cloud_id, index vs
# data_stream, paths vs journald, tls, multiline)
_CLOUD_ID = "name:" + base64.b64encode(b"example.com$abc$def").decode()
RICH_CONFIGS = (
    (REPO / "config" / "shipper.yaml").read_text(),
    """
inputs:
  - paths: ['/var/log/a/*.log']
    format: regex
    pattern: nginx
    multiline: {start: '^\\S', max_lines: 10, timeout: 2s}
  - journald: {directory: /var/log/journal, units: [app]}
output:
  elasticsearch:
    url: http://127.0.0.1:9200
    data_stream: {type: logs, dataset: app, namespace: prod}
    index_template: auto
    tls: {verify: true, ca_fingerprint: '""" + "ab" * 32 + """'}
metrics: {listen: null, health_down_after: 30s}
clean_removed_after: 2h
""",
    f"output: {{elasticsearch: {{cloud_id: '{_CLOUD_ID}', username: u, password: p}}}}\n",
    """
inputs:
  - paths: ['/var/log/app/*.log']
    ecs: replace
    drop_when:
      - {field: req.url, equals: /healthz}
      - {field: log.level, in: [trace, debug]}
      - {field: message, matches: '^GET /static/'}
      - {field: a, prefix: x}
      - {field: b, exists: false}
    sample:
      - {field: url.path, prefix: /static/, keep: 0.01}
      - {field: a, equals: 1, keep: 0.5}
      - {field: a, in: [1, 2], keep: 0.5}
      - {field: a, matches: x, keep: 0.5}
      - {field: a, exists: true, keep: 0}
    throttle: {key: '{service.name}', events_per_s: 1000, burst: 5000}
    redact: [req.headers.authorization, password]
""",
    "output: {elasticsearch: {url: 'https://search-logs.eu-west-1.es.amazonaws.com', "
    "aws_sigv4: {region: eu-west-1, service: es}, proxy_url: 'http://proxy:3128', document_id: none}}\n",
)


def accepted_keys() -> set[str]:
    """Every dotted key the loader read while loading RICH_CONFIGS (list indices as `[]`): what
    each config section marks as used is exactly what it accepts; the rest is `unknown key`."""
    seen: set[str] = set()
    original = config_values.Section.finish

    def finish(self: config_values.Section) -> None:
        seen.update(re.sub(r"\[\d+\]", "[]", self.key(name)) for name in self.used)
        original(self)

    config_values.Section.finish = finish  # type: ignore[method-assign]
    try:
        for text in RICH_CONFIGS:
            load_config_text(text)
    finally:
        config_values.Section.finish = original  # type: ignore[method-assign]
    return seen


def key_names_in_the_loader_source() -> set[str]:
    """The names the loader's readers are called with (`s.string("index", ...)`): a guard that
    RICH_CONFIGS reach every branch, so a key added to the loader cannot escape accepted_keys()."""
    src = "".join((REPO / "shipper" / f).read_text() for f in CONFIG_SOURCES)
    return set(re.findall(r'\.(?:string|strings|integer|size|duration|boolean|mapping|json_mapping|raw|wrap|has)'
                          r'\("([a-z_]+)"', src))


def documented_keys() -> dict[str, str]:
    """Keys in the first column of every `| key | default | meaning |` table of docs/*.md -> page."""
    out: dict[str, str] = {}
    for page in sorted(DOCS.glob("*.md")):
        in_table = False
        for line in page.read_text().splitlines():
            if re.match(r"^\|\s*key\s*\|\s*default\s*\|\s*meaning\s*\|", line):
                in_table = True
                continue
            if in_table and line.startswith("|"):
                first = line.split("|")[1]
                for key in re.findall(r"`([^`]+)`", first):
                    out[key] = page.name
            elif in_table and not line.startswith("|"):
                in_table = False
    return out


def test_the_rich_configs_reach_every_key_the_loader_reads() -> None:
    leaves = {k.rsplit(".", 1)[-1].removeprefix("inputs[]").strip(".") or "inputs" for k in accepted_keys()}
    missing = key_names_in_the_loader_source() - leaves
    assert not missing, f"the loader reads keys no test config reaches (add them to RICH_CONFIGS): {missing}"


def test_every_accepted_key_is_documented_and_no_documented_key_is_refused() -> None:
    accepted = accepted_keys()
    documented = documented_keys()
    assert len(accepted) > 50
    undocumented = sorted(accepted - set(documented))
    assert not undocumented, f"keys the loader accepts that docs/configuration.md does not name: {undocumented}"
    refused = sorted(set(documented) - accepted)
    assert not refused, f"keys the reference names that the loader refuses: {refused}"
    in_reference = {k for k, page in documented.items() if page == "configuration.md"}
    assert len(in_reference) >= len(accepted) - 10, "the reference itself should hold (nearly) every key"


def test_a_documented_key_the_loader_does_not_know_fails_the_check() -> None:
    with pytest.raises(Exception, match="unknown key"):
        load_config_text("output: {elasticsearch: {bogus: 1}}\n")
    assert "output.elasticsearch.bogus" not in accepted_keys()


def test_the_documented_example_configs_load(monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = load_config(str(REPO / "config" / "shipper.yaml"))
    assert cfg.inputs and cfg.output.hosts == ("http://127.0.0.1:9200",)
    assert cfg.metrics.listen == "127.0.0.1:9607"
    monkeypatch.setenv("LOGSENE_TOKEN", "0123abcd-token")
    logsene = load_config(str(REPO / "config" / "logsene.yaml"))
    assert logsene.output.index == "0123abcd-token"


# ---------------------------------------------------------------- links

def slug(heading: str) -> str:
    """An anchor as MkDocs' toc extension (and, for these headings, GitHub) makes it."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)
    text = re.sub(r"[`*]", "", text)
    text = unicodedata.normalize("NFKD", text).encode("ascii", "ignore").decode()
    text = re.sub(r"[^\w\s-]", "", text).strip().lower()
    return re.sub(r"[-\s]+", "-", text)


def _prose(text: str, inline_code: bool = False) -> str:
    """The text outside fenced code blocks (and outside inline code unless `inline_code`)."""
    out, fence = [], False
    for line in text.splitlines():
        if line.lstrip().startswith("```"):
            fence = not fence
            continue
        if not fence:
            out.append(line if inline_code else re.sub(r"`[^`]*`", "", line))
    return "\n".join(out)


def anchors(path: Path) -> set[str]:
    return {slug(m) for m in re.findall(r"^#{1,6} (.+)$", _prose(path.read_text(), inline_code=True), re.M)}


def links(path: Path) -> list[str]:
    return re.findall(r"\]\(([^)\s]+)\)", _prose(path.read_text()))


PAGES = [REPO / "README.md", *sorted(DOCS.glob("*.md"))]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_every_relative_link_resolves(page: Path) -> None:
    broken = []
    for target in links(page):
        if re.match(r"^[a-z]+:", target):          # http:, https:, mailto:
            continue
        file_part, _, anchor = target.partition("#")
        dest = (page.parent / file_part).resolve() if file_part else page
        rel = dest.relative_to(REPO).as_posix() if dest.is_relative_to(REPO) else str(dest)
        if not dest.exists():
            if rel not in PENDING_PAGES:
                broken.append(f"{target}: no such file")
            continue
        if anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            broken.append(f"{target}: no heading gives #{anchor}")
    assert not broken, f"{page.relative_to(REPO)}: {broken}"


def test_the_link_checker_sees_a_broken_link_and_a_broken_anchor(tmp_path: Path) -> None:
    (tmp_path / "a.md").write_text("# Top\n\n## Files: `paths`, globs\n\n[x](b.md) [y](#nope) "
                                   "[z](#files-paths-globs) `[not](a link)`\n")
    assert anchors(tmp_path / "a.md") == {"top", "files-paths-globs"}
    assert links(tmp_path / "a.md") == ["b.md", "#nope", "#files-paths-globs"]


# ---------------------------------------------------------------- troubleshooting

def log_phrases() -> set[str]:
    """The fixed phrases of shipper's own log lines at info and above (the first literal of each
    call: a phrase continued on the next line is matched by its start)."""
    phrases: set[str] = set()
    for f in (REPO / "shipper").rglob("*.py"):
        src = f.read_text()
        for m in re.finditer(r'(?:log\.(?:info|warning|error|critical|exception)|events\.info)\(\s*"([^"]+)"', src):
            phrases.add(m.group(1).strip())
    from shipper.ship.sender import _EPISODE_PHRASES
    phrases.update(_EPISODE_PHRASES.values())
    return phrases


def test_troubleshooting_names_every_log_phrase() -> None:
    page = (DOCS / "troubleshooting.md").read_text()
    phrases = log_phrases()
    assert len(phrases) > 40 and "output host unreachable, retrying with backoff" in phrases
    missing = sorted(p for p in phrases if p not in page)
    assert not missing, f"log phrases docs/troubleshooting.md does not explain: {missing}"


# ---------------------------------------------------------------- the README

def test_readme_is_short_and_keeps_its_two_first_commands() -> None:
    lines = (REPO / "README.md").read_text().splitlines()
    assert lines[0] == "# shipper"
    assert lines[2] == "```sh"
    assert lines[3].startswith("python3 -m venv .venv && .venv/bin/pip install -e '.[demo]' && .venv/bin/shipper demo")
    assert lines[4].startswith("bash .ci/run ")
    assert lines[5] == "```"
    assert len(lines) <= 200, "the README is the first screen; the manual is docs/"
    text = "\n".join(lines)
    for page in ("docs/configuration.md", "docs/delivery.md", "docs/troubleshooting.md", "bench/README.md"):
        assert f"]({page}" in text, f"the README does not link {page}"


def test_every_docs_page_is_in_the_nav() -> None:
    nav = (REPO / "mkdocs.yml").read_text()
    for page in DOCS.glob("*.md"):
        assert re.search(rf":\s*{re.escape(page.name)}\s*$", nav, re.M), f"{page.name} is not in mkdocs.yml's nav"
    for pending in PENDING_PAGES:                      # a place is kept for them
        assert Path(pending).name in nav


# ---------------------------------------------------------------- the record stays out of the manual

# The manual is README.md, docs/*.md and bench/README.md (included by docs/benchmarks.md). It
# describes the software as it is; how the figures came about, session by session, is
# bench/history/.
MANUAL = [REPO / "README.md", *sorted(DOCS.glob("*.md")), REPO / "bench" / "README.md"]
HISTORY = REPO / "bench" / "history"
_ORDINALS = ("first|second|third|fourth|fifth|sixth|seventh|eighth|ninth|tenth|eleventh|twelfth|"
             "thirteenth|fourteenth|fifteenth|sixteenth|seventeenth|eighteenth|nineteenth|twentieth")
NARRATION = re.compile(rf"\bissue \d+|\bround \d+|\b(?:{_ORDINALS}) (?:round|sitting)|\bsittings?\b"
                       r"|\b(?:earlier|previous|last|this) round\b|\brounds? before\b", re.I)


def narration(text: str) -> list[str]:
    return [m.group(0) for m in NARRATION.finditer(text)]


@pytest.mark.parametrize("page", MANUAL, ids=lambda p: str(p.relative_to(REPO)))
def test_the_manual_describes_the_software_not_its_rounds(page: Path) -> None:
    found = narration(page.read_text())
    assert not found, f"{page.relative_to(REPO)} narrates rounds or issues ({found}): that story goes to bench/history/"


def test_the_narration_check_sees_a_round_and_an_issue() -> None:
    assert narration("As of the fourteenth round of issue 14, in this sitting; the round before.") == [
        "fourteenth round", "issue 14", "sitting", "round before"]
    assert narration("read rounds pass it by; a round trip; the issue's reference machine") == []


def test_performance_is_one_page_and_history_stays_out_of_the_manual() -> None:
    assert len((DOCS / "performance.md").read_text().splitlines()) <= 250
    for page in [*DOCS.glob("*.md"), REPO / "mkdocs.yml"]:
        for included in re.findall(r'--8<--\s*"([^"]+)"', page.read_text()):
            assert not included.startswith("bench/history"), f"{page.name} includes {included} in the manual"


def test_every_history_file_is_dated_and_indexed() -> None:
    index = (HISTORY / "README.md").read_text()
    files = sorted(p.name for p in HISTORY.glob("*.md") if p.name != "README.md")
    assert files
    for name in files:
        assert re.fullmatch(r"\d{4}-\d{2}-\d{2}-issue\d{2}-[a-z0-9-]+\.md", name), name
        assert f"]({name})" in index, f"bench/history/README.md does not list {name}"
