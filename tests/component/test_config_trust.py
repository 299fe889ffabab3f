"""What root refuses to load (SPEC, Trust boundaries), through the real command line: a config
file other users may write (exit 2 naming the file and its mode, unless
--allow-insecure-config), and a `state_dir` that is a file, `/` or a top-level system directory
(exit 2 naming the key; b19ade4 took `/` and crashed with a traceback, exit 1, on a file)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.daemon import REPO_ROOT, write_config

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the refusal is root's: needs root")


def shipper(*args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT))
    return subprocess.run([sys.executable, "-m", "shipper", *args], capture_output=True, text=True, timeout=60,
                          env=env, check=False)


def config(tmp_path: Path, state_dir: str | Path | None = None) -> Path:
    cfg = write_config(tmp_path, es_url="http://127.0.0.1:9", paths=str(tmp_path / "*.log"), state_dir=state_dir,
                       extra_yaml={"metrics": {"listen": None}})
    os.chmod(cfg, 0o644)
    return cfg


@pytest.mark.parametrize("mode, commands", [
    (0o666, (["check"], ["status"], ["run"], ["dlq", "list"], ["template", "--print"], ["state", "check"])),
    (0o646, (["check"],)), (0o664, (["run"],)), (0o620, (["status"],)),
])
def test_root_refuses_a_config_others_may_write(tmp_path: Path, mode: int, commands: tuple[list[str], ...]) -> None:
    cfg = config(tmp_path)
    os.chmod(cfg, mode)
    for command in commands:
        p = shipper(*command, "-c", str(cfg))
        assert p.returncode == 2, (command, p.stdout, p.stderr)
        assert f"config file {cfg} is writable by users other than its owner (mode {mode:04o})" in p.stderr, p.stderr
        assert "Traceback" not in p.stderr
    p = shipper("check", "-c", str(cfg), "--allow-insecure-config")
    assert p.returncode != 2 and f"config: {cfg}: valid" in p.stdout, p.stdout + p.stderr


def test_root_loads_a_config_only_its_owner_may_write(tmp_path: Path) -> None:
    cfg = config(tmp_path)
    for mode in (0o600, 0o644, 0o640):
        os.chmod(cfg, mode)
        p = shipper("check", "-c", str(cfg))
        assert f"config: {cfg}: valid" in p.stdout, (mode, p.stdout, p.stderr)


@pytest.mark.parametrize("state_dir, words", [
    ("/", "is the root directory (/)"),
    ("/var", "is a system directory (/var)"),
    ("/etc/", "is a system directory (/etc)"),
    ("/usr/../tmp", "is a system directory (/tmp)"),
])
def test_state_dir_may_not_be_root_or_a_system_directory(tmp_path: Path, state_dir: str, words: str) -> None:
    p = shipper("check", "-c", str(config(tmp_path, state_dir)))
    assert p.returncode == 2 and "config error: state_dir:" in p.stderr and words in p.stderr, p.stderr


def test_state_dir_may_not_lead_to_a_system_directory(tmp_path: Path) -> None:
    (tmp_path / "state").symlink_to("/etc")
    p = shipper("check", "-c", str(config(tmp_path, tmp_path / "state")))
    assert p.returncode == 2 and "config error: state_dir: is a system directory (/etc)" in p.stderr, p.stderr


def test_a_file_as_state_dir_is_a_config_error(tmp_path: Path) -> None:
    (tmp_path / "state").write_text("not a directory")
    cfg = config(tmp_path, tmp_path / "state")
    for command in (["check"], ["run"]):
        p = shipper(*command, "-c", str(cfg))
        assert p.returncode == 2 and "Traceback" not in p.stderr, (command, p.stderr)
        assert f"config error: state_dir: {tmp_path / 'state'} exists and is not a directory" in p.stderr, p.stderr
    assert (tmp_path / "state").read_text() == "not a directory"


def test_a_directory_or_nothing_is_a_state_dir(tmp_path: Path) -> None:
    for state in (tmp_path / "absent", tmp_path):
        p = shipper("check", "-c", str(config(tmp_path, state)))
        assert "config error" not in p.stderr and f"state_dir: {state}: writable" in p.stdout, p.stdout + p.stderr
