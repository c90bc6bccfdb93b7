"""Reading a cluster's logs (executors/hosts/logs.py) on files written as the processes
write them: records with their tracebacks, one flow's records, lines written in parts,
logs that appear later, all logs merged in time order."""

from __future__ import annotations

from executors.hosts.logs import LogFollower, log_files


def write(path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as f:
        f.write(text)


TB = 'Traceback (most recent call last):\n  File "/src/app.py", line 5, in f\nValueError: no\n'


def test_records_of_every_log_in_time_order_with_their_tracebacks(tmp_path):
    write(tmp_path / "cluster.log", "2026-01-01 10:00:00,100 flowserve.gateway INFO deployed flow a v1\n")
    write(tmp_path / "cluster.log", "2026-01-01 10:00:02,000 flowserve.gateway INFO flow a request r1: 500\n")
    write(
        tmp_path / "logs" / "cpu0.log",
        "2026-01-01 10:00:01,000 executor cpu0 WARNING flow a stage f request r1: x\n" + TB,
    )
    assert [name for name, _ in log_files(tmp_path)] == ["cluster", "cpu0"]
    assert LogFollower(tmp_path).tail() == [
        "cluster | 2026-01-01 10:00:00,100 flowserve.gateway INFO deployed flow a v1",
        "cpu0    | 2026-01-01 10:00:01,000 executor cpu0 WARNING flow a stage f request r1: x",
        "cpu0    | Traceback (most recent call last):",
        'cpu0    |   File "/src/app.py", line 5, in f',
        "cpu0    | ValueError: no",
        "cluster | 2026-01-01 10:00:02,000 flowserve.gateway INFO flow a request r1: 500",
    ]
    assert LogFollower(tmp_path).tail(2)[-1].endswith("request r1: 500")


def test_one_flows_records_keep_their_tracebacks_and_leave_the_others_out(tmp_path):
    write(
        tmp_path / "logs" / "cpu0.log", "2026-01-01 10:00:01,000 executor cpu0 WARNING flow b stage f request r2: y\n"
    )
    write(tmp_path / "logs" / "cpu0.log", TB)
    write(
        tmp_path / "logs" / "cpu0.log", "2026-01-01 10:00:02,000 executor cpu0 WARNING flow a stage f request r3: z\n"
    )
    write(tmp_path / "logs" / "cpu0.log", TB)
    write(tmp_path / "cluster.log", "2026-01-01 10:00:03,000 flowserve.access INFO flow ab request r4: 200\n")
    write(tmp_path / "cluster.log", "2026-01-01 10:00:04,000 flowserve.gateway INFO deploying flow 'a' v2\n")
    shown = LogFollower(tmp_path, flow="a").tail()
    assert [line.split(" | ", 1)[1] for line in shown] == [
        "2026-01-01 10:00:02,000 executor cpu0 WARNING flow a stage f request r3: z",
        *TB.splitlines(),
        "2026-01-01 10:00:04,000 flowserve.gateway INFO deploying flow 'a' v2",
    ]


def test_following_reads_what_is_written_since_a_line_in_parts_once_whole_and_new_logs(tmp_path):
    write(tmp_path / "cluster.log", "2026-01-01 10:00:00,000 flowserve.cluster INFO old\n")
    follower = LogFollower(tmp_path)
    follower.skip_to_end()
    assert follower.read() == []
    write(tmp_path / "cluster.log", "2026-01-01 10:00:05,000 flowserve.cluster INFO ha")
    assert follower.read() == []  # half a line: not yet
    write(tmp_path / "cluster.log", "lf\n")
    write(tmp_path / "logs" / "cpu1.log", "2026-01-01 10:00:04,000 executor cpu1 WARNING started\n")
    assert follower.read() == [
        "cpu1    | 2026-01-01 10:00:04,000 executor cpu1 WARNING started",  # a log that appeared: from its start
        "cluster | 2026-01-01 10:00:05,000 flowserve.cluster INFO half",
    ]
    write(tmp_path / "logs" / "cpu1.log", TB)  # the rest of a record read before
    assert follower.read() == ["cpu1    | " + line for line in TB.splitlines()]
    (tmp_path / "cluster.log").write_text("2026-01-01 11:00:00,000 flowserve.cluster INFO anew\n")  # replaced
    assert follower.read() == ["cluster | 2026-01-01 11:00:00,000 flowserve.cluster INFO anew"]
