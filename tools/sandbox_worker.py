"""The sandboxed interpreter: confines itself, then runs code cells in one namespace.

Started by `tools.sandbox.Worker` as `python -I -u sandbox_worker.py REQ_FD REPLY_FD`, so it
imports the standard library only. The parent sends JSON lines on REQ_FD (a config first,
then one `{"code", "cpu_s"}` per cell) and reads JSON lines on REPLY_FD (the confinement
report, then one status per cell). fd 1 and fd 2 are one pipe the parent reads and caps.

Confinement, strongest available first; each step reports what it did, and nothing
that fails is skipped silently (the report says so):
- network and process tree: new network and PID namespaces (as root directly, otherwise
  inside a new user namespace); Landlock's TCP rules (ABI >= 4) as well. The processes a
  cell starts end with the cell: killed and reaped before its status is sent
  (`end_cell_processes`); the server kills any that are left (tools/process_tree.py);
- files: Landlock — read/execute only the Python installation and system libraries,
  read/write only the private working directory;
- processes and memory: rlimits (address space, file size, processes, core dumps), and
  as root a private uid so that the process limit applies (root is exempt from it);
  memory is limited per process, not in total (no cgroups);
- CPU: a per-cell CPU timer (ITIMER_PROF) and RLIMIT_CPU backstop whose signals stop the cell.
"""

from __future__ import annotations

import ast
import builtins
import ctypes
import errno
import faulthandler
import json
import linecache
import math
import os
import resource
import signal
import sys
import sysconfig
import time
import traceback

_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long
_CLONE_NEWUSER, _CLONE_NEWNET, _CLONE_NEWPID = 0x10000000, 0x40000000, 0x20000000
_PR_SET_NO_NEW_PRIVS, _PR_SET_KEEPCAPS, _PR_SET_CHILD_SUBREAPER, _PR_SET_PDEATHSIG = 38, 8, 36, 1
_SERVER_CHECK_S = 0.25  # how often the PID namespace's relay checks that its server is alive
_CAP_DAC_READ_SEARCH = 2
_SYS_LANDLOCK = (444, 445, 446)  # create_ruleset, add_rule, restrict_self (all architectures)
_FS_FILE_RIGHTS = 1 | 2 | 4  # execute, write_file, read_file
_FS_READ = 1 | 4 | 8  # execute, read_file, read_dir
_SYSTEM_READ_PATHS = ("/usr", "/lib", "/lib64", "/lib32", "/bin", "/sbin", "/etc/ld.so.cache",
                      "/etc/localtime", "/etc/alternatives")
_DEVICES = ("/dev/null", "/dev/zero", "/dev/urandom", "/dev/random")


class CpuTimeExceeded(BaseException):
    """Raised in the cell by SIGXCPU; a BaseException so `except Exception` does not swallow it."""


def _errno_text() -> str:
    return os.strerror(ctypes.get_errno())


# -- confinement ---------------------------------------------------------------
def isolate_namespaces() -> tuple[dict[str, str], int]:
    """New network and PID namespaces (inside a new user namespace when not root).

    In its own PID namespace the interpreter is process 1: orphans of the cell become its
    children, so it reaps them, and when it dies the kernel kills and reaps all of them.
    """
    names = "network and PID namespaces"
    flags = [_CLONE_NEWNET | _CLONE_NEWPID, _CLONE_NEWNET]
    if os.geteuid() != 0:
        names, flags = names + " inside a user namespace", [_CLONE_NEWUSER | f for f in flags]
    flag = next((f for f in flags if _libc.unshare(f) == 0), None)
    if flag is None:
        failed = f"not enforced: unshare failed: {_errno_text()}"
        return {"network": failed, "process tree": failed}, 0
    if flag & _CLONE_NEWUSER:
        uid, gid = os.getuid(), os.getgid()
        for name, text in (("setgroups", "deny"), ("uid_map", f"{uid} {uid} 1"), ("gid_map", f"{gid} {gid} 1")):
            with open(f"/proc/self/{name}", "w") as f:
                f.write(text)
    tree = ("enforced: private PID namespace, every process a cell starts ends with the cell" if flag & _CLONE_NEWPID
            else "not enforced: no PID namespace; the server kills the processes a cell leaves behind")
    return {"network": f"enforced: private {names} (no interfaces up)", "process tree": tree}, flag


def enter_pid_namespace(keep_fds: tuple[int, ...]) -> None:
    """Fork the namespace's process 1, which returns here. This process only relays SIGINT
    (interrupt the cell) and SIGTERM (kill it) to it, reaps it, and exits as it did.

    Neither outlives the server: a server killed while it was killing the interpreter (stopped
    first, see tools/process_tree.kill_tree) left both behind for good, the interpreter stopped
    and this process waiting on it. So this process kills it when the server is gone, and the
    kernel kills it when this process is (a parent-death signal; not on this process itself:
    the server starts interpreters from threads, and the signal follows the thread)."""
    server = os.getppid()
    child = os.fork()
    if child == 0:
        _libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        return
    for fd in keep_fds:
        os.close(fd)
    signal.signal(signal.SIGINT, lambda *_: os.kill(child, signal.SIGINT))
    signal.signal(signal.SIGTERM, lambda *_: os.kill(child, signal.SIGKILL))
    # SIGCHLD held pending, so that the wait wakes the moment the child ends (no thread: RLIMIT_NPROC
    # is already the cell's, and a thread here would spend one of its processes)
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGCHLD})
    while not (reaped := os.waitpid(child, os.WNOHANG))[0]:
        if os.getppid() != server:  # orphaned: nobody reads the cell's output or will stop it
            os.kill(child, signal.SIGKILL)
        signal.sigtimedwait({signal.SIGCHLD}, _SERVER_CHECK_S)
    status = reaped[1]
    if os.WIFSIGNALED(status):
        signal.signal(os.WTERMSIG(status), signal.SIG_DFL)
        os.kill(os.getpid(), os.WTERMSIG(status))
    os._exit(os.waitstatus_to_exitcode(status))


def set_rlimits(cfg: dict, fresh_uid: bool) -> None:
    """Address space, file size, core dumps and processes. RLIMIT_NPROC counts every task
    of the real uid (in this user namespace): unless the uid is fresh here, the user's
    tasks already running are added, so that the cell gets `max_procs` more."""
    procs = cfg["max_procs"] + (0 if fresh_uid else _count_tasks(os.getuid()))
    for limit, value in ((resource.RLIMIT_AS, cfg["memory_bytes"]), (resource.RLIMIT_FSIZE, cfg["file_bytes"]),
                         (resource.RLIMIT_CORE, 0), (resource.RLIMIT_NPROC, procs)):
        resource.setrlimit(limit, (value, value))


def _count_tasks(uid: int) -> int:
    count = 0
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/status") as f:
                fields = dict(line.split(":", 1) for line in f)
        except (OSError, ValueError):
            continue
        if int(fields["Uid"].split()[0]) == uid:
            count += int(fields["Threads"])
    return count


def _set_capabilities(mask: int) -> bool:
    header = (ctypes.c_uint32 * 2)(0x20080522, 0)  # _LINUX_CAPABILITY_VERSION_3, this process
    data = (ctypes.c_uint32 * 6)(mask, mask, 0, 0, 0, 0)  # effective, permitted, inheritable (x2 words)
    return _libc.syscall(126 if os.uname().machine == "x86_64" else 91, header, data) == 0


def drop_privileges(cfg: dict) -> str:
    """As root, become the parent's private uid: root is exempt from RLIMIT_NPROC.

    The Python installation may sit in a root-only directory (/root/.pyenv), so the
    worker keeps one capability, reading past file permissions; Landlock, applied next,
    bounds what it reads. Without Landlock that is no more than root could read anyway.
    """
    limit = f"at most {cfg['max_procs']} processes/threads (RLIMIT_NPROC)"
    if os.geteuid() != 0:
        _set_capabilities(0)  # drop what the user namespace granted
        return f"enforced: {limit}"
    uid = cfg["uid"]
    os.setgroups([])
    _libc.prctl(_PR_SET_KEEPCAPS, 1, 0, 0, 0)
    os.setresgid(uid, uid, uid)
    os.setresuid(uid, uid, uid)
    kept = "CAP_DAC_READ_SEARCH only" if _set_capabilities(1 << _CAP_DAC_READ_SEARCH) else "no capabilities"
    return f"enforced: private uid {uid} ({kept}), {limit}"


def landlock_abi() -> int:
    abi = _libc.syscall(_SYS_LANDLOCK[0], None, 0, 1)  # LANDLOCK_CREATE_RULESET_VERSION
    return max(abi, 0)


def _read_paths() -> set[str]:
    paths = {sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix}
    paths |= {p for p in sysconfig.get_paths().values()}
    paths |= {p for p in sys.path if p.endswith(("site-packages", "dist-packages"))}
    return {os.path.realpath(p) for p in paths | set(_SYSTEM_READ_PATHS)} | set(_SYSTEM_READ_PATHS)


def apply_landlock(workdir: str, abi: int) -> tuple[str, str]:
    """Restrict files to `workdir` (all rights) and read-only runtime paths; returns (files, net) reports."""
    if abi < 1:
        return "not enforced: Landlock unavailable; only the working directory is private", "not enforced"
    fs_all = (1 << 13) - 1  # ABI 1 rights; then refer (2), truncate (3), ioctl_dev (5)
    fs_all |= (1 << 13 if abi >= 2 else 0) | (1 << 14 if abi >= 3 else 0) | (1 << 15 if abi >= 5 else 0)
    net_all = 3 if abi >= 4 else 0  # bind_tcp, connect_tcp
    scoped = 3 if abi >= 6 else 0  # abstract unix sockets, signals outside the sandbox
    attr = (ctypes.c_uint64 * 3)(fs_all, net_all, scoped)
    size = 8 if abi < 4 else 16 if abi < 6 else 24
    ruleset = _libc.syscall(_SYS_LANDLOCK[0], attr, size, 0)
    if ruleset < 0:
        return f"not enforced: landlock_create_ruleset failed: {_errno_text()}", "not enforced"
    rules = [(p, _FS_READ) for p in _read_paths()] + [(d, 4 | 2) for d in _DEVICES] + [(workdir, fs_all)]
    for path, access in rules:
        _add_landlock_rule(ruleset, path, access)
    _libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
    if _libc.syscall(_SYS_LANDLOCK[2], ruleset, 0) != 0:
        return f"not enforced: landlock_restrict_self failed: {_errno_text()}", "not enforced"
    os.close(ruleset)
    files = (f"enforced (Landlock ABI {abi}): read/write only in the working directory; "
             "read-only Python and system libraries")
    net = "enforced: Landlock denies TCP connect/bind" if net_all else "not enforced by Landlock (ABI < 4)"
    return files, net


def _add_landlock_rule(ruleset: int, path: str, access: int) -> None:
    try:
        fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
    except OSError:
        return
    if not os.path.isdir(path):
        access &= _FS_FILE_RIGHTS
    attr = ctypes.create_string_buffer(access.to_bytes(8, "little") + fd.to_bytes(4, "little", signed=True), 12)
    _libc.syscall(_SYS_LANDLOCK[1], ruleset, 1, attr, 0)  # LANDLOCK_RULE_PATH_BENEATH
    os.close(fd)


def confine(cfg: dict, pipe_fds: tuple[int, ...]) -> dict:
    report, flags = isolate_namespaces()
    set_rlimits(cfg, fresh_uid=os.geteuid() == 0 or bool(flags & _CLONE_NEWUSER))
    if report["process tree"].startswith("enforced"):
        enter_pid_namespace(pipe_fds)
    _libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)  # orphans of the cell come back here to be reaped
    abi = landlock_abi()
    report["memory"] = f"enforced: {cfg['memory_bytes']} bytes of address space per process (RLIMIT_AS)"
    report["processes"] = drop_privileges(cfg)
    report["files"], report["tcp"] = apply_landlock(cfg["workdir"], abi)
    os.chdir(cfg["workdir"])
    return report


# -- cells ------------------------------------------------------------------------
def _on_cpu_limit(signum, frame):
    raise CpuTimeExceeded("CPU time limit exceeded")


def _compile_cell(code: str, filename: str):
    """(statements, final expression or None): a final expression's value is printed, as in Jupyter."""
    linecache.cache[filename] = (len(code), None, code.splitlines(True), filename)
    tree = ast.parse(code, filename, "exec")
    final = tree.body[-1] if tree.body else None
    if isinstance(final, ast.Expr):
        tree.body.pop()
        last = ast.Expression(final.value)
        return compile(tree, filename, "exec"), compile(last, filename, "eval")
    return compile(tree, filename, "exec"), None


def _print_exception(exc: BaseException) -> None:
    """The traceback without this file's frames: the model sees its own cell only."""
    report = traceback.TracebackException.from_exception(exc)
    report.stack = traceback.StackSummary.from_list([f for f in report.stack if f.filename != __file__])
    sys.stderr.write("".join(report.format()))


def _limit_status(exc: BaseException) -> str:
    """Which sandbox limit stopped the cell, if any: cpu | memory | processes | interrupted | ok."""
    if isinstance(exc, BlockingIOError) and exc.errno == errno.EAGAIN:
        frames = traceback.extract_tb(exc.__traceback__)
        starts_process = frames and ("fork" in (frames[-1].line or "") or
                                     frames[-1].filename.endswith(("subprocess.py", "popen_fork.py", "pty.py")))
        return "processes" if starts_process else "ok"
    kinds = {CpuTimeExceeded: "cpu", MemoryError: "memory", KeyboardInterrupt: "interrupted"}
    return next((status for kind, status in kinds.items() if isinstance(exc, kind)), "ok")


def _reap_children() -> bool:
    """Collect exited children (a fork bomb leaves many), which would otherwise count against
    the process limit; True while live children remain. A `Popen` of the cell whose process
    was reaped here reads returncode 0."""
    try:
        while os.waitpid(-1, os.WNOHANG)[0] > 0:
            pass
    except ChildProcessError:
        return False
    return True


def end_cell_processes(in_pid_namespace: bool) -> None:
    """Kill and reap every process the cell started, before its status is sent: none outlives
    the cell or writes into the next one's output.

    In its own PID namespace the interpreter is process 1, so kill(-1) reaches exactly the
    cell's processes (setsid'd and double-forked ones included) and spares the caller; a fork
    racing it fails. Without a namespace this process cannot list them (Landlock hides /proc):
    the server kills its descendants from outside (tools/process_tree.py) after the reply.
    """
    deadline = time.monotonic() + 5.0
    while in_pid_namespace and time.monotonic() < deadline:
        try:
            os.kill(-1, signal.SIGKILL)
        except ProcessLookupError:
            pass
        if not _reap_children():
            return
        time.sleep(0.001)  # killed, not yet exited
    _reap_children()


def run_cell(code: str, cpu_s: float, namespace: dict, filename: str, in_pid_namespace: bool = False) -> str:
    """Run one cell in `namespace`; returns the status (see `_limit_status`)."""
    main_pid = os.getpid()
    _reap_children()  # orphans that exited since the last cell
    used = resource.getrusage(resource.RUSAGE_SELF)
    soft = math.ceil(used.ru_utime + used.ru_stime + cpu_s) + 1  # backstop, and the limit forked children inherit
    resource.setrlimit(resource.RLIMIT_CPU, (soft, resource.RLIM_INFINITY))
    signal.setitimer(signal.ITIMER_PROF, cpu_s)  # precise: this process's CPU time in this cell
    status = "ok"
    try:
        statements, last = _compile_cell(code, filename)
        exec(statements, namespace)
        if last is not None and (value := eval(last, namespace)) is not None:
            print(repr(value))
    except SyntaxError as exc:
        sys.stderr.write("".join(traceback.format_exception_only(type(exc), exc)))
    except BaseException as exc:  # the cell's own errors are output, as in a notebook
        if os.getpid() != main_pid:
            os._exit(1)  # a child the cell forked: never return to the request loop
        status = _limit_status(exc)
        _print_exception(exc)
    finally:
        if os.getpid() != main_pid:
            os._exit(0)
        signal.setitimer(signal.ITIMER_PROF, 0)
        end_cell_processes(in_pid_namespace)
        resource.setrlimit(resource.RLIMIT_CPU, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
    return status


def main() -> None:
    requests = os.fdopen(int(sys.argv[1]), "r", encoding="utf-8")
    replies = os.fdopen(int(sys.argv[2]), "w", encoding="utf-8", buffering=1)
    cfg = json.loads(requests.readline())
    report = confine(cfg, (requests.fileno(), replies.fileno()))
    in_pid_namespace = report["process tree"].startswith("enforced")
    replies.write(json.dumps({"report": report}) + "\n")
    faulthandler.enable()  # a segfault prints the cell's Python traceback before the process dies
    # The wall-clock limit interrupts a cell with SIGINT: honour it even when batchrun itself was
    # started with SIGINT ignored (`batchrun submit ... &` from a script), which children inherit.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    for signum in (signal.SIGXCPU, signal.SIGPROF):
        signal.signal(signum, _on_cpu_limit)
    namespace = {"__name__": "__main__", "__builtins__": builtins}
    number = 0
    while line := _next_request(requests):  # ends when the parent closes the pipe
        number += 1
        request = json.loads(line)
        status = run_cell(request["code"], request["cpu_s"], namespace, f"<cell {number}>", in_pid_namespace)
        replies.write(json.dumps({"status": status}) + "\n")


def _next_request(requests) -> str:
    """The next request line ('' at EOF); an interrupt that arrives between cells is ignored."""
    while True:
        try:
            return requests.readline()
        except KeyboardInterrupt:
            continue


if __name__ == "__main__":
    main()
