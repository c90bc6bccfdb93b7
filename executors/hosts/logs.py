"""A local cluster's logs, read and followed as they are written (``flowserve logs``,
``flowserve serve``).

A cluster keeps its logs in its directory: ``cluster.log`` (the supervisor and the
gateway's log lines), ``logs/<executor>.log`` (each executor's log lines, tracebacks and
whatever its operators print) and ``logs/gateway.log`` (the gateway process's own output:
a crash's Python stack). Each line is shown after the name of the log it came from:

    cpu0    | 2026-11-27 04:33:27,654 executor cpu0 WARNING flow dbl stage boom qid 1 request my-req-1: ...
    cpu0    | Traceback (most recent call last):
    cluster | 2026-11-27 04:33:27,655 flowserve.gateway INFO flow dbl request my-req-1: 500 ...

A record is a line that starts with a timestamp and the lines after it that do not (its
traceback); ``flow=`` keeps the records that name that flow (``flow NAME``, ``flow 'NAME'``,
``/flows/NAME``), so a traceback stays with its line.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

CLUSTER_LOG = "cluster.log"
LOG_DIR = "logs"
TAIL_BYTES = 4 << 20  # the most read of each log for its last lines: older records are not shown
_STAMP = re.compile(rb"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d")  # logging's asctime, which starts a record


def log_files(home: Path) -> list[tuple[str, Path]]:
    """(name, path) of the logs in a cluster's directory that exist now."""
    home = Path(home)
    found = [("cluster", home / CLUSTER_LOG)] if (home / CLUSTER_LOG).is_file() else []
    return found + [(p.stem, p) for p in sorted((home / LOG_DIR).glob("*.log"))]


def names_flow(flow: str):
    """A test of a record's first line: does it name flow ``flow``."""
    pattern = re.compile(rf"(?:\bflow |/flows/)['\"]?{re.escape(flow)}(?![\w.-])")
    return lambda line: pattern.search(line) is not None


@dataclass
class _Log:
    name: str
    path: Path
    offset: int = 0
    inode: int | None = None
    partial: bytes = b""  # a line written in part: completed by the next read
    keep: bool = True  # whether the record being read is shown (its traceback goes with it)
    stamp: str = ""  # the timestamp of the record being read


class LogFollower:
    """Reads a cluster's logs from where it last stopped, line by line, each line with the
    name of its log; logs that appear later (an executor started since) are read from
    their start.

        follower = LogFollower(home, flow="dbl")
        for line in follower.tail(100):   # the last 100 lines, oldest first
            print(line)
        while True:
            for line in follower.read():  # what was written since
                print(line)
    """

    def __init__(self, home: str | os.PathLike, flow: str | None = None):
        self.home = Path(home)
        self.wanted = names_flow(flow) if flow else None
        self.logs: dict[Path, _Log] = {}
        self.width = 7

    def skip_to_end(self) -> None:
        """Read only what is written from now on (logs that appear later: from their start)."""
        for name, path in log_files(self.home):
            log = self._log(name, path)
            try:
                st = path.stat()
            except OSError:
                continue
            log.offset, log.inode = st.st_size, st.st_ino

    def tail(self, n: int | None = None) -> list[str]:
        """The last ``n`` lines (None: all) of what the logs hold now, the records of all
        logs merged in time order; later reads go on from there."""
        records: list[tuple[str, int, list[str]]] = []
        for name, path in log_files(self.home):
            log = self._log(name, path)
            try:
                size = path.stat().st_size
            except OSError:
                continue
            log.offset = max(0, size - TAIL_BYTES)
            first = log.offset > 0  # a partial first line when the read starts mid-file
            for i, (stamp, lines) in enumerate(self._records(log, self._take(log))):
                if first and i == 0:
                    continue
                records.append((stamp, len(records), lines))
        records.sort(key=lambda r: (r[0], r[1]))  # stable: a log's own order within one timestamp
        out = [line for _, _, lines in records for line in lines]
        return out if n is None else out[-n:] if n > 0 else []

    def read(self) -> list[str]:
        """The lines written since the last read, the records of all logs in time order."""
        records: list[tuple[str, int, list[str]]] = []
        for name, path in log_files(self.home):
            log = self._log(name, path)
            for stamp, lines in self._records(log, self._take(log)):
                records.append((stamp, len(records), lines))
        records.sort(key=lambda r: (r[0], r[1]))
        return [line for _, _, lines in records for line in lines]

    # -- reading -------------------------------------------------------------------------

    def _log(self, name: str, path: Path) -> _Log:
        log = self.logs.get(path)
        if log is None:
            # lines before a log's first record (an operator's print) name no flow
            log = self.logs[path] = _Log(name, path, keep=self.wanted is None)
            self.width = max(self.width, len(name))
        return log

    def _take(self, log: _Log) -> list[bytes]:
        """The complete lines appended to ``log`` since the last take."""
        try:
            with open(log.path, "rb") as f:
                st = os.fstat(f.fileno())
                if log.inode is not None and (st.st_ino != log.inode or st.st_size < log.offset):
                    log.offset, log.partial = 0, b""  # replaced or truncated: read it anew
                log.inode = st.st_ino
                f.seek(log.offset)
                data = f.read()
        except OSError:
            return []
        log.offset += len(data)
        data = log.partial + data
        cut = data.rfind(b"\n") + 1
        log.partial = data[cut:]
        return data[:cut].splitlines()

    def _records(self, log: _Log, lines: list[bytes]) -> list[tuple[str, list[str]]]:
        """``lines`` grouped into records (a timestamped line and the lines after it), the
        records kept by the flow filter, each line prefixed with its log's name."""
        out: list[tuple[str, list[str]]] = []
        prefix = f"{log.name:<{self.width}} | "
        for raw in lines:
            text = raw.decode("utf-8", "replace")
            if _STAMP.match(raw):
                log.stamp = text[:23]
                log.keep = self.wanted is None or self.wanted(text)
                if log.keep:
                    out.append((log.stamp, [prefix + text]))
            elif log.keep:
                if out:
                    out[-1][1].append(prefix + text)
                else:  # the rest of a record begun in an earlier read
                    out.append((log.stamp, [prefix + text]))
        return out
