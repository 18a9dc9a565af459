"""Tables that cannot half-happen: the one appender of the recorders (bench sweep, prefill, the study
recorders that append) and the checks a resume makes before it trusts a table.

    append_rows(path, rows, columns)         # header on the first write; whole rows, one write + flush + fsync
    check_resumable(path, columns, settings) # header, tail, settings columns: the rows a resume may keep
    check_tail(path)                         # refuse a file whose last row was cut (no newline, too few fields)
    write_text_atomic(path, text)            # metadata and whole tables: temp file + fsync + os.replace
    seal(path, meta_path)                    # rows + sha256 of the CSV into its metadata (schemas.write_seal)
    claim(path, overwrite=, columns=, settings=)  # before any work: refuse a foreign / other-settings / existing table
    write_table(path, rows, columns, meta=)  # a whole table (temp + rename), then its metadata, then its seal
    seal_files(folder)                       # the seals of a session folder's CSVs (its meta["files"])
    lock_output(path)                        # an exclusive lock on <path>.lock for this process (claim takes it)

The rules, each an error naming the file and the row or column (all `TableError`, a ValueError):

* A file is created at its first row (header and row in one write): a recorder that fails before it
  has measured anything leaves no file behind, so a rerun is never blocked by an empty CSV.
* Before every append the tail is checked: the file must end with a newline and its last row must
  have every column. A row is never written onto an unterminated line.
* A resume (`check_resumable`) DROPS a cut last row: once every check below has passed, the file is rewritten
  atomically without it and the row is measured again (the cut is reported on stderr, naming the file and row). A
  refused resume leaves the file as it found it (its seal still vouches for it, for the next resume). A damaged row
  anywhere else, a foreign header or a table made with other settings is refused.
* A table made with other settings (seed, dtype, device, warm-up, repetitions: the `settings`
  columns) is refused on resume: its rows and the new ones could not be told apart by their key.
* A resume verifies the table's seal before it appends (without a cut last row): a table edited, cut or
  grown since its last seal is refused, never resealed with the edit in it.
* One writer per output: `lock_output` (taken by `claim` and by the recorders that append) holds
  `fcntl.flock` on `<out>.lock` for the life of the process; a second writer is refused with the holder's pid
  (OutputLockedError). The lock file stays (removing it would race a writer that has just opened it).
"""
from __future__ import annotations

import contextlib
import csv
import fcntl
import hashlib
import io
import json
import os
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Mapping, Sequence


class TableError(ValueError):
    """A table that cannot be appended to or resumed; the message names the file and the row/column."""

    def __init__(self, path, what: str):
        self.path = Path(path)
        super().__init__(f"{path}: {what}")


class CutRowError(TableError):
    """The last row of a table was cut in the write (no newline at the end, or fewer fields)."""


class DamagedRowError(TableError):
    """A row other than the last one has the wrong number of fields."""


class HeaderMismatchError(TableError):
    """The table holds another kind of rows (its header differs)."""


class SettingsMismatchError(TableError):
    """The table's rows were made with other settings than this run's."""


class DuplicateKeyError(TableError):
    """Two rows of a table share their key."""


class OutputLockedError(TableError):
    """Another process is writing this output (it holds <out>.lock)."""


_HELD: dict[str, int] = {}  # lock file -> the descriptor holding it (this process)


def lock_output(path) -> Path:
    """Take the exclusive lock of the output `path` (`fcntl.flock` on `<path>.lock`, the holder's pid written in
    it) for the rest of this process; taken again by the same process it is a no-op. OutputLockedError naming the
    holder's pid when another process writes this output. Returns the lock file."""
    p = Path(path)
    lk = p.with_name(p.name + ".lock")
    key = str(lk.resolve())
    if key in _HELD:
        return lk
    lk.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(lk, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
        os.close(fd)
        raise OutputLockedError(p, f"another writer (pid {holder}) is writing it (it holds {lk.name}): wait for it "
                                   "to finish, or choose another --out") from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    _HELD[key] = fd
    return lk


@contextlib.contextmanager
def holding(path):
    """lock_output(path) for the block; released after it unless this process held it already."""
    p = Path(path)
    held = str(p.with_name(p.name + ".lock").resolve()) in _HELD
    lock_output(p)
    try:
        yield p
    finally:
        if not held:
            unlock_output(p)


def unlock_output(path) -> None:
    """Release the lock `lock_output(path)` took (a process that exits releases it anyway)."""
    p = Path(path)
    fd = _HELD.pop(str(p.with_name(p.name + ".lock").resolve()), None)
    if fd is not None:
        os.close(fd)


def verify_seal(path, meta_path=None, *, dropped_cut: bool = False, data: bytes | None = None) -> None:
    """Before an append: the table agrees with its seal in its metadata (`meta_path`, else the sibling
    <name>.meta.json), where that holds one; an edited, cut or grown table is refused (schemas.RecordingError,
    naming the file), never resealed with the change in it. One whole row past the seal is accepted when the sealed
    rows before it still hash to the seal: a run stopped between a row's write and its seal (append_rows writes one
    row, then seals). `data`: the table's bytes to check in place of the file's (a resume's, without a cut row)."""
    try:
        from ..analysers import schemas
    except ImportError:  # pandera missing: no seals were written either
        return
    p = Path(path)
    mp = Path(meta_path) if meta_path is not None else sibling_meta(p)
    if not p.exists() or not mp.is_file():
        return
    m = schemas.read_json(mp)
    if isinstance(m, dict) and "files" not in m and not any(k in m for k in ("rows", "sha256")):
        return  # metadata written before seals
    data = p.read_bytes() if data is None else data
    sealed = int(schemas.seal_of(p, mp, m)["rows"])
    text = data.decode("utf-8", errors="replace")
    recs = list(_split_records(text))
    if dropped_cut and len(recs) - 1 == sealed - 1:  # the sealed last row was cut (the disk lost its end) and dropped
        print(f"{p}: its last sealed row (row {sealed}) was cut and is measured again; the seal cannot vouch for the "
              "rows before it", file=sys.stderr)
        return
    if len(recs) - 1 == sealed + 1:  # one row past the seal: the sealed prefix must still be what was sealed
        prefix = text[:recs[sealed][2]].encode()
        if schemas.seal_of(p, mp, m)["sha256"] == hashlib.sha256(prefix).hexdigest():
            print(f"{p}: row {sealed + 1} was written after the last seal (a run stopped between the row and its "
                  "seal): its rows before it agree with the seal; kept", file=sys.stderr)
            return
    schemas.check_seal(p, data, meta=mp, sealed=True)


# ----------------------------------------------------------------------------------------------
# Reading what a table holds
@dataclass
class Scan:
    """What a CSV holds: its header, its complete data rows (as strings), and a cut last row if any."""

    path: Path
    header: list[str] | None = None
    rows: list[list[str]] = field(default_factory=list)
    cut: str | None = None  # the text of a cut last row
    cut_row: int | None = None  # its 1-based data row number
    good_bytes: int = 0  # length of the file (bytes) up to the cut row

    @property
    def exists(self) -> bool:
        return self.header is not None


def _split_records(text: str):
    """(record fields, start offset, end offset) of every CSV record of `text` (quoted newlines kept)."""
    buf = io.StringIO(text, newline="")
    out = []
    pos = 0
    reader = csv.reader(_LineTracker(buf, out))
    for fields in reader:
        end = out[-1] if out else len(text)
        out.clear()
        yield fields, pos, end
        pos = end


class _LineTracker:
    """An iterator of lines for csv.reader that remembers the offset after each line it hands out."""

    def __init__(self, buf, sink):
        self.buf, self.sink, self.off = buf, sink, 0

    def __iter__(self):
        return self

    def __next__(self):
        line = self.buf.readline()
        if not line:
            raise StopIteration
        self.off += len(line)
        self.sink.append(self.off)
        return line


def scan(path) -> Scan:
    """Every record of `path`. Raises DamagedRowError for a short or long row that is not the last."""
    p = Path(path)
    s = Scan(p)
    if not p.exists():
        return s
    text = p.read_bytes().decode("utf-8", errors="replace")
    if not text.strip():
        return s
    recs = list(_split_records(text))
    s.header = recs[0][0]
    n = len(s.header)
    ends_nl = text.endswith("\n")
    good = len(text)
    for i, (fields, start, end) in enumerate(recs[1:], start=1):
        last = i == len(recs) - 1
        if last and (not ends_nl or len(fields) != n):
            s.cut, s.cut_row, good = text[start:end], i, start
            break
        if len(fields) != n:
            if not fields:
                continue  # a blank line
            raise DamagedRowError(p, f"row {i}: {len(fields)} fields, the header has {n}: a damaged row "
                                     "(not a cut last one); repair it by hand or write a new file")
        s.rows.append(fields)
    if s.cut is None and len(recs) == 1 and not ends_nl:
        s.cut, s.cut_row, good = text, 0, 0  # the header itself was cut
    s.good_bytes = len(text[:good].encode())
    return s


def read_header(path) -> list[str] | None:
    """The first record of a CSV (None when the file is missing or empty)."""
    p = Path(path)
    if not p.exists() or p.stat().st_size == 0:
        return None
    with p.open(newline="") as f:
        return next(csv.reader(f), None)


def check_header(path, columns: Sequence[str], header: list[str] | None = None) -> None:
    """HeaderMismatchError unless the file's header is `columns` (a file of another kind)."""
    header = read_header(path) if header is None else header
    if header is None or list(header) == list(columns):
        return
    cols = list(columns)
    i = next((j for j, (a, b) in enumerate(zip(header, cols)) if a != b), min(len(header), len(cols)))
    have = header[i] if i < len(header) else "(no more columns)"
    want = cols[i] if i < len(cols) else "(no more columns)"
    raise HeaderMismatchError(path, f"header differs from this table's at column {i + 1}: the file has {have!r}, "
                                    f"this recorder writes {want!r} ({len(header)} vs {len(cols)} columns): a file "
                                    "of another kind; choose another --out")


def check_tail(path) -> int:
    """Number of complete data rows; CutRowError (naming the file and row) when the last row was cut."""
    s = scan(path)
    if s.cut is not None:
        raise CutRowError(path, f"row {s.cut_row} is cut ({s.cut.strip()[:60]!r}...): the file does not end with "
                                "a whole row; a --resume drops it and measures it again")
    return len(s.rows)


def _tail_ok(path: Path, ncols: int) -> None:
    """The cheap check before an append: the file ends with a newline and its last record is whole."""
    size = path.stat().st_size
    with path.open("rb") as f:
        f.seek(max(0, size - 65536))
        tail = f.read()
    if not tail.endswith(b"\n"):
        s = scan(path)
        raise CutRowError(path, f"row {s.cut_row} is cut (the file does not end with a newline): refusing to "
                                "append onto it; resume (it drops the cut row) or write a new file")
    lines = tail.decode("utf-8", errors="replace").splitlines()
    last = next((ln for ln in reversed(lines) if ln.strip()), "")
    fields = next(csv.reader([last]), [])
    if len(fields) != ncols and '"' not in last:  # a quoted multi-line field: scan properly below
        s = scan(path)
        raise CutRowError(path, f"row {s.cut_row if s.cut_row is not None else len(s.rows)} has {len(fields)} "
                                f"fields, the header {ncols}: refusing to append onto a cut row")
    if '"' in last:
        s = scan(path)
        if s.cut is not None:
            raise CutRowError(path, f"row {s.cut_row} is cut: refusing to append onto it")


# ----------------------------------------------------------------------------------------------
# Writing
def write_text_atomic(path, text: str) -> None:
    """Write `text` to `path` so a reader sees the old or the new file, never half of one."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=p.parent, prefix=f".{p.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", newline="") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, p)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def write_json_atomic(path, obj, **kw) -> None:
    write_text_atomic(path, json.dumps(obj, indent=1, **kw) + "\n")


def csv_text(rows, columns: Sequence[str], header: bool = False) -> str:
    """`rows` (dicts or a DataFrame) as CSV text in `columns` order (missing cells empty, extra keys ignored)."""
    if hasattr(rows, "to_dict"):
        rows = rows.to_dict("records")
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=list(columns), extrasaction="ignore", restval="", lineterminator="\n")
    if header:
        w.writeheader()
    for r in rows:
        w.writerow({k: ("" if _isnan(v) else v) for k, v in r.items()})
    return buf.getvalue()


def _isnan(v) -> bool:
    return isinstance(v, float) and v != v


def write_csv_atomic(path, rows, columns: Sequence[str] | None = None) -> Path:
    """A whole table written at once (temp file + os.replace). Columns: first-seen order of the rows' keys."""
    if hasattr(rows, "to_dict"):
        columns = list(rows.columns) if columns is None else columns
        rows = rows.to_dict("records")
    rows = list(rows)
    columns = list(dict.fromkeys(k for r in rows for k in r)) if columns is None else list(columns)
    write_text_atomic(path, csv_text(rows, columns, header=True))
    return Path(path)


def append_rows(path, rows_df, kind_columns: Sequence[str], *, meta_path=None, seal_it: bool = True) -> int:
    """Append whole rows to the table at `path` (created, header first, at its first row), as ONE write
    followed by flush and os.fsync. Before appending: the header must be `kind_columns` and the tail whole.
    With `seal_it`, the CSV's seal (rows, sha256) is then stored in its metadata (`meta_path`, else the
    sibling <name>.meta.json). Returns the number of rows written."""
    p = Path(path)
    if hasattr(rows_df, "to_dict"):
        rows_df = rows_df.to_dict("records")
    rows = list(rows_df)
    if not rows:
        return 0
    cols = list(kind_columns)
    fresh = not p.exists() or p.stat().st_size == 0
    if not fresh:
        check_header(p, cols)
        _tail_ok(p, len(cols))
    data = csv_text(rows, cols, header=fresh).encode()
    p.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(p, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        n = os.write(fd, data)
        while n < len(data):  # a short write (a signal, a full pipe): finish it, still before fsync
            n += os.write(fd, data[n:])
        os.fsync(fd)
    finally:
        os.close(fd)
    if seal_it:
        seal(p, meta_path)
    return len(rows)


def seal(csv_path, meta_path=None) -> dict | None:
    """Store the CSV's seal ({"rows", "sha256"}) in its metadata through schemas.write_seal (atomic);
    nothing when that module is not importable (its seal is then never checked either)."""
    try:
        from ..analysers.schemas import write_seal
    except ImportError:  # pandera missing: the seal is an extra, the tail checks here stand alone
        return None
    return write_seal(csv_path, meta_path)


def sibling_meta(csv_path) -> Path:
    """<name up to the first dot>.meta.json beside the CSV (schemas.meta_path's 'sibling' rule)."""
    p = Path(csv_path)
    return p.parent / (p.name.split(".")[0] + ".meta.json")


def read_meta(path) -> dict:
    """A metadata file (TableError naming it when it is not JSON); {} when it does not exist."""
    p = Path(path)
    if not p.exists():
        return {}
    try:
        m = json.loads(p.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise TableError(p, f"metadata is not JSON ({e}): repair it or pass --overwrite") from None
    return m if isinstance(m, dict) else {}


# ----------------------------------------------------------------------------------------------
# Resuming
def _norm(v) -> str:
    s = "" if v is None or _isnan(v) else str(v)
    if isinstance(v, bool) or s in ("True", "False"):
        return s
    try:
        f = float(s)
    except ValueError:
        return s
    return f"{f:.6g}"


def drop_cut_row(path, s: Scan | None = None, *, quiet: bool = False) -> Scan:
    """Rewrite `path` atomically without its cut last row (if it has one); returns the new scan."""
    s = scan(path) if s is None else s
    if s.cut is None:
        return s
    p = Path(path)
    good = p.read_bytes()[:s.good_bytes]
    if not quiet:
        print(f"{p}: row {s.cut_row} was cut in its write ({s.cut.strip()[:60]!r}): dropped, it is measured again",
              file=sys.stderr)
    if s.cut_row == 0 or not good:
        p.unlink()
        return Scan(p)
    write_text_atomic(p, good.decode())
    return scan(p)


def keep_rows(path, columns: Sequence[str], keep: Sequence[bool], *, why: str = "") -> int:
    """Rewrite the table atomically with only the rows where `keep` is True (in scan order); returns
    how many were dropped. Used by resumes that re-measure rows (error rows, incomplete repetitions)."""
    s = scan(path)
    if s.cut is not None:
        raise CutRowError(path, f"row {s.cut_row} is cut: drop it first")
    keep = list(keep)
    if len(keep) != len(s.rows):
        raise ValueError(f"{path}: {len(keep)} keep flags for {len(s.rows)} rows")
    dropped = len(keep) - sum(keep)
    if not dropped:
        return 0
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(s.header)
    w.writerows(r for r, k in zip(s.rows, keep) if k)
    write_text_atomic(path, buf.getvalue())
    if why:
        print(f"{path}: {dropped} row(s) dropped ({why}): they are measured again", file=sys.stderr)
    return dropped


def check_resumable(path, columns: Sequence[str], settings: Mapping[str, object], *, key: Sequence[str] = (),
                    drop_cut: bool = True, meta_path=None):
    """Verify that the table at `path` can be resumed by a run with these `settings` (column -> value):
    it is this process's to write (lock_output), the header is `columns`, the tail is whole (a cut last row is
    dropped, atomically, when `drop_cut`; else CutRowError), the rest agrees with its seal (verify_seal: in
    `meta_path`, else the sibling metadata), every settings column holds this run's value only, and (with `key`)
    no two rows share a key. Returns the rows as a DataFrame of strings (None when there is no table yet)."""
    import pandas as pd

    p = Path(path)
    lock_output(p)
    s = scan(p)
    if not s.exists:
        return None
    check_header(p, columns, s.header)
    cut = s.cut is not None
    if cut:
        if not drop_cut:
            raise CutRowError(p, f"row {s.cut_row} is cut: the file does not end with a whole row")
        if s.cut_row == 0:  # the header itself was cut: no row to keep, nothing to check
            drop_cut_row(p, s)
            return None
        print(f"{p}: row {s.cut_row} was cut in its write ({s.cut.strip()[:60]!r}): the resume drops it and measures "
              "it again", file=sys.stderr)
    # The checks run on the whole rows before anything is rewritten: a refused resume leaves the file and its seal
    # as they were, so a later resume with the right settings still finds them agreeing.
    verify_seal(p, meta_path, dropped_cut=cut, data=p.read_bytes()[:s.good_bytes] if cut else None)
    df = pd.DataFrame(s.rows, columns=s.header, dtype=object)
    for col, want in settings.items():
        if col not in df.columns:
            raise SettingsMismatchError(p, f"has no column {col!r}: it cannot say which {col} its rows were made "
                                           "with; write to a new file")
        have = sorted({_norm(v) for v in df[col]} - {""})
        if have and have != [_norm(want)]:
            first = int(next(i for i, v in enumerate(df[col]) if _norm(v) not in ("", _norm(want))))
            raise SettingsMismatchError(p, f"row {first + 1}: its rows were made with {col}={', '.join(have)}, this "
                                           f"run has {col}={want}: resuming would mix both in one table with no way "
                                           "to tell them apart; pass --overwrite or choose another --out")
    if key:
        check_unique(p, df, key)
    if cut:
        drop_cut_row(p, s, quiet=True)
    return df


def check_unique(path, df, key: Sequence[str]) -> None:
    """DuplicateKeyError naming the first row whose key an earlier row already has."""
    if not len(df):
        return
    k = [c for c in key if c in df.columns]
    normed = df[k].map(_norm) if hasattr(df, "map") else df[k].applymap(_norm)
    dup = normed.duplicated().to_numpy()
    if dup.any():
        i = int(dup.argmax())
        raise DuplicateKeyError(path, f"row {i + 1} repeats the key {dict(zip(k, df.iloc[i][k]))} of an earlier row")


def rows_to_dicts(df) -> Iterable[dict]:
    return [] if df is None else df.to_dict("records")


# ----------------------------------------------------------------------------------------------
# Whole tables (the study recorders that write a table once, or rewrite their own table as it grows)
class TableExistsError(TableError):
    """A recording is already at the path (of this kind and these settings): a rerun must say --overwrite."""


def _settings_differ(p: Path, header, rows, settings: Mapping[str, object]) -> None:
    cols = list(header)
    for col, want in settings.items():
        if col not in cols:
            continue  # the old table cannot say: its header check (or the exists check) decides
        j = cols.index(col)
        have = sorted({_norm(r[j]) for r in rows if j < len(r)} - {""})
        if have and have != [_norm(want)]:
            first = next(i for i, r in enumerate(rows) if _norm(r[j]) not in ("", _norm(want)))
            raise SettingsMismatchError(p, f"row {first + 1}: its rows were made with {col}={', '.join(have)}, "
                                           f"this run has {col}={want}: pass --overwrite to replace it, or choose "
                                           "another --out")


def claim(path, *, overwrite: bool = False, columns: Sequence[str] | None = None,
          settings: Mapping[str, object] | None = None) -> None:
    """Before any work: may this run write its table at `path`? Nothing there (or an empty file): yes. With
    `overwrite`: yes (the table is replaced when the run writes it). Else refused, naming the file and why:
    HeaderMismatchError (a file of another kind: its header is not `columns`), SettingsMismatchError (its
    rows were made with other `settings`: column -> value) or TableExistsError (the same kind and settings:
    a recording is made once; --overwrite makes it again)."""
    p = Path(path)
    lock_output(p)  # one writer per output, from here to the end of the process
    if overwrite or not p.exists() or p.stat().st_size == 0:
        return
    s = scan(p) if p.is_file() else Scan(p)
    if columns is not None and s.header is not None:
        check_header(p, columns, s.header)
    if settings and s.header is not None:
        _settings_differ(p, s.header, s.rows, settings)
    raise TableExistsError(p, f"a recording is already here ({len(s.rows)} rows"
                              f"{', its last row cut' if s.cut is not None else ''}): pass --overwrite to "
                              "record it again, or choose another --out")


def claim_session(folder, overwrite: bool) -> None:
    """Before any work: a session folder that holds tables already is refused (a session is recorded once: its
    meta.json would describe another run's rows); `overwrite` (--overwrite) removes them first."""
    work = Path(folder)
    lock_output(work)  # <folder>.lock: one writer per session folder
    old = sorted(work.glob("*.csv")) if work.is_dir() else []
    if old and not overwrite:
        raise TableExistsError(work, f"this session's folder holds {len(old)} table(s) already ({old[0].name}, "
                                     "...): pass --overwrite to record the session again, or name another --session")
    for f in old:
        f.unlink()


def write_table(path, rows, columns: Sequence[str] | None = None, *, meta: Mapping | None = None, meta_path=None,
                replace: bool = False, settings: Mapping[str, object] | None = None, seal_it: bool = True,
                **json_kw) -> Path:
    """A whole table written at once, so a reader sees the old or the new one, never half: the CSV (temp file
    + fsync + os.replace), then its metadata (`meta`, when given: written the same way, keeping the seals of
    the other files it describes), then the CSV's seal (rows + sha256) in that metadata (`meta_path`, else
    the sibling <name>.meta.json). A kill between the two leaves a CSV its seal refuses: never a half table.

    An existing table at `path` is replaced only when it is of this kind (its header is `columns`) and, with
    `settings` (column -> value), its rows were made with these settings; else HeaderMismatchError /
    SettingsMismatchError naming the file. `replace=True` (--overwrite, or a run rewriting the table it
    owns as it grows) skips both checks. No rows: nothing is written (no empty CSV to block a rerun), the
    metadata still is. Returns the CSV's path."""
    p = Path(path)
    if hasattr(rows, "to_dict"):
        columns = list(rows.columns) if columns is None else columns
        rows = rows.to_dict("records")
    rows = list(rows)
    columns = list(dict.fromkeys(k for r in rows for k in r)) if columns is None else list(columns)
    mp = Path(meta_path) if meta_path is not None else sibling_meta(p)
    if rows:
        if not replace and p.exists() and p.stat().st_size > 0:
            s = scan(p)
            check_header(p, columns, s.header)
            if settings:
                _settings_differ(p, s.header, s.rows, settings)
        write_csv_atomic(p, rows, columns)
    if meta is not None:
        m = dict(meta)
        old = read_meta(mp)
        if isinstance(old.get("files"), dict):
            m["files"] = {**old["files"], **(m.get("files") or {})}
        write_json_atomic(mp, m, **json_kw)
    if rows and seal_it:
        seal(p, mp)
    return p


def seal_files(folder, pattern: str = "*.csv", skip: Sequence[str] = ()) -> dict:
    """{file name: {"rows", "sha256"}} of the CSVs in `folder` (a session folder's meta["files"])."""
    try:
        from ..analysers.schemas import seal as _seal
    except ImportError:
        return {}
    return {f.name: _seal(f) for f in sorted(Path(folder).glob(pattern)) if f.is_file() and f.name not in skip}
