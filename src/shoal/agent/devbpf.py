"""Device control on cgroup v2: a BPF_PROG_TYPE_CGROUP_DEVICE program, as runc and systemd
attach one, since v2 has no ``devices.deny`` file.

The program is a handful of BPF instructions written out here (no compiler, no libbpf),
loaded with the bpf(2) system call through ctypes and attached to the job's cgroup with
``BPF_CGROUP_DEVICE`` and ``BPF_F_ALLOW_MULTI``: it and any program an ancestor has (systemd's
``DevicePolicy``) or a descendant gets (runc's, for a container made below the job) all run, and
an access is allowed only if every one allows it. It denies the listed character devices
(``c MAJOR:MINOR rwm``, the other jobs' GPUs) and allows everything else, as the v1 path's
``devices.deny`` lines do. The attachment holds the program: its descriptor is closed at
once, and it goes with the cgroup when the cgroup is removed.
"""

from __future__ import annotations

import ctypes
import errno
import os
import platform
import struct
from collections.abc import Sequence
from pathlib import Path

_SYS_BPF = {"x86_64": 321, "aarch64": 280, "ppc64le": 361, "s390x": 351}
_BPF_PROG_LOAD, _BPF_PROG_ATTACH = 5, 8
_BPF_PROG_TYPE_CGROUP_DEVICE = 15
_BPF_CGROUP_DEVICE = 6
_BPF_F_ALLOW_MULTI = 2
_BPF_DEVCG_DEV_CHAR = 2  # struct bpf_cgroup_dev_ctx.access_type: (access << 16) | type
_ATTR_SIZE = 128  # union bpf_attr, zero past the fields used (the kernel checks)

# BPF opcodes used (linux/bpf.h, bpf_common.h)
_LDX_W = 0x61  # dst = *(u32 *)(src + off)
_AND_K = 0x57  # dst &= imm (64-bit)
_JNE_K = 0x55  # if dst != imm: pc += off
_JEQ_K = 0x15  # if dst == imm: pc += off
_MOV_K = 0xb7  # dst = imm (64-bit)
_EXIT = 0x95


def _insn(code: int, dst: int = 0, src: int = 0, off: int = 0, imm: int = 0) -> bytes:
    return struct.pack("<BBhi", code, dst | (src << 4), off, imm)


def deny_program(major: int, minors: Sequence[int]) -> bytes:
    """The program's instructions: 0 (deny) for a character device ``major:m``, ``m`` in
    ``minors``, whatever the access; 1 (allow) for everything else."""
    n = len(minors)
    code = [_insn(_LDX_W, 2, 1, 0),  # r2 = ctx->access_type
            _insn(_AND_K, 2, imm=0xffff),  # r2 = the device's type
            _insn(_LDX_W, 3, 1, 4),  # r3 = ctx->major
            _insn(_LDX_W, 4, 1, 8),  # r4 = ctx->minor
            _insn(_JNE_K, 2, off=n + 1, imm=_BPF_DEVCG_DEV_CHAR),  # not a character device: allow
            _insn(_JNE_K, 3, off=n, imm=major)]  # another major: allow
    code += [_insn(_JEQ_K, 4, off=n - i + 1, imm=m) for i, m in enumerate(minors)]  # a denied minor: deny
    code += [_insn(_MOV_K, 0, imm=1), _insn(_EXIT),  # allow
             _insn(_MOV_K, 0, imm=0), _insn(_EXIT)]  # deny
    return b"".join(code)


def _bpf(cmd: int, attr: bytes) -> int:
    nr = _SYS_BPF.get(platform.machine())
    if nr is None:
        raise OSError(errno.ENOSYS, f"bpf(2)'s number on {platform.machine()} is not known here")
    libc = ctypes.CDLL(None, use_errno=True)
    buf = ctypes.create_string_buffer(attr, _ATTR_SIZE)
    r = libc.syscall(ctypes.c_long(nr), ctypes.c_int(cmd), buf, ctypes.c_uint(_ATTR_SIZE))
    if r < 0:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e))
    return int(r)


def deny_devices(cgroup: Path, major: int, minors: Sequence[int]) -> None:
    """Attach to the cgroup2 directory ``cgroup`` a device program that denies the character
    devices ``major:m`` for ``m`` in ``minors`` (nothing when there are none). Raises OSError
    (the verifier's log in its message when the kernel refused the program)."""
    if not minors:
        return
    code = deny_program(major, sorted(set(minors)))
    insns = ctypes.create_string_buffer(code, len(code))
    license_ = ctypes.create_string_buffer(b"GPL")
    log = ctypes.create_string_buffer(4096)
    # prog_type, insn_cnt, insns, license, log_level, log_size, log_buf, kern_version, prog_flags, prog_name
    attr = struct.pack("<IIQQIIQII16s", _BPF_PROG_TYPE_CGROUP_DEVICE, len(code) // 8, ctypes.addressof(insns),
                       ctypes.addressof(license_), 1, len(log), ctypes.addressof(log), 0, 0, b"shoal_devices")
    try:
        prog = _bpf(_BPF_PROG_LOAD, attr)
    except OSError as e:
        detail = log.value.decode(errors="replace").strip().splitlines()
        raise OSError(e.errno, f"cannot load the device program: {e.strerror}"
                               + (f" ({detail[-1]})" if detail else "")) from None
    try:
        target = os.open(cgroup, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            # target_fd, attach_bpf_fd, attach_type, attach_flags
            _bpf(_BPF_PROG_ATTACH, struct.pack("<IIII", target, prog, _BPF_CGROUP_DEVICE, _BPF_F_ALLOW_MULTI))
        except OSError as e:
            raise OSError(e.errno, f"cannot attach the device program to {cgroup}: {e.strerror}") from None
        finally:
            os.close(target)
    finally:
        os.close(prog)
