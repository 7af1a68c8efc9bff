"""The seccomp profile of a container that writes into a host folder other host users may
reach: the engine's default rules, plus no set-user-ID or set-group-ID bit, ever.

Why: without a user namespace, root in a container is uid 0 on the host's filesystem. A root
sandbox that can write a host folder (the caller's workspace, a read-write mount) could leave
a root-owned program there with the set-user-ID bit, and any host user who later runs it is
root. Capabilities cannot stop that (an owner sets the bit on its own file without any), so
every system call that can set it is filtered on its mode argument:

- chmod, fchmod, fchmodat, creat, mknod, mknodat: allowed only when the mode has neither
  S_ISUID nor S_ISGID;
- open, openat: allowed without O_CREAT/O_TMPFILE, or with a mode free of both bits;
- openat2 (its mode sits in a struct a filter cannot read), fchmodat2 and io_uring (whose
  operations no filter sees) answer ENOSYS, so C libraries fall back to the calls above.

File capabilities (`security.capability`) need CAP_SETFCAP, which no file is granted on its
own (spec/policy.py), and device nodes need CAP_MKNOD: with this profile no program left in
such a folder gives privileges to anyone. The rest is the engine's default profile (the
system calls a container may make, and those gated on a capability it holds), written here
because an engine takes one profile or its own, never both.

A container that writes only into the private workspace (in the owner-only project folder)
keeps the engine's own profile: a root sandbox may install set-user-ID programs into its own
filesystem there (a package manager does), which no other host user can reach. gVisor does
not apply this profile to `docker exec`'d processes: spec checks keep its writable host
folders out of other users' reach instead (backends/container/binds.py)."""

from __future__ import annotations

import json
from typing import Any

SETID_BITS = 0o6000
"""S_ISUID | S_ISGID."""
CREATE_FLAGS = 0o100 | 0o20000000
"""O_CREAT | __O_TMPFILE (the same numbers on every architecture Linux containers run on)."""
ENOSYS = 38

_ALLOWED = """
accept accept4 access adjtimex alarm bind brk capget capset chdir chown chown32
clock_adjtime clock_adjtime64 clock_getres clock_getres_time64 clock_gettime clock_gettime64
clock_nanosleep clock_nanosleep_time64 close close_range connect copy_file_range dup dup2
dup3 epoll_create epoll_create1 epoll_ctl epoll_ctl_old epoll_pwait epoll_pwait2 epoll_wait
epoll_wait_old eventfd eventfd2 execve execveat exit exit_group faccessat faccessat2
fadvise64 fadvise64_64 fallocate fanotify_mark fchdir fchown fchown32 fchownat fcntl fcntl64
fdatasync fgetxattr flistxattr flock fork fremovexattr fsetxattr fstat fstat64 fstatat64
fstatfs fstatfs64 fsync ftruncate ftruncate64 futex futex_time64 futex_waitv futimesat
getcpu getcwd getdents getdents64 getegid getegid32 geteuid geteuid32 getgid getgid32
getgroups getgroups32 getitimer getpeername getpgid getpgrp getpid getppid getpriority
getrandom getresgid getresgid32 getresuid getresuid32 getrlimit get_robust_list getrusage
getsid getsockname getsockopt get_thread_area gettid gettimeofday getuid getuid32 getxattr
inotify_add_watch inotify_init inotify_init1 inotify_rm_watch io_cancel ioctl io_destroy
io_getevents io_pgetevents io_pgetevents_time64 ioprio_get ioprio_set io_setup io_submit ipc
kill landlock_add_rule landlock_create_ruleset landlock_restrict_self lchown lchown32
lgetxattr link linkat listen listxattr llistxattr _llseek lremovexattr lseek lsetxattr lstat
lstat64 madvise membarrier memfd_create memfd_secret mincore mkdir mkdirat mlock mlock2
mlockall mmap mmap2 mprotect mq_getsetattr mq_notify mq_open mq_timedreceive
mq_timedreceive_time64 mq_timedsend mq_timedsend_time64 mq_unlink mremap msgctl msgget
msgrcv msgsnd msync munlock munlockall munmap name_to_handle_at nanosleep newfstatat
_newselect pause pidfd_open pidfd_send_signal pipe pipe2 pkey_alloc pkey_free pkey_mprotect
poll ppoll ppoll_time64 prctl pread64 preadv preadv2 prlimit64 process_mrelease pselect6
pselect6_time64 pwrite64 pwritev pwritev2 read readahead readlink readlinkat readv recv
recvfrom recvmmsg recvmmsg_time64 recvmsg remap_file_pages removexattr rename renameat
renameat2 restart_syscall rmdir rseq rt_sigaction rt_sigpending rt_sigprocmask
rt_sigqueueinfo rt_sigreturn rt_sigsuspend rt_sigtimedwait rt_sigtimedwait_time64
rt_tgsigqueueinfo sched_getaffinity sched_getattr sched_getparam sched_get_priority_max
sched_get_priority_min sched_getscheduler sched_rr_get_interval sched_rr_get_interval_time64
sched_setaffinity sched_setattr sched_setparam sched_setscheduler sched_yield seccomp select
semctl semget semop semtimedop semtimedop_time64 send sendfile sendfile64 sendmmsg sendmsg
sendto setfsgid setfsgid32 setfsuid setfsuid32 setgid setgid32 setgroups setgroups32
setitimer setpgid setpriority setregid setregid32 setresgid setresgid32 setresuid
setresuid32 setreuid setreuid32 setrlimit set_robust_list setsid setsockopt set_thread_area
set_tid_address setuid setuid32 setxattr shmat shmctl shmdt shmget shutdown sigaltstack
signalfd signalfd4 sigprocmask sigreturn socketcall socketpair splice stat stat64 statfs
statfs64 statx symlink symlinkat sync sync_file_range syncfs sysinfo tee tgkill time
timer_create timer_delete timer_getoverrun timer_gettime timer_gettime64 timer_settime
timer_settime64 timerfd_create timerfd_gettime timerfd_gettime64 timerfd_settime
timerfd_settime64 times tkill truncate truncate64 ugetrlimit umask uname unlink unlinkat
utime utimensat utimensat_time64 utimes vfork vmsplice wait4 waitid waitpid write writev
""".split()  # noqa: SIM905 (a table, kept readable)
"""Allowed to every container, as in the engine's default profile (less the calls below)."""

MODE_ARG = {
    "chmod": 1,
    "fchmod": 1,
    "fchmodat": 2,
    "creat": 1,
    "mknod": 1,
    "mknodat": 2,
    "open": 2,
    "openat": 3,
}
"""The calls whose mode may carry S_ISUID/S_ISGID, and which argument holds it."""
CREATE_FLAGS_ARG = {"open": 1, "openat": 2}
"""Where open and openat keep their flags (without O_CREAT the mode is not used)."""
UNAVAILABLE = ("openat2", "fchmodat2", "io_uring_setup", "io_uring_enter", "io_uring_register")
"""Answered ENOSYS: each could set the bits, or open files, past the filter."""

_ARCHES = {
    "SCMP_ARCH_X86_64": ["SCMP_ARCH_X86", "SCMP_ARCH_X32"],
    "SCMP_ARCH_AARCH64": ["SCMP_ARCH_ARM"],
    "SCMP_ARCH_S390X": ["SCMP_ARCH_S390"],
    "SCMP_ARCH_RISCV64": [],
}
_CAP_GATED = {
    "CAP_SYS_ADMIN": (
        "bpf clone clone3 fanotify_init fsconfig fsmount fsopen fspick lookup_dcookie mount "
        "mount_setattr move_mount open_tree perf_event_open quotactl quotactl_fd "
        "setdomainname sethostname setns syslog umount umount2 unshare"
    ),
    "CAP_DAC_READ_SEARCH": "open_by_handle_at",
    "CAP_SYS_BOOT": "reboot",
    "CAP_SYS_CHROOT": "chroot",
    "CAP_SYS_MODULE": "delete_module init_module finit_module",
    "CAP_SYS_PACCT": "acct",
    "CAP_SYS_PTRACE": "kcmp pidfd_getfd process_madvise process_vm_readv process_vm_writev ptrace",
    "CAP_SYS_RAWIO": "iopl ioperm",
    "CAP_SYS_TIME": "settimeofday stime clock_settime clock_settime64",
    "CAP_SYS_TTY_CONFIG": "vhangup",
    "CAP_SYS_NICE": "get_mempolicy mbind set_mempolicy set_mempolicy_home_node",
    "CAP_SYSLOG": "syslog",
    "CAP_BPF": "bpf",
    "CAP_PERFMON": "perf_event_open",
}
"""Calls a container may make only when it holds the capability (evaluated by the engine)."""
NAMESPACE_FLAGS = 0x7E020000
"""CLONE_NEWNS|NEWCGROUP|NEWUTS|NEWIPC|NEWUSER|NEWPID|NEWNET: `clone` without them is allowed
to every container; with them only under CAP_SYS_ADMIN."""
_PERSONALITIES = (0x0, 0x8, 0x20000, 0x20008, 0xFFFFFFFF)


def _arg(index: int, value: int, op: str, two: int = 0) -> dict[str, Any]:
    return {"index": index, "value": value, "valueTwo": two, "op": op}


def _no_setid_rules() -> list[dict[str, Any]]:
    rules: list[dict[str, Any]] = []
    for name, index in MODE_ARG.items():
        rules.append(
            {
                "names": [name],
                "action": "SCMP_ACT_ALLOW",
                "args": [_arg(index, SETID_BITS, "SCMP_CMP_MASKED_EQ")],
            }
        )
    for name, index in CREATE_FLAGS_ARG.items():
        rules.append(
            {
                "names": [name],
                "action": "SCMP_ACT_ALLOW",
                "args": [_arg(index, CREATE_FLAGS, "SCMP_CMP_MASKED_EQ")],
            }
        )
    rules.append({"names": list(UNAVAILABLE), "action": "SCMP_ACT_ERRNO", "errnoRet": ENOSYS})
    return rules


def _engine_rules() -> list[dict[str, Any]]:
    """The engine's default rules beyond the plain allow-list."""
    rules: list[dict[str, Any]] = [
        {
            "names": ["ptrace", "process_vm_readv", "process_vm_writev"],
            "action": "SCMP_ACT_ALLOW",
            "includes": {"minKernel": "4.8"},
        },
        {"names": ["socket"], "action": "SCMP_ACT_ALLOW", "args": [_arg(0, 40, "SCMP_CMP_NE")]},
        *(
            {
                "names": ["personality"],
                "action": "SCMP_ACT_ALLOW",
                "args": [_arg(0, p, "SCMP_CMP_EQ")],
            }
            for p in _PERSONALITIES
        ),
        {
            "names": ["arch_prctl"],
            "action": "SCMP_ACT_ALLOW",
            "includes": {"arches": ["amd64", "x32"]},
        },
        {
            "names": ["modify_ldt"],
            "action": "SCMP_ACT_ALLOW",
            "includes": {"arches": ["amd64", "x32", "x86"]},
        },
        {
            "names": [
                "arm_fadvise64_64",
                "arm_sync_file_range",
                "sync_file_range2",
                "breakpoint",
                "cacheflush",
                "set_tls",
            ],
            "action": "SCMP_ACT_ALLOW",
            "includes": {"arches": ["arm", "arm64"]},
        },
        {
            "names": ["s390_pci_mmio_read", "s390_pci_mmio_write", "s390_runtime_instr"],
            "action": "SCMP_ACT_ALLOW",
            "includes": {"arches": ["s390", "s390x"]},
        },
        {
            "names": ["riscv_flush_icache"],
            "action": "SCMP_ACT_ALLOW",
            "includes": {"arches": ["riscv64"]},
        },
        {
            "names": ["clone"],
            "action": "SCMP_ACT_ALLOW",
            "args": [_arg(0, NAMESPACE_FLAGS, "SCMP_CMP_MASKED_EQ")],
            "excludes": {"caps": ["CAP_SYS_ADMIN"], "arches": ["s390", "s390x"]},
        },
        {
            "names": ["clone"],
            "action": "SCMP_ACT_ALLOW",
            "args": [_arg(1, NAMESPACE_FLAGS, "SCMP_CMP_MASKED_EQ")],
            "includes": {"arches": ["s390", "s390x"]},
            "excludes": {"caps": ["CAP_SYS_ADMIN"]},
        },
        {
            "names": ["clone3"],
            "action": "SCMP_ACT_ERRNO",
            "errnoRet": ENOSYS,
            "excludes": {"caps": ["CAP_SYS_ADMIN"]},
        },
    ]
    for cap, names in _CAP_GATED.items():
        rules.append(
            {"names": names.split(), "action": "SCMP_ACT_ALLOW", "includes": {"caps": [cap]}}
        )
    return rules


def profile() -> dict[str, Any]:
    """The whole profile, as the engine takes it (`--security-opt seccomp=FILE`)."""
    return {
        "defaultAction": "SCMP_ACT_ERRNO",
        "defaultErrnoRet": 1,
        "archMap": [{"architecture": a, "subArchitectures": s} for a, s in _ARCHES.items()],
        "syscalls": [
            {"names": list(_ALLOWED), "action": "SCMP_ACT_ALLOW"},
            *_engine_rules(),
            *_no_setid_rules(),
        ],
    }


def profile_text() -> str:
    """The profile as the file the engine reads (compact: Compose inlines it as given)."""
    return json.dumps(profile(), separators=(",", ":"), sort_keys=True)
