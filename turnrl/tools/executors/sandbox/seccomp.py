"""The seccomp filter of the bubblewrap sandbox: a classic-BPF program, built here, that denies
the system calls no model-written program needs and that widen the attack surface.

Denied with ``EPERM``: ``ptrace`` and cross-process memory access (``process_vm_readv/writev``,
``pidfd_getfd``, ``kcmp``); every mount and namespace operation (``mount``, ``umount2``,
``pivot_root``, ``chroot``, the new mount API, ``unshare``, ``setns``, and ``clone`` with any
``CLONE_NEW*`` flag); the kernel keyring; ``bpf``, ``perf_event_open``, ``userfaultfd``;
``io_uring`` (its operations bypass seccomp); module and kexec loading; file handles
(``open_by_handle_at``); ``acct``, swap, ``reboot``, ``syslog``, ``quotactl``; ``mq_open`` (a POSIX
message queue outlives its processes in the sandbox's IPC namespace, where no mount lists it, so
a recycled sandbox could not be wiped of it; System V IPC stays allowed: the warm server removes
those objects, read from ``/proc/sysvipc``). ``clone3`` gets
``ENOSYS``: its flags sit in memory a filter cannot read, and libc then falls back to ``clone``,
whose flags it can. System calls of a foreign ABI (i386 through ``int 0x80``, x32) are denied.

bubblewrap loads it (``--seccomp FD``) after setting up the sandbox and before running the
program, so it binds the program and everything the program starts.
"""

from __future__ import annotations

import errno
import platform
import struct

__all__ = ["DENIED", "filter_program", "supported"]

DENIED = (
    "ptrace", "process_vm_readv", "process_vm_writev", "pidfd_getfd", "kcmp",
    "mount", "umount2", "pivot_root", "chroot", "fsopen", "fsconfig", "fsmount", "fspick", "move_mount",
    "open_tree", "mount_setattr", "unshare", "setns",
    "keyctl", "add_key", "request_key", "bpf", "perf_event_open", "userfaultfd",
    "io_uring_setup", "io_uring_enter", "io_uring_register",
    "kexec_load", "kexec_file_load", "init_module", "finit_module", "delete_module",
    "open_by_handle_at", "name_to_handle_at", "acct", "swapon", "swapoff", "reboot", "syslog", "quotactl",
    "mq_open",
)
"""System calls the sandbox denies with EPERM (``clone`` with namespace flags too)."""

# (AUDIT_ARCH_*, syscall numbers) per machine; numbers from the kernel's unistd headers.
_GENERIC = {  # asm-generic/unistd.h (aarch64)
    "ptrace": 117, "process_vm_readv": 270, "process_vm_writev": 271, "pidfd_getfd": 438, "kcmp": 272,
    "mount": 40, "umount2": 39, "pivot_root": 41, "chroot": 51, "fsopen": 430, "fsconfig": 431,
    "fsmount": 432, "fspick": 433, "move_mount": 429, "open_tree": 428, "mount_setattr": 442,
    "unshare": 97, "setns": 268, "keyctl": 219, "add_key": 217, "request_key": 218, "bpf": 280,
    "perf_event_open": 241, "userfaultfd": 282, "io_uring_setup": 425, "io_uring_enter": 426,
    "io_uring_register": 427, "kexec_load": 104, "kexec_file_load": 294, "init_module": 105,
    "finit_module": 273, "delete_module": 106, "open_by_handle_at": 265, "name_to_handle_at": 264,
    "acct": 89, "swapon": 224, "swapoff": 225, "reboot": 142, "syslog": 116, "quotactl": 60,
    "mq_open": 180, "clone": 220, "clone3": 435,
}
_X86_64 = {  # asm/unistd_64.h
    "ptrace": 101, "process_vm_readv": 310, "process_vm_writev": 311, "pidfd_getfd": 438, "kcmp": 312,
    "mount": 165, "umount2": 166, "pivot_root": 155, "chroot": 161, "fsopen": 430, "fsconfig": 431,
    "fsmount": 432, "fspick": 433, "move_mount": 429, "open_tree": 428, "mount_setattr": 442,
    "unshare": 272, "setns": 308, "keyctl": 250, "add_key": 248, "request_key": 249, "bpf": 321,
    "perf_event_open": 298, "userfaultfd": 323, "io_uring_setup": 425, "io_uring_enter": 426,
    "io_uring_register": 427, "kexec_load": 246, "kexec_file_load": 320, "init_module": 175,
    "finit_module": 313, "delete_module": 176, "open_by_handle_at": 304, "name_to_handle_at": 303,
    "acct": 163, "swapon": 167, "swapoff": 168, "reboot": 169, "syslog": 103, "quotactl": 179,
    "mq_open": 240, "clone": 56, "clone3": 435,
}
_ARCHES = {"x86_64": (0xC000003E, _X86_64), "amd64": (0xC000003E, _X86_64),
           "aarch64": (0xC00000B7, _GENERIC), "arm64": (0xC00000B7, _GENERIC)}
_X32_BIT = 0x40000000
_CLONE_NEW = 0x7E020000  # CLONE_NEWNS | NEWCGROUP | NEWUTS | NEWIPC | NEWUSER | NEWPID | NEWNET

# classic BPF opcodes and seccomp return values (linux/filter.h, linux/seccomp.h)
_LD_ABS = 0x20   # BPF_LD | BPF_W | BPF_ABS
_JEQ = 0x15      # BPF_JMP | BPF_JEQ | BPF_K
_JGE = 0x35      # BPF_JMP | BPF_JGE | BPF_K
_JSET = 0x45     # BPF_JMP | BPF_JSET | BPF_K
_RET = 0x06      # BPF_RET | BPF_K
_ALLOW = 0x7FFF0000
_ERRNO = 0x00050000
_NR, _ARCH, _ARG0 = 0, 4, 16  # offsets in struct seccomp_data (little-endian: low word of args[0])


def supported(machine: str | None = None) -> bool:
    """Whether a filter can be built for ``machine`` (default: this one's)."""
    return (machine or platform.machine()).lower() in _ARCHES


def filter_program(machine: str | None = None) -> bytes:
    """The filter as the ``struct sock_filter`` array bubblewrap's ``--seccomp FD`` reads.

    Raises:
        RuntimeError: If ``machine`` is neither x86_64 nor aarch64.
    """
    key = (machine or platform.machine()).lower()
    if key not in _ARCHES:
        raise RuntimeError(f"no seccomp filter for machine {key!r} (x86_64 and aarch64 are supported)")
    arch, numbers = _ARCHES[key]
    deny, enosys = _ERRNO | errno.EPERM, _ERRNO | errno.ENOSYS
    ops: list[tuple[int, int, int, int]] = [
        (_LD_ABS, 0, 0, _ARCH),
        (_JEQ, 1, 0, arch),
        (_RET, 0, 0, deny),          # a foreign ABI
        (_LD_ABS, 0, 0, _NR),
    ]
    if numbers is _X86_64:
        ops += [(_JGE, 0, 1, _X32_BIT), (_RET, 0, 0, deny)]
    for name in DENIED:
        ops += [(_JEQ, 0, 1, numbers[name]), (_RET, 0, 0, deny)]
    ops += [
        (_JEQ, 0, 1, numbers["clone3"]), (_RET, 0, 0, enosys),
        (_JEQ, 0, 3, numbers["clone"]),
        (_LD_ABS, 0, 0, _ARG0),
        (_JSET, 0, 1, _CLONE_NEW), (_RET, 0, 0, deny),
        (_RET, 0, 0, _ALLOW),
    ]
    return b"".join(struct.pack("<HBBI", *op) for op in ops)
