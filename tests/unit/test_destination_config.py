"""Destination settings: Elastic Cloud ids, API keys in both forms, data streams, index_template,
and the data-stream action line on both build paths (C and Python)."""

from __future__ import annotations

import base64

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shipper.config import DataStreamConfig, decode_cloud_id, load_config_text
from shipper.errors import ConfigError
from shipper.parse import document
from shipper.parse.document import DocBuilder
from shipper.ship import batching, bulk
from shipper.ship.client import api_key_header
from tests.support.native import c_function

# The example id of Elastic's own documentation (deployment "staging"):
DOC_ID = ("staging:dXMtZWFzdC0xLmF3cy5mb3VuZC5pbyRjZWM2ZjI2MWE3NGJmMjRjZTMzYmI4ODExYjg0Mjk0ZiRjNmMyY2E2ZDA0MjI0OWFmMGN"
          "jN2Q3YTllOTYyNTc0Mw==")


def _b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


@pytest.mark.parametrize("cloud_id, url", [
    (DOC_ID, "https://cec6f261a74bf24ce33bb8811b84294f.us-east-1.aws.found.io:443"),
    # a port on the host part: Azure and GCP deployments (Kibana's docs show this form)
    ("my-deployment:" + _b64("eastus2.azure.elastic-cloud.com:9243$59ef636c6917463db140321484d63cfa"
                             "$a8b109c08adc43279ef48f29af1a3911"),
     "https://59ef636c6917463db140321484d63cfa.eastus2.azure.elastic-cloud.com:9243"),
    # a port on the Elasticsearch part wins over the host's
    ("x:" + _b64("europe-west1.gcp.cloud.es.io:443$0123456789abcdef0123456789abcdef:9243$kb"),
     "https://0123456789abcdef0123456789abcdef.europe-west1.gcp.cloud.es.io:9243"),
    # no label; no Kibana part; base64 without its padding
    (_b64("us-central1.gcp.cloud.es.io$aaaabbbbccccdddd").rstrip("="),
     "https://aaaabbbbccccdddd.us-central1.gcp.cloud.es.io:443"),
    # a label with a colon in it: everything before the last `:` is the label
    ("prod:eu:" + _b64("eu-west-1.aws.found.io$abc$def"), "https://abc.eu-west-1.aws.found.io:443"),
])
def test_cloud_id_decodes_to_the_https_host(cloud_id: str, url: str) -> None:
    assert decode_cloud_id(cloud_id) == url
    c = load_config_text(f"output:\n  elasticsearch:\n    cloud_id: '{cloud_id}'\n")
    assert c.output.hosts == (url,) and c.output.cloud_id == cloud_id


@pytest.mark.parametrize("cloud_id, words", [
    ("staging:not base64!", "not a cloud id"),
    ("x:" + _b64("only-a-host"), "host$elasticsearch_id"),
    ("x:" + _b64("host.example:99999$abc$def"), "invalid port"),
    ("x:" + _b64("bad host$abc$def"), "invalid host"),
])
def test_bad_cloud_ids_name_the_key(cloud_id: str, words: str) -> None:
    with pytest.raises(ConfigError) as e:
        load_config_text(f"output:\n  elasticsearch:\n    cloud_id: '{cloud_id}'\n")
    assert e.value.key == "output.elasticsearch.cloud_id" and words in e.value.message and e.value.line == 3


def test_cloud_id_with_hosts_is_refused() -> None:
    with pytest.raises(ConfigError) as e:
        load_config_text(f"output:\n  elasticsearch:\n    cloud_id: '{DOC_ID}'\n    hosts: ['https://x:9200']\n")
    assert e.value.key == "output.elasticsearch.cloud_id" and "not both" in e.value.message


def test_api_key_both_forms_give_the_same_header() -> None:
    key_id, key = "VuaCfGcBCdbkQm-e5aOx", "ui2lp2axTNmsyakw9tvNnw"
    encoded = base64.b64encode(f"{key_id}:{key}".encode()).decode()
    assert api_key_header(f"{key_id}:{key}") == f"ApiKey {encoded}"       # id:api_key, from the create answer
    assert api_key_header(encoded) == f"ApiKey {encoded}"                 # the `encoded` form, as it is
    assert api_key_header(f"ApiKey {encoded}") == f"ApiKey {encoded}"     # pasted with its scheme
    assert api_key_header(f"  {encoded}\n") == f"ApiKey {encoded}"


def test_data_stream_config() -> None:
    c = load_config_text("output:\n  elasticsearch:\n    data_stream: {dataset: myapp}\n")
    assert c.output.data_stream == DataStreamConfig("logs", "myapp", "default")
    assert c.output.index == "logs-myapp-default"
    c = load_config_text("output:\n  elasticsearch:\n"
                         "    data_stream: {type: logs, dataset: nginx.access, namespace: prod}\n")
    assert c.output.index == "logs-nginx.access-prod"
    assert load_config_text("output:\n  elasticsearch:\n    data_stream: {}\n").output.index == "logs-generic-default"


ES_ = "output:\n  elasticsearch:\n"


@pytest.mark.parametrize("yaml_text, key, words", [
    (ES_ + "    data_stream: {dataset: my-app}\n", "output.elasticsearch.data_stream.dataset", "no `-`"),
    (ES_ + "    data_stream: {namespace: Prod}\n", "output.elasticsearch.data_stream.namespace", "lower-case"),
    (ES_ + "    data_stream: {dataset: x, ilm: y}\n", "output.elasticsearch.data_stream.ilm", "unknown key"),
    (ES_ + "    index: 'x-%Y'\n    data_stream: {dataset: x}\n", "output.elasticsearch.index", "not both"),
    ("inputs: [{paths: ['/a.log'], index: 'logs-a-%Y.%m.%d'}]\noutput:\n  elasticsearch:\n    data_stream: {}\n",
     "inputs[0].index", "no strftime"),
    ("output:\n  elasticsearch:\n    index_template: sometimes\n", "output.elasticsearch.index_template", "auto, off"),
])
def test_destination_config_errors(yaml_text: str, key: str, words: str) -> None:
    with pytest.raises(ConfigError) as e:
        load_config_text(yaml_text)
    assert e.value.key == key and words in e.value.message, e.value


def test_index_template_modes() -> None:
    assert load_config_text("").output.index_template == "auto"
    assert load_config_text("output:\n  elasticsearch:\n    index_template: off\n").output.index_template == "off"
    assert load_config_text("output:\n  elasticsearch:\n    index_template: 'off'\n").output.index_template == "off"
    assert load_config_text("output:\n  elasticsearch:\n    index_template: auto\n").output.index_template == "auto"


@pytest.fixture(params=["native", "python"])
def build_path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setattr(document, "native_splice", c_function("splice") if request.param == "native" else None)
    return str(request.param)


def test_data_stream_action_lines_on_both_paths(build_path: str) -> None:
    c = load_config_text("inputs: [{paths: ['/a.log']}]\n" + ES_ + "    data_stream: {dataset: myapp}\n")
    b = DocBuilder(c.inputs[0], c.output.index, "h")
    assert (b.splice is not None) == (build_path == "native")       # the fast case stays fast
    lines = [b'{"level":30,"time":1790000000123,"msg":"pino","seq":1}', b"plain text", b'{"msg":"no time"}']
    events = [(i * 100, i * 100 + len(ln) + 1, ln, 0) for i, ln in enumerate(lines)]
    out: list[bytes] = []
    b.build("inc", "/a.log", events, 1_790_000_000.0, out)
    assert len(out) == 3
    for i, pair in enumerate(out):
        action, source = pair.rstrip(b"\n").split(b"\n")
        assert orjson.loads(action) == {"create": {"_index": "logs-myapp-default", "_id": f"inc-{i * 100}"}}
        assert "@timestamp" in orjson.loads(source)                    # a data stream requires it


def test_document_id_modes() -> None:
    assert load_config_text("").output.document_id == "auto"
    assert load_config_text("output:\n  elasticsearch:\n    document_id: none\n").output.document_id == "none"
    with pytest.raises(ConfigError) as e:
        load_config_text("output:\n  elasticsearch:\n    document_id: uuid\n")
    assert e.value.key == "output.elasticsearch.document_id" and "auto, none" in e.value.message


_INDEX_NAMES = st.text(st.sampled_from('ab-_.,":{}\\ _id'), min_size=1, max_size=20)
_DOC_TEXT = st.text(st.sampled_from('ab ,":{}\\_id\n\t\u00e9'), max_size=40)


@settings(max_examples=150, deadline=None)
@given(index=_INDEX_NAMES, texts=st.lists(_DOC_TEXT, min_size=1, max_size=6), with_time=st.booleans())
def test_without_ids_cuts_only_the_id_of_each_action_on_both_paths(
        index: str, texts: list[str], with_time: bool) -> None:
    """Whatever the index name (`{field}` puts user bytes there) and the documents hold (JSON lines
    whose last field is `"_id":"..."}}`), `document_id: none` removes the `_id` of each action and
    nothing else; bodies from both build paths, from grouping several parts and multi-pair parts."""
    c = load_config_text("inputs: [{paths: ['/a.log']}]\n")
    lines = []
    for i, t in enumerate(texts):
        obj = {"msg": t, "nested": {"x": 1, "_id": t}, "seq": i}
        if with_time:
            obj["time"] = 1_790_000_000_000 + i
        lines.append(orjson.dumps(obj) if i % 2 == 0 else t.replace("\n", " ").encode())
    events = [(i * 100, i * 100 + len(ln) + 1, ln, 0) for i, ln in enumerate(lines)]
    for native in (c_function("splice"), None):
        document.native_splice = native
        try:
            b = DocBuilder(c.inputs[0], index, "h")
            out: list[bytes] = []
            b.build("inc", "/a.log", events, 1_790_000_000.0, out)
        finally:
            document.native_splice = c_function("splice")
        for bodies in (batching.group(out, 1000, 10**6), batching.group(out, 2, 10**6),
                       batching.group([b"".join(out)], 1000, 10**6, {0: len(out)})):
            stripped = batching.group_without_ids(out, 1000, 10**6) if len(bodies) == 1 else None
            for body, n in bodies:
                cut = batching.without_ids(body)
                before, after = body.split(b"\n"), cut.split(b"\n")
                assert len(before) == len(after) == 2 * n + 1
                for k in range(0, 2 * n, 2):
                    meta = orjson.loads(before[k])["create"]
                    assert set(meta) == {"_index", "_id"}
                    assert orjson.loads(after[k]) == {"create": {"_index": meta["_index"]}}
                    assert after[k + 1] == before[k + 1]
            if stripped is not None:
                assert stripped == [(batching.without_ids(bodies[0][0]), bodies[0][1])]


def test_dead_letter_replays_follow_document_id() -> None:
    items = [{"index": "logs-x", "id": "inc-1", "document": b'{"a":1}'}]
    assert bulk.dead_letter_pairs(items) == [b'{"create":{"_index":"logs-x","_id":"inc-1"}}\n{"a":1}\n']
    assert bulk.dead_letter_pairs(items, with_ids=False) == [b'{"create":{"_index":"logs-x"}}\n{"a":1}\n']


# ---------------------------------------------------------------- credentials in the clear (SPEC, Trust boundaries)

def test_credentials_to_an_http_host_are_named_without_being_shown() -> None:
    from shipper.config import ElasticsearchConfig
    cfg = ElasticsearchConfig(hosts=("http://elastic:pw-in-url@10.0.0.5:9200", "https://es.example:9243"),
                              password="s3cret", host_proxies=(None, ("https_proxy", "http://px:proxy-pw@proxy:3128")))
    got = cfg.cleartext_credentials()
    assert got == [
        "credentials (password, the password in the URL) are sent unencrypted to http://10.0.0.5:9200: "
        "anyone on the way can read them; use https://",
        "the proxy's credentials (https_proxy) are sent unencrypted to http://proxy:3128 (proxies are reached over "
        "http://)"]
    assert not any(s in " ".join(got) for s in ("s3cret", "pw-in-url", "proxy-pw", "elastic", "px:"))


def test_no_warning_for_https_or_for_http_without_credentials() -> None:
    from shipper.config import ElasticsearchConfig
    assert ElasticsearchConfig(hosts=("https://es:9243",), api_key="k").cleartext_credentials() == []
    assert ElasticsearchConfig(hosts=("http://127.0.0.1:9200",)).cleartext_credentials() == []
    assert ElasticsearchConfig(hosts=("http://[::1]:9200",), api_key="k").cleartext_credentials() == [
        "credentials (api_key) are sent unencrypted to http://[::1]:9200: anyone on the way can read them; use https://"]
    assert ElasticsearchConfig(hosts=("https://es:9243",),
                               host_proxies=(("output.elasticsearch.proxy_url", "http://proxy:3128"),)
                               ).cleartext_credentials() == []
