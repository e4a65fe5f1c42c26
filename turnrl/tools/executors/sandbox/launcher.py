"""The trusted server inside a warm sandbox (``pool.py``): the sandbox's pid 1, started
by ``python3 -c`` with this file's text before any call arrives, that runs one program per
request and stays for the next.

Not imported by turnrl: its source is sent into the sandbox. It needs only the sandbox's
``python3`` (3.9 or later) and imports everything it uses at start, with the working dir off
``sys.path``, so no file a program leaves behind is ever imported by it; it imports C modules
(``_socket``, ``_signal``, ``_ctypes``) rather than their Python wrappers, which would pull in
``enum`` and ``re``: a sandbox starts faster and a program finds few modules it did not import.
It makes itself non-dumpable (``prctl``), so no program reads or writes its memory or fds
through ``/proc/1``, and ignores SIGINT (pid 1 ignores what it has no handler for).

Protocol, on the control socket whose fd is ``argv[1]``:

- once started it sends ``b"R"``;
- a call is the one-byte message ``b"C"`` carrying four fds (SCM_RIGHTS): the input pipe
  (a length-prefixed JSON spec as the cold launcher's, the session's packed files when
  ``spec["state_bytes"]`` > 0, then the program's stdin; the spec is marshalled, not JSON), the
  program's stdout and stderr, and
  the pipe the packed working dir goes out through;
- for each it restores the files (only ever into the empty ``/work`` of a fresh sandbox),
  writes ``Program.files``, forks the program under the rlimits, reaps every orphan until the
  program ends, kills every process left (``kill(-1)`` from pid 1) and reaps them, packs
  ``/work`` out, empties ``/tmp`` and ``/dev/shm``, and answers
  ``b"<exit status> <clean> <packed>\\n"`` (``clean`` 0: something could not be removed, so the
  host must not reuse this sandbox; ``packed`` 0: the working dir could not be packed whole, so
  the host keeps the session's files as they were and does not reuse the sandbox either);
- a wipe is the one-byte message ``b"W"`` without fds (``pool="recycle"``, after an episode):
  it kills and reaps every process left, empties ``/work``, ``/tmp`` and ``/dev/shm``, removes
  every System V IPC object of the sandbox's IPC namespace (shared memory, semaphore sets,
  message queues, read from ``/proc/sysvipc``) and checks that all of it is gone, then answers
  ``b"<clean>\n"`` (1: the sandbox is as a fresh one, its next call may be another episode's).
  POSIX message queues, which no mount here would list, cannot be made: seccomp denies
  ``mq_open``.

A ``python3 SCRIPT ...`` or ``python3 -c CODE ...`` program, where ``python3`` is this very
interpreter, runs in the forked child itself, as a fresh interpreter would run it (``__main__``
module, ``sys.argv``, ``sys.path[0]``, tracebacks, ``SystemExit``, threads joined, atexit,
files flushed at exit): no exec, no interpreter start-up. The child starts from this server's
state, which no program can change (each runs in its own forked copy). Anything else is exec'd.
"""

import _ctypes
import _signal
import _socket
import atexit
import builtins
import gc
import marshal
import os
import resource
import stat
import sys
import types

H = 16
"""Digits of a length header (``HEADER_DIGITS`` of ``sandbox.py``)."""
FDS = 4
PYTHON = os.path.realpath(sys.executable)
SEARCH = ("/usr/bin", "/bin")
SCRATCH = {top: stat.S_IMODE(os.stat(top).st_mode) for top in ("/tmp", "/dev/shm")}
WRITABLE = {os.getcwd(): stat.S_IMODE(os.stat(".").st_mode), **SCRATCH}
"""Every writable place in the sandbox (the working dir, bubblewrap's ``--chdir``, first)."""
SYSV = ("shm", "sem", "msg")
"""The System V IPC kinds, as ``/proc/sysvipc`` names them."""
IPC_RMID = 0
PR_SET_DUMPABLE = 4


class _Int(_ctypes._SimpleCData):
    _type_ = "i"


class _Function(_ctypes.CFuncPtr):
    _flags_ = _ctypes.FUNCFLAG_CDECL
    _restype_ = _Int


class _Libc:
    _handle = _ctypes.dlopen(None, 0)


prctl = _Function(("prctl", _Libc()))
shmctl, semctl, msgctl = (_Function((name, _Libc())) for name in ("shmctl", "semctl", "msgctl"))
ipc_remove = {"shm": lambda i: shmctl(i, IPC_RMID, None), "sem": lambda i: semctl(i, 0, IPC_RMID),
              "msg": lambda i: msgctl(i, IPC_RMID, None)}
sys.path[:] = [p for p in sys.path if p not in ("", ".", os.getcwd())]
resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
_signal.signal(_signal.SIGINT, _signal.SIG_IGN)
prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)


def read_exact(fd, n):
    parts = []
    while n:
        b = os.read(fd, min(n, 1 << 20))
        if not b:
            raise EOFError("the input was cut short")
        parts.append(b)
        n -= len(b)
    return b"".join(parts)


def restore(fd, left):
    dirs = []
    while left > 0:
        n = int(read_exact(fd, H))
        left -= H + n
        path, kind, mode, data = marshal.loads(read_exact(fd, n))
        try:
            if kind == "d":
                os.makedirs(path, exist_ok=True)
                dirs.append((path, mode))
            elif kind == "l":
                os.symlink(data, path)
            else:
                f = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
                with os.fdopen(f, "wb") as out:
                    out.write(data)
                os.chmod(path, mode)
        except (OSError, ValueError):
            pass
    for path, mode in reversed(dirs):
        try:
            os.chmod(path, mode)
        except OSError:
            pass


def write_files(files):
    for rel, text in files.items():
        parent = os.path.dirname(rel)
        if parent:
            os.makedirs(parent, exist_ok=True)
        if os.path.islink(rel):
            os.unlink(rel)
        with open(rel, "w", encoding="utf-8") as f:
            f.write(text)


def entry(path):
    """``(kind, mode, data)`` of ``path`` in a pack; None for what is not kept (a fifo, a socket)."""
    st = os.lstat(path)
    if stat.S_ISLNK(st.st_mode):
        return "l", 0, os.readlink(path)
    if stat.S_ISDIR(st.st_mode):
        return "d", stat.S_IMODE(st.st_mode), b""
    if stat.S_ISREG(st.st_mode):
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        with os.fdopen(fd, "rb") as f:
            if stat.S_ISREG(os.fstat(fd).st_mode):
                return "f", stat.S_IMODE(st.st_mode), f.read()
    return None


def pack(out):
    """Write ``/work``'s records to ``out``, each dir before what it holds; False if they could
    not be written whole. No recursion: a tree may be deeper than Python's stack."""
    tops = [""]
    try:
        while tops:
            top = tops.pop()
            try:
                names = os.listdir(top or ".")
            except OSError:
                continue
            for name in names:
                path = top + "/" + name if top else name
                try:
                    item = entry(path)
                except OSError:  # gone meanwhile, or unreadable: not kept
                    continue
                if item is None:
                    continue
                rec = marshal.dumps((path, *item))
                view = memoryview(b"%0*d" % (H, len(rec)) + rec)
                while view:
                    view = view[os.write(out, view):]
                if item[0] == "d":
                    tops.append(path)
    except OSError:
        return False
    return True


def remove(path):
    """Remove ``path``, a whole tree for a dir (each made writable and searchable first),
    without recursion (a tree may be deeper than Python's stack)."""
    todo = [(path, False)]
    while todo:
        path, emptied = todo.pop()
        if emptied:
            os.rmdir(path)
        elif os.path.isdir(path) and not os.path.islink(path):
            os.chmod(path, 0o700)
            todo.append((path, True))
            todo += [(os.path.join(path, name), False) for name in os.listdir(path)]
        else:
            os.unlink(path)


def empty(top, mode):
    """Remove everything under ``top`` and give it back ``mode``; True when that worked."""
    try:
        os.chmod(top, 0o700)
        for name in os.listdir(top):
            remove(os.path.join(top, name))
        os.chmod(top, mode)
        return not os.listdir(top)
    except (OSError, RecursionError):
        return False


def in_process(argv):
    """(source path or None, code or None, sys.argv, sys.path[0]) when ``argv`` is this python
    running a script or ``-c``; None otherwise (then it is exec'd)."""
    if len(argv) < 2 or "/" in argv[0] and os.path.realpath(argv[0]) != PYTHON:
        return None
    if "/" not in argv[0]:
        found = [os.path.join(d, argv[0]) for d in SEARCH if os.access(os.path.join(d, argv[0]), os.X_OK)]
        if not found or os.path.realpath(found[0]) != PYTHON:
            return None
    if argv[1] == "-c" and len(argv) >= 3:
        return None, argv[2], ["-c", *argv[3:]], ""
    if argv[1].startswith("-") or not os.path.isfile(argv[1]):
        return None
    path = os.path.abspath(argv[1])
    return path, None, argv[1:], os.path.dirname(path)


def exit_status(code):
    """The exit status ``SystemExit(code)`` gives, printing a non-int code as python does."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    try:
        print(code, file=sys.stderr)
    except Exception:
        pass
    return 1


def run_python(path, code, args, path0):
    """Run the program in this (forked) interpreter as ``python3`` would; never returns."""
    sys.argv[:] = args
    sys.path.insert(0, path0)
    main = types.ModuleType("__main__")
    main.__dict__.update(__builtins__=builtins, __spec__=None, __loader__=None, __package__=None)
    if path is not None:
        main.__file__, main.__cached__ = path, None
    sys.modules["__main__"] = main
    status = 0
    try:
        if path is not None:
            with open(path, "rb") as f:
                code = f.read()
        compiled = compile(code, path or "<string>", "exec")
        exec(compiled, main.__dict__)
    except SystemExit as e:
        status = exit_status(e.code)
    except BaseException as e:
        e.__traceback__ = e.__traceback__.tb_next  # without this function's own frame, as python shows it
        try:
            sys.excepthook(type(e), e, e.__traceback__)
        except BaseException:
            pass
        status = -_signal.SIGINT if isinstance(e, KeyboardInterrupt) else 1
    try:
        threading = sys.modules.get("threading")
        if threading is not None:
            threading._shutdown()
        atexit._run_exitfuncs()
        main.__dict__.clear()
        gc.collect()  # unclosed files flush at exit, as in a fresh interpreter
    except SystemExit as e:
        status = exit_status(e.code)
    except BaseException:
        pass
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except BaseException:
            status = status or 120
    if status == -_signal.SIGINT:  # python ends on KeyboardInterrupt by killing itself with SIGINT
        _signal.signal(_signal.SIGINT, _signal.SIG_DFL)
        os.kill(os.getpid(), _signal.SIGINT)
    os._exit(status)


def start(spec, fds):
    """Fork the program with ``fds`` (stdin, stdout, stderr) as 0, 1, 2; its pid."""
    argv = spec["argv"]
    pid = os.fork()
    if pid:
        return pid
    try:
        for i, fd in enumerate(fds):
            os.dup2(fd, i)
        os.closerange(3, resource.getrlimit(resource.RLIMIT_NOFILE)[0])
        for name, soft, hard in spec["limits"]:
            resource.setrlimit(getattr(resource, name), (soft, hard))
        prctl(PR_SET_DUMPABLE, 1, 0, 0, 0)  # as after an exec
        _signal.signal(_signal.SIGINT, _signal.default_int_handler)  # as in a fresh python3
        python = in_process(argv)
        if python is not None:
            run_python(*python)
        for sig in (_signal.SIGPIPE, _signal.SIGXFSZ):
            _signal.signal(sig, _signal.SIG_DFL)
        os.execvp(argv[0], argv)
    except OSError as e:
        os.write(2, ("cannot run %r: %s\n" % (argv[0], e.strerror)).encode())
    except BaseException as e:
        os.write(2, ("cannot run %r: %r\n" % (argv[0], e)).encode())
    finally:
        os._exit(127)


def reap(pid):
    """Reap orphans until ``pid`` ends, then kill and reap every process left; its status."""
    status = 0
    while True:
        try:
            done, got = os.wait()
        except ChildProcessError:
            break
        if done == pid:
            status = got
            break
    kill_all()
    return os.waitstatus_to_exitcode(status) if os.WIFEXITED(status) else 128 + os.WTERMSIG(status)


def kill_all():
    """Kill (``kill(-1)`` from pid 1: every process but this one) and reap until none is left."""
    while True:
        try:
            os.kill(-1, _signal.SIGKILL)
        except OSError:
            pass
        try:
            os.wait()
        except ChildProcessError:
            break


def ipc_ids(kind):
    """The ids of the System V IPC objects of ``kind`` in this IPC namespace."""
    with open("/proc/sysvipc/" + kind) as f:
        return [int(line.split()[1]) for line in f.read().splitlines()[1:] if line.strip()]


def wipe():
    """Make the sandbox as a fresh one (the ``b"W"`` request); True when nothing is left."""
    kill_all()
    clean = all([empty(top, mode) for top, mode in WRITABLE.items()])
    try:
        for kind in SYSV:
            for i in ipc_ids(kind):
                ipc_remove[kind](i)
        return clean and not any(ipc_ids(kind) for kind in SYSV)
    except (OSError, ValueError, IndexError):
        return False


def receive(control):
    """The next request: a call's four fds, ``[]`` for a wipe, or None when the host is gone
    or sent something else."""
    try:
        data, ancillary, _, _ = control.recvmsg(1, _socket.CMSG_SPACE(FDS * 4))
    except OSError:
        return None
    fds = []
    for level, kind, payload in ancillary:
        if level == _socket.SOL_SOCKET and kind == _socket.SCM_RIGHTS:
            fds += memoryview(payload[: len(payload) - len(payload) % 4]).cast("i").tolist()
    if (data, len(fds)) in ((b"C", FDS), (b"W", 0)):
        return fds
    for fd in fds:
        os.close(fd)
    return None


def serve(control):
    control.sendall(b"R")
    while True:
        fds = receive(control)
        if fds is None:
            return
        if not fds:
            control.sendall(b"%d\n" % wipe())
            continue
        source, out, err, state = fds
        spec = marshal.loads(read_exact(source, int(read_exact(source, H))))
        try:
            restore(source, spec["state_bytes"])
            write_files(spec["files"])
        except (OSError, ValueError) as e:  # e.g. main.py made a directory by the last call
            os.write(err, ("turnrl sandbox: cannot write the program's files: %s\n" % e).encode())
            status = 1
        else:
            gc.freeze()  # the forked program's collections then skip (and never copy) the server's objects
            status = None
        if status is None:
            pid = start(spec, (source, out, err))
        for fd in (source, out, err):
            os.close(fd)
        if status is None:
            status = reap(pid)
        packed = pack(state)
        os.close(state)
        clean = all([empty(top, mode) for top, mode in SCRATCH.items()])
        control.sendall(b"%d %d %d\n" % (status, clean, packed))


if __name__ == "__main__":
    try:
        serve(_socket.socket(fileno=int(sys.argv[1])))
    except (EOFError, OSError, ValueError):
        pass
    os._exit(0)
