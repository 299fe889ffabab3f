"""config/docker-host.yaml and config/kubernetes-daemonset.yaml are valid and say what they claim:
the shipper config inside loads, the logs are mounted read-only, the state dir is on the host."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from shipper.config import load_config_text
from shipper.tail.discovery import is_excluded

REPO = Path(__file__).resolve().parents[2]
CID = "4c01db0b339c7a8a2a4f1b6e1e3d5a2f9c8b7a6d5e4f3c2b1a09988776655440"


def test_docker_host_config_loads() -> None:
    text = (REPO / "config/docker-host.yaml").read_text()
    cfg = load_config_text(text, "config/docker-host.yaml", env={"ES_URL": "https://es.example.com:9200"})
    [inp] = cfg.inputs
    assert inp.format == "docker" and inp.paths == ("/var/lib/docker/containers/*/*-json.log",)
    assert cfg.state_dir == "/var/lib/shipper"
    assert "-v /var/lib/docker/containers:/var/lib/docker/containers:ro" in text
    assert "-v shipper-state:/var/lib/shipper" in text


def manifest() -> dict[str, dict[str, Any]]:
    docs = [d for d in yaml.safe_load_all((REPO / "config/kubernetes-daemonset.yaml").read_text()) if d]
    return {d["kind"]: d for d in docs}


def test_daemonset_config_loads_and_excludes_only_itself() -> None:
    cm = manifest()["ConfigMap"]
    cfg = load_config_text(cm["data"]["shipper.yaml"], "configmap", env={"ES_URL": "https://es:9200", "ES_API_KEY": "k"})
    [inp] = cfg.inputs
    assert inp.format == "cri" and inp.paths == ("/var/log/containers/*.log",)
    assert is_excluded(f"/var/log/containers/shipper-x7k2p_logging_shipper-{CID}.log", inp.exclude)
    assert not is_excluded(f"/var/log/containers/checkout-1_shop_api-{CID}.log", inp.exclude)
    assert cfg.state_dir == "/var/lib/shipper" and cfg.metrics.listen == "127.0.0.1:9607"


def test_daemonset_mounts_logs_read_only_and_keeps_state_on_the_host() -> None:
    ds = manifest()["DaemonSet"]
    pod = ds["spec"]["template"]["spec"]
    [c] = pod["containers"]
    mounts = {m["name"]: m for m in c["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert mounts["varlog"] == {"name": "varlog", "mountPath": "/var/log", "readOnly": True}
    assert volumes["varlog"]["hostPath"]["path"] == "/var/log"
    assert mounts["state"]["mountPath"] == "/var/lib/shipper" and not mounts["state"].get("readOnly")
    assert volumes["state"]["hostPath"] == {"path": "/var/lib/shipper", "type": "DirectoryOrCreate"}
    assert pod["terminationGracePeriodSeconds"] > 10 and pod["hostNetwork"] is True
    assert c["securityContext"]["readOnlyRootFilesystem"] is True
    assert c["livenessProbe"]["httpGet"]["port"] == 9607
