"""`rackc compile -o OUT`: the only code that writes an output folder, and the rules that keep it
from destroying anything rackc did not write.

OUT may be created, an empty OUT filled, or an OUT that rackc wrote replaced. rackc knows its
own folders by `MANIFEST`, which lists every file with its sha256: a folder whose contents are
not exactly what its manifest lists (a file added, edited or removed since) is not replaced.
Everything else is refused before any work: a non-empty foreign folder, a non-directory, a
link, a device, `/`, the home folder, the working directory or a folder above it, and a folder
that holds an input file.

Replacing is one `renameat2(RENAME_EXCHANGE)` of a fully written staging folder with OUT (so
OUT is never missing), falling back to two renames with the old OUT restored if the second
fails. A lock on OUT's parent folder serialises concurrent compiles into one OUT; staging
folders (marked with their process id and a random token) of processes that were killed are
swept under that lock. Nothing is left beside OUT when a run ends, however it ends short of
SIGKILL.
"""

import contextlib
import ctypes
import errno
import fcntl
import hashlib
import json
import os
import secrets
import shutil
import stat
from collections.abc import Iterable, Iterator
from pathlib import Path, PurePosixPath

from compiler import interrupts
from compiler.files import kind_of, os_error, output_error, umask

MANIFEST = ".rackc-manifest.json"
STAGE_MARKER = ".rackc-staging"
FORMAT = "rackc-output/1"
FLAG = "-o"
PSEUDO_FILESYSTEMS = (Path("/dev"), Path("/proc"), Path("/sys"))


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _encode(content: str | bytes) -> bytes:
    return content if isinstance(content, bytes) else content.encode("utf-8")


def target_of(rel: str) -> str:
    """Which target wrote a file: every target writes under a folder of its own name."""
    return "plan" if "/" not in rel else rel.split("/", 1)[0]


def manifest_text(artifacts: dict[str, bytes]) -> str:
    files = {rel: _sha256(data) for rel, data in sorted(artifacts.items())}
    return json.dumps({"format": FORMAT, "files": files}, indent=1, sort_keys=True) + "\n"


def _refuse(out: Path, expected: str, got: str, hint: str):
    return output_error(FLAG, out, expected, got, hint)


def _inside(path: Path, folder: Path) -> bool:
    return path == folder or folder in path.parents


def check_location(out: Path, inputs: tuple[Path, ...] = ()) -> Path:
    """OUT as an absolute path, or CompileError when OUT names a place rackc must never
    replace, whatever it holds."""
    lexical = Path(os.path.abspath(out))
    try:
        if lexical.is_symlink():
            raise _refuse(out, "a folder", "a symbolic link",
                          "name the folder itself, not a link to it")
        real = lexical.resolve()
    except OSError as exc:
        raise os_error(FLAG, out, exc) from None
    cwd = Path.cwd().resolve()
    home = Path.home().resolve()
    if real == Path("/"):
        raise _refuse(out, "a folder of its own", "the root folder", "name a new folder")
    if real == home:
        raise _refuse(out, "a folder of its own", "your home folder", "name a new folder")
    if _inside(cwd, real):
        what = "the working directory" if real == cwd else "a folder above the working directory"
        raise _refuse(out, "a folder of its own", what, "name a new folder, e.g. `-o out/`")
    if any(_inside(real, p) for p in PSEUDO_FILESYSTEMS):
        raise _refuse(out, "a folder on a real filesystem", f"a path under /{real.parts[1]}",
                      "name a new folder")
    for f in inputs:
        if _inside(Path(f).resolve(), real):
            raise _refuse(out, "a folder that holds no input", f"a folder holding {f}",
                          "write the output somewhere else")
    return real


def listing(out: Path) -> tuple[dict[str, str], list[str], set[str]]:
    """Files below OUT (relative path -> sha256), what is neither a file nor a folder, and the
    folders. Nothing but regular files is opened (a FIFO would block the read)."""
    files: dict[str, str] = {}
    odd: list[str] = []
    folders: set[str] = set()
    for root, dirs, names in os.walk(out):
        for name in sorted(dirs + names):
            path = Path(root) / name
            rel = path.relative_to(out).as_posix()
            st = os.lstat(path)
            if stat.S_ISREG(st.st_mode):
                with open(path, "rb") as f:  # streamed: a huge file costs no memory
                    files[rel] = hashlib.file_digest(f, "sha256").hexdigest()
            elif stat.S_ISDIR(st.st_mode):
                folders.add(rel)
            else:
                odd.append(f"{rel} ({kind_of(st.st_mode)})")
    return files, odd, folders


def folders_of(files: Iterable[str]) -> set[str]:
    """The folders that hold `files` (what rackc creates for them)."""
    return {p.as_posix() for rel in files for p in PurePosixPath(rel).parents
            if p != PurePosixPath(".")}


def read_manifest(out: Path) -> dict[str, str] | None:
    try:
        with open(out / MANIFEST, "rb") as f:
            data = json.loads(f.read(1 << 24))
        if data.get("format") == FORMAT and isinstance(data.get("files"), dict):
            return {str(k): str(v) for k, v in data["files"].items()}
    except (OSError, ValueError, AttributeError):
        pass
    return None


def _shown(names: list[str]) -> str:
    return ", ".join(names[:5]) + (f" and {len(names) - 5} more" if len(names) > 5 else "")


def _inventory(out: Path, shown: Path) -> tuple[dict[str, str] | None, dict[str, str],
                                              list[str]] | None:
    """(manifest, files on disk, odd entries) of an existing non-empty OUT; None when OUT does
    not exist or is empty; CompileError when OUT is not a folder."""
    try:
        st = os.lstat(out)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise os_error(FLAG, shown, exc) from None
    if not stat.S_ISDIR(st.st_mode):
        raise _refuse(shown, "a folder", kind_of(st.st_mode),
                      "name a folder; rackc never replaces a file with a folder")
    try:
        if not any(os.scandir(out)):
            return None
        manifest = read_manifest(out)
        files, odd, folders = listing(out)
    except OSError as exc:
        raise os_error(FLAG, shown, exc) from None
    files.pop(MANIFEST, None)
    if manifest is not None:  # a folder rackc did not make (even an empty one) is not its own
        odd += [f"{rel}/ (a folder)" for rel in sorted(folders - folders_of(manifest))]
    if manifest is None:
        raise _refuse(shown, "a new, empty or rackc-written folder",
                      f"a folder rackc did not write (no {MANIFEST}), holding "
                      f"{_shown(sorted(os.listdir(out)))}",
                      "name a new folder, or move this one away yourself")
    return manifest, files, odd


def owned_files(out: Path, shown: Path | None = None) -> dict[str, str] | None:
    """What an existing OUT holds (None when OUT does not exist or is an empty folder), or
    CompileError when OUT is not a folder rackc wrote and left as it was."""
    shown = shown or out
    found = _inventory(out, shown)
    if found is None:
        return None
    manifest, files, odd = found
    drift = drifted(manifest, files)
    drift["files rackc did not write:"] += odd
    if any(drift.values()):
        got = "; ".join(f"{label} {_shown(names)}" for label, names in drift.items() if names)
        raise _refuse(shown, "a folder exactly as rackc wrote it", got,
                      "move what you want to keep out of it, or name a new folder")
    return files


def drifted(manifest: dict[str, str], files: dict[str, str]) -> dict[str, list[str]]:
    """How the files on disk differ from what the manifest lists, by kind of difference."""
    return {"files rackc did not write:": sorted(set(files) - set(manifest)),
            "files changed since:": sorted(k for k in files
                                           if k in manifest and files[k] != manifest[k]),
            "files removed since:": sorted(set(manifest) - set(files))}


def _writable_tree(out: Path, shown: Path) -> None:
    """Refuse now, before swapping, if the old OUT could not be removed afterwards."""
    for root, _dirs, _names in os.walk(out):
        if not os.access(root, os.W_OK | os.X_OK):
            raise _refuse(shown, "a folder rackc can replace", f"{root} is not writable",
                          "check its permissions")


def differences(out: Path, artifacts: dict[str, str | bytes], subset: bool = False) -> list[str]:
    """`compile --check`: how OUT differs from what the inputs compile to ('+' only in the
    new output, '-' only in OUT, '~' changed); with `subset`, only the targets `artifacts`
    covers are compared."""
    want = {rel: _sha256(_encode(c)) for rel, c in artifacts.items()}
    found = _inventory(out, out)
    have = found[1] if found else {}
    if subset:
        covered = {target_of(rel) for rel in want}
        have = {rel: h for rel, h in have.items() if target_of(rel) in covered}
    return sorted([f"+ {k}" for k in set(want) - set(have)]
                  + [f"- {k}" for k in set(have) - set(want)]
                  + [f"~ {k}" for k in set(want) & set(have) if want[k] != have[k]],
                  key=lambda s: s[2:])


def _exchange(a: Path, b: Path) -> bool:
    """Swap two paths atomically; False where the kernel or filesystem cannot."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        renameat2 = libc.renameat2
    except (OSError, AttributeError):
        return False
    at_fdcwd, rename_exchange = -100, 2
    if renameat2(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), rename_exchange) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.ENOSYS, errno.EINVAL, errno.ENOTSUP):
        return False
    raise OSError(err, os.strerror(err), str(b))


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _stage_prefix(out: Path) -> str:
    return f".{out.name}.rackc-stage."


def _marker_text(pid: int, token: str) -> str:
    return f"rackc staging {pid} {token}\n"


def _ours_and_dead(entry: os.DirEntry, prefix: str) -> bool:
    """A staging folder rackc made (its name's pid and token written in its marker file)
    whose process has died. A folder of the same name without that marker is never touched."""
    pid, _, token = entry.name[len(prefix):].partition(".")
    if not (pid.isdigit() and token) or not entry.is_dir(follow_symlinks=False):
        return False
    try:
        marker = os.path.join(entry.path, STAGE_MARKER)
        if not stat.S_ISREG(os.lstat(marker).st_mode):
            return False
        with open(marker, encoding="utf-8") as f:
            written = f.read(200)
    except (OSError, UnicodeDecodeError):
        return False
    return written == _marker_text(int(pid), token) and not _alive(int(pid))


def _sweep(out: Path) -> None:
    """Remove staging folders beside OUT left by compiles whose process was killed (SIGKILL,
    a power cut: every other end removes its own)."""
    prefix = _stage_prefix(out)
    for entry in os.scandir(out.parent):
        if entry.name.startswith(prefix) and _ours_and_dead(entry, prefix):
            shutil.rmtree(entry.path, ignore_errors=True)


def _new_staging(out: Path) -> Path:
    """`.OUT.rackc-stage.PID.TOKEN/` holding the marker and `out/`, the new OUT being built:
    the swap exchanges `out/` with OUT, so the marker stays until the whole folder goes."""
    token = secrets.token_hex(8)
    staging = out.parent / f"{_stage_prefix(out)}{os.getpid()}.{token}"
    staging.mkdir(mode=0o700)
    with open(staging / STAGE_MARKER, "x", encoding="utf-8") as f:
        f.write(_marker_text(os.getpid(), token))
    (staging / "out").mkdir(mode=0o777 & ~umask())
    return staging


@contextlib.contextmanager
def _locked(out: Path) -> Iterator[None]:
    """Serialise writers of OUT by a lock on OUT's parent folder itself, so that nothing is
    left beside OUT when the run ends."""
    fd = os.open(out.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _safe_rel(rel: str) -> PurePosixPath:
    p = PurePosixPath(rel)
    if p.is_absolute() or ".." in p.parts or not p.parts or rel == MANIFEST:
        raise ValueError(f"target wrote an unsafe path {rel!r}")  # a bug in a target
    return p


def _make_parents(folder: Path) -> list[Path]:
    """mkdir -p, returning what was created (to remove again on failure)."""
    made = []
    for p in reversed([folder, *folder.parents]):
        if not p.exists():
            p.mkdir()
            made.append(p)
    return made


def _fill(staging: Path, artifacts: dict[str, bytes]) -> None:
    for rel, data in artifacts.items():
        path = staging.joinpath(*_safe_rel(rel).parts)
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "xb") as f:
            f.write(data)
    with open(staging / MANIFEST, "x", encoding="utf-8", newline="\n") as f:
        f.write(manifest_text(artifacts))


def _swap_in(new: Path, out: Path, replacing: bool) -> None:
    if not replacing:
        os.rename(new, out)  # onto nothing, or onto an empty folder
        return
    if _exchange(new, out):
        return  # `new` now holds the old OUT, removed with its staging folder
    old = new.with_name("old")
    os.rename(out, old)
    try:
        os.rename(new, out)
    except BaseException:
        os.rename(old, out)
        raise


def write_output(out: Path, artifacts: dict[str, str | bytes], inputs: tuple[Path, ...] = (),
                 keep_targets: bool = False) -> None:
    """Write `artifacts` as OUT, atomically. With `keep_targets`, files of targets that
    `artifacts` does not cover are carried over from the old OUT (a `--targets` subset never
    deletes the others). An interrupt (SIGINT, SIGTERM) before the swap leaves OUT as it was
    and removes everything this call made; one that comes later waits until the swap is done
    and the staging folder gone."""
    shown, out = out, check_location(out, inputs)
    data = {rel: _encode(c) for rel, c in artifacts.items()}
    made: list[Path] = []
    staging: Path | None = None
    try:
        with interrupts.held():
            made = _make_parents(out.parent)
        with _locked(out):
            _sweep(out)
            old = owned_files(out, shown)
            if old:
                _writable_tree(out, shown)
                if keep_targets:
                    covered = {target_of(rel) for rel in data}
                    data.update({rel: (out / rel).read_bytes() for rel in old
                                 if target_of(rel) not in covered})
            with interrupts.held():
                staging = _new_staging(out)
            _fill(staging / "out", dict(sorted(data.items())))
            with interrupts.held():
                if interrupts.pending():
                    return  # the interrupt is raised when the signals are let through
                _swap_in(staging / "out", out, replacing=out.exists())
                made = []
                shutil.rmtree(staging, ignore_errors=True)
                staging = None
                interrupts.forget()  # OUT is new: the command finishes (exit 0)
    except OSError as exc:
        raise os_error(FLAG, shown, exc) from None
    finally:
        with interrupts.held():
            if staging is not None:
                shutil.rmtree(staging, ignore_errors=True)
            for p in reversed(made):
                with contextlib.suppress(OSError):
                    p.rmdir()

