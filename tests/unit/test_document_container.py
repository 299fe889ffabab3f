"""Documents from container logs (DocBuilder.build_container): a pino line inside a Docker or CRI
record gives the document it gives in a file plus log.stream and the path's Kubernetes fields;
@timestamp is the line's own time, else the runtime's; plain lines among them are built as usual."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shipper.config import InputConfig
from shipper.model import FLAG_CONTAINER_UNPARSED, FLAG_TRUNCATED
from shipper.parse import document
from shipper.parse.container import ContainerEvent
from shipper.parse.container_join import ContainerJoiner
from shipper.parse.document import DocBuilder
from shipper.tail.lines import LineSplitter
from tests.support.container_writer import cri_record, docker_pieces, docker_record
from tests.support.native import c_function
from tests.unit.test_splice import CONFIGS, CORPUS, _keys, _render, _values, assert_same

CID = "9a" * 32
LINK = f"/var/log/containers/checkout-7d9f8b6c5-x2x9q_shop_api-{CID}.log"
NOW = 1_790_000_000.25            # read time
RT = "2026-12-01T10:00:00.5Z"     # runtime time, as the runtime writes it
RT_NS = 1_796_119_200_500_000_000
PINO = b'{"level":30,"time":1790000000123,"pid":7,"hostname":"h","msg":"order placed","order":{"id":991}}'


@pytest.fixture(autouse=True, params=["native", "python"])
def build_path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Each test twice: pino records through the C splice (`_native.c`, which must be built) and without it."""
    monkeypatch.setattr(document, "native_splice", c_function("splice") if request.param == "native" else None)
    return str(request.param)


def builder(**inp: Any) -> DocBuilder:
    inp.setdefault("paths", ("/var/log/containers/*.log",))
    return DocBuilder(InputConfig(**inp), "logs-%Y.%m.%d", "node-1")


def pairs(b: DocBuilder, events: list[ContainerEvent], path: str = LINK) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    out: list[bytes] = []
    n = b.build_container("inc1", path, events, NOW, out)
    assert n == sum(len(p) for p in out)
    res = []
    for p in out:
        action, doc, empty = p.split(b"\n")
        assert empty == b""
        res.append((orjson.loads(action), orjson.loads(doc)))
    return res


def file_doc(line: bytes, offset: int, path: str = LINK, **inp: Any) -> dict[str, Any]:
    out: list[bytes] = []
    builder(format="auto", **inp).build("inc1", path, [(offset, offset + len(line) + 1, line, 0)], NOW, out)
    return dict(orjson.loads(out[0].split(b"\n")[1]))


def ev(data: bytes, stream: str = "stdout", start: int = 100, t: str = RT, flags: int = 0,
       attrs: dict[str, Any] | None = None) -> ContainerEvent:
    return (start, start + 50, data, flags, stream, t, attrs)


@pytest.mark.parametrize("fmt", ["docker", "cri", "auto"])
def test_pino_line_in_a_container_log_is_the_file_document_plus_stream_and_kubernetes(fmt: str) -> None:
    [(action, doc)] = pairs(builder(format=fmt), [ev(PINO)])
    assert action == {"create": {"_index": "logs-2026.09.21", "_id": "inc1-100"}}
    assert doc["log"].pop("stream") == "stdout"
    assert doc.pop("kubernetes") == {"pod": {"name": "checkout-7d9f8b6c5-x2x9q"}, "namespace": "shop"}
    assert doc.pop("container") == {"name": "api", "id": CID}
    assert doc == file_doc(PINO, 100)
    assert doc["@timestamp"] == "2026-09-21T14:13:20.123Z"          # pino's own time wins


def test_text_line_takes_the_runtime_time() -> None:
    [(action, doc)] = pairs(builder(format="cri"), [ev(b"GET /healthz 200", "stderr")])
    assert doc["@timestamp"] == "2026-12-01T10:00:00.500Z"
    assert action["create"]["_index"] == "logs-2026.12.01"
    assert doc["message"] == "GET /healthz 200" and doc["log"]["stream"] == "stderr"
    assert doc["log"]["offset"] == 100 and doc["log"]["file"] == {"path": LINK}
    assert doc["host"] == {"name": "node-1"}


def test_json_line_without_time_takes_the_runtime_time() -> None:
    [(_a, doc)] = pairs(builder(format="docker"), [ev(b'{"msg":"no time here"}')])
    assert doc["@timestamp"] == "2026-12-01T10:00:00.500Z" and doc["message"] == "no time here"


def test_unusable_runtime_time_falls_back_to_the_read_time() -> None:
    for bad in ("0001-01-01T00:00:00Z", "yesterday", ""):
        [(_a, doc)] = pairs(builder(format="docker"), [ev(b"zero time", t=bad)])
        assert doc["@timestamp"] == "2026-09-21T14:13:20.250Z"


def test_flags_truncated_and_unparsed() -> None:
    b = builder(format="docker")
    [(_a, d1), (_b, d2)] = pairs(b, [ev(b"cut", flags=FLAG_TRUNCATED),
                                     ev(b"not a docker line", stream="", start=300, t="", flags=FLAG_CONTAINER_UNPARSED)])
    assert d1["log"]["flags"] == ["truncated"]
    assert d2["log"]["flags"] == ["docker_parse_failed"] and "stream" not in d2["log"]
    assert d2["message"] == "not a docker line" and "kubernetes" not in d2
    [(_c, d3)] = pairs(builder(format="cri"), [ev(b"x", stream="", t="", flags=FLAG_CONTAINER_UNPARSED)])
    assert d3["log"]["flags"] == ["cri_parse_failed"]


def test_plain_lines_among_records_are_built_as_file_lines() -> None:
    b = builder(format="auto")
    plain = b'{"level":40,"time":1790000000999,"msg":"plain"}'
    events = [ev(plain, stream="", start=0, t=""), ev(PINO, start=60), ev(plain, stream="", start=200, t="")]
    got = pairs(b, events, path="/var/log/app/app.log")
    assert [a["create"]["_id"] for a, _d in got] == ["inc1-0", "inc1-60", "inc1-200"]
    assert got[0][1] == file_doc(plain, 0, "/var/log/app/app.log")
    assert got[2][1] == file_doc(plain, 200, "/var/log/app/app.log")
    assert got[1][1]["log"]["stream"] == "stdout" and "kubernetes" not in got[1][1]


def test_pods_path_and_docker_path_metadata() -> None:
    uid = "0b8e1c2a-5f3d-4e21-9c1b-7a6d5e4f3c2b"
    pods = f"/var/log/pods/shop_checkout-1_{uid}/api/0.log.20261201-100000"
    [(_a, doc)] = pairs(builder(format="cri"), [ev(b"x")], path=pods)
    assert doc["kubernetes"] == {"pod": {"name": "checkout-1", "uid": uid}, "namespace": "shop"}
    assert doc["container"] == {"name": "api"}
    dpath = f"/var/lib/docker/containers/{CID}/{CID}-json.log"
    [(_b, doc)] = pairs(builder(format="docker"), [ev(b"x", attrs={"tag": "web"})], path=dpath)
    assert doc["container"] == {"id": CID} and doc["docker"] == {"attrs": {"tag": "web"}}


def test_app_fields_named_like_ours_are_kept() -> None:
    line = b'{"msg":"m","container":"sidecar","kubernetes":{"cluster":"eu-1"}}'
    [(_a, doc)] = pairs(builder(format="docker"), [ev(line)])
    assert doc["container"] == {"name": "api", "id": CID, "original": "sidecar"}
    assert doc["kubernetes"] == {"cluster": "eu-1", "pod": {"name": "checkout-7d9f8b6c5-x2x9q"}, "namespace": "shop"}


def test_input_fields_and_drop_fields_apply_to_container_docs() -> None:
    b = builder(format="docker", fields={"kubernetes": {"cluster": "prod"}}, drop_fields=("container.id",))
    [(_a, doc)] = pairs(b, [ev(b"x")])
    assert doc["kubernetes"]["cluster"] == "prod" and doc["kubernetes"]["namespace"] == "shop"
    assert doc["container"] == {"name": "api"}


def test_line_filters_see_the_inner_text() -> None:
    b = builder(format="cri", exclude_lines=("healthz",))
    got = pairs(b, [ev(b"GET /healthz"), ev(b"GET /cart", start=200)])
    assert [d["message"] for _a, d in got] == ["GET /cart"]


def test_deeply_nested_json_goes_as_text() -> None:
    deep = b'{"a":' * 300 + b"1" + b"}" * 300
    [(_a, doc)] = pairs(builder(format="docker"), [ev(deep)])
    assert doc["log"]["flags"] == ["json_parse_failed"] and doc["log"]["stream"] == "stdout"


def test_from_bytes_to_documents() -> None:
    """The whole pure path: bytes as dockerd writes them -> splitter -> joiner -> documents."""
    big = b'{"level":50,"time":1790000000500,"msg":"' + b"s" * 40000 + b'"}'
    blob = (docker_record(PINO + b"\n", "stdout", RT_NS) + b"".join(docker_pieces(big, "stderr", RT_NS))
            + cri_record(b"not docker", "stdout", "F", RT_NS))
    sp = LineSplitter(0, 200_000)
    j = ContainerJoiner("docker", 1024 * 1024)
    evs: list[ContainerEvent] = []
    for ln in sp.feed(blob):
        evs += j.feed(ln, 0.0)
    got = pairs(builder(format="docker"), evs)
    assert [d["log"]["offset"] for _a, d in got] == [0, len(docker_record(PINO + b"\n", "stdout", RT_NS)),
                                                     len(blob) - len(cri_record(b"not docker", "stdout", "F", RT_NS))]
    assert got[1][1]["log"]["level"] == "error" and len(got[1][1]["msg"]) == 40000
    assert got[1][1]["log"]["stream"] == "stderr"
    assert got[2][1]["log"]["flags"] == ["docker_parse_failed"]


# ------------------------------------------------------------------ the splice equals to_doc

CONTAINER_CONFIGS = [dict(c, format="docker") for c in CONFIGS] + [
    {"format": "cri", "index": "k8s-{kubernetes.namespace}-%Y.%m"},      # reads an added field: never spliced
    {"format": "cri", "fields": {"kubernetes": {"cluster": "eu-1"}}},
    {"format": "auto", "fields": {"container": "x"}},
    {"format": "cri", "index": "static"},
]


def both_container(b: DocBuilder, events: list[ContainerEvent], path: str = LINK) -> tuple[list[bytes], list[bytes]]:
    """(spliced: C or Python per the fixture, to_doc + full serialisation)"""
    fast: list[bytes] = []
    slow: list[bytes] = []
    assert b.build_container("inc1", path, events, NOW, fast) == sum(map(len, fast))
    saved = b.containers.reserved, b.containers.native
    b.containers.reserved = b.containers.native = None
    try:
        assert b.build_container("inc1", path, events, NOW, slow) == sum(map(len, slow))
    finally:
        b.containers.reserved, b.containers.native = saved
    return fast, slow


def _container_events(lines: list[bytes]) -> list[ContainerEvent]:
    out: list[ContainerEvent] = []
    pos = 0
    for i, ln in enumerate(lines):
        attrs = {"tag": "web"} if i % 7 == 3 else None
        out.append((pos, pos + len(ln) + 60, ln, 0, ("stdout", "stderr")[i % 2], f"2026-12-01T10:00:{i % 60:02d}.5Z",
                    attrs))
        pos += len(ln) + 60
    return out


@pytest.mark.parametrize("cfg", CONTAINER_CONFIGS, ids=lambda c: orjson.dumps(c).decode())
def test_container_corpus_spliced_equals_to_doc(cfg: dict[str, Any]) -> None:
    b = builder(**cfg)
    fast, slow = both_container(b, _container_events(CORPUS))
    assert_same(fast, slow)
    fast, slow = both_container(b, _container_events(CORPUS), path="/var/log/app/app.log")
    assert_same(fast, slow)


def test_the_container_splice_is_taken(build_path: str) -> None:
    b = builder(format="docker")
    assert b.containers.reserved is not None
    assert (b.containers.native is not None) == (build_path == "native")
    spaced = b'{"level": 30, "time": 1790000000123, "msg": "x"}'
    out: list[bytes] = []
    b.build_container("inc1", LINK, [ev(spaced), ev(spaced, stream="stderr", start=300)], NOW, out)
    assert all((b'"level": 30' in p) == (build_path == "native") for p in out)    # C passes the line through
    assert [orjson.loads(p.split(b"\n")[1])["log"]["stream"] for p in out] == ["stdout", "stderr"]
    assert builder(format="cri", index="k8s-{kubernetes.namespace}").containers.reserved is None
    assert builder(format="cri", drop_fields=("pid",)).containers.reserved is None
    [(action, _doc)] = pairs(builder(format="cri", index="k8s-{kubernetes.namespace}"), [ev(PINO)])
    assert action["create"]["_index"] == "k8s-shop"


@settings(max_examples=200, deadline=None)
@given(obj=st.dictionaries(_keys | st.sampled_from(["kubernetes", "container", "docker", "stream"]), _values,
                           max_size=6),
       style=st.integers(0, 2), cfg=st.sampled_from(CONTAINER_CONFIGS),
       t=st.sampled_from([RT, "0001-01-01T00:00:00Z", "", "2026-12-01T11:00:00.25+01:00"]))
def test_random_json_in_records_spliced_equals_to_doc(obj: dict[str, Any], style: int, cfg: dict[str, Any],
                                                      t: str) -> None:
    line = _render(obj, style, None)
    fast, slow = both_container(builder(**cfg), [(5, 90, line, 0, "stderr", t, None)])
    assert_same(fast, slow)
