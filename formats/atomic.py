"""Writing outputs so that nothing is lost: each file goes to a temporary file in the target's
folder and is renamed over the target (`os.replace` is atomic on POSIX within one file system),
so a failure mid-write (disk full, a signal) leaves the previous file as it was.

A set of files for one folder (a launch set) is written as a whole: every file is written to
its temporary first, and only when all are complete are they renamed into place. The folder
keeps a manifest (MANIFEST) of the files the tool wrote there, so that a later write may
replace or remove those and only those: a folder holding other files is refused unless
`force`, and files of an earlier set that the new set does not have are removed (a stale
warnings.txt or another framework's config would mislead).
"""

from __future__ import annotations

import json
import os
import stat
import tempfile
from pathlib import Path

from model.errors import SpecError

MANIFEST = ".pipette-files.json"


def _temp_beside(path: Path) -> tuple[int, str]:
    return tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)


def _write_temp(path: Path, data: bytes, mode: int | None) -> str:
    fd, tmp = _temp_beside(path)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, mode if mode is not None else 0o644)
    except BaseException:
        _discard(tmp)
        raise
    return tmp


def _discard(tmp: str) -> None:
    try:
        os.unlink(tmp)
    except OSError:
        pass


def _os_error(e: OSError, path: Path, field: str) -> SpecError:
    return SpecError(f"cannot write it ({e.strerror or e}); the previous file, if any, is "
                     "unchanged", source=str(path), field=field)


def check_target(path: Path, field: str) -> None:
    """Refuse, before anything is written, a target that is a folder or a special file, or
    whose folder cannot be made (a file stands where a folder would be)."""
    path = Path(path)
    try:
        if path.is_dir():
            raise SpecError("is a folder; give a file name", source=str(path), field=field)
        if path.exists() and not stat.S_ISREG(path.stat().st_mode):
            raise SpecError("is not a regular file; give a file name", source=str(path),
                            field=field)
        up = path.parent
        while not up.exists():
            up = up.parent
    except OSError as e:
        raise SpecError(f"cannot be checked ({e.strerror})", source=str(path),
                        field=field) from None
    if not up.is_dir():
        raise SpecError(f"{up} is not a folder, so the file cannot be made there",
                        source=str(path), field=field)
    # the folder exists; whether a file can be made in it is only known by making one (a
    # read-only or pseudo file system such as /proc passes the checks above)
    try:
        fd, probe = tempfile.mkstemp(dir=up, prefix=".pipette-check-")
        os.close(fd)
        os.unlink(probe)
    except OSError as e:
        raise SpecError(f"cannot be written: no file can be made in {up} ({e.strerror})",
                        source=str(path), field=field) from None


def write_atomic(path: Path, data: str | bytes, *, field: str = "output",
                 mode: int | None = None) -> Path:
    """Write `data` to `path` through a temporary file and a rename."""
    path = Path(path)
    check_target(path, field)
    raw = data.encode() if isinstance(data, str) else data
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = _write_temp(path, raw, mode)
        os.replace(tmp, path)
    except OSError as e:
        raise _os_error(e, path, field) from None
    return path


def _manifest(folder: Path) -> set[str]:
    try:
        return set(json.loads((folder / MANIFEST).read_text())["files"])
    except (OSError, ValueError, KeyError, TypeError):
        return set()


def check_set(folder: Path, names, *, force: bool = False, field: str = "--out") -> None:
    """Refuse, before anything is written, a folder that is not one, or that holds files the
    tool did not write (unless `force`), or where one of `names` is not a regular file."""
    folder = Path(folder)
    try:
        if folder.exists() and not folder.is_dir():
            raise SpecError("is not a folder", source=str(folder), field=field)
        if not folder.exists():
            up = folder.parent
            while not up.exists():
                up = up.parent
            if not up.is_dir():
                raise SpecError(f"{up} is not a folder, so the folder cannot be made there",
                                source=str(folder), field=field)
            return
        ours = _manifest(folder)
        foreign = sorted(p.name for p in folder.iterdir()
                         if p.name not in ours and p.name != MANIFEST
                         and not (p.name.startswith(".") and p.name.endswith(".tmp")))
        for name in names:
            p = folder / name
            if p.is_dir() or (p.exists() and not stat.S_ISREG(p.stat().st_mode)):
                raise SpecError(f"{name} there is not a regular file", source=str(folder),
                                field=field)
    except OSError as e:
        raise SpecError(f"cannot be read ({e.strerror})", source=str(folder),
                        field=field) from None
    if foreign and not force:
        shown = ", ".join(foreign[:4]) + (" ..." if len(foreign) > 4 else "")
        raise SpecError(f"holds files this tool did not write ({shown}); choose an empty or "
                        "new folder, or add --force to write beside them", source=str(folder),
                        field=field)


def write_set(folder: Path, files: dict[str, str | bytes], *, modes: dict[str, int] | None = None,
              force: bool = False, field: str = "--out") -> list[Path]:
    """Write `files` ({name: content}) into `folder` as a whole or not at all.

    A folder that holds files the tool did not write (not in its manifest) is refused unless
    `force`; files of the tool's previous set there that this set lacks are removed."""
    folder = Path(folder)
    check_set(folder, files, force=force, field=field)
    ours = _manifest(folder)
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise SpecError(f"cannot create the folder ({e.strerror})", source=str(folder),
                        field=field) from None
    temps: dict[str, str] = {}
    try:
        for name, data in files.items():
            raw = data.encode() if isinstance(data, str) else data
            temps[name] = _write_temp(folder / name, raw, (modes or {}).get(name))
        man = json.dumps({"files": sorted(files)}, indent=1) + "\n"
        temps[MANIFEST] = _write_temp(folder / MANIFEST, man.encode(), None)
    except OSError as e:
        for t in temps.values():
            _discard(t)
        raise SpecError(f"cannot write the files ({e.strerror or e}); nothing was changed",
                        source=str(folder), field=field) from None
    for name, tmp in temps.items():
        os.replace(tmp, folder / name)
    for name in sorted(ours - set(files)):
        try:
            (folder / name).unlink()
        except OSError:
            pass
    return [folder / n for n in files]
