"""Where shipper-setup's commands run and users live: `SystemHost` runs them, `DryRunHost`
(--root, i.e. images and tests) only records them in `planned`.
"""

from __future__ import annotations

import grp
import pwd
import shlex
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol


@dataclass(frozen=True, slots=True)
class CommandResult:
    returncode: int
    output: str


@dataclass(frozen=True, slots=True)
class ServiceUser:
    uid: int
    gid: int
    groups: frozenset[str]


class Host(Protocol):
    """Where commands run and users live. `is_dry_run` hosts record instead of acting."""

    is_dry_run: bool
    planned: list[str]

    def run(self, argv: Sequence[str]) -> CommandResult: ...

    def lookup_user(self, name: str) -> ServiceUser | None: ...

    def systemd_is_running(self) -> bool: ...


class SystemHost:
    """The machine we run on: commands really run."""

    is_dry_run = False

    def __init__(self) -> None:
        self.planned: list[str] = []

    def run(self, argv: Sequence[str]) -> CommandResult:
        try:
            done = subprocess.run(list(argv), capture_output=True, text=True, timeout=120, check=False)
        except FileNotFoundError:
            return CommandResult(127, f"{argv[0]}: command not found")
        except subprocess.TimeoutExpired:
            return CommandResult(124, f"{shlex.join(argv)}: timed out after 120 s")
        return CommandResult(done.returncode, (done.stdout + done.stderr).strip())

    def lookup_user(self, name: str) -> ServiceUser | None:
        try:
            pw = pwd.getpwnam(name)
        except KeyError:
            return None
        groups = {g.gr_name for g in grp.getgrall() if name in g.gr_mem}
        try:
            groups.add(grp.getgrgid(pw.pw_gid).gr_name)
        except KeyError:
            pass
        return ServiceUser(pw.pw_uid, pw.pw_gid, frozenset(groups))

    def systemd_is_running(self) -> bool:
        return Path("/run/systemd/system").is_dir()


class DryRunHost:
    """--root: files are written under the prefix, but no command runs and no user is created."""

    is_dry_run = True

    def __init__(self) -> None:
        self.planned: list[str] = []

    def run(self, argv: Sequence[str]) -> CommandResult:
        self.planned.append(shlex.join(argv))
        return CommandResult(0, "")

    def lookup_user(self, name: str) -> ServiceUser | None:
        return None

    def systemd_is_running(self) -> bool:
        return False
