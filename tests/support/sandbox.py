"""The systemd unit's process restrictions, applied to a test's daemon without systemd.

`systemd-analyze security` scores a unit but does not run it, and these machines have no systemd
to run it under. What can be applied to a plain child process is applied here, read from the
unit itself: `SystemCallFilter=` (the groups expanded by `systemd-analyze syscall-filter`, a
seccomp filter installed through libseccomp, `SystemCallErrorNumber=` for what it refuses, or
SIGSYS), `SystemCallArchitectures=native` (libseccomp's default), `MemoryDenyWriteExecute=`
(the kernel's PR_SET_MDWE), `UMask=` and `NoNewPrivileges=`. Namespaces and mounts
(ProtectSystem, PrivateDevices, ProtectProc, ...) are not: they need systemd or a container.
"""

from __future__ import annotations

import ctypes
import errno
import os
import shutil
import subprocess
from collections.abc import Callable, Iterable

SCMP_ACT_KILL_PROCESS = 0x80000000
SCMP_ACT_ALLOW = 0x7FFF0000
PR_SET_NO_NEW_PRIVS = 38
PR_SET_MDWE = 65
PR_MDWE_REFUSE_EXEC_GAIN = 1


def available() -> str | None:
    """Why the sandbox cannot be applied here, or None."""
    if shutil.which("systemd-analyze") is None:
        return "systemd-analyze is not installed (.ci/run installs systemd)"
    try:
        ctypes.CDLL("libseccomp.so.2")
    except OSError:
        return "libseccomp is not installed"
    return None


def unit_settings(text: str) -> dict[str, list[str]]:
    """Every KEY=VALUE of the unit's [Service] section, in order (a key may repeat)."""
    out: dict[str, list[str]] = {}
    section = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("["):
            section = line
            continue
        if section == "[Service]" and "=" in line:
            key, _, value = line.partition("=")
            out.setdefault(key.strip(), []).append(value.strip())
    return out


def expand(names: Iterable[str]) -> set[str]:
    """System call names and @groups -> the system calls, as systemd expands them."""
    calls: set[str] = set()
    for name in names:
        if not name.startswith("@"):
            calls.add(name)
            continue
        listing = subprocess.run(["systemd-analyze", "syscall-filter", name], capture_output=True, text=True,
                                 check=True).stdout
        for line in listing.splitlines()[1:]:
            item = line.strip()
            if not item or item.startswith("#"):
                continue
            calls |= expand([item]) if item.startswith("@") else {item}
    return calls


def allowed_syscalls(settings: dict[str, list[str]]) -> set[str]:
    """What the unit's SystemCallFilter= lines leave allowed: the allow lists, less every `~` list."""
    allow: set[str] = set()
    deny: set[str] = set()
    for value in settings.get("SystemCallFilter", []):
        if value.startswith("~"):
            deny |= expand(value[1:].split())
        else:
            allow |= expand(value.split())
    return allow - deny


def restrictions(unit_text: str) -> Callable[[], None]:
    """A preexec_fn that applies the unit's restrictions in the child, just before it execs."""
    settings = unit_settings(unit_text)
    calls = sorted(allowed_syscalls(settings))
    refuse = settings.get("SystemCallErrorNumber", [""])[-1]
    action = SCMP_ACT_KILL_PROCESS if not refuse else 0x00050000 | getattr(errno, refuse)   # SCMP_ACT_ERRNO(n)
    mdwe = settings.get("MemoryDenyWriteExecute", ["false"])[-1] in ("true", "yes", "1")
    umask = int(settings["UMask"][-1], 8) if "UMask" in settings else None
    no_new_privs = settings.get("NoNewPrivileges", ["false"])[-1] in ("true", "yes", "1")
    seccomp = ctypes.CDLL("libseccomp.so.2", use_errno=True)
    seccomp.seccomp_init.restype = ctypes.c_void_p
    seccomp.seccomp_init.argtypes = [ctypes.c_uint32]
    seccomp.seccomp_syscall_resolve_name.argtypes = [ctypes.c_char_p]
    seccomp.seccomp_rule_add.argtypes = [ctypes.c_void_p, ctypes.c_uint32, ctypes.c_int, ctypes.c_uint]
    seccomp.seccomp_load.argtypes = [ctypes.c_void_p]
    numbers = [n for n in (seccomp.seccomp_syscall_resolve_name(c.encode()) for c in calls) if n >= 0]
    libc = ctypes.CDLL(None, use_errno=True)

    def apply() -> None:             # in the child, after fork: no Python imports, only calls
        if umask is not None:
            os.umask(umask)
        if no_new_privs:
            libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
        if mdwe and libc.prctl(PR_SET_MDWE, PR_MDWE_REFUSE_EXEC_GAIN, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "PR_SET_MDWE")
        if calls:
            ctx = seccomp.seccomp_init(action)
            for n in numbers:
                seccomp.seccomp_rule_add(ctx, SCMP_ACT_ALLOW, n, 0)
            if seccomp.seccomp_load(ctx) != 0:
                raise OSError(ctypes.get_errno(), "seccomp_load")

    return apply
