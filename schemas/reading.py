"""Reading inputs: regular files only, at most `cap + 1` bytes, every path problem a FileProblem.

The path is checked as text (NUL bytes, lone surrogates, PATH_MAX / NAME_MAX), stat'ed before
it is opened (a FIFO or a device is never opened), opened non-blocking, checked again on the
open descriptor (no race), and read for at most `cap + 1` bytes (`/dev/zero` cannot fill memory).
"""

import errno
import os
import stat
from dataclasses import dataclass

MAX_BYTES = 64 * 1024  # a hand-written input is a few KiB; anything larger is a mistake
PATH_MAX, NAME_MAX = 4096, 255  # Linux limits, in bytes (PATH_MAX counts the final NUL)


@dataclass(eq=False)
class FileProblem(Exception):
    """Why a path cannot be read as an input; the caller decides where to blame it."""

    code: str  # E001 unreadable, E003 too large
    expected: str
    got: str
    hint: str


_ERRNO = {
    errno.ENOENT: ("no such file", "check the path"),
    errno.ENOTDIR: ("a path through something that is not a folder", "check the path"),
    errno.ELOOP: ("a symlink loop", "point the symlink at a real file"),
    errno.ENAMETOOLONG: ("a name too long for the file system", "shorten the path"),
    errno.EACCES: ("permission denied", "check permissions"),
    errno.EPERM: ("permission denied", "check permissions"),
}
_KINDS = ((stat.S_ISDIR, "a directory", "name the file inside it"),
          (stat.S_ISFIFO, "a FIFO (named pipe)", "rackc reads regular files only"),
          (stat.S_ISCHR, "a character device", "rackc reads regular files only"),
          (stat.S_ISBLK, "a block device", "rackc reads regular files only"),
          (stat.S_ISSOCK, "a socket", "rackc reads regular files only"))


def _not_regular(mode: int) -> FileProblem | None:
    if stat.S_ISREG(mode):
        return None
    got, hint = next(((g, h) for test, g, h in _KINDS if test(mode)), ("not a file", ""))
    return FileProblem("E001", "a regular file", got, hint)


def _path_bytes(path: str | os.PathLike) -> bytes:
    text = os.fspath(path)
    if "\0" in text:
        raise FileProblem("E001", "a path", "a NUL byte in the path", "remove the NUL byte")
    try:
        raw = os.fsencode(text)
    except UnicodeEncodeError:
        raise FileProblem("E001", "a path", "a lone surrogate in the path",
                          "write the path as plain UTF-8 text") from None
    if len(raw) >= PATH_MAX:
        raise FileProblem("E001", f"a path under {PATH_MAX} bytes", f"{len(raw)} bytes",
                          "shorten the path")
    longest = max((len(part) for part in raw.split(b"/")), default=0)
    if longest > NAME_MAX:
        raise FileProblem("E001", f"file and folder names of at most {NAME_MAX} bytes",
                          f"a name of {longest} bytes", "shorten the path")
    return raw


def read_regular(path: str | os.PathLike, cap: int = MAX_BYTES) -> bytes:
    """The bytes of a regular file of at most `cap` bytes, or FileProblem."""
    raw = _path_bytes(path)
    try:
        problem = _not_regular(os.stat(raw).st_mode)
        if problem:
            raise problem
        fd = os.open(raw, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    except OSError as exc:
        got, hint = _ERRNO.get(exc.errno or 0, (exc.strerror or str(exc), "check the file"))
        raise FileProblem("E001", "a readable file", got, hint) from None
    try:
        problem = _not_regular(os.fstat(fd).st_mode)
        if problem:
            raise problem
        chunks, size = [], 0
        while size <= cap:
            chunk = os.read(fd, cap + 1 - size)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
    except OSError as exc:
        raise FileProblem("E001", "a readable file", exc.strerror or str(exc),
                          "check the file") from None
    finally:
        os.close(fd)
    if size > cap:
        raise FileProblem("E003", f"a file of at most {cap // 1024} KiB",
                          f"more than {cap // 1024} KiB", "this is not a file rackc reads")
    return b"".join(chunks)
