"""The scripts' command lines as a newcomer meets them: every flag says what it does in --help, and CPU
thread defaults do not fall off a cliff when another job shares the cores (cli.default_threads)."""

import argparse
import os

import pytest

import analyze
from plumbing import cli
import eval_math
import sample
import surgery
import train

PARSE = {  # each script's parser, with just its required flags
    "sample": lambda: sample.parse_args([]),
    "eval_math": lambda: eval_math.parse_args(["--init", "x", "--task", "loss"]),
    "analyze": lambda: analyze.get_args(["--init", "x"]),
}


@pytest.mark.parametrize("cores, expected", [({0}, 1), ({0, 1}, 1), (set(range(16)), 8)])
@pytest.mark.parametrize("script", sorted(PARSE))
def test_threads_default_to_half_the_cores(script, cores, expected, monkeypatch):
    # 2 threads on 2 shared cores made sample.py's prefill 4-10x slower than 1 (cli.default_threads)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: cores, raising=False)
    assert PARSE[script]().threads == expected
    monkeypatch.setenv("OMP_NUM_THREADS", "3")  # the user's own setting wins
    assert PARSE[script]().threads == 3
    assert cli.default_threads() == 3


class Captured(Exception):
    pass


@pytest.mark.parametrize("script", ["train", "sample", "eval_math", "analyze", "surgery"])
def test_every_flag_has_a_help_text(script, monkeypatch):
    # the parser each script builds, caught at its first parse (train.py's --help listed ~50 bare flags)
    parsers = []

    def capture(self, *args, **kwargs):
        parsers.append(self)
        raise Captured

    monkeypatch.setattr(argparse.ArgumentParser, "parse_known_args", capture)
    entry = {"train": train.parse_args, "sample": sample.parse_args, "eval_math": eval_math.parse_args,
             "analyze": analyze.get_args, "surgery": surgery.main}[script]
    with pytest.raises(Captured):
        entry([])
    flags = [a for a in parsers[0]._actions if a.option_strings]
    bare = [a.option_strings[-1] for a in flags if not (a.help or "").strip()]
    assert len(flags) > 5 and bare == []
