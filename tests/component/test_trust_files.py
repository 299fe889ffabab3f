"""Which files shipper reads (SPEC, Trust boundaries), on real files, real links `lchown`ed to
`nobody`, real FIFOs, real /proc and real sparse files: the one opening policy (`tail/opening.py`)
on its own, and the reading side (the pipeline rig, in-process) through it.

What an attacker who can write a watched directory does is done here as root and then handed
to `nobody` (chown/lchown): what matters to shipper is who owns what it meets.
"""

from __future__ import annotations

import gzip
import os
import subprocess
import threading
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shipper.commands.check import hardlink_warning
from shipper.config import Symlinks
from shipper.sources.journald.probe import JournalDirRefused, check_journal, child_env, journal_directory
from shipper.tail import identity, look, opening
from shipper.tail.harvester import Harvester
from shipper.tail.lines import LineSplitter
from shipper.tail.opening import Refused, Rule
from shipper.tail.scan import MAX_DEPTH, Scanner
from tests.support.journal import Journal, journal_remote
from tests.support.pipeline_rig import Rig, RigFactory

NOBODY = 65534
OTHER = 4242             # a user that owns nothing else here (no account needed to own files)

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to hand files and links to other users")


def write(path: Path, *msgs: str) -> None:
    with open(path, "ab") as f:
        f.write(b"".join(m.encode() + b"\n" for m in msgs))


def secret_file(tmp_path: Path, text: str = "root-only secret line") -> Path:
    """A root-only file (0600 in a 0700 directory), as /etc/shadow or a key is."""
    d = tmp_path / "root-only"
    d.mkdir(mode=0o700)
    p = d / "secret"
    p.write_text(text + "\n")
    os.chmod(p, 0o600)
    return p


def link(target: Path | str, at: Path, owner: int = 0) -> Path:
    os.symlink(target, at)
    os.lchown(at, owner, owner)
    return at


def opened(got: tuple[int, os.stat_result] | Refused | None) -> os.stat_result | Refused | None:
    """What `open_log` gave, the fd closed."""
    if isinstance(got, tuple):
        os.close(got[0])
        return got[1]
    return got


# ---------------------------------------------------------------- the opening policy

def test_a_link_is_followed_only_as_its_rule_says(tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    logs.mkdir()
    secret = secret_file(tmp_path)
    mine = logs / "mine.txt"
    mine.write_text("nobody's own\n")
    os.chown(mine, NOBODY, NOBODY)
    evil = link(secret, logs / "evil.log", NOBODY)            # nobody's link to root's file
    own = link(mine, logs / "own.log", NOBODY)                # nobody's link to nobody's file
    kube = link(mine, logs / "kube.log", 0)                   # root's link to anyone's file
    base = str(logs)
    r = opened(opening.open_log(str(evil), Rule("owner", base)))
    assert isinstance(r, Refused) and r.link == str(evil) and r.rule == "symlinks: owner"
    assert "uid 65534" in r.reason and "uid 0" in r.reason
    for p in (own, kube):
        got = opened(opening.open_log(str(p), Rule("owner", base)))
        assert isinstance(got, os.stat_result) and got.st_ino == mine.stat().st_ino
    for p in (evil, own, kube):
        r = opened(opening.open_log(str(p), Rule("none", base)))
        assert isinstance(r, Refused) and r.rule == "symlinks: false" and r.link == str(p)
        assert isinstance(opened(opening.open_log(str(p), Rule("all", base))), os.stat_result)


def test_every_link_on_the_way_is_judged_not_only_the_last(tmp_path: Path) -> None:
    """A chain (root's link -> nobody's link -> root's file) and a link to a directory on the way
    (nobody's link to a root-only directory): each link against what it resolves to."""
    logs = tmp_path / "logs"
    logs.mkdir()
    secret = secret_file(tmp_path)
    hop = link(secret, logs / "hop", NOBODY)
    chain = link("hop", logs / "chain.log", 0)
    r = opened(opening.open_log(str(chain), Rule("owner", str(logs))))
    assert isinstance(r, Refused) and r.link == str(hop)
    into = link(secret.parent, logs / "into", NOBODY)
    r = opened(opening.open_log(str(into / "secret"), Rule("owner", str(logs))))
    assert isinstance(r, Refused) and r.link == str(into) and "uid 65534" in r.reason
    # a directory link of nobody's into nobody's directory is fine, as is root's into anyone's
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    (theirs / "a.log").write_text("a\n")
    os.chown(theirs, NOBODY, NOBODY)
    link(theirs, logs / "ok", NOBODY)
    link(secret.parent, logs / "rootlink", 0)
    assert isinstance(opened(opening.open_log(str(logs / "ok" / "a.log"), Rule("owner", str(logs)))), os.stat_result)
    assert isinstance(opened(opening.open_log(str(logs / "rootlink" / "secret"), Rule("owner", str(logs)))),
                      os.stat_result)


def test_links_in_the_globs_fixed_part_are_the_admins(tmp_path: Path) -> None:
    """/var/log -> /data/log set up by the admin: the glob's own directory may be a link of anyone's."""
    real = tmp_path / "data"
    real.mkdir()
    (real / "app.log").write_text("x\n")
    via = link(real, tmp_path / "logs", NOBODY)
    assert isinstance(opened(opening.open_log(str(via / "app.log"), Rule("none", str(via)))), os.stat_result)
    # judged when the glob's fixed part does not hold it
    r = opened(opening.open_log(str(via / "app.log"), Rule("owner", str(tmp_path / "elsewhere"))))
    assert isinstance(r, Refused) and r.link == str(via)


def test_proc_sys_and_dev_are_never_read_whatever_symlinks_says(tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    logs.mkdir()
    env = link("/proc/self/environ", logs / "x.log", 0)
    shm = Path("/dev/shm") / f"shipper-test-{os.getpid()}.log"
    shm.write_text("on tmpfs under /dev\n")
    try:
        link(shm, logs / "shm.log", 0)
        link("/sys/kernel/mm/transparent_hugepage/enabled", logs / "sys.log", 0)
        for name in ("x.log", "shm.log", "sys.log"):
            for rule in ("owner", "all"):
                r = opened(opening.open_log(str(logs / name), Rule(rule, str(logs))))
                assert isinstance(r, Refused | None), (name, rule, r)
                if os.path.exists(logs / name):
                    assert isinstance(r, Refused) and r.reason == "on /proc, /sys or /dev", (name, rule)
        # a glob under /proc itself
        r = opened(opening.open_log("/proc/self/environ", Rule("all", "/proc/self")))
        assert isinstance(r, Refused) and r.reason == "on /proc, /sys or /dev"
        assert opening.is_pseudo(os.stat("/proc/self/environ").st_dev) and not opening.is_pseudo(env.lstat().st_dev)
    finally:
        shm.unlink()


def test_a_fifo_or_a_device_is_refused_without_blocking(tmp_path: Path) -> None:
    """Opened non-blocking and judged by fstat: a FIFO with no writer does not wait for one."""
    os.mkfifo(tmp_path / "app.log")
    r = opened(opening.open_log(str(tmp_path / "app.log"), Rule("owner", str(tmp_path))))
    assert isinstance(r, Refused) and r.reason == "not a regular file"
    link("/dev/zero", tmp_path / "zero.log")
    r = opened(opening.open_log(str(tmp_path / "zero.log"), Rule("all", str(tmp_path))))
    assert isinstance(r, Refused)
    # the looks at rotated siblings go through the same policy: a FIFO there is no sibling
    os.mkfifo(tmp_path / "app.log.1")
    assert identity.look_at(str(tmp_path / "app.log.1")) is None
    assert identity.head_of_path(str(tmp_path / "app.log.1")) == b""


def test_a_rotated_copy_is_no_link_and_its_originals_owners_or_roots(tmp_path: Path) -> None:
    secret = secret_file(tmp_path)
    app = tmp_path / "app.log"
    app.write_text("x\n")
    os.chown(app, NOBODY, NOBODY)
    link(secret, tmp_path / "app.log.1", 0)                     # even root's link is no copy
    r = opened(opening.open_log(str(tmp_path / "app.log.1"), opening.copy_rule(str(app), NOBODY)))
    assert isinstance(r, Refused) and r.rule == "rotated copies"
    assert identity.look_at(str(tmp_path / "app.log.1")) is None
    forged = tmp_path / "app.log.2"
    forged.write_text("x\n")
    os.chown(forged, OTHER, OTHER)
    r = opened(opening.open_log(str(forged), opening.copy_rule(str(app), NOBODY)))
    assert isinstance(r, Refused) and f"uid {OTHER}" in r.reason
    for owner in (NOBODY, 0):
        os.chown(forged, owner, owner)
        assert isinstance(opened(opening.open_log(str(forged), opening.copy_rule(str(app), NOBODY))), os.stat_result)


def test_a_fifo_renamed_over_a_rotated_name_again_and_again_never_blocks_a_look(tmp_path: Path) -> None:
    """The look at siblings opened what it had stat'ed: a FIFO renamed over app.log.1 in between
    blocked the thread for good. Renames race the looks here; each look must come back."""
    app = tmp_path / "app.log"
    app.write_text("first line\n")
    fifo, plain = tmp_path / "fifo", tmp_path / "plain"
    stop = threading.Event()

    def flip() -> None:
        while not stop.is_set():
            os.mkfifo(fifo)
            os.rename(fifo, tmp_path / "app.log.1")
            plain.write_text("first line\n")
            os.rename(plain, tmp_path / "app.log.1")

    t = threading.Thread(target=flip, daemon=True)
    t.start()
    try:
        for _ in range(2000):
            look.Surroundings().siblings(str(app))
            identity.look_at(str(tmp_path / "app.log.1"))
    finally:
        stop.set()
        t.join()


# ---------------------------------------------------------------- the `**` walk

def test_a_dir_link_on_a_walk_is_followed_as_the_inputs_rule_says(tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    (logs / "app").mkdir(parents=True)
    (logs / "app" / "a.log").write_text("a\n")
    secret = secret_file(tmp_path)
    (secret.parent / "deep").mkdir()
    (secret.parent / "deep" / "b.log").write_text("b\n")
    link(secret.parent, logs / "app" / "into", NOBODY)
    pattern = f"{logs}/**/*.log"

    def walk(rule: Symlinks) -> tuple[list[str], list[Refused]]:
        s = Scanner()
        s.begin()
        got = sorted(s.iglob(pattern, rule))
        s.end()
        return got, s.refused

    got, refused = walk("owner")
    assert got == [f"{logs}/app/a.log"]
    assert [(r.link, r.rule) for r in refused] == [(f"{logs}/app/into", "symlinks: owner")]
    got, refused = walk("none")
    assert got == [f"{logs}/app/a.log"] and refused[0].rule == "symlinks: false"
    got, refused = walk("all")
    assert got == [f"{logs}/app/a.log", f"{logs}/app/into/deep/b.log"] and not refused
    os.lchown(logs / "app" / "into", 0, 0)                    # root's link (a runtime's) is followed
    assert walk("owner")[0] == walk("all")[0]


def test_a_walk_goes_at_most_eight_levels_below_the_globs_fixed_part(tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    d = logs
    for level in range(1, 13):
        d = d / f"l{level}"
        d.mkdir(parents=True)
        (d / "x.log").write_text("x\n")
    s = Scanner()
    s.begin()
    got = list(s.iglob(f"{logs}/**/*.log"))
    s.end()
    depths = sorted(p[len(str(logs)):].count("/") - 1 for p in got)
    assert depths == list(range(1, MAX_DEPTH + 1)), "files in the directories of levels 1..8"
    s.begin()
    deeper = list(s.iglob(f"{logs}/l1/l2/**/*.log"))           # counted from this glob's fixed part
    s.end()
    assert len(deeper) == MAX_DEPTH + 1 and max(p.count("/") for p in deeper) == f"{logs}/l1/l2".count("/") + 9


def test_links_fanning_out_to_siblings_make_a_walk_of_each_directory_once(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each of 16 directories links to every other one: glob walks 16 ** depth paths (65,536 at
    four levels); the walk visits each of the 17 directories once and matches each file by one path."""
    logs = tmp_path / "logs"
    names = [f"d{i:02d}" for i in range(16)]
    for n in names:
        (logs / n).mkdir(parents=True)
        (logs / n / f"{n}.log").write_text("x\n")
    for n in names:
        for m in names:
            if m != n:
                os.symlink(f"../{m}", logs / n / m)
    listed: list[str] = []
    real = os.scandir

    def counting(path: str) -> object:
        listed.append(os.path.realpath(path))
        return real(path)

    monkeypatch.setattr(os, "scandir", counting)
    s = Scanner()
    s.begin()
    got = list(s.iglob(f"{logs}/**/*.log"))
    s.end()
    assert len(listed) == len(set(listed)) == 17, "each directory listed once"
    assert sorted(os.path.realpath(p) for p in got) == sorted(str(logs / n / f"{n}.log") for n in names)
    assert len(got) == len(set(os.path.realpath(p) for p in got))


# ---------------------------------------------------------------- sparse files

def _rchar() -> int:
    """Bytes this process read through read(2)-like calls so far (/proc/self/io)."""
    for line in Path("/proc/self/io").read_text().splitlines():
        if line.startswith("rchar:"):
            return int(line.split()[1])
    raise AssertionError("no rchar in /proc/self/io")


def _harvester(path: Path) -> Harvester:
    from shipper.model import Checkpoint
    fd = os.open(path, os.O_RDONLY)
    st = os.fstat(fd)
    fp_len, fp = identity.fingerprint_fd(fd, st.st_size)
    cp = Checkpoint("inc", str(path), st.st_dev, st.st_ino, fp_len, fp, 0, st.st_size)
    return Harvester(str(path), fd, st, cp, 1024 * 1024, 0.0)


def _read_all(h: Harvester) -> list[tuple[int, int, bytes]]:
    out: list[tuple[int, int, bytes]] = []
    for _ in range(10_000):
        got = h.read(256 * 1024)
        out.extend((a, b, bytes(c)) for a, b, c, _f in got)
        if h.at_eof and not got:
            break
    return out


GiB = 1024 ** 3


def test_a_hole_is_skipped_not_read(tmp_path: Path) -> None:
    p = tmp_path / "sparse.log"
    with open(p, "wb") as f:
        f.write(b"before\n")
        f.seek(2 * GiB)
        f.write(b"after\n")
    h = _harvester(p)
    try:
        r0 = _rchar()
        got = _read_all(h)
        read = _rchar() - r0
    finally:
        h.close()
    # the lines and offsets reading every NUL gives (head NULs of a line are consumed as read)
    assert got == [(0, 7, b"before"), (2 * GiB, 2 * GiB + 6, b"after")]
    assert read < 16 * 1024 * 1024, f"{read} bytes read for 13 bytes of data"


def test_a_hole_up_to_the_end_is_not_consumed_and_what_fills_it_is_read(tmp_path: Path) -> None:
    """A file extended ahead of its writer (ftruncate, a mmap appender): shipper waits where the data
    ends; the lines written into the hole later, and after its end, are read, the hole never."""
    p = tmp_path / "prealloc.log"
    with open(p, "wb") as f:
        f.write(b"one\n")
        f.truncate(2 * GiB)
    h = _harvester(p)
    block = os.statvfs(p).f_bsize
    try:
        r0 = _rchar()
        assert _read_all(h) == [(0, 4, b"one")]
        assert _read_all(h) == []
        # the NULs after the line up to the end of its block are data to the filesystem (consumed,
        # as the head NULs of a next line are); the hole after it is not
        assert h.position == block and h.hole_at == block and h.data_end == block
        with open(p, "r+b") as f:
            f.seek(64 * 1024)
            f.write(b"two\n")                                  # into the hole, after where we are
        assert _read_all(h) == [(64 * 1024, 64 * 1024 + 4, b"two")]
        with open(p, "ab") as f:
            f.write(b"three\n")                                # after the hole's end
        assert _read_all(h) == [(2 * GiB, 2 * GiB + 6, b"three")]
        assert _rchar() - r0 < 16 * 1024 * 1024
    finally:
        h.close()


def test_a_hole_inside_a_line_makes_it_cut_as_reading_its_nuls_would(tmp_path: Path) -> None:
    p = tmp_path / "mid.log"
    with open(p, "wb") as f:
        f.write(b"partial")
        f.seek(GiB)
        f.write(b"rest\nnext\n")
    h = _harvester(p)
    try:
        r0 = _rchar()
        got = _read_all(h)
        assert _rchar() - r0 < 16 * 1024 * 1024
    finally:
        h.close()
    assert [(a, b) for a, b, _ in got] == [(0, 0), (GiB + 5, GiB + 10)]
    assert got[0][2] == b"partial" + b"\0" * (1024 * 1024 - 7)
    assert got[1][2] == b"next"


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=60), st.integers(0, 200), st.binary(max_size=40), st.integers(16, 40))
def test_skipping_zeros_is_feeding_them(before: bytes, n: int, after: bytes, limit: int) -> None:
    a, b = LineSplitter(0, limit), LineSplitter(0, limit)
    got_a = a.feed(before) + a.feed(bytes(n)) + a.feed(after) + a.flush()
    got_b = b.feed(before) + b.skip_zeros(n) + b.feed(after) + b.flush()
    assert [(s, e, bytes(t), f) for s, e, t, f in got_a] == [(s, e, bytes(t), f) for s, e, t, f in got_b]
    assert (a.offset, a.read_position) == (b.offset, b.read_position)


# ---------------------------------------------------------------- the reading side through the policy

async def test_the_pipeline_ships_what_the_rules_allow_and_nothing_behind_a_refused_link(
        make_rig: RigFactory, tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    secret = secret_file(tmp_path, "do-not-ship")
    (secret.parent / "inner.log").write_text("do-not-ship-either\n")
    mine = tmp_path / "mine.txt"
    mine.write_text("followed: nobody's link to nobody's file\n")
    os.chown(mine, NOBODY, NOBODY)
    pod = tmp_path / "pod.txt"
    pod.write_text("followed: root's link\n")
    os.chown(pod, NOBODY, NOBODY)
    link(secret, logs / "evil.log", NOBODY)
    link(mine, logs / "own.log", NOBODY)
    link(pod, logs / "kube.log", 0)
    link("/proc/self/environ", logs / "env.log", 0)
    link(secret.parent, logs / "dir", NOBODY)
    os.mkfifo(logs / "fifo.log")
    write(logs / "app.log", "plain")
    rig = make_rig([str(logs / "**" / "*.log")])
    await rig.settle()
    assert sorted(rig.messages()) == sorted(["plain", "followed: nobody's link to nobody's file",
                                             "followed: root's link"])
    refused = {(a[0], a[2], a[3]) for a in rig.events.of("file_refused")}
    assert (str(logs / "evil.log"), str(logs / "evil.log"), "symlinks: owner") in refused
    assert (str(logs / "dir"), str(logs / "dir"), "symlinks: owner") in refused
    assert (str(logs / "env.log"), None, "") in refused
    # a FIFO matched by the glob is never opened, and the log says why it is not shipped
    assert {a[1] for a in rig.events.of("file_refused") if a[0] == str(logs / "fifo.log")} == \
        {"not a regular file (a FIFO)"}


async def test_a_link_at_a_rotated_name_is_no_copy(make_rig: RigFactory, tmp_path: Path) -> None:
    """The attack the review found: app.log begins as a key file does; it is truncated; app.log.1
    is a link to the key. The copy lookup matched the first bytes and shipped the key's body
    "from the rotated copy". A copy is never a link: the rest of app.log is lost, and said so."""
    logs = tmp_path / "logs"
    head = "-----BEGIN OPENSSH PRIVATE KEY-----"
    key = secret_file(tmp_path, head + "\nb3BlbnNzaC1rZXktdjEAAAAABG5vbmUAAAAEbm9uZQ\n-----END OPENSSH PRIVATE KEY-----")
    app = logs / "app.log"
    write(app, head)
    os.chown(app, NOBODY, NOBODY)
    rig = make_rig()
    await rig.step()
    assert rig.messages() == [head]
    link(key, logs / "app.log.1", NOBODY)
    os.truncate(app, 0)
    write(app, "after the truncation")
    await rig.settle()
    assert sorted(rig.messages()) == sorted([head, "after the truncation"])
    assert not any("b3BlbnNzaC1" in m or "END OPENSSH" in m for m in rig.messages())


async def nobodys_app(make_rig: RigFactory, tmp_path: Path) -> tuple[Rig, Path]:
    """logs/app.log of nobody's with two lines, shipped."""
    app = tmp_path / "logs" / "app.log"
    write(app, "a1", "a2")
    os.chown(app, NOBODY, NOBODY)
    rig = make_rig()
    await rig.step()
    return rig, app


@pytest.mark.parametrize(("copy_owner", "is_read"), [(OTHER, False), (NOBODY, True), (0, True)])
async def test_a_rotated_copy_is_read_only_when_of_the_originals_owner_or_roots(
        make_rig: RigFactory, tmp_path: Path, copy_owner: int, is_read: bool) -> None:
    """copytruncate's copy, found by content: read when it is the original's owner's or root's (as
    logrotate's copies are); one of another user is not it (its first bytes are whoever wrote them)."""
    rig, app = await nobodys_app(make_rig, tmp_path)
    logs = app.parent
    write(app, "a3 unread before the copytruncate")
    copy = logs / "app.log.1"
    copy.write_bytes(app.read_bytes())
    os.chown(copy, copy_owner, copy_owner)
    os.truncate(app, 0)
    write(app, "b1")
    await rig.settle()
    assert rig.events.of("file_truncated"), "the copy was looked for"
    assert sorted(rig.messages()) == sorted(["a1", "a2", "b1"] + (["a3 unread before the copytruncate"] if is_read else []))


async def test_a_compressed_copy_of_roots_is_read_after_a_restart(make_rig: RigFactory, tmp_path: Path) -> None:
    """The owner is kept with the checkpoint: after a restart, a .gz copy (root's, as logrotate
    makes it) of what was not read yet is read from where its checkpoint stands."""
    rig, app = await nobodys_app(make_rig, tmp_path)
    logs = app.parent
    assert [cp.uid for cp in await rig.checkpoints()] == [NOBODY]
    await rig.restart()
    write(app, "b2 unread before the rotation")
    with open(app, "rb") as src, gzip.open(logs / "app.log.2.gz", "wb") as dst:
        dst.write(src.read())
    os.truncate(app, 0)
    await rig.settle()
    assert sorted(rig.messages()) == ["a1", "a2", "b2 unread before the rotation"]


# ---------------------------------------------------------------- the journal directory

def test_journalctl_reads_the_journal_directory_that_was_judged(tmp_path: Path) -> None:
    """The directory is opened and judged, and journalctl gets that very directory (its fd): what
    is renamed over the path meanwhile is not what it reads. One on /proc is not read at all."""
    if journal_remote() is None:
        pytest.skip("systemd-journal-remote is not installed")
    judged = tmp_path / "journal"
    Journal(judged).append("from the judged directory")
    with journal_directory(str(judged)) as (where, fds):
        assert where is not None and where.startswith("/proc/self/fd/") and len(fds) == 1
        judged.rename(tmp_path / "moved")
        Journal(judged).append("from what was renamed over it")
        out = subprocess.run(["journalctl", "-D", where, "--output=cat", "--all"], pass_fds=fds, env=child_env(),
                             capture_output=True, text=True, check=True).stdout
    assert out.splitlines() == ["from the judged directory"]
    link("/proc/self", tmp_path / "proc-journal")
    with pytest.raises(JournalDirRefused), journal_directory(str(tmp_path / "proc-journal")):
        pass
    c = check_journal(str(tmp_path / "proc-journal"), [])
    assert not c.is_readable and c.detail.endswith("not read: on /proc, /sys or /dev")


def test_check_says_when_users_may_hard_link_files_they_cannot_read(tmp_path: Path) -> None:
    """A hard link is the file itself: with fs.protected_hardlinks 0 the rules cannot tell it."""
    sysctl = tmp_path / "protected_hardlinks"
    sysctl.write_text("0\n")
    warning = hardlink_warning(str(sysctl))
    assert warning is not None and "fs.protected_hardlinks" in warning
    sysctl.write_text("1\n")
    assert hardlink_warning(str(sysctl)) is None
    assert hardlink_warning(str(tmp_path / "absent")) is None
