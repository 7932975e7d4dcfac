"""Single-file writes (`predict --plot`, `import-hf -o`, `calibrate -o`): never a half-written
file, never through a planted symlink, never onto something that is not a regular file.

The file is written to an O_EXCL temporary in the target's own folder (so the final rename stays
on one filesystem and cannot follow a link someone placed at the temporary's name), then renamed
over the target. On any error the temporary is removed and the target is as it was.
"""

import contextlib
import os
import stat
import tempfile
from pathlib import Path

from compiler import interrupts
from schemas.diagnostics import CompileError, Diagnostic


def output_error(flag: str, path: Path | str, expected: str, got: str, hint: str) -> CompileError:
    """An output-side failure: names the option, exits 2 (never an internal error)."""
    return CompileError([Diagnostic("error", "E801", "<argument>", 0, 0, f"{flag} {path}",
                                    expected, got, hint)])


def os_error(flag: str, path: Path | str, exc: OSError) -> CompileError:
    where = f" ({exc.filename})" if exc.filename and str(exc.filename) != str(path) else ""
    return output_error(flag, path, "a place rackc can write", f"{exc.strerror or exc}{where}",
                        "check the path, its permissions and free space")


def kind_of(mode: int) -> str:
    for test, name in ((stat.S_ISDIR, "a directory"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISFIFO, "a named pipe"),
                       (stat.S_ISSOCK, "a socket"), (stat.S_ISLNK, "a symbolic link")):
        if test(mode):
            return name
    return "a regular file"


def write_text_atomic(path: Path, text: str, flag: str = "-o",
                      keep: tuple[Path | str, ...] = ()) -> None:
    write_bytes_atomic(path, text.encode("utf-8"), flag, keep)


def check_target(path: Path, flag: str = "-o", keep: tuple[Path | str, ...] = ()) -> int | None:
    """Refuse `path` as an output when it is not a regular file or is one of `keep` (the
    command's inputs, also through a hard link); the mode of the file it would replace (None
    when there is none). Commands call it before their work, and the write calls it again."""
    path = Path(os.path.abspath(path))
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise os_error(flag, path, exc) from None
    if not stat.S_ISREG(st.st_mode):
        raise output_error(flag, path, "a new or regular file", kind_of(st.st_mode),
                           "name a file path; rackc replaces only regular files")
    for k in keep:
        with contextlib.suppress(OSError):
            if os.path.samefile(k, path):
                raise output_error(flag, path, "a file other than the command's inputs",
                                   f"the input {k}", "write the output to a new file")
    return stat.S_IMODE(st.st_mode)


def write_bytes_atomic(path: Path, data: bytes, flag: str = "-o",
                       keep: tuple[Path | str, ...] = ()) -> None:
    """Write `data` to `path`, replacing only a regular file that is none of `keep`; a
    replaced file keeps its mode, a new one gets the umask's."""
    path = Path(os.path.abspath(path))
    mode = check_target(path, flag, keep)
    tmp = None
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".rackc-tmp", dir=path.parent)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.chmod(tmp, mode if mode is not None else 0o666 & ~umask())
        with interrupts.held():  # an interrupt before this replaces nothing; one during it
            os.replace(tmp, path)  # lets the command finish with the file written
            tmp = None
            interrupts.forget()
    except OSError as exc:
        raise os_error(flag, path, exc) from None
    finally:
        if tmp is not None:
            Path(tmp).unlink(missing_ok=True)


def umask() -> int:
    """The process's umask (read by setting and restoring it)."""
    mask = os.umask(0)
    os.umask(mask)
    return mask
