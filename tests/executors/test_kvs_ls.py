"""`flowserve kvs ls` pages its keys (against a real Redis server): the first 100 by
default and a line on stderr saying how many more and how to see them; ``--after KEY``
goes on from a page's last key, ``--limit`` sets the page, ``--all`` lists every key."""

from __future__ import annotations

import argparse

from executors.hosts.commands import add_runtime_commands, kvs_ls


def ls(store, capsys, *argv):
    parser = argparse.ArgumentParser()
    add_runtime_commands(parser, parser.add_subparsers())
    args = parser.parse_args(["kvs", "ls", *argv])
    assert kvs_ls(store, args) == 0
    out = capsys.readouterr()
    return out.out.split(), out.err


def test_a_long_listing_comes_a_page_at_a_time(kvs, capsys):
    kvs.mput({f"user:{i:04d}": i for i in range(2000)})
    kvs.put("flowserve:own", 1)  # the runtime's: hidden unless --all
    keys, more = ls(kvs, capsys)
    assert keys == [f"user:{i:04d}" for i in range(100)]
    assert more.startswith("... and 1900 more keys: `flowserve kvs ls --after user:0099` for the next 100")
    keys, more = ls(kvs, capsys, "--after", "user:0099", "--limit", "1000")
    assert keys == [f"user:{i:04d}" for i in range(100, 1100)] and "and 900 more keys" in more
    keys, more = ls(kvs, capsys, "--after", "user:1899", "--limit", "500")
    assert keys == [f"user:{i:04d}" for i in range(1900, 2000)] and more == ""
    keys, more = ls(kvs, capsys, "--limit", "0")
    assert len(keys) == 2000 and more == ""
    keys, more = ls(kvs, capsys, "--all")
    assert len([k for k in keys if not k.startswith("flowserve:")]) == 2000 and "flowserve:own" in keys and more == ""
    keys, more = ls(kvs, capsys, "user:19*")
    assert keys == [f"user:{i:04d}" for i in range(1900, 2000)] and more == ""


def test_a_short_listing_has_no_footer(kvs, capsys):
    kvs.mput({"b": 1, "a": 2})
    assert ls(kvs, capsys) == (["a", "b"], "")
