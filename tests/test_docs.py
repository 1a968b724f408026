"""
The documentation runs: every ```python block of README.md and RESULTS.md is executed here, in a fresh
directory, and a block followed by "prints" and a code block must print exactly that. A block whose first
line is `# needs: a GPU` or `# needs: the hub` is skipped (it says so to the reader too). Blocks that read
`out/smollm2_2_2_2` get it from the README's own surgery command (the offline SmolLM2 GGUF).
Every ```bash block of the README runs too, in order, in one scratch copy of the repository, unless its first
line says why not (`# not run by the tests: ...`: minutes of training, a GPU, the demo's outputs); the plain
block right after it is what it prints: those lines must appear, one after another, in what the commands print,
with the numbers of times and speeds (which vary by machine and load) masked.
And the words a reader sees speak of the recipe, not of how the work on it was organized.

    python -m pytest -q tests/test_docs.py
"""

import os
import re
import shutil
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOCS = ("README.md", "RESULTS.md")
SKIP = ("# needs: a GPU", "# needs: the hub")
FENCE = re.compile(r"^```(\w*)\n(.*?)^```\n", re.S | re.M)


def python_blocks(name):
    """[(first line number, code, expected stdout or None)] of a markdown file's python blocks."""
    with open(os.path.join(REPO, name)) as f:
        text = f.read()
    fences = list(FENCE.finditer(text))
    out = []
    for i, m in enumerate(fences):
        if m.group(1) != "python":
            continue
        expected = None
        if i + 1 < len(fences) and fences[i + 1].group(1) == "":
            between = text[m.end():fences[i + 1].start()].strip()
            if between.startswith("prints"):
                expected = fences[i + 1].group(2)
        out.append((text.count("\n", 0, m.start()) + 1, m.group(2), expected))
    return out


def test_blocks_are_found():
    # the README teaches by its python walk-through and the transformers snippet: a parser that finds
    # nothing would pass every doc test below vacuously
    blocks = python_blocks("README.md")
    assert len(blocks) >= 2 and any(expected for _, _, expected in blocks)


CASES = [pytest.param(name, line, code, expected, id=f"{name}:{line}")
         for name in DOCS for line, code, expected in python_blocks(name)]


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    return tmp_path_factory.mktemp("docs")


def run(args, cwd, timeout=600):
    env = {**os.environ, "PYTHONPATH": REPO, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1",
           "TRANSFORMERS_VERBOSITY": "error", "PYTHONWARNINGS": "ignore"}
    return subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


def needs_surgery(workdir, code):
    # the README's step 1, run as written (into this test's directory)
    if "out/smollm2_2_2_2" in code and not os.path.isdir(workdir / "out" / "smollm2_2_2_2"):
        res = run([sys.executable, os.path.join(REPO, "surgery.py"), "--init=smollm2", "--shape", "2,2,2",
                   "--out", "out/smollm2_2_2_2"], workdir)
        assert res.returncode == 0, res.stderr[-2000:]


@pytest.mark.slow
@pytest.mark.parametrize("name, line, code, expected", CASES)
def test_python_block_runs(workdir, name, line, code, expected):
    if code.startswith(SKIP):
        pytest.skip(code.splitlines()[0])
    needs_surgery(workdir, code)
    res = run([sys.executable, "-c", code], workdir)
    assert res.returncode == 0, f"{name} line {line} failed:\n{res.stderr[-3000:]}"
    if expected is not None:
        assert res.stdout == expected, f"{name} line {line} printed\n{res.stdout}\ninstead of\n{expected}"


NOT_RUN = "# not run by the tests:"
TIMED = re.compile(r"\d+(\.\d+)?(?=\s?(s\b|tok/s|ms\b|MiB|GiB))|(?<=decode kernel: )\S+.*")


def bash_blocks(name="README.md"):
    """[(first line number, commands, shown output or None)] of a markdown file's bash blocks; commands joined
    across trailing backslashes, comments and blank lines dropped."""
    with open(os.path.join(REPO, name)) as f:
        text = f.read()
    fences = list(FENCE.finditer(text))
    out = []
    for i, m in enumerate(fences):
        if m.group(1) != "bash":
            continue
        shown = None
        if i + 1 < len(fences) and fences[i + 1].group(1) == "" and not text[m.end():fences[i + 1].start()].strip():
            shown = fences[i + 1].group(2)
        commands = [c.split(" #")[0].strip() for c in m.group(2).replace("\\\n", " ").splitlines()]
        out.append((text.count("\n", 0, m.start()) + 1, m.group(2), [c for c in commands if c and not c.startswith("#")],
                    shown))
    return out


def masked(lines):
    return [TIMED.sub("#", line.rstrip()) for line in lines]


def test_bash_blocks_are_found_and_marked():
    blocks = bash_blocks()
    run_here = [b for b in blocks if not b[1].startswith(NOT_RUN)]
    assert len(run_here) >= 3 and all(shown for *_, shown in run_here if "surgery.py" in " ".join(_[1]))
    assert any(b[1].startswith(NOT_RUN) for b in blocks)  # the long ones say so
    shown = "prefill 0.09s, decode 24.2 tok/s, KV cache 1.3 MiB; decode kernel: numpy (cached: plain 113.93)"
    assert masked([shown]) == ["prefill #s, decode # tok/s, KV cache # MiB; decode kernel: #"]


@pytest.fixture(scope="module")
def scratch_repo(tmp_path_factory):
    """A copy of the repository's files (the commands write data/ and out/ as a user's would, not into the repo)."""
    dst = tmp_path_factory.mktemp("readme")
    files = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True).stdout.split()
    for f in files:
        if os.path.isfile(os.path.join(REPO, f)):
            os.makedirs(os.path.dirname(os.path.join(dst, f)) or dst, exist_ok=True)
            shutil.copy(os.path.join(REPO, f), os.path.join(dst, f))
    return dst


BASH_CASES = [pytest.param(line, code, commands, shown, id=f"README.md:{line}") for line, code, commands, shown in
              bash_blocks() if not code.startswith(NOT_RUN)]


@pytest.mark.slow
@pytest.mark.parametrize("line, code, commands, shown", BASH_CASES)
def test_bash_block_prints_what_the_readme_shows(scratch_repo, line, code, commands, shown):
    printed = []
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "PYTHONWARNINGS": "ignore", "PYTHONUNBUFFERED": "1",
           "PATH": os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"]}
    for cmd in commands:
        res = subprocess.run(cmd, shell=True, cwd=scratch_repo, env=env, stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True, timeout=900)  # as a terminal shows them
        assert res.returncode == 0, f"README.md line {line}: {cmd}\n{res.stdout[-2000:]}"
        printed += res.stdout.splitlines()
    if shown is None:
        return
    want, got = masked(shown.splitlines()), masked(printed)
    assert any(got[i:i + len(want)] == want for i in range(len(got) - len(want) + 1)), \
        f"README.md line {line} shows\n" + "\n".join(want) + "\nbut the commands printed\n" + "\n".join(got)


# words about how the work was organized, and paths to files outside the repository
PROCESS = re.compile(r"\b(issues?|helpers?|aims?)\b|\.\./shared|reference\.md", re.I)


def reader_files():
    """What a reader sees: the docs, the code and its docstrings, the configs, the scripts (tests' own
    docstrings may say where their fixtures come from; their names may not speak of the work)."""
    files = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True).stdout.split()
    keep = lambda f: (f.endswith((".md", ".py", ".json", ".sh", ".txt")) or f == "Makefile") and not f.startswith("tests/")
    return [f for f in files if keep(f) and os.path.isfile(os.path.join(REPO, f))]


def test_no_process_words():
    hits = []
    for f in reader_files():
        with open(os.path.join(REPO, f), errors="replace") as fh:
            for n, line in enumerate(fh, 1):
                if PROCESS.search(line):
                    hits.append(f"{f}:{n}: {line.strip()[:100]}")
    assert not hits, "\n".join(hits[:20])


def test_no_process_words_in_test_names():
    names = subprocess.run(["git", "ls-files", "tests"], cwd=REPO, capture_output=True, text=True).stdout.split()
    bad = []
    for f in names:
        if not f.endswith(".py"):
            continue
        bad += [f"{f}: {m}" for m in re.findall(r"def (test\w*)", open(os.path.join(REPO, f)).read())
                if PROCESS.search(m.replace("_", " "))]
        if PROCESS.search(os.path.basename(f).replace("_", " ")):
            bad.append(f)
    assert not bad, bad


# history ("tried first", "an earlier measurement") and timings belong in RESULTS.md or the git log, not in the code,
# its configs and scripts: a time is true of one machine on one day (a format spec such as {name:8s} is no time)
HISTORY = re.compile(r"tried first|was tried|an earlier (measurement|run|version)|earlier measurements?|used to (be|take)|"
                     r"previously|at first we|we first", re.I)
TIMING = re.compile(r"(?<![\w.:<>^])~?\d+(\.\d+)?(-\d+(\.\d+)?)? ?(ms|s|sec|seconds|min|minutes|hours)\b(?![\w(])")


def code_files():
    return [f for f in reader_files() if f.endswith((".py", ".json", ".sh")) or f == "Makefile"]


def test_no_history_or_timings_in_code():
    hits = []
    for f in code_files():
        with open(os.path.join(REPO, f), errors="replace") as fh:
            for n, line in enumerate(fh, 1):
                if HISTORY.search(line) or TIMING.search(line):
                    hits.append(f"{f}:{n}: {line.strip()[:100]}")
    assert not hits, "\n".join(hits[:20])


def test_history_and_timing_patterns_catch_what_they_should():
    for text in ("tried first on the model", "an earlier measurement gave 70 s", "(~45 minutes a seed)", "~2 s a step",
                 "1-3 min a step", "took 0.5 s", "(~6 min, 1 CPU thread)"):
        assert HISTORY.search(text) or TIMING.search(text), text
    for text in ('f"{name:38s} {wall:10.1f}"', "the answer no longer changes", "s_0 of row b", "--ckpt_minutes 5",
                 "(B, T, h)", "r=4 s_1", "t_start"):
        assert not (HISTORY.search(text) or TIMING.search(text)), text


def test_process_pattern_catches_what_it_should():
    assert PROCESS.search("as the issue asked") and PROCESS.search("see ../shared/data") and PROCESS.search("The aim")
    assert not PROCESS.search("the claim holds") and not PROCESS.search("tissue")
