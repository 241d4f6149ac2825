"""Reading the user's input files: one module, so that every reader refuses the same things
the same way, with one line naming the file: a missing path, a folder, a FIFO, a device or
socket (refused from `stat`, never opened: reading a FIFO would wait for a writer, a device
might never end), a file over MAX_INPUT_BYTES, and text that is not UTF-8. Training logs are
streamed instead (text_lines): any size, gzip or plain."""

from __future__ import annotations

import gzip
import io
import math
import os
import stat
import zlib
from pathlib import Path

from model.errors import SpecError

# the largest input read: a measured bandwidth matrix of 4096 nodes in CSV is ~100 MB
MAX_INPUT_BYTES = 256 * 2**20


def _regular_file(path: str | Path, field: str | None, what: str) -> os.stat_result:
    """The stat of a regular file; a missing path, a folder, a FIFO, device or socket is one
    SpecError naming the file (refused from `stat`, never opened)."""
    src = str(path)
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise SpecError(f"file not found; give {what}", source=src, field=field) from None
    except OSError as e:
        raise SpecError(f"cannot read {what} ({e.strerror})", source=src, field=field) from None
    if stat.S_ISDIR(st.st_mode):
        raise SpecError(f"is a folder; give {what} itself", source=src, field=field)
    if not stat.S_ISREG(st.st_mode):
        raise SpecError(f"is not a regular file (a FIFO, device or socket); give {what} as a "
                        "file", source=src, field=field)
    return st


def read_text(path: str | Path, field: str | None = None, what: str = "the file",
              errors: str = "strict") -> str:
    """The text of a regular file; every problem is one SpecError naming the file."""
    src = str(path)
    st = _regular_file(path, field, what)
    if st.st_size > MAX_INPUT_BYTES:
        raise SpecError(f"is {st.st_size / 2**20:.0f} MiB; inputs over "
                        f"{MAX_INPUT_BYTES // 2**20} MiB are refused", source=src, field=field)
    try:
        data = Path(path).read_bytes()
    except OSError as e:
        raise SpecError(f"cannot read {what} ({e.strerror})", source=src, field=field) from None
    try:
        # utf-8-sig: a byte-order mark, which some editors save, is read past (JSON and TOML
        # parsers refuse it: a plan file with one had been called damaged)
        return data.decode("utf-8-sig", errors=errors)
    except UnicodeDecodeError as e:
        raise SpecError(f"is not UTF-8 text (byte {e.start}); save it as UTF-8", source=src,
                        field=field) from None


def text_lines(path: str | Path, field: str | None = None, what: str = "the file",
               cut_short: list | None = None, unfinished: list | None = None):
    """The lines of a regular file as a stream, whatever its size (a long run's training log
    can be gigabytes), gunzipped where it is gzip (a rotated log: its magic bytes, whatever
    its name), bytes that are not UTF-8 replaced; refused as read_text refuses a path. Given
    `cut_short` (a list), a gzip stream that ends before its end marker (a job killed while
    its log was piped through gzip) is read up to there, as zcat does, and True appended.
    Given `unfinished` (a list), a last line without its line end (a log copied while the job
    was still writing it: 'elapsed time per iteration (ms): 38' of what became 3850.2) is
    not yielded but appended there."""
    src = str(path)
    _regular_file(path, field, what)
    gz = False
    last = None  # the line read last, yielded once the next one shows it was whole
    try:
        with open(path, "rb") as raw:
            gz = raw.read(2) == b"\x1f\x8b"
            raw.seek(0)
            stream = gzip.GzipFile(fileobj=raw) if gz else raw
            for line in io.TextIOWrapper(stream, encoding="utf-8", errors="replace",
                                         newline=""):
                if last is not None:
                    yield last.rstrip("\r\n")
                last = line
    except EOFError:
        if not gz or cut_short is None:
            raise SpecError(f"cannot read {what} (a damaged gzip file)", source=src,
                            field=field) from None
        cut_short.append(True)
    except (OSError, zlib.error) as e:  # gzip.BadGzipFile is an OSError
        why = "a damaged gzip file" if gz else getattr(e, "strerror", None) or str(e)
        raise SpecError(f"cannot read {what} ({why})", source=src, field=field) from None
    if last is not None:
        if unfinished is not None and not last.endswith(("\n", "\r")):
            unfinished.append(last)
        else:
            yield last.rstrip("\r\n")


def yaml_mapping(text: str, source: str, field: str, what: str) -> dict:
    """YAML text that must hold a mapping at the top (a Megatron-Bridge run_config.yaml, the
    configuration a NeMo 1.x log printed), safe-loaded; one SpecError naming `what` when it is
    not YAML or not a mapping."""
    import yaml

    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise SpecError(f"{what} is not YAML ({str(e).splitlines()[0]})", source=source,
                        field=field) from None
    if not isinstance(doc, dict):
        raise SpecError(f"{what} has no mapping at the top", source=source, field=field)
    return doc


class FieldReader:
    """Typed field access into a parsed document (JSON, TOML) that names the file and the dotted
    field on every problem (plan files, torchtitan TOML)."""

    def __init__(self, src: str):
        self.src = src

    def err(self, fld: str, problem: str) -> SpecError:
        return SpecError(problem, source=self.src, field=fld)

    def obj(self, d, key: str, where: str, optional=False) -> dict | None:
        fld = f"{where}.{key}" if where else key
        if key not in d or d[key] is None:
            if optional:
                return None
            raise self.err(fld, "missing; the file must have this section")
        v = d[key]
        if not isinstance(v, dict):
            raise self.err(fld, f"must be an object, got {type(v).__name__}")
        return v

    def get(self, d: dict, key: str, where: str, kind, default=..., nullable=False):
        fld = f"{where}.{key}" if where else key
        if key not in d:
            if default is not ...:
                return default
            raise self.err(fld, "missing")
        v = d[key]
        if v is None and nullable:
            return None
        if kind is int:
            ok = isinstance(v, int) and not isinstance(v, bool)
            name = "an integer"
        elif kind is float:
            ok = isinstance(v, (int, float)) and not isinstance(v, bool)
            name = "a number"
        elif kind is bool:
            ok = isinstance(v, bool)
            name = "true or false"
        elif kind is str:
            ok = isinstance(v, str)
            name = "a string"
        elif kind is list:
            ok = isinstance(v, list)
            name = "a list"
        else:  # pragma: no cover - internal
            raise TypeError(kind)
        if not ok:
            raise self.err(fld, f"must be {name}{' or null' if nullable else ''}, got {v!r}")
        return float(v) if kind is float else v

    def known(self, d: dict, where: str, keys) -> None:
        """Refuse a key of `d` outside `keys`: a misspelt field is named, never ignored."""
        unknown_keys(d, keys, self.src, where)

    def wrap(self, e: SpecError, prefix: str) -> SpecError:
        """A spec's error under the file's path to it (`prefix`); an error `get` raised inside
        the same try already names its field from the file's root and keeps it."""
        named = e.field and (e.field == prefix or e.field.startswith(prefix + "."))
        fld = e.field if named else (f"{prefix}.{e.field}" if e.field else prefix)
        return SpecError(e.problem, source=self.src, field=fld)


def unknown_keys(d: dict, keys, src: str, where: str = "") -> None:
    """One SpecError naming the first key of `d` that is not in `keys` (a misspelt or foreign
    field would otherwise be dropped without a word), with the keys that are known there."""
    for k in d:
        if k not in keys:
            fld = f"{where}.{k}" if where else str(k)
            raise SpecError(f"unknown field {str(k)[:40]!r}; known here: "
                            f"{', '.join(sorted(keys))}", source=src, field=fld)


def finite_number(v, src: str, fld: str, what: str) -> float:
    """A finite number (not a bool; an integer beyond any float is not), or one line naming
    the field: "must be {what}"."""
    try:
        ok = not isinstance(v, bool) and isinstance(v, (int, float)) and math.isfinite(v)
    except OverflowError:  # an integer beyond any float
        ok = False
    if not ok:
        shown = repr(v) if isinstance(v, str) else str(v)  # "5" is a string, not 5
        raise SpecError(f"must be {what}, got {shown[:40]}", source=src, field=fld)
    return float(v)
