"""Linux isolation primitives for the code sandbox (stdlib only: the runner imports this file
under ``python -I -S``, so nothing from the project or site-packages is importable here).

Each function applies one layer and reports whether it worked; the runner records the outcome
so that callers can see which defences were really in force (see ``docs/custom_workflow.md``
and ``workflows/sandbox/__init__.py`` for the list and their limits).
"""

from __future__ import annotations

import ctypes
import errno
import os
import stat

CLONE_NEWNS = 0x00020000
CLONE_NEWUTS = 0x04000000
CLONE_NEWIPC = 0x08000000
CLONE_NEWUSER = 0x10000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000

MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_NOATIME, MS_NODIRATIME, MS_BIND = 32, 1024, 2048, 4096
MS_REC, MS_PRIVATE, MS_RELATIME, MS_STRICTATIME = 1 << 14, 1 << 18, 1 << 21, 1 << 24
# Per-mount flags that must be kept on a read-only remount (inside a user namespace the kernel
# refuses a remount that would clear a locked one).
_KEEP_FLAGS = {
    "nosuid": MS_NOSUID, "nodev": MS_NODEV, "noexec": MS_NOEXEC, "noatime": MS_NOATIME,
    "nodiratime": MS_NODIRATIME, "relatime": MS_RELATIME, "strictatime": MS_STRICTATIME,
}

PR_SET_PDEATHSIG, PR_SET_DUMPABLE, PR_CAPBSET_DROP = 1, 4, 24
PR_SET_SECUREBITS, PR_SET_NO_NEW_PRIVS = 28, 38
# NOROOT + NOROOT_LOCKED: uid 0 gains no capabilities on execve. (Not NO_SETUID_FIXUP: that
# would let a process keep its capabilities across setuid(0 -> U).)
SECBITS_NO_ROOT_CAPS = 0x01 | 0x02

_libc = ctypes.CDLL(None, use_errno=True)
_libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p]
_libc.unshare.argtypes = [ctypes.c_int]
_libc.prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]


def _check(rc: int, what: str) -> None:
    if rc != 0:
        e = ctypes.get_errno()
        raise OSError(e, f"{what}: {os.strerror(e)}")


def prctl(option: int, arg: int = 0) -> None:
    _check(_libc.prctl(option, arg, 0, 0, 0), f"prctl({option})")


def die_with_parent() -> None:
    """SIGKILL this process when the thread that forked it dies (set again after a uid change:
    the kernel clears it then)."""
    prctl(PR_SET_PDEATHSIG, 9)


def unshare(flags: int) -> bool:
    return _libc.unshare(flags) == 0


def _enc(s: str | None) -> bytes | None:
    return s.encode() if s is not None else None


def mount(src: str | None, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    enc = _enc
    _check(_libc.mount(enc(src), enc(target), enc(fstype), flags, enc(data)), f"mount {target}")


def enter_namespaces(is_root: bool) -> dict[str, bool]:
    """Unshare what this host allows. Root unshares directly; other users first enter a new
    user namespace (mapped to themselves) that grants the rights for the rest.
    The pid namespace applies to the *next* child: the caller must fork after this."""
    got = {"user_ns": False}
    if not is_root:
        uid, gid = os.getuid(), os.getgid()
        if unshare(CLONE_NEWUSER):
            try:
                with open("/proc/self/setgroups", "w") as f:
                    f.write("deny")
                with open("/proc/self/uid_map", "w") as f:
                    f.write(f"0 {uid} 1")
                with open("/proc/self/gid_map", "w") as f:
                    f.write(f"0 {gid} 1")
                got["user_ns"] = True
            except OSError:
                pass
        if not got["user_ns"]:
            return {**got, "mount_ns": False, "net_ns": False, "pid_ns": False, "ipc_ns": False}
    for name, flag in (("mount_ns", CLONE_NEWNS), ("net_ns", CLONE_NEWNET),
                       ("pid_ns", CLONE_NEWPID), ("ipc_ns", CLONE_NEWIPC | CLONE_NEWUTS)):
        got[name] = unshare(flag)
    return got


def _mountinfo() -> list[tuple[str, str]]:
    """(mount point, per-mount options) of every mount in this namespace."""
    out = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            parts = line.split()
            point = parts[4].encode().decode("unicode_escape")  # \040 etc.
            out.append((point, parts[5]))
    return out


def blocking_ancestor(path: str, uid: int, gid: int) -> str | None:
    """The top-most directory on ``path``'s way from / that ``uid`` could not traverse."""
    cur = "/"
    for part in [p for p in path.split("/") if p][:-1]:
        cur = os.path.join(cur, part)
        st = os.stat(cur)
        if st.st_uid == uid:
            ok = st.st_mode & stat.S_IXUSR
        elif st.st_gid == gid:
            ok = st.st_mode & stat.S_IXGRP
        else:
            ok = st.st_mode & stat.S_IXOTH
        if not ok:
            return cur
    return None


def expose_paths(paths: list[str], uid: int, gid: int) -> bool:
    """Make each of ``paths`` reachable by ``uid`` without changing the host: a private tmpfs
    (mode 0755) covers each blocking ancestor (e.g. a 0700 /root holding the interpreter) and
    the needed directory is bind-mounted back at its own path inside it."""
    todo: dict[str, list[tuple[str, int]]] = {}
    for p in paths:
        b = blocking_ancestor(p, uid, gid)
        if b is not None:
            todo.setdefault(b, []).append((p, os.open(p, os.O_PATH)))
    for anc, items in todo.items():
        mount("tmpfs", anc, "tmpfs", MS_NOSUID | MS_NODEV, "mode=0755,size=1m")
        for p, fd in items:
            os.makedirs(p, mode=0o755, exist_ok=True)
            mount(f"/proc/self/fd/{fd}", p, None, MS_BIND | MS_REC)
            os.close(fd)
    return True


def private_tmpfs(workdir: str, size_mb: int, uid: int, gid: int) -> None:
    """A size-capped tmpfs owned by the sandbox user, visible only in this mount namespace."""
    mount("tmpfs", workdir, "tmpfs", MS_NOSUID | MS_NODEV,
          f"size={size_mb}m,mode=0700,uid={uid},gid={gid}")


def make_everything_readonly(keep_writable: str) -> tuple[bool, list[str]]:
    """Remount every mount of this namespace read-only except ``keep_writable``.
    Returns (root filesystem made read-only, mount points that failed)."""
    mount(None, "/", None, MS_REC | MS_PRIVATE)  # never propagate anything to the host
    failed, root_ok = [], False
    for point, opts in _mountinfo():
        if point == keep_writable:
            continue
        optset = set(opts.split(","))
        flags = MS_REMOUNT | MS_BIND | MS_RDONLY
        for name, bit in _KEEP_FLAGS.items():
            if name in optset:
                flags |= bit
        try:
            if "ro" not in optset:
                mount(None, point, None, flags)
            root_ok = root_ok or point == "/"
        except OSError as e:
            if e.errno not in (errno.ENOENT,):
                failed.append(point)
    return root_ok and not failed, failed


def drop_capabilities() -> bool:
    """Empty the bounding set and lock 'root has no capabilities' for the next execve."""
    try:
        with open("/proc/sys/kernel/cap_last_cap") as f:
            last = int(f.read())
    except OSError:
        last = 40
    ok = True
    try:
        prctl(PR_SET_SECUREBITS, SECBITS_NO_ROOT_CAPS)
    except OSError:
        ok = False
    for cap in range(last + 1):
        try:
            prctl(PR_CAPBSET_DROP, cap)
        except OSError:
            ok = False
    prctl(PR_SET_NO_NEW_PRIVS, 1)
    return ok


def count_processes_of(uid: int) -> int:
    n = 0
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                if os.stat(f"/proc/{d}").st_uid == uid:
                    n += 1
            except OSError:
                pass
    return n
