"""The executor's descriptors: frames written whole, and the host's FIFOs opened (as root)
for a command. Standard library only, Python 3.7+ (copied into containers beside the
executor)."""

import errno
import fcntl
import os
import select
import socket
import stat


def write_all(fd, data):
    """Write all of `data`, or raise: a frame is never cut. Some kernels (gVisor's) take a
    write in pieces, or refuse one for a moment (EAGAIN) on a descriptor that blocks
    elsewhere; a frame cut there would leave the reader taking bytes of output for a
    header."""
    view = memoryview(data)
    while view:
        try:
            view = view[os.write(fd, view) :]
        except BlockingIOError:
            select.select([], [fd], [], 1.0)
        except InterruptedError:
            pass


def open_fifo(path, flags):
    """A FIFO of the host's, opened here as root: the host made it mode 0, so that only a
    process holding CAP_DAC_OVERRIDE opens it (this executor, and a root sandbox, which may
    do anything in it anyway), never another sandbox user. Non-blocking to open (the host
    holds the other end already), blocking for the command."""
    fd = os.open(path, flags | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        if not stat.S_ISFIFO(os.fstat(fd).st_mode):
            raise OSError(errno.EINVAL, "not a FIFO")
        fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~os.O_NONBLOCK)
    except OSError:
        os.close(fd)
        raise
    return fd


def open_fifos(req):
    """[stdin, stdout]: the request's FIFOs opened, or None for a pipe."""
    fifos = [None, None]
    try:
        if req.stdin_fifo:
            fifos[0] = open_fifo(req.stdin_fifo, os.O_RDONLY)
        if req.stdout_fifo:
            fifos[1] = open_fifo(req.stdout_fifo, os.O_WRONLY)
    except OSError:
        close_all(fifos)
        raise
    return fifos


def close_all(fds):
    for i, fd in enumerate(fds):
        if fd is not None:
            fds[i] = None
            try:
                os.close(fd)
            except OSError:
                pass


CONNECT_WITHIN = 1.5
"""Seconds the executor tries to reach the host's socket before it stays on its pipes."""


def connect_host(path, token):
    """A connection to the socket the host listens on (in the host folder this container
    alone sees, read-only here), the host's token shown first, once the host said it took
    it (one byte): the host takes no other connection for this executor's. The folder is
    opened without following a link (an image may have put one where it is mounted), and
    the socket reached through that descriptor."""
    folder, _, name = path.rpartition("/")
    if not name or "/" in name or name in (".", ".."):
        raise ValueError("not a socket's path: %r" % path)
    fd = os.open(folder or "/", os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.settimeout(CONNECT_WITHIN)
        sock.connect("/proc/self/fd/%d/%s" % (fd, name))
        sock.sendall(token)
        if sock.recv(1) != b"\1":
            raise OSError(errno.ECONNRESET, "the host did not take the connection")
        sock.settimeout(None)
    except BaseException:
        sock.close()
        raise
    finally:
        os.close(fd)
    return sock
