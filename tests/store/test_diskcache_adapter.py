"""What the store relies on in diskcache beyond its public API (store/diskcache_adapter.py).

A diskcache release that renames a Cache column, stops keeping its count and
size settings by trigger, changes what ``Disk.store`` returns or how
``_transact`` removes files fails here, by name, before any store test does.
"""

from __future__ import annotations

import sqlite3
import threading
from pathlib import Path

import diskcache
import diskcache.core
import pytest

from habitrun.store import diskcache_adapter as dc
from habitrun.store import integrity


@pytest.fixture
def cache(tmp_path: Path):
    c = dc.open_cache(tmp_path / "c")
    yield c
    c.close()


def _settings(con: sqlite3.Connection) -> dict:
    return dict(con.execute("SELECT key, value FROM Settings").fetchall())


def test_the_cache_table_has_the_columns_the_store_reads_and_writes(cache: diskcache.Cache) -> None:
    con = dc.connection(cache)
    assert tuple(row[1] for row in con.execute(f"PRAGMA table_info({dc.CACHE_TABLE})")) == dc.CACHE_COLUMNS


def test_settings_are_as_the_store_opens_them_and_kept_by_diskcache_triggers(cache: diskcache.Cache) -> None:
    con = dc.connection(cache)
    settings = _settings(con)
    assert {name: settings[name] for name in dc.SETTINGS} == dc.SETTINGS
    assert all(name in settings for name in dc.COUNTED_SETTINGS)
    large = cache.disk.store(b"x" * 100_000, False, key="big")
    with dc.write_transaction(cache) as (sql, remove_after_commit):
        dc.replace_results(con, sql, ["big"], {"big": large}, 1.0, remove_after_commit)
    assert (_settings(con)["count"], _settings(con)["size"]) == (1, large[0])  # the triggers counted it
    assert cache["big"] == b"x" * 100_000 and cache.check() == []  # diskcache reads the row as its own


def test_disk_store_returns_size_mode_filename_value(cache: diskcache.Cache) -> None:
    assert (diskcache.core.MODE_RAW, diskcache.core.MODE_BINARY, diskcache.core.MODE_TEXT,
            diskcache.core.MODE_PICKLE) == (integrity.MODE_RAW, integrity.MODE_BINARY, integrity.MODE_TEXT,
                                            integrity.MODE_PICKLE)
    size, mode, filename, value = cache.disk.store(7, False, key="k")
    assert (mode, filename, value) == (integrity.MODE_RAW, None, 7)
    size, mode, filename, value = cache.disk.store({"a": "y" * 100_000}, False, key="k")
    assert mode == integrity.MODE_PICKLE and value is None and (Path(cache.directory) / filename).stat().st_size == size
    cache.disk.remove(filename)


def test_a_replaced_file_is_removed_only_once_the_transaction_commits(cache: diskcache.Cache) -> None:
    con = dc.connection(cache)
    first = cache.disk.store(b"a" * 100_000, False, key="big")
    with dc.write_transaction(cache) as (sql, remove_after_commit):
        dc.replace_results(con, sql, ["big"], {"big": first}, 1.0, remove_after_commit)
    path = Path(cache.directory) / first[2]
    second = cache.disk.store(b"b" * 100_000, False, key="big")
    with dc.write_transaction(cache) as (sql, remove_after_commit):
        dc.replace_results(con, sql, ["big"], {"big": second}, 2.0, remove_after_commit)
        assert path.exists()  # still there until the commit
    assert not path.exists() and cache["big"] == b"b" * 100_000 and cache.check() == []
    dc.move_result(con, "big", "moved")
    assert "big" not in cache and cache["moved"] == b"b" * 100_000


def test_the_connection_is_one_per_thread(cache: diskcache.Cache) -> None:
    mine = dc.connection(cache)
    assert isinstance(mine, sqlite3.Connection) and dc.connection(cache) is mine
    other: list[sqlite3.Connection] = []
    thread = threading.Thread(target=lambda: other.append(dc.connection(cache)))
    thread.start()
    thread.join(timeout=30)
    assert other and other[0] is not mine
