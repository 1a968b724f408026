"""
What the scripts' command lines share: flags checked before any model loads, an output directory
checked before long work starts, and failures as one line that names the problem and the fix.

train.py, eval_math.py, analyze.py, sample.py and surgery.py call these and print the ValueError's
message as their own one-line error (exit code 1), never a traceback:

    from plumbing.cli import Parser, int_list, at_least, ready_out_dir, os_error
    p = Parser(description=...)                        # argparse, but a bad flag is one line, not the usage
    p = flag_parser(doc, {"the recipe": RECIPE_FLAGS}) # argparse from a flag table (train.py), --config too
    shape = int_list(args.shape, "--shape", n=3)       # "6,8,6" -> [6, 8, 6]
    at_least(args, 1, "max_new_tokens", "batch_size")  # "--batch_size 0 must be >= 1"
    ready_out_dir(args.out_dir)                        # created and written to before the evaluation

    python -m pytest -q tests/test_eval_math.py -k out_dir   # the checks in use
"""

import argparse
import errno
import json
import os
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


class Parser(argparse.ArgumentParser):
    """argparse with one-line errors (exit code 2): the error names the flag, --help shows the usage."""

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


def read_json(path):
    """json.load of a file whose parse error names the file and what to do (still a json.JSONDecodeError, so
    every caller that turns a ValueError into a one-line error keeps doing so)."""
    with open(path, encoding="utf-8") as f:
        text = f.read()
    try:
        return json.loads(text)
    except json.JSONDecodeError as err:
        raise json.JSONDecodeError(f"{path} is not valid JSON (repair it, or write it again with the command that "
                                   f"made it): {err.msg}", err.doc, err.pos) from None


def str2bool(text):
    """--flag true|false (also 1/0, yes/no, on/off) as an argparse type."""
    if isinstance(text, bool):
        return text
    if text.lower() in ("1", "true", "yes", "on"):
        return True
    if text.lower() in ("0", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")


def bool_or(words):
    """An argparse type for a bool flag that also takes the words in words (train.py's --resume auto)."""
    def parse(text):
        if text in words:
            return text
        try:
            return str2bool(text)
        except argparse.ArgumentTypeError:
            raise argparse.ArgumentTypeError(f"expected true, false or {' or '.join(words)}, got {text!r}") from None
    return parse


def flag_parser(description, groups, names=None):
    """argparse from flag tables {group title: {key: (default, help[, allowed values])}}, the groups in --help in
    this order (train.py). A bool flag takes --key, --key=true or --key false (and the words among its allowed
    values: --resume auto); the allowed values show as argparse shows choices, but the script checks them itself, from the command line and a --config file alike.
    names {key: name}: a flag's name on the command line where it differs from the key it is saved under (the key
    stays a second name of the flag, and a --config file may use either)."""
    parser = argparse.ArgumentParser(description=description, allow_abbrev=False)
    names = names or {}
    for title, flags in groups.items():
        group = parser.add_argument_group(title)
        for key, (value, text, *choices) in flags.items():
            text = text.replace("%", "%%") + " (default: %(default)r)"  # argparse %-formats help texts
            flag = [f"--{names[key]}", f"--{key}"] if key in names else [f"--{key}"]
            if isinstance(value, bool):
                words = [c for c in (choices[0] if choices else ()) if isinstance(c, str)]
                group.add_argument(*flag, dest=key, type=bool_or(words) if words else str2bool, nargs="?", const=True,
                                   default=value, help=text)
            else:
                metavar = "{" + ",".join(map(repr, choices[0])) + "}" if choices else names.get(key, key).upper()
                group.add_argument(*flag, dest=key, type=type(value), default=value, help=text, metavar=metavar)
    return parser


def config_defaults(parser, argv, known, names=None):
    """Make --config FILE's keys (a JSON object; keys that start with "_" are its comments) the parser's defaults,
    so that the command line still overrides them. names: flag_parser's, a flag's command-line name, which a file
    may use for its key. An unknown key is a parser error, a file that cannot be read a ValueError that names it."""
    first, _ = parser.parse_known_args(argv)
    if not first.config:
        return
    try:
        cfg = read_json(first.config)
    except (OSError, ValueError) as err:
        raise ValueError(f"--config {first.config}: {getattr(err, 'strerror', None) or err}") from None
    key_of = {name: key for key, name in (names or {}).items()}
    cfg = {key_of.get(k, k): v for k, v in cfg.items() if not k.startswith("_")}  # "_comment": documentation
    unknown = sorted(set(cfg) - set(known))
    if unknown:
        parser.error(f"{first.config}: unknown keys {unknown}")
    parser.set_defaults(**cfg)


def git_commit(short=False):
    """The repository's HEAD commit (recorded with every run and evaluation), or None outside git."""
    try:
        cmd = ["git", "rev-parse", *(["--short"] if short else []), "HEAD"]
        return subprocess.run(cmd, cwd=REPO, capture_output=True, text=True).stdout.strip() or None
    except OSError:
        return None


def int_list(text, flag, n=None, minimum=1):
    """'1,4,8' -> [1, 4, 8]. A ValueError naming the flag when an entry is not an integer >= minimum,
    when the list is empty, or (with n) when it does not hold exactly n entries."""
    what = f"{n} comma-separated integers" if n else "comma-separated integers"
    try:
        values = [int(x) for x in str(text).split(",") if x.strip()]
    except ValueError:
        values = []
    if not values or (n and len(values) != n) or min(values) < minimum:
        raise ValueError(f"{flag} {text!r} must be {what}, each >= {minimum}")
    return values


def at_least(args, minimum, *names):
    """A ValueError naming the first flag in names whose value is below minimum (None: not set)."""
    for name in names:
        value = getattr(args, name)
        if value is not None and value < minimum:
            raise ValueError(f"--{name} {value} must be >= {minimum}")


def os_error(err, where):
    """One line for an OSError while reading or writing under `where`: the path, the system's reason,
    and what to do about a full disk or a missing permission."""
    fix = {errno.ENOSPC: "free space on that disk or write elsewhere (--out_dir)",
           errno.EDQUOT: "free space (the disk quota is used up) or write elsewhere (--out_dir)",
           errno.EACCES: "pick a directory you may write (--out_dir)", errno.EROFS: "pick a writable disk (--out_dir)"}
    path = err.filename or where
    return f"{path}: {err.strerror or err}: {fix.get(err.errno, 'check the path')}"


def ready_out_dir(path, flag="--out_dir"):
    """Create the output directory and write a probe file in it, so that a file in the way, a missing
    permission or a read-only disk stops a script before its long work rather than after it."""
    p = Path(path)
    if p.exists() and not p.is_dir():
        raise ValueError(f"{flag} {path} is an existing file, not a directory: pass another {flag} or move the file")
    try:
        p.mkdir(parents=True, exist_ok=True)
        probe = p / f".write_probe.{os.getpid()}"
        probe.write_bytes(b"ok")
        probe.unlink()
    except OSError as err:
        raise ValueError(f"{flag} {path} is not writable: {os_error(err, path)}") from None
    return p


def default_threads():
    """--threads of sample.py, eval_math.py, analyze.py: OMP_NUM_THREADS when set, else half the cores this
    process may use (at least 1). Not all of them: OpenMP threads meet at a barrier after every op, so with as
    many threads as cores one other busy process stalls every op on a descheduled thread (RESULTS.md has the
    measurement)."""
    if os.environ.get("OMP_NUM_THREADS", "").isdigit():
        return max(1, int(os.environ["OMP_NUM_THREADS"]))
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return max(1, cores // 2)


THREADS_HELP = ("torch CPU threads (default: OMP_NUM_THREADS, else half the cores, here %(default)s): as many "
                "threads as cores makes every op wait whenever another job runs (2 cores: prefill 4-10x slower)")
