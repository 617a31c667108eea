"""The jail's seccomp filter: system calls graded code never needs, refused with EPERM.

A classic-BPF program (what ``bwrap --seccomp FD`` loads) that refuses
debugging other processes (ptrace, process_vm_readv/writev), new namespaces
(unshare, setns, clone with a CLONE_NEW* flag: a nested user namespace would
give the submission capabilities over its own mounts), mounting, loading
kernel code (bpf, modules, kexec), the kernel's keyring, perf_event_open,
userfaultfd, open_by_handle_at and io_uring (whose queued operations no
filter sees). clone3 answers ENOSYS: its flags are in memory a filter cannot
read, and the C library falls back to clone, whose flags it can.

Sockets of four families only: AF_UNIX, AF_INET and AF_INET6 (zmq, gloo and
c10d on the loopback) and AF_NETLINK's NETLINK_ROUTE protocol (getifaddrs and
if_nameindex, which gloo, NCCL and course._processes call to find the
loopback interface). Every other family (AF_VSOCK, AF_PACKET, AF_BLUETOOTH,
AF_ALG, ...) answers EAFNOSUPPORT, as a kernel without it would; another
netlink protocol EPROTONOSUPPORT; socketpair only AF_UNIX. Everything the labs
do (threads, fork, forkserver, sockets on 127.0.0.1) passes.
"""
from __future__ import annotations

import errno
import platform
import struct

# linux/audit.h
AUDIT_ARCH = {"x86_64": 0xC000003E, "aarch64": 0xC00000B7}
X32_SYSCALL_BIT = 0x40000000

#: The refused calls' numbers: arch/x86/entry/syscalls/syscall_64.tbl and asm-generic/unistd.h.
REFUSED = {
    "x86_64": {
        "ptrace": 101, "process_vm_readv": 310, "process_vm_writev": 311, "setns": 308,
        "mount": 165, "umount2": 166, "pivot_root": 155, "chroot": 161, "bpf": 321,
        "perf_event_open": 298, "userfaultfd": 323, "keyctl": 250, "add_key": 248,
        "request_key": 249, "kexec_load": 246, "kexec_file_load": 320, "init_module": 175,
        "finit_module": 313, "delete_module": 176, "open_by_handle_at": 304,
        "open_tree": 428, "move_mount": 429, "fsopen": 430, "fsconfig": 431, "fsmount": 432,
        "fspick": 433, "mount_setattr": 442, "swapon": 167, "swapoff": 168, "reboot": 169,
        "io_uring_setup": 425, "io_uring_enter": 426, "io_uring_register": 427,
    },
    "aarch64": {
        "ptrace": 117, "process_vm_readv": 270, "process_vm_writev": 271, "setns": 268,
        "mount": 40, "umount2": 39, "pivot_root": 41, "chroot": 51, "bpf": 280,
        "perf_event_open": 241, "userfaultfd": 282, "keyctl": 219, "add_key": 217,
        "request_key": 218, "kexec_load": 104, "kexec_file_load": 294, "init_module": 105,
        "finit_module": 273, "delete_module": 106, "open_by_handle_at": 265,
        "open_tree": 428, "move_mount": 429, "fsopen": 430, "fsconfig": 431, "fsmount": 432,
        "fspick": 433, "mount_setattr": 442, "swapon": 224, "swapoff": 225, "reboot": 142,
        "io_uring_setup": 425, "io_uring_enter": 426, "io_uring_register": 427,
    },
}
#: Calls refused only with namespace flags in their first argument.
FLAG_CHECKED = {"x86_64": {"clone": 56, "unshare": 272}, "aarch64": {"clone": 220, "unshare": 97}}
CLONE3 = 435  # the same on both
#: Calls refused unless their first argument is an allowed address family.
FAMILY_CHECKED = {"x86_64": {"socket": 41, "socketpair": 53}, "aarch64": {"socket": 198, "socketpair": 199}}
# linux/socket.h, linux/netlink.h
AF_UNIX, AF_INET, AF_INET6, AF_NETLINK, NETLINK_ROUTE = 1, 2, 10, 16, 0
SOCKET_FAMILIES = (AF_UNIX, AF_INET, AF_INET6)  # and AF_NETLINK with NETLINK_ROUTE

# linux/sched.h: CLONE_NEWNS, NEWCGROUP, NEWUTS, NEWIPC, NEWUSER, NEWPID, NEWNET
CLONE_NEW_NAMESPACES = 0x00020000 | 0x02000000 | 0x04000000 | 0x08000000 | 0x10000000 | 0x20000000 | 0x40000000
CLONE_NEWTIME = 0x00000080  # unshare only: in clone's flags these bits are the exit signal

# linux/filter.h, linux/seccomp.h
LD_W_ABS, JEQ_K, JGE_K, AND_K, RET_K = 0x20, 0x15, 0x35, 0x54, 0x06
RET_ALLOW = 0x7FFF0000
RET_ERRNO = 0x00050000
NR_OFFSET, ARCH_OFFSET, ARG0_LOW_OFFSET, ARG2_LOW_OFFSET = 0, 4, 16, 32  # struct seccomp_data, little-endian


class SeccompUnsupported(Exception):
    pass


def _ins(code: int, k: int = 0, jt: int = 0, jf: int = 0) -> tuple:
    return (code, jt, jf, k)


def program(machine: str | None = None) -> bytes:
    """The filter for this machine's architecture, as bwrap reads it (struct sock_filter[])."""
    machine = machine or platform.machine()
    if machine not in AUDIT_ARCH:
        raise SeccompUnsupported(f"no seccomp filter for {machine}; the jail knows x86_64 and aarch64")
    refused = sorted(REFUSED[machine].values())
    clone, unshare = FLAG_CHECKED[machine]["clone"], FLAG_CHECKED[machine]["unshare"]
    socket, socketpair = FAMILY_CHECKED[machine]["socket"], FAMILY_CHECKED[machine]["socketpair"]
    # Layout: checks, then the returns they jump to. Jumps are relative and forward only.
    body = [("ld", ARCH_OFFSET), ("jne", AUDIT_ARCH[machine], "eperm"), ("ld", NR_OFFSET)]
    if machine == "x86_64":  # the x32 ABI numbers the same calls differently
        body.append(("jge", X32_SYSCALL_BIT, "eperm"))
    body += [("jeq", nr, "eperm") for nr in refused]
    body += [("jeq", CLONE3, "enosys"), ("jeq", clone, "clone"), ("jeq", unshare, "unshare"),
             ("jeq", socket, "socket"), ("jeq", socketpair, "socketpair"), ("ret", RET_ALLOW)]
    # The family and protocol are ints: the kernel reads the low 32 bits of each argument only.
    body += [("label", "socket"), ("ld", ARG0_LOW_OFFSET), *[("jeq", f, "allow") for f in SOCKET_FAMILIES],
             ("jeq", AF_NETLINK, "netlink"), ("ret", RET_ERRNO | errno.EAFNOSUPPORT),
             ("label", "netlink"), ("ld", ARG2_LOW_OFFSET), ("jeq", NETLINK_ROUTE, "allow"),
             ("ret", RET_ERRNO | errno.EPROTONOSUPPORT)]
    body += [("label", "socketpair"), ("ld", ARG0_LOW_OFFSET), ("jeq", AF_UNIX, "allow"),
             ("ret", RET_ERRNO | errno.EAFNOSUPPORT)]
    body += [("label", "clone"), ("ld", ARG0_LOW_OFFSET), ("and", CLONE_NEW_NAMESPACES),
             ("jeq", 0, "allow"), ("ret", RET_ERRNO | errno.EPERM)]
    body += [("label", "unshare"), ("ld", ARG0_LOW_OFFSET), ("and", CLONE_NEW_NAMESPACES | CLONE_NEWTIME),
             ("jeq", 0, "allow"), ("ret", RET_ERRNO | errno.EPERM)]
    body += [("label", "allow"), ("ret", RET_ALLOW),
             ("label", "eperm"), ("ret", RET_ERRNO | errno.EPERM),
             ("label", "enosys"), ("ret", RET_ERRNO | errno.ENOSYS)]
    labels, index = {}, 0
    for op in body:
        if op[0] == "label":
            labels[op[1]] = index
        else:
            index += 1
    out, index = [], 0
    for op in body:
        kind = op[0]
        if kind == "label":
            continue
        if kind == "ld":
            out.append(_ins(LD_W_ABS, op[1]))
        elif kind == "and":
            out.append(_ins(AND_K, op[1]))
        elif kind == "ret":
            out.append(_ins(RET_K, op[1]))
        else:
            jump = labels[op[2]] - index - 1
            if not 0 <= jump < 256:
                raise AssertionError(f"seccomp jump out of range: {jump}")
            if kind == "jne":
                out.append(_ins(JEQ_K, op[1], jt=0, jf=jump))
            else:
                out.append(_ins(JEQ_K if kind == "jeq" else JGE_K, op[1], jt=jump, jf=0))
        index += 1
    return b"".join(struct.pack("=HBBI", *ins) for ins in out)
