"""shipper-setup against real files under a --root prefix, in-process and as a subprocess.

--root writes everything under the prefix and runs nothing, so these tests never touch the
machine. The decisions a real host needs (create the user, reload, restart only on change) are
driven through `install` with a `FakeHost` that answers like systemctl would.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import pytest
import yaml

from shipper.commands import setup
from shipper.commands.setup import CommandResult, ServiceUser, SetupError, SetupOptions, main
from shipper.config import LOGSENE_RECEIVER, LOGSENE_RECEIVER_EU, load_config

REPO = Path(__file__).resolve().parents[2]
TOKEN = "0f3c9a7e-1b2d-4c5e-8f90-a1b2c3d4e5f6"
OTHER_TOKEN = "9a8b7c6d-0000-4c5e-8f90-a1b2c3d4e5f6"
GLOB = "/var/log/**/*.log"
CONFIG = "/etc/shipper/shipper.yaml"
UNIT = "/etc/systemd/system/shipper.service"
JOB = "/etc/init/shipper.conf"


def under(root: Path, real: str) -> Path:
    return root / real.lstrip("/")


def mode(path: Path) -> int:
    return path.stat().st_mode & 0o777


def run_setup(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    assert TOKEN not in out + err and OTHER_TOKEN not in out + err, "the token was printed in full"
    return code, out, err


def test_root_install_writes_config_state_dir_and_unit(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run_setup(capsys, "--root", str(tmp_path), "--init", "systemd", "--no-start", TOKEN, GLOB)
    assert code == 0, err

    config = under(tmp_path, CONFIG)
    assert mode(config) == 0o600
    data = yaml.safe_load(config.read_text())
    assert data["output"]["elasticsearch"]["index"] == TOKEN
    assert data["output"]["elasticsearch"]["hosts"] == [LOGSENE_RECEIVER]
    assert data["inputs"] == [{"paths": [GLOB], "exclude": ["*.gz"]}]
    assert data["state_dir"] == "/var/lib/shipper"
    assert data["metrics"]["listen"] == "127.0.0.1:9607"
    cfg = load_config(str(config), env={})  # what the daemon will read
    assert cfg.output.index == TOKEN and cfg.state_dir == "/var/lib/shipper"

    state = under(tmp_path, "/var/lib/shipper")
    assert state.is_dir() and mode(state) == 0o700      # SPEC: "The state dir, when shipper creates it, is mode 0700"
    assert (state / ".shipper-state-dir").is_file()

    unit = under(tmp_path, UNIT)
    assert mode(unit) == 0o644
    text = unit.read_text()
    assert f"run -c {CONFIG}\n" in text and "ReadWritePaths=/var/lib/shipper\n" in text
    assert str(tmp_path) not in text and str(tmp_path) not in config.read_text()
    exec_start = next(l for l in text.splitlines() if l.startswith("ExecStart="))
    assert os.access(exec_start.split("=", 1)[1].split()[0], os.X_OK), exec_start
    assert not under(tmp_path, JOB).exists()

    assert "0f3c…" in out
    assert "useradd --system" in out and "--groups adm shipper" in out
    assert "systemctl enable shipper.service" in out and "--now" not in out
    assert "shipper status" in out and "journalctl -u shipper" in out


def test_subprocess_entry_point(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "shipper.commands.setup", "--root", str(tmp_path), "--init", "systemd",
         "--no-start", TOKEN, GLOB],
        cwd=REPO, capture_output=True, text=True, timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert TOKEN not in done.stdout + done.stderr
    assert mode(under(tmp_path, CONFIG)) == 0o600
    assert under(tmp_path, UNIT).exists()
    bad = subprocess.run([sys.executable, "-m", "shipper.commands.setup", "--root", str(tmp_path), TOKEN],
                         cwd=REPO, capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2, bad.stderr


def test_rerun_with_the_same_arguments_changes_nothing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = ("--root", str(tmp_path), "--init", "systemd", "--no-start", TOKEN, GLOB)
    assert run_setup(capsys, *args)[0] == 0
    files = [under(tmp_path, p) for p in (CONFIG, UNIT, "/var/lib/shipper")]
    before = [(f.stat().st_mtime_ns, f.stat().st_ino) for f in files]
    code, out, _ = run_setup(capsys, *args)
    assert code == 0
    assert "nothing changed" in out
    assert [(f.stat().st_mtime_ns, f.stat().st_ino) for f in files] == before
    assert not under(tmp_path, CONFIG + ".bak").exists()


def test_a_different_config_is_refused_without_force_and_kept_as_bak_with_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    base = ("--root", str(tmp_path), "--init", "systemd", "--no-start")
    assert run_setup(capsys, *base, TOKEN, GLOB)[0] == 0
    config = under(tmp_path, CONFIG)
    original = config.read_text()

    code, out, err = run_setup(capsys, *base, OTHER_TOKEN, GLOB)
    assert code == 1
    assert "--force" in err
    assert config.read_text() == original
    assert not under(tmp_path, CONFIG + ".bak").exists()

    code, out, err = run_setup(capsys, *base, "--force", OTHER_TOKEN, GLOB)
    assert code == 0, err
    backup = under(tmp_path, CONFIG + ".bak")
    assert backup.read_text() == original
    assert mode(backup) == 0o600 and mode(config) == 0o600
    assert yaml.safe_load(config.read_text())["output"]["elasticsearch"]["index"] == OTHER_TOKEN
    assert ".bak" in out


def test_region_and_receiver(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    def hosts(root: Path) -> list[str]:
        return yaml.safe_load(under(root, CONFIG).read_text())["output"]["elasticsearch"]["hosts"]

    assert run_setup(capsys, "--root", str(tmp_path / "eu"), "--init", "none", "--region", "eu", TOKEN, GLOB)[0] == 0
    assert hosts(tmp_path / "eu") == [LOGSENE_RECEIVER_EU]
    assert run_setup(capsys, "--root", str(tmp_path / "us"), "--init", "none", "--region", "us", TOKEN, GLOB)[0] == 0
    assert hosts(tmp_path / "us") == [LOGSENE_RECEIVER]
    own = "https://es.example.internal:9200"
    assert run_setup(capsys, "--root", str(tmp_path / "own"), "--init", "none", "--receiver", own + "/", TOKEN, GLOB)[0] == 0
    assert hosts(tmp_path / "own") == [own]


def test_custom_config_and_state_paths_are_named_in_the_unit(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run_setup(capsys, "--root", str(tmp_path), "--init", "systemd", "--no-start",
                             "--config", "/opt/shipper/etc/s.yaml", "--state-dir", "/srv/shipper",
                             TOKEN, "/srv/app/*.log", "/home/app/logs/*.log")
    assert code == 0, err
    text = under(tmp_path, UNIT).read_text()
    assert "run -c /opt/shipper/etc/s.yaml\n" in text
    assert "ReadWritePaths=/srv/shipper\n" in text
    assert "ProtectHome=read-only\n" in text  # an input lives under /home
    data = yaml.safe_load(under(tmp_path, "/opt/shipper/etc/s.yaml").read_text())
    assert data["state_dir"] == "/srv/shipper"
    assert data["inputs"][0]["paths"] == ["/srv/app/*.log", "/home/app/logs/*.log"]
    assert mode(under(tmp_path, "/srv/shipper")) == 0o700


def test_upstart_writes_the_job(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run_setup(capsys, "--root", str(tmp_path), "--init", "upstart", TOKEN, GLOB)
    assert code == 0, err
    job = under(tmp_path, JOB)
    assert mode(job) == 0o644
    text = job.read_text()
    assert "setuid shipper\n" in text and "start on runlevel [2345]\n" in text
    assert f"run -c {CONFIG}\n" in text and str(tmp_path) not in text
    assert not under(tmp_path, UNIT).exists()
    assert "initctl start shipper" in out


def test_init_none_says_how_to_start(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run_setup(capsys, "--root", str(tmp_path), "--init", "none", TOKEN, GLOB)
    assert code == 0, err
    assert f"run -c {CONFIG}" in out
    assert not (tmp_path / "etc/systemd").exists() and not (tmp_path / "etc/init").exists()
    assert mode(under(tmp_path, CONFIG)) == 0o600


@pytest.mark.parametrize(
    ("marker", "expected"),
    [(None, "none"), ("lib/systemd/systemd", "systemd"), ("sbin/initctl", "upstart")],
)
def test_init_auto_looks_at_the_root(tmp_path: Path, marker: str | None, expected: str) -> None:
    if marker:
        (tmp_path / marker).parent.mkdir(parents=True)
        (tmp_path / marker).write_text("")
    assert setup.detect_init(tmp_path) == expected


def test_uninstall_removes_the_unit_and_keeps_config_and_state(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert run_setup(capsys, "--root", str(tmp_path), "--init", "systemd", "--no-start", TOKEN, GLOB)[0] == 0
    wants = under(tmp_path, "/etc/systemd/system/multi-user.target.wants/shipper.service")
    wants.parent.mkdir(parents=True)
    wants.symlink_to(UNIT)  # what `systemctl enable` leaves

    code, out, err = run_setup(capsys, "--root", str(tmp_path), "--uninstall")
    assert code == 0, err
    assert not under(tmp_path, UNIT).exists() and not wants.is_symlink()
    assert under(tmp_path, CONFIG).exists() and under(tmp_path, "/var/lib/shipper").is_dir()
    assert "systemctl disable --now shipper.service" in out and "--purge" in out

    code, out, _ = run_setup(capsys, "--root", str(tmp_path), "--uninstall")
    assert code == 0 and "nothing changed" in out

    (under(tmp_path, "/var/lib/shipper") / "spool.db").write_text("x")
    code, out, err = run_setup(capsys, "--root", str(tmp_path), "--uninstall", "--purge")
    assert code == 0, err
    assert not under(tmp_path, CONFIG).exists() and not under(tmp_path, "/var/lib/shipper").exists()
    assert not under(tmp_path, "/etc/shipper").exists()


def test_uninstall_removes_an_upstart_job(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert run_setup(capsys, "--root", str(tmp_path), "--init", "upstart", TOKEN, GLOB)[0] == 0
    code, out, _ = run_setup(capsys, "--root", str(tmp_path), "--uninstall")
    assert code == 0
    assert not under(tmp_path, JOB).exists() and "initctl stop shipper" in out


@pytest.mark.parametrize(
    "argv",
    [
        [],
        [TOKEN],
        [TOKEN, "var/log/*.log"],
        [TOKEN, "./app.log"],
        ["Not A Token", GLOB],
        [TOKEN, GLOB, "--config", "shipper.yaml"],
        [TOKEN, GLOB, "--state-dir", "state"],
        [TOKEN, GLOB, "--config", "/etc/ship per.yaml"],
        [TOKEN, GLOB, "--init", "sysv"],
        [TOKEN, GLOB, "--region", "ap"],
        [TOKEN, GLOB, "--region", "eu", "--receiver", "https://x.example"],
        [TOKEN, GLOB, "--receiver", "ftp://x.example"],
        [TOKEN, GLOB, "--purge"],
        ["--uninstall", TOKEN],
        [TOKEN, GLOB, "--bogus"],
    ],
)
def test_bad_usage_exits_2_and_writes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str]
) -> None:
    code, _, err = run_setup(capsys, "--root", str(tmp_path), "--init", "systemd", *argv)
    assert code == 2, err
    assert err.strip()
    assert not (tmp_path / "etc").exists()


# ---------------------------------------------------------------- a real host's decisions

class FakeHost:
    """Answers like a systemd host: a user appears after useradd, a unit is active after enable --now."""

    is_dry_run = False

    def __init__(self, *, has_user: bool = False, failing: Sequence[str] = (), check_rc: int = 0) -> None:
        self.planned: list[str] = []
        self.commands: list[list[str]] = []
        self.user = ServiceUser(os.getuid(), os.getgid(), frozenset({"shipper", "adm"})) if has_user else None
        self.is_enabled = False
        self.is_active = False
        self.failing = set(failing)
        self.check_rc = check_rc

    def run(self, argv: Sequence[str]) -> CommandResult:
        argv = list(argv)
        self.commands.append(argv)
        words = " ".join(argv)
        if any(words.startswith(f) for f in self.failing):
            return CommandResult(1, "Failed: simulated")
        if argv[0] == "useradd":
            self.user = ServiceUser(os.getuid(), os.getgid(), frozenset({"shipper", "adm"}))
        elif argv[:2] == ["systemctl", "is-enabled"]:
            return CommandResult(0 if self.is_enabled else 1, "")
        elif argv[:2] == ["systemctl", "is-active"]:
            return CommandResult(0 if self.is_active else 3, "")
        elif argv[:3] == ["systemctl", "enable", "--now"]:
            self.is_enabled = self.is_active = True
        elif "check" in argv:
            return CommandResult(self.check_rc, f"config ok, index {TOKEN}, output unreachable")
        return CommandResult(0, "")

    def lookup_user(self, name: str) -> ServiceUser | None:
        return self.user

    def systemd_is_running(self) -> bool:
        return True

    def systemctl(self) -> list[str]:
        return [" ".join(c[1:]) for c in self.commands if c[0] == "systemctl"]


def options(token: str = TOKEN, **overrides: object) -> SetupOptions:
    values: dict[str, object] = dict(
        token=token, globs=(GLOB,), receiver=LOGSENE_RECEIVER, config_path=CONFIG,
        state_dir="/var/lib/shipper", init="systemd", should_start=True, is_forced=False,
        executable=setup.find_executable(),
    )
    values.update(overrides)
    return SetupOptions(**values)  # type: ignore[arg-type]


def test_real_host_creates_the_user_then_reloads_enables_starts_and_checks(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    host = FakeHost()
    code, report = setup.install(options(), host, tmp_path)
    assert code == 0
    useradd = next(c for c in host.commands if c[0] == "useradd")
    assert useradd[-1] == "shipper" and "--system" in useradd and "adm" in useradd
    assert host.systemctl() == ["daemon-reload", "is-enabled --quiet shipper.service",
                                "is-active --quiet shipper.service", "enable --now shipper.service"]
    assert host.commands.index(useradd) < 2, "the user exists before files are given to it"
    assert any("check" in c and CONFIG in c for c in host.commands)
    assert "enabled and started shipper.service" in report.changes
    out = capsys.readouterr().out
    assert "output unreachable" in out and TOKEN not in out  # check's output, token masked

    # Same arguments again: no reload, no restart, no enable; nothing reported as changed.
    host.commands.clear()
    code, report = setup.install(options(), host, tmp_path)
    assert code == 0 and report.changes == []
    assert host.systemctl() == ["is-enabled --quiet shipper.service", "is-active --quiet shipper.service"]
    assert not any(c[0] in ("useradd", "usermod") for c in host.commands)

    # A new token with --force restarts the running service; the unit is unchanged, so no reload.
    host.commands.clear()
    code, report = setup.install(options(OTHER_TOKEN, is_forced=True), host, tmp_path)
    assert code == 0
    assert "restart shipper.service" in host.systemctl() and "daemon-reload" not in host.systemctl()


def test_real_host_no_start_enables_at_boot_only(tmp_path: Path) -> None:
    host = FakeHost(has_user=True)
    setup.install(options(should_start=False), host, tmp_path)
    assert "enable shipper.service" in host.systemctl()
    assert not any("--now" in c or "check" in c for c in host.commands)


def test_real_host_failure_to_start_is_exit_1(tmp_path: Path) -> None:
    host = FakeHost(has_user=True, failing=["systemctl enable"])
    with pytest.raises(SetupError, match="starting the service failed"):
        setup.install(options(), host, tmp_path)


def test_real_host_failing_check_is_reported_not_fatal(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    host = FakeHost(has_user=True, check_rc=1)
    code, _ = setup.install(options(), host, tmp_path)
    assert code == 0
    assert "shipper check reported a problem (exit 1)" in capsys.readouterr().out


# ---------------------------------------------------------------- --journald

def test_journald_writes_a_journald_input_and_the_unit_may_read_the_journal(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run_setup(capsys, "--root", str(tmp_path), "--init", "systemd", "--no-start", TOKEN, GLOB,
                               "--journald", "app.service", "web")
    assert code == 0, err
    data = yaml.safe_load(under(tmp_path, CONFIG).read_text())
    assert data["inputs"] == [{"paths": [GLOB], "exclude": ["*.gz"]}, {"journald": {"units": ["app.service", "web"]}}]
    cfg = load_config(str(under(tmp_path, CONFIG)), env={})
    assert cfg.inputs[1].journald is not None and cfg.inputs[1].journald.units == ("app.service", "web")
    assert cfg.inputs[1].journald.directory is None                     # the system journal
    assert "SupplementaryGroups=adm systemd-journal\n" in under(tmp_path, UNIT).read_text()
    assert "--groups adm,systemd-journal shipper" in out and "journald:  app.service, web" in out


def test_journald_alone_reads_every_unit(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run_setup(capsys, "--root", str(tmp_path), "--init", "systemd", "--no-start", TOKEN, "--journald")
    assert code == 0, err
    assert yaml.safe_load(under(tmp_path, CONFIG).read_text())["inputs"] == [{"journald": {"units": []}}]


def test_without_journald_the_unit_keeps_only_the_log_group(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert run_setup(capsys, "--root", str(tmp_path), "--init", "systemd", "--no-start", TOKEN, GLOB)[0] == 0
    text = under(tmp_path, UNIT).read_text()
    assert "SupplementaryGroups=adm\n" in text and "systemd-journal" not in text


@pytest.mark.parametrize("argv", [[TOKEN, "--journald", "bad unit"], [TOKEN, "--journald", "a/b.service"],
                                  ["--uninstall", "--journald"]])
def test_journald_bad_usage_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str]) -> None:
    code, _, err = run_setup(capsys, "--root", str(tmp_path), "--init", "systemd", *argv)
    assert code == 2 and err.strip()
    assert not (tmp_path / "etc").exists()


def test_real_host_adds_an_existing_user_to_the_journal_group(tmp_path: Path) -> None:
    host = FakeHost(has_user=True)
    code, report = setup.install(options(journald_units=("app.service",)), host, tmp_path)
    assert code == 0
    assert ["usermod", "--append", "--groups", "systemd-journal", "shipper"] in host.commands
    assert "added shipper to group systemd-journal" in report.changes


def test_the_summary_never_prints_a_receivers_password(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run_setup(capsys, "--root", str(tmp_path), "--init", "none", "--receiver",
                               "https://elastic:Rc-s3cret@es.example:9243", TOKEN, GLOB)
    assert code == 0, err
    assert "Rc-s3cret" not in out + err and "receiver https://es.example:9243" in out


# ---------------------------------------------------------------- whose directory --state-dir is (SPEC, Trust boundaries)

def test_state_dir_must_be_new_or_shippers(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    lib = under(tmp_path, "/var/lib")
    (lib / "dpkg").mkdir(parents=True)
    (lib / "dpkg" / "status").write_text("precious")
    for state, words in (("/var/lib", "is an existing directory that shipper did not make"),
                         ("/var", "is a system directory"), ("/", "is the root directory (/)")):
        code, out, err = run_setup(capsys, "--root", str(tmp_path), "--init", "systemd", "--no-start",
                                   "--state-dir", state, TOKEN, GLOB)
        assert code in (1, 2) and words in err, (state, err)      # 2: the config it would write is invalid
        assert "chown" not in out and not under(tmp_path, CONFIG).exists() and not under(tmp_path, UNIT).exists()
    assert (lib / "dpkg" / "status").read_text() == "precious" and mode(lib) != 0o700


@pytest.mark.parametrize("contents", [(), ("lock", "spool/cache.db", "status.json")])
def test_an_empty_directory_or_an_older_state_dir_is_taken_and_marked(tmp_path: Path, contents: tuple[str, ...],
                                                                      capsys: pytest.CaptureFixture[str]) -> None:
    state = under(tmp_path, "/srv/state")
    state.mkdir(parents=True)
    for name in contents:
        (state / name).parent.mkdir(parents=True, exist_ok=True)
        (state / name).write_text("x")
    code, _out, err = run_setup(capsys, "--root", str(tmp_path), "--init", "none", "--state-dir", "/srv/state",
                                TOKEN, GLOB)
    assert code == 0, err
    assert (state / ".shipper-state-dir").is_file() and all((state / n).exists() for n in contents)


def test_purge_removes_only_a_directory_shipper_made(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert run_setup(capsys, "--root", str(tmp_path), "--init", "systemd", "--no-start", TOKEN, GLOB)[0] == 0
    config = under(tmp_path, CONFIG)
    data = yaml.safe_load(config.read_text())
    data["state_dir"] = "/srv/data"                      # edited by hand to a directory that is not shipper's
    config.write_text(yaml.safe_dump(data))
    other = under(tmp_path, "/srv/data")
    other.mkdir(parents=True)
    (other / "db.sqlite").write_text("precious")
    code, _out, err = run_setup(capsys, "--root", str(tmp_path), "--uninstall", "--purge")
    assert code == 1 and "refusing to delete /srv/data: shipper did not make it" in err, err
    assert (other / "db.sqlite").read_text() == "precious" and config.exists() and under(tmp_path, UNIT).exists()
    (other / ".shipper-state-dir").write_text("")        # now it says it is shipper's
    code, _out, err = run_setup(capsys, "--root", str(tmp_path), "--uninstall", "--purge")
    assert code == 0 and not other.exists() and not config.exists(), err


def test_a_python_under_a_home_directory_is_warned_of(tmp_path: Path) -> None:
    """Found trying main as a user: a venv in /opt made with pyenv's Python (/root/.pyenv/...) has
    bin/python3 -> a file under /root; the unit's ProtectHome hides it (and the shipper user cannot
    read /root), so the service cannot start. shipper-setup judged only the `shipper` script's own
    path (/opt/...) and said nothing. The interpreter its #! line names, links resolved, is judged too."""
    venv = tmp_path / "opt" / "shipper" / "bin"
    venv.mkdir(parents=True)
    os.symlink("/root/.pyenv/versions/3.11.7/bin/python3.11", venv / "python3")
    script = venv / "shipper"
    script.write_text(f"#!{venv / 'python3'}\n# -*- coding: utf-8 -*-\nimport sys\n")
    script.chmod(0o755)
    code, report = setup.install(options(executable=str(script)), FakeHost(has_user=True), tmp_path / "root")
    assert code == 0
    [note] = [n for n in report.notes if "home directory" in n]
    assert "/root/.pyenv/versions/3.11.7/bin/python3.11" in note and "ProtectHome" in note
    # a venv made from the system's Python: no such warning
    os.remove(venv / "python3")
    os.symlink("/usr/bin/python3", venv / "python3")
    code, report = setup.install(options(executable=str(script), is_forced=True), FakeHost(has_user=True),
                                 tmp_path / "root2")
    assert code == 0 and not [n for n in report.notes if "home directory" in n]
