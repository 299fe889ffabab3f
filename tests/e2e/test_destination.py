"""The destination side end to end: a default `shipper run` (index_template: auto) installs the
template before its first bulk request, so the daily index gets typed fields; a destination that
refuses the template gets one warning and every line still arrives exactly once.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest

from tests.support.daemon import write_config
from tests.support.es import ES
from tests.support.proxy import FaultProxy
from tests.support.wait import wait_until
from tests.support.writer import write_lines

pytestmark = pytest.mark.slow

PASSWORD = "s3cr3t-Horse-Battery"


def _logs(tmp_path: Path) -> Path:
    logs = tmp_path / "logs"
    logs.mkdir()
    return logs


def _messages(output: str) -> list[dict[str, Any]]:
    out = []
    for line in output.splitlines():
        try:
            rec = orjson.loads(line)
        except orjson.JSONDecodeError:
            continue
        if isinstance(rec, dict):
            out.append(rec)
    return out


def test_a_default_run_installs_the_template_and_the_index_is_typed(
        tmp_path: Path, es: ES, osmem_clone: Any, daemon_factory: Any) -> None:
    logs = _logs(tmp_path)
    write_lines(logs / "app.log", range(300))
    cfg = write_config(tmp_path, es_url=osmem_clone.url, paths=[logs / "*.log"])   # index logs-%Y.%m.%d
    d = daemon_factory(cfg)
    d.wait_ready()
    wait_until(lambda: es.count("logs-*") >= 300, lambda: f"300 documents (have {es.count('logs-*')})\n{d.tail()}",
               timeout_s=30)
    (index,) = es.indices()
    assert index.startswith("logs-20")
    mapping = es.request("GET", f"/{index}/_mapping")[index]["mappings"]["properties"]
    assert mapping["log"]["properties"]["level"]["type"] == "keyword"
    assert mapping["@timestamp"]["type"] == "date"
    assert mapping["log"]["properties"]["offset"]["type"] == "long"
    assert mapping["log"]["properties"]["file"]["properties"]["path"]["type"] == "keyword"
    assert mapping["host"]["properties"]["name"]["type"] == "keyword"
    template = es.request("GET", "/_index_template/shipper")["index_templates"][0]["index_template"]
    assert template["index_patterns"] == ["logs-*"]
    assert any(m.get("msg") == "index template installed" for m in _messages(d.output()))
    check = d.cli("check")
    assert "template shipper: installed (logs-*" in check.stdout, check.stdout
    es.assert_exactly_once(range(300), index="logs-*")
    assert d.alive, d.tail()


def test_a_refused_template_is_one_warning_and_every_line_arrives(
        tmp_path: Path, es: ES, fault_proxy: FaultProxy, daemon_factory: Any) -> None:
    logs = _logs(tmp_path)
    write_lines(logs / "app.log", range(200))
    fault_proxy.require_basic_auth("shipper", PASSWORD)
    fault_proxy.fail_next(403)          # the first request, GET /: a key without the monitor privilege
    cfg = write_config(tmp_path, es_url=fault_proxy.url, paths=[logs / "*.log"],
                       extra_yaml={"output": {"elasticsearch": {"username": "shipper", "password": PASSWORD}}})
    d = daemon_factory(cfg)
    d.wait_ready()
    wait_until(lambda: es.count("logs-*") >= 200, lambda: f"200 documents (have {es.count('logs-*')})\n{d.tail()}",
               timeout_s=30)
    write_lines(logs / "app.log", range(200, 250))
    wait_until(lambda: es.count("logs-*") >= 250, lambda: f"250 documents (have {es.count('logs-*')})", timeout_s=30)
    records = _messages(d.output())
    refused = [m for m in records if str(m.get("msg", "")).startswith("index template not installed")]
    assert len(refused) == 1 and refused[0]["level"] in ("warning", "WARNING"), refused
    assert "monitor cluster privilege" in refused[0]["reason"]
    assert es.request("GET", "/_index_template/shipper", ok=(404,))
    es.assert_exactly_once(range(250), index="logs-*")
    assert d.alive, d.tail()
    assert PASSWORD not in d.output()
