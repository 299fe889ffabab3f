"""Which proxy a host is reached through: `proxy_url`, the environment as curl reads it, NO_PROXY."""

from __future__ import annotations

import base64

import pytest

from shipper.config import load_config_text
from shipper.errors import ConfigError
from shipper.ship.proxy import chosen_proxy, no_proxy_matches, parse_proxy, secrets_of


@pytest.mark.parametrize("host, no_proxy, exempt", [
    ("es.example.com", "example.com", True),            # a suffix match at a dot
    ("es.example.com", ".example.com", True),           # with a leading dot as well
    ("example.com", ".example.com", True),
    ("notexample.com", "example.com", False),           # not at a dot
    ("ES.Example.COM", "example.com", True),            # case does not matter
    ("es.example.com", "other.org, example.com", True),  # a list, spaces around
    ("es.example.com", "*", True),
    ("es.example.com", "*.example.com", False),         # curl: only `*` alone is a wildcard
    ("127.0.0.1", "", False),                           # loopback is proxied unless listed
    ("localhost", "", False),
    ("localhost", "localhost", True),
    ("127.0.0.1", "localhost", False),                  # names are not resolved
    ("127.0.0.1", "127.0.0.1", True),
    ("10.1.2.3", "10.0.0.0/8", True),                   # CIDR (curl 7.86+)
    ("10.1.2.3", "10.1.2.4", False),
    ("::1", "::1", True),
    ("[::1]", "[::1]", True),
    ("fd00::5", "fd00::/8", True),
    ("1.2.3.4", "2.3.4", False),                        # an address is not a name suffix
])
def test_no_proxy_as_curl_matches(host: str, no_proxy: str, exempt: bool) -> None:
    assert no_proxy_matches(host, no_proxy) is exempt


def test_the_environment_as_curl_reads_it() -> None:
    env = {"https_proxy": "http://lower:3128", "HTTPS_PROXY": "http://upper:3128", "HTTP_PROXY": "upper-http:8080"}
    assert chosen_proxy("https", "es", None, env) == ("https_proxy", "http://lower:3128")     # lower case wins
    assert chosen_proxy("http", "es", None, env) == ("HTTP_PROXY", "upper-http:8080")
    assert chosen_proxy("https", "es", None, {"HTTPS_PROXY": "http://u:1"}) == ("HTTPS_PROXY", "http://u:1")
    assert chosen_proxy("https", "es", None, {"https_proxy": " ", "HTTPS_PROXY": "http://u:1"}) == ("HTTPS_PROXY", "http://u:1")
    assert chosen_proxy("https", "es", None, {"http_proxy": "http://h:1"}) is None      # by the destination's scheme
    assert chosen_proxy("https", "es.corp", None, {**env, "no_proxy": "corp", "NO_PROXY": "*"}) is None
    assert chosen_proxy("https", "es.cloud", None, {**env, "no_proxy": "corp", "NO_PROXY": "*"}) is not None
    # proxy_url is for every host, and NO_PROXY still exempts
    assert chosen_proxy("http", "es", "http://p:1", {}) == ("output.elasticsearch.proxy_url", "http://p:1")
    assert chosen_proxy("https", "127.0.0.1", "http://p:1", env) == ("output.elasticsearch.proxy_url", "http://p:1")
    assert chosen_proxy("https", "127.0.0.1", "http://p:1", {"NO_PROXY": "127.0.0.1"}) is None


def test_parse_proxy() -> None:
    p = parse_proxy("http://alice:s%40cret@proxy.corp:3128", "k")
    assert (p.host, p.port, p.label) == ("proxy.corp", 3128, "http://proxy.corp:3128")
    assert p.authorization == "Basic " + base64.b64encode(b"alice:s@cret").decode()
    assert parse_proxy("proxy.corp:8080", "k").label == "http://proxy.corp:8080"      # no scheme: http
    assert parse_proxy("http://proxy.corp", "k").port == 1080                          # curl's default
    assert parse_proxy("http://[::1]:3128", "k").label == "http://[::1]:3128"
    assert b"CONNECT es.example:443 HTTP/1.1\r\nHost: es.example:443\r\nProxy-Authorization: Basic " in \
        p.connect_request("es.example", 443)
    assert secrets_of("http://alice:s%40cret@proxy.corp:3128")[0] == "s@cret"
    assert secrets_of("http://proxy.corp:3128") == []
    for bad, words in (("https://proxy.corp:443", "only http://"), ("socks5://p:1080", "only http://"),
                       ("http://p:99999", "port"), ("http://p:3128/path", "without a path")):
        with pytest.raises(ConfigError) as e:
            parse_proxy(bad, "output.elasticsearch.proxy_url")
        assert e.value.key == "output.elasticsearch.proxy_url" and words in e.value.message, e.value


def test_config_resolves_each_host_and_names_a_bad_key_or_variable() -> None:
    text = "output:\n  elasticsearch:\n    hosts: ['https://es.cloud:443', 'http://es.corp:9200']\n"
    c = load_config_text(text, env={"HTTPS_PROXY": "http://p:3128", "NO_PROXY": ".corp"})
    assert c.output.host_proxies == (("HTTPS_PROXY", "http://p:3128"), None)
    c = load_config_text(text + "    proxy_url: http://u:pw@q:8080\n", env={})
    assert c.output.proxy_url == "http://u:pw@q:8080"
    assert c.output.host_proxies == (("output.elasticsearch.proxy_url", "http://u:pw@q:8080"),) * 2
    with pytest.raises(ConfigError) as e:
        load_config_text(text + "    proxy_url: https://q:8080\n", env={})
    assert e.value.key == "output.elasticsearch.proxy_url" and e.value.line == 4
    with pytest.raises(ConfigError) as e:
        load_config_text(text, env={"https_proxy": "socks5h://q:1080"})
    assert e.value.key == "https_proxy (environment)" and "only http://" in e.value.message
