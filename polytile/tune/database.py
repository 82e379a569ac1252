"""The tuning database (TC §6.1-6.2): every measured candidate and the best options per key.

    db = TuningDatabase.of(config)                  # <cache_dir>/tuning.sqlite3
    db.record(measurements, default_median=0.11)    # one transaction; updates `best`
    db.best(key)                                    # BestEntry or None
    db.inject(key, options)                         # a hand-written entry wins until beaten
    data = db.export(); db.clear(); db.import_(data)
    db.import_(only_targets(data, runs_here)[0])    # what `polytile cache import` does

SQLite (stdlib) in WAL mode: readers never block the writer, and every write is one
`BEGIN IMMEDIATE` transaction, so concurrent tuners serialize their writes (waiting
up to a minute) and a crash leaves the last committed state. A row of `best` is
replaced only by a faster measurement (conditional upsert inside the same
transaction as the insert), so two tuners racing on one key keep the faster result.

Schema (version 2; version 1 had no `family` and is migrated on first use):

    meta(name PRIMARY KEY, value)                   -- schema version
    keys(key PRIMARY KEY, program, signature, target, compiler, function, family)
    measurements(id, key, options, options_json, status, median, spread, detail,
                 host, created, run)                -- one row per measured candidate
    best(key PRIMARY KEY, options, options_json, median, default_median, source,
         host, updated)                             -- the options later calls use

`key` is TuningKey.digest(): the compilation-cache key minus the options. `family`
identifies the program whatever its sizes (TuningKey.program hashes the lowered IR,
sizes included), so `similar` finds the same program tuned at other shapes. `median`
and `spread` (p90 - p10) are seconds per call; a rejected candidate has status
compile-error, compile-timeout, crash, timeout, wrong or error and no median.
"""
from __future__ import annotations

import json
import logging
import platform
import sqlite3
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from polytile.compile import TuningKey
from polytile.config import Config
from polytile.errors import ArgumentError, PolytileError
from polytile.runtime.files import ensure_private_dir
from polytile.targets.target import load_target
from polytile.tune.options import Options

log = logging.getLogger(__name__)

DB_NAME = "tuning.sqlite3"
SCHEMA_VERSION = 2
EXPORT_FORMAT = "polytile-tuning"
EXPORT_VERSION = 1
BUSY_TIMEOUT_SECONDS = 60.0
STATUSES = ("ok", "compile-error", "compile-timeout", "crash", "timeout", "wrong", "error")

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (name TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS keys (
    key TEXT PRIMARY KEY, program TEXT NOT NULL, signature TEXT NOT NULL,
    target TEXT NOT NULL, compiler TEXT NOT NULL, function TEXT NOT NULL,
    family TEXT NOT NULL DEFAULT '');
CREATE TABLE IF NOT EXISTS measurements (
    id INTEGER PRIMARY KEY, key TEXT NOT NULL REFERENCES keys(key),
    options TEXT NOT NULL, options_json TEXT NOT NULL, status TEXT NOT NULL,
    median REAL, spread REAL, detail TEXT NOT NULL, host TEXT NOT NULL,
    created TEXT NOT NULL, run TEXT NOT NULL,
    UNIQUE (key, options, host, created, run));
CREATE INDEX IF NOT EXISTS measurements_by_key ON measurements (key, median);
CREATE TABLE IF NOT EXISTS best (
    key TEXT PRIMARY KEY REFERENCES keys(key), options TEXT NOT NULL,
    options_json TEXT NOT NULL, median REAL, default_median REAL, source TEXT NOT NULL,
    host TEXT NOT NULL, updated TEXT NOT NULL);
"""

# The best entry changes only for a faster measurement, or for any measurement when
# the entry has no median (an injected entry, kept until something is measured).
_UPSERT_BEST = """
INSERT INTO best (key, options, options_json, median, default_median, source, host, updated)
VALUES (?, ?, ?, ?, ?, ?, ?, ?)
ON CONFLICT(key) DO UPDATE SET options = excluded.options,
    options_json = excluded.options_json, median = excluded.median,
    default_median = COALESCE(excluded.default_median, best.default_median),
    source = excluded.source, host = excluded.host, updated = excluded.updated
WHERE best.median IS NULL OR excluded.median < best.median
"""
_REPLACE_BEST = _UPSERT_BEST.split("WHERE")[0]


@dataclass(frozen=True)
class Measurement:
    options: Options
    status: str                  # one of STATUSES
    median: float | None = None  # seconds per call
    spread: float | None = None  # p90 - p10, seconds
    detail: str = ""             # why it was rejected
    host: str = ""               # the machine that measured it ("": this one)


@dataclass(frozen=True)
class BestEntry:
    key: TuningKey
    function: str
    options: Options
    median: float | None
    default_median: float | None
    source: str                  # tuned, injected or imported
    host: str
    updated: str
    family: str = ""             # the program whatever its sizes ("": unknown)


def host_name() -> str:
    return f"{platform.node()} {platform.machine()}"


def now() -> str:
    return datetime.now(UTC).isoformat(timespec="microseconds")


class TuningDatabase:
    """A path and the operations on the database there; every call opens its own
    connection (cheap), so a value of this class may cross fork() and threads."""

    def __init__(self, path: Path):
        self.path = Path(path)

    @staticmethod
    def of(config: Config) -> TuningDatabase:
        return TuningDatabase(config.cache_dir / DB_NAME)

    # ------------------------------------------------------------ connections
    @contextmanager
    def _connect(self, write: bool) -> Iterator[sqlite3.Connection]:
        ensure_private_dir(self.path.parent)
        conn = sqlite3.connect(self.path, timeout=BUSY_TIMEOUT_SECONDS, isolation_level=None)
        try:
            conn.execute("PRAGMA foreign_keys = ON")
            _ensure_schema(conn)
            if write:
                with _transaction(conn):
                    yield conn
            else:
                yield conn
        except sqlite3.DatabaseError as e:
            raise PolytileError(f"tuning database {self.path}: {e}",
                                hint="if it is damaged, move it away; `polytile cache "
                                     "export` first keeps what can still be read") from e
        finally:
            conn.close()

    # ------------------------------------------------------------ writes
    def record(self, key: TuningKey, function: str, measurements: Sequence[Measurement],
               run: str, default_median: float | None = None, *,
               best: Measurement | None = None, family: str = "") -> None:
        """Store measured candidates and update the key's best entry, atomically: to the
        fastest of them if it beats the entry, or to `best` regardless (the winner of a
        confirmation that measured the contenders side by side)."""
        host, created = host_name(), now()
        with self._connect(write=True) as conn:
            _insert_key(conn, key, function, family)
            digest = key.digest()
            for m in measurements:
                if m.status not in STATUSES:
                    raise ValueError(f"unknown status {m.status!r}")
                conn.execute(
                    "INSERT OR IGNORE INTO measurements (key, options, options_json, status, "
                    "median, spread, detail, host, created, run) VALUES (?,?,?,?,?,?,?,?,?,?)",
                    (digest, m.options.text(), m.options.dumps(), m.status, m.median, m.spread,
                     m.detail[:2000], m.host or host, created, run))
            ok = [m for m in measurements if m.status == "ok" and m.median is not None]
            if best is not None:
                conn.execute(_REPLACE_BEST, (digest, best.options.text(), best.options.dumps(),
                                             best.median, default_median, "tuned",
                                             best.host or host, created))
            elif ok:
                fastest = min(ok, key=lambda m: m.median or 0.0)
                conn.execute(_UPSERT_BEST, (digest, fastest.options.text(),
                                            fastest.options.dumps(), fastest.median,
                                            default_median, "tuned", fastest.host or host,
                                            created))

    def inject(self, key: TuningKey, options: Options, function: str = "",
               family: str = "") -> None:
        """A hand-written entry (TC §6.1): used by later calls until a tuner measures
        something faster."""
        with self._connect(write=True) as conn:
            _insert_key(conn, key, function, family)
            conn.execute("INSERT OR REPLACE INTO best (key, options, options_json, median, "
                         "default_median, source, host, updated) VALUES (?,?,?,?,?,?,?,?)",
                         (key.digest(), options.text(), options.dumps(), None, None,
                          "injected", host_name(), now()))

    def clear(self) -> int:
        """Delete every entry and measurement; returns the number of best entries."""
        if not self.path.exists():
            return 0
        with self._connect(write=True) as conn:
            count = conn.execute("SELECT COUNT(*) FROM best").fetchone()[0]
            for table in ("best", "measurements", "keys"):
                conn.execute(f"DELETE FROM {table}")
        return int(count)

    # ------------------------------------------------------------ reads
    def best(self, key: TuningKey) -> BestEntry | None:
        if not self.path.exists():
            return None
        with self._connect(write=False) as conn:
            rows = _best_rows(conn, "WHERE b.key = ?", (key.digest(),))
        return rows[0] if rows else None

    def similar(self, key: TuningKey, family: str, limit: int = 4) -> list[BestEntry]:
        """Best entries of the same program family at other sizes on the same target,
        most recent first (seeds for the genetic search). Other programs are left out:
        their blocks share names like s0 but not meaning, so their schedules would be
        random points."""
        if not family or not self.path.exists():
            return []
        with self._connect(write=False) as conn:
            return _best_rows(conn, "WHERE k.target = ? AND k.family = ? AND b.key != ? "
                              "ORDER BY b.updated DESC LIMIT ?",
                              (key.target, family, key.digest(), limit))

    def entries(self) -> list[BestEntry]:
        if not self.path.exists():
            return []
        with self._connect(write=False) as conn:
            return _best_rows(conn, "ORDER BY k.function, k.signature", ())

    def measurements(self, key: TuningKey | None = None) -> list[dict[str, Any]]:
        if not self.path.exists():
            return []
        with self._connect(write=False) as conn:
            return _measurement_rows(conn, key)

    def info(self) -> str:
        if not self.path.exists():
            return f"tuning database: {self.path} (none yet)"
        with self._connect(write=False) as conn:
            keys = conn.execute("SELECT COUNT(*) FROM best").fetchone()[0]
            rows = conn.execute("SELECT COUNT(*) FROM measurements").fetchone()[0]
        return f"tuning database: {self.path}\ntuned keys: {keys}\nmeasurements: {rows}"

    # ------------------------------------------------------------ export / import
    def export(self, target: str | None = None) -> dict[str, Any]:
        """Every best entry and measurement as versioned JSON data; with `target` (a
        name such as cpu-avx2, or a full Target.identity), only those for it."""
        best = [_entry_json(e) for e in self.entries()
                if target is None or target_matches(e.key.target, target)]
        rows = [r for r in self.measurements()
                if target is None or target_matches(r["key"]["target"], target)]
        return {"format": EXPORT_FORMAT, "version": EXPORT_VERSION, "exported": now(),
                "host": host_name(), "target": target, "best": best, "measurements": rows}

    def import_(self, data: Any) -> tuple[int, int]:
        """Merge exported data: measurements are added (once), and an imported best
        entry replaces ours when ours is missing or slower. Returns (best entries
        taken, measurements added). All or nothing."""
        best, rows = _validate_export(data)
        taken = added = 0
        with self._connect(write=True) as conn:
            for item in rows:
                key = _key_from_json(item["key"])
                _insert_key(conn, key, str(item.get("function", "")),
                            str(item.get("family", "")))
                cur = conn.execute(
                    "INSERT OR IGNORE INTO measurements (key, options, options_json, status, "
                    "median, spread, detail, host, created, run) VALUES (?,?,?,?,?,?,?,?,?,?)",
                    (key.digest(), item["options_text"], json.dumps(item["options"],
                                                                    sort_keys=True),
                     item["status"], item.get("median"), item.get("spread"),
                     str(item.get("detail", "")), str(item.get("host", "")),
                     str(item.get("created", "")), str(item.get("run", ""))))
                added += cur.rowcount
            for item in best:
                key = _key_from_json(item["key"])
                options = Options.from_json(item["options"])
                _insert_key(conn, key, str(item.get("function", "")),
                            str(item.get("family", "")))
                median = item.get("median")
                cur = conn.execute(
                    "INSERT INTO best (key, options, options_json, median, default_median, "
                    "source, host, updated) VALUES (?,?,?,?,?,?,?,?) ON CONFLICT(key) DO UPDATE "
                    "SET options = excluded.options, options_json = excluded.options_json, "
                    "median = excluded.median, default_median = excluded.default_median, "
                    "source = excluded.source, host = excluded.host, updated = excluded.updated "
                    "WHERE excluded.median IS NOT NULL AND (best.median IS NULL OR "
                    "excluded.median < best.median)",
                    (key.digest(), options.text(), options.dumps(), median,
                     item.get("default_median"), str(item.get("source", "imported")),
                     str(item.get("host", "")), str(item.get("updated", now()))))
                taken += cur.rowcount
        return taken, added


def target_matches(identity: str, wanted: str) -> bool:
    """Whether a key's Target.identity is `wanted`: that identity, or its target name."""
    return identity == wanted or identity.split("[")[0] == wanted


def only_targets(data: Any, keep: Callable[[str], bool]) -> tuple[dict[str, Any], Counter[str]]:
    """Exported `data` (checked first, as import_ does) without the entries and
    measurements whose key's target `keep` refuses; and how many rows of each refused
    target were left out. `polytile cache import` keeps this machine's hardware only:
    a time measured on other hardware says nothing about this one."""
    best, rows = _validate_export(data)
    skipped: Counter[str] = Counter()
    kept: dict[str, list[dict[str, Any]]] = {"best": [], "measurements": []}
    for name, items in (("best", best), ("measurements", rows)):
        for item in items:
            target = _key_from_json(item["key"]).target
            if keep(target):
                kept[name].append(item)
            else:
                skipped[target] += 1
    return {**data, **kept}, skipped


def lookup(config: Config, key: TuningKey) -> dict[str, Any] | None:
    """The tuned pass options for `key`, for Compiler(tuned=...); None when there are
    none. Never raises: a database that cannot be read means the heuristics."""
    path = config.cache_dir / DB_NAME
    if not path.exists():
        return None
    try:
        entry = TuningDatabase(path).best(key)
    except (PolytileError, OSError, sqlite3.Error) as e:
        log.warning("polytile: tuning database not used: %s", e)
        return None
    return entry.options.pass_options() if entry is not None else None


# ---------------------------------------------------------------- helpers
@contextmanager
def _transaction(conn: sqlite3.Connection) -> Iterator[None]:
    """A write transaction that takes the database's write lock at once (concurrent
    writers wait their turn, up to the busy timeout) and rolls back on any exception."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        yield
        conn.execute("COMMIT")
    except BaseException:
        conn.execute("ROLLBACK")
        raise


def _ensure_schema(conn: sqlite3.Connection) -> None:
    row = None
    try:
        row = conn.execute("SELECT value FROM meta WHERE name = 'schema'").fetchone()
    except sqlite3.OperationalError:
        pass                     # no tables yet
    if row is not None:
        if int(row[0]) == 1:
            _migrate_from_1(conn)
        elif int(row[0]) != SCHEMA_VERSION:
            raise PolytileError(f"tuning database schema {row[0]} is not {SCHEMA_VERSION}",
                                hint="export it with the polytile that wrote it, or move it "
                                     "away")
        return
    for attempt in range(50):
        try:
            conn.execute("PRAGMA journal_mode = WAL")
            break
        except sqlite3.OperationalError:      # another process is creating it
            time.sleep(0.05 * (attempt + 1))
    with _transaction(conn):
        for statement in filter(str.strip, _SCHEMA.split(";")):
            conn.execute(statement)
        conn.execute("INSERT OR IGNORE INTO meta (name, value) VALUES ('schema', ?)",
                     (str(SCHEMA_VERSION),))


def _migrate_from_1(conn: sqlite3.Connection) -> None:
    """Add keys.family (empty for the keys already there: they seed nothing)."""
    with _transaction(conn):
        # Another process may have migrated between our read and this transaction.
        row = conn.execute("SELECT value FROM meta WHERE name = 'schema'").fetchone()
        if int(row[0]) == 1:
            conn.execute("ALTER TABLE keys ADD COLUMN family TEXT NOT NULL DEFAULT ''")
            conn.execute("UPDATE meta SET value = ? WHERE name = 'schema'",
                         (str(SCHEMA_VERSION),))


def _insert_key(conn: sqlite3.Connection, key: TuningKey, function: str,
                family: str = "") -> None:
    conn.execute("INSERT INTO keys (key, program, signature, target, compiler, function, "
                 "family) VALUES (?,?,?,?,?,?,?) ON CONFLICT(key) DO UPDATE SET "
                 "family = excluded.family WHERE keys.family = '' AND excluded.family != ''",
                 (key.digest(), key.program, key.signature, key.target, key.compiler,
                  function, family))


def _best_rows(conn: sqlite3.Connection, where: str, args: tuple[Any, ...]) -> list[BestEntry]:
    query = ("SELECT k.program, k.signature, k.target, k.compiler, k.function, b.options_json, "
             "b.median, b.default_median, b.source, b.host, b.updated, k.family "
             "FROM best b JOIN keys k ON k.key = b.key " + where)
    out = []
    for row in conn.execute(query, args):
        try:
            options = Options.from_json(row[5])
        except ArgumentError as e:
            log.warning("polytile: skipping a tuning entry that cannot be read: %s", e)
            continue
        out.append(BestEntry(TuningKey(*row[:4]), row[4], options, row[6], row[7], row[8],
                             row[9], row[10], row[11]))
    return out


def _measurement_rows(conn: sqlite3.Connection, key: TuningKey | None) -> list[dict[str, Any]]:
    query = ("SELECT k.program, k.signature, k.target, k.compiler, k.function, m.options, "
             "m.options_json, m.status, m.median, m.spread, m.detail, m.host, m.created, m.run, "
             "k.family FROM measurements m JOIN keys k ON k.key = m.key")
    args: tuple[Any, ...] = ()
    if key is not None:
        query += " WHERE m.key = ?"
        args = (key.digest(),)
    out = []
    for row in conn.execute(query + " ORDER BY m.id", args):
        out.append({"key": TuningKey(*row[:4]).parts(), "function": row[4],
                    "options_text": row[5], "options": json.loads(row[6]), "status": row[7],
                    "median": row[8], "spread": row[9], "detail": row[10], "host": row[11],
                    "created": row[12], "run": row[13], "family": row[14]})
    return out


def _entry_json(e: BestEntry) -> dict[str, Any]:
    return {"key": e.key.parts(), "function": e.function, "family": e.family,
            "options": e.options.to_json(),
            "options_text": e.options.text(), "median": e.median,
            "default_median": e.default_median, "source": e.source, "host": e.host,
            "updated": e.updated}


def _key_from_json(data: Any) -> TuningKey:
    try:
        return TuningKey(**{k: str(data[k]) for k in ("program", "signature", "target",
                                                      "compiler")})
    except (KeyError, TypeError):
        raise ArgumentError(f"not a tuning key: {data!r}",
                            hint="a key has program, signature, target and compiler") from None


def _validate_export(data: Any) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    if not isinstance(data, dict) or data.get("format") != EXPORT_FORMAT:
        raise ArgumentError("not a polytile tuning export",
                            hint="make one with `polytile cache export FILE`")
    if data.get("version") != EXPORT_VERSION:
        raise ArgumentError(f"tuning export version {data.get('version')!r} is not supported",
                            hint=f"this polytile reads version {EXPORT_VERSION}")
    best, rows = data.get("best", []), data.get("measurements", [])
    if not isinstance(best, list) or not isinstance(rows, list):
        raise ArgumentError("'best' and 'measurements' must be lists")
    for item in best + rows:
        if not isinstance(item, dict) or "key" not in item or "options" not in item:
            raise ArgumentError(f"tuning export entry without key or options: {item!r:.200}")
        Options.from_json(item["options"])
    for item in best:       # what later calls will apply: checked against its target
        key = _key_from_json(item["key"])
        try:
            Options.from_json(item["options"]).check(load_target(key.target.split("[")[0]))
        except ArgumentError as e:
            raise ArgumentError(f"tuning export entry for {item.get('function', '?')} at "
                                f"{key.signature} ({key.target}) cannot be used: {e.message}",
                                hint="nothing was imported; remove the entry or export again "
                                     "from a polytile that made it") from None
    for item in rows:
        if item.get("status") not in STATUSES or "options_text" not in item:
            raise ArgumentError(f"tuning export measurement is malformed: {item!r:.200}")
    return best, rows
