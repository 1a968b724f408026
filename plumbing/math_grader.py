"""
The Minerva protocol for MATH: the 4-shot prompt, \\boxed{} extraction, normalization, sympy check.

The MATH benchmark (Hendrycks et al. 2021, arXiv 2103.03874) is graded by comparing the final
answer of a solution with the reference answer. The Minerva protocol (Lewkowycz et al. 2022,
arXiv 2206.14858, appendix D.1) normalizes both strings (units, \\text{}, \\dfrac, shorthand
\\frac12, thousands separators, "x = ...") and then checks equivalence with sympy. This file
implements that protocol for eval_math.py; retrofitted recurrent models (McLeish et al. 2025,
arXiv 2511.07384) are evaluated with it on MATH-500.

sympy's own LaTeX parser needs antlr4 4.11 (4.13 is what pip gives, and it refuses it), so this
file converts the small LaTeX subset of final answers to sympy itself and uses parse_latex only
if it works. Every symbolic check runs under a timeout (SIGALRM, main thread only; elsewhere the
symbolic step is skipped, with a one-time warning).

    from plumbing.math_grader import extract_boxed, grade_math
    grade_math(extract_boxed(r"so $x = \\boxed{\\frac12}$."), "0.5")   # True

Test: python -m pytest -q tests/test_eval_math.py
"""

import math
import re
import signal
import string
import threading
import warnings
from contextlib import contextmanager

import sympy
from sympy.parsing.sympy_parser import (convert_xor, factorial_notation, implicit_multiplication_application,
                                        parse_expr, rationalize, standard_transformations)

SYMBOLIC_TIMEOUT_S = 3.0  # per atom compared; the sympy step is skipped past it (counted not equal)
MAX_SYMBOLIC_CHARS = 300  # longer answers are compared as strings only

# -----------------------------------------------------------------------------
# extraction and the prompt's exemplars


def extract_boxed(text):
    """The content of the last \\boxed{...} (or \\fbox{...}, or "\\boxed 5") in text, or None."""
    if text is None:
        return None
    starts = [(text.rfind(cmd), cmd) for cmd in ("\\boxed", "\\fbox")]
    idx, cmd = max(starts)
    if idx < 0:
        return None
    i = idx + len(cmd)
    while i < len(text) and text[i] == " ":
        i += 1
    if i < len(text) and text[i] == "{":
        content, end = _braced(text, i)
        return content  # None when the braces never close (a truncated generation)
    if i == idx + len(cmd):
        return None  # e.g. "\boxedx": not a box
    # "\boxed 5$": lm-eval's rule, the argument runs to the closing "$" (or the end of the line)
    return re.split(r"[$\n]", text[i:])[0].strip() or None


def _braced(s, i):
    """s[i] == '{': (the content up to the matching '}', index after it), or (None, len(s))."""
    depth = 0
    for j in range(i, len(s)):
        if s[j] == "{" and (j == 0 or s[j - 1] != "\\"):
            depth += 1
        elif s[j] == "}" and (j == 0 or s[j - 1] != "\\"):
            depth -= 1
            if depth == 0:
                return s[i + 1:j], j + 1
    return None, len(s)


def extract_math(text):
    """The last \\boxed{} answer, else Minerva's "The final answer is X. I hope it is correct."."""
    boxed = extract_boxed(text)
    if boxed is not None:
        return boxed
    m = re.search(r"[Ff]inal [Aa]nswer(?::| is)?.*?is \$?(.*?)\$?\.? I hope it is correct", text or "")
    return m.group(1).strip() if m else None



MINERVA_SHOTS = [  # the 4-shot MATH prompt of Lewkowycz et al. 2022, appendix D.2: (problem, solution)
    ("Find the domain of the expression  $\\frac{\\sqrt{x-2}}{\\sqrt{5-x}}$.}",
     "The expressions inside each square root must be non-negative. Therefore, $x-2 \\ge 0$, so $x\\ge2$, and "
     "$5 - x \\ge 0$, so $x \\le 5$. Also, the denominator cannot be equal to zero, so $5-x>0$, which gives $x<5$. "
     "Therefore, the domain of the expression is $\\boxed{[2,5)}$.\nFinal Answer: The final answer is $[2,5)$. "
     "I hope it is correct."),
    ("If $\\det \\mathbf{A} = 2$ and $\\det \\mathbf{B} = 12,$ then find $\\det (\\mathbf{A} \\mathbf{B}).$",
     "We have that $\\det (\\mathbf{A} \\mathbf{B}) = (\\det \\mathbf{A})(\\det \\mathbf{B}) = (2)(12) = "
     "\\boxed{24}.$\nFinal Answer: The final answer is $24$. I hope it is correct."),
    ("Terrell usually lifts two 20-pound weights 12 times. If he uses two 15-pound weights instead, how many times "
     "must Terrell lift them in order to lift the same total weight?",
     "If Terrell lifts two 20-pound weights 12 times, he lifts a total of $2\\cdot 12\\cdot20=480$ pounds of weight.  "
     "If he lifts two 15-pound weights instead for $n$ times, he will lift a total of $2\\cdot15\\cdot n=30n$ pounds "
     "of weight.  Equating this to 480 pounds, we can solve for $n$:\n\\begin{align*}\n30n&=480\\\\\n"
     "\\Rightarrow\\qquad n&=480/30=\\boxed{16}\n\\end{align*}\nFinal Answer: The final answer is $16$. "
     "I hope it is correct."),
    ("If the system of equations\n\n\\begin{align*}\n6x-4y&=a,\\\\\n6y-9x &=b.\n\\end{align*}has a solution $(x, y)$ "
     "where $x$ and $y$ are both nonzero, find $\\frac{a}{b},$ assuming $b$ is nonzero.",
     "If we multiply the first equation by $-\\frac{3}{2}$, we obtain\n\n$$6y-9x=-\\frac{3}{2}a.$$Since we also know "
     "that $6y-9x=b$, we have\n\n$$-\\frac{3}{2}a=b\\Rightarrow\\frac{a}{b}=\\boxed{-\\frac{2}{3}}.$$\n"
     "Final Answer: The final answer is $-\\frac{2}{3}$. I hope it is correct."),
]

# -----------------------------------------------------------------------------
# normalization (Hendrycks' _strip_string and Minerva's normalize_final_answer, merged)

_UNIT_WORDS = ("square", "sq", "ways", "integers", "dollars", "dollar", "mph", "inches", "inch", "ft", "feet", "foot",
               "hours", "hour", "km", "units", "unit", "sue", "points", "minutes", "minute", "seconds", "digits",
               "cents", "cent", "degrees", "degree", "cm", "meters", "meter", "meals", "edges", "students",
               "childrentickets", "multiples", "pounds", "miles", "days", "years")
_UNITS_RE = re.compile(r"(?<![A-Za-z\\])(?:%s)(?![A-Za-z])(\^[23]|\^\{[23]\})?" % "|".join(_UNIT_WORDS))


def _fix_fracs(s):
    """\\frac12 -> \\frac{1}{2}, \\frac1{72} -> \\frac{1}{72}, \\frac{3}4 -> \\frac{3}{4} (spaces already gone)."""
    out, i = [], 0
    while True:
        j = s.find("\\frac", i)
        if j < 0:
            out.append(s[i:])
            return "".join(out)
        out.append(s[i:j] + "\\frac")
        i = j + 5
        for _ in range(2):  # numerator, then denominator
            if i >= len(s):
                break
            if s[i] == "{":
                content, end = _braced(s, i)
                if content is None:
                    break
                out.append(s[i:end])
                i = end
            elif s[i] == "\\":  # \frac\pi2
                m = re.match(r"\\[A-Za-z]+", s[i:])
                out.append("{" + m.group(0) + "}")
                i += len(m.group(0))
            else:
                out.append("{" + s[i] + "}")
                i += 1


def _unwrap(s, commands):
    """\\cmd{content} -> content (nested braces kept), for each command."""
    for cmd in commands:
        while True:
            i = s.find(cmd + "{")
            if i < 0:
                break
            content, end = _braced(s, i + len(cmd))
            if content is None:
                break
            s = s[:i] + content.strip() + s[end:]
    return s


def _fix_sqrt(s):
    """\\sqrt2 -> \\sqrt{2}, \\sqrt\\pi -> \\sqrt{\\pi}."""
    s = re.sub(r"\\sqrt(\\[A-Za-z]+)", r"\\sqrt{\1}", s)
    return re.sub(r"\\sqrt([^{\[\\])", r"\\sqrt{\1}", s)


def strip_string(s):
    """Normalize a final answer so that equal answers usually become equal strings."""
    s = s.strip().replace("\n", "").replace("\\!", "")
    s = s.replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac").replace("\\mbox", "\\text")
    s = s.replace("\\textbf", "\\text").replace("\\mathrm", "\\text").replace("\\textrm", "\\text")
    s = s.replace("\\left", "").replace("\\right", "").replace("\\displaystyle", "")
    s = re.sub(r"\\q?quad|(?<!\\)\\[,;: ]|~", " ", s)  # spacing commands (but not a "\\" row break)
    # degrees and percent carry no value (MATH writes 90^\circ for an angle of 90)
    for deg in ("^{\\circ}", "^\\circ", "\\circ", "°", "\\degree", "\\%", "%", "\\$", "$"):
        s = s.replace(deg, "")
    # "2 \text{ and } 3", "2, and 3" -> "2,3" (Minerva's "\text{and}" -> ",")
    s = re.sub(r"\s*,?\s*\\text\{\s*and\s*\}\s*|(?<=[\d}])\s*,?\s*and\s+(?=[-\d\\])", ",", s)
    # Hendrycks: "\text{ " (with a space) only introduces units on the right
    i = s.find("\\text{ ", 1)
    while i > 0:
        end = _braced(s, i + 5)[1]
        s = s[:i] + re.sub(r"^\^(\{[23]\}|[23])", "", s[end:])  # "864 \text{ inches}^2" -> "864"
        i = s.find("\\text{ ", 1)
    s = _unwrap(s, ("\\text", "\\boxed", "\\overline"))  # \text{Evelyn} -> Evelyn
    s = _UNITS_RE.sub("", s)
    for dots in ("\\ldots", "\\cdots", "\\dots"):
        s = s.replace(dots, "")
    s = s.strip().rstrip(".").strip()
    # "x = 3" -> "3", "x \in [2,7]" -> "[2,7]" (the left side names the unknown, MATH answers are the value)
    m = re.fullmatch(r"\s*[A-Za-z](?:_\{?\w+\}?)?(?:\([A-Za-z]\))?\s*(=|\\in)\s*(.+)", s)
    if m and "=" not in m.group(2):
        s = m.group(2)
    s = _fix_sqrt(s)
    s = s.replace(" ", "")
    s = _fix_fracs(s)
    s = re.sub(r"(?<![\d}])\.(\d)", r"0.\1", s)  # .5 -> 0.5
    if re.fullmatch(r"-?\d{1,3}(,\d{3})+(\.\d+)?", s) or re.fullmatch(r"-?\d{1,3}(\{,\}\d{3})+(\.\d+)?", s):
        s = s.replace("{,}", "").replace(",", "")  # 10,080 -> 10080 (but "1,2" stays a list)
    m = re.fullmatch(r"(-?)(\d+)\\frac\{(\d+)\}\{(\d+)\}", s)  # mixed number 1\frac{4}{5} -> \frac{9}{5}
    if m:
        whole, num, den = int(m.group(2)), int(m.group(3)), int(m.group(4))
        s = "%s\\frac{%d}{%d}" % (m.group(1), whole * den + num, den)
    if re.fullmatch(r"-?\d+/\d+", s):  # 3/4 -> \frac{3}{4}
        a, b = s.lstrip("-").split("/")
        s = ("-" if s.startswith("-") else "") + "\\frac{%s}{%s}" % (a, b)
    s = re.sub(r"^\(([A-Ea-e])\)$", r"\1", s)  # multiple choice "(C)" -> "C"
    return s


# -----------------------------------------------------------------------------
# structure: lists, sets, tuples/intervals, unions, matrices, +-


def _split_top(s, sep):
    """Split s on sep where no bracket is open."""
    parts, depth, start, i = [], 0, 0, 0
    while i < len(s):
        if s[i] in "([{":
            depth += 1
        elif s[i] in ")]}":
            depth -= 1
        elif depth == 0 and s.startswith(sep, i):
            parts.append(s[start:i])
            start = i + len(sep)
            i = start
            continue
        i += 1
    parts.append(s[start:])
    return parts


def _encloses(s, open_i, close_i):
    """True if the bracket at open_i is closed exactly at close_i (counting all bracket kinds)."""
    depth = 0
    for j in range(open_i, close_i + 1):
        depth += s[j] in "([{"
        depth -= s[j] in ")]}"
        if depth == 0 and j < close_i:
            return False
    return depth == 0


def _expand_pm(items):
    """["1\\pm\\sqrt{5}", "-2"] -> ["1+\\sqrt{5}", "1-\\sqrt{5}", "-2"]."""
    out = []
    for x in items:
        out += [x.replace("\\pm", "+", 1), x.replace("\\pm", "-", 1)] if x.count("\\pm") == 1 else [x]
    return out


def _structure(s):
    """(kind, items) for a normalized answer: kind is 'atom', 'set' (unordered), 'tuple(' style, or 'matrix'."""
    m = re.fullmatch(r"\\begin\{([pbv]?matrix)\}(.*)\\end\{\1\}", s)
    if m:
        rows = [r for r in m.group(2).split("\\\\") if r != ""]
        return "matrix", [tuple(r.split("&")) for r in rows]
    if "\\pm" in s and s.count("\\pm") == 1 and "," not in s:
        return "set", [s.replace("\\pm", "+"), s.replace("\\pm", "-")]
    if len(_split_top(s, "\\cup")) > 1:
        return "set", _split_top(s, "\\cup")
    if s.startswith("\\{") and s.endswith("\\}"):
        return "set", _expand_pm(_split_top(s[2:-2], ","))
    if len(s) >= 2 and s[0] in "([" and s[-1] in ")]" and _encloses(s, 0, len(s) - 1):
        inner = _split_top(s[1:-1], ",")
        if len(inner) > 1:
            return "tuple" + s[0] + s[-1], inner
    parts = _split_top(s, ",")
    if len(parts) > 1:
        return "set", _expand_pm([p for p in parts if p != ""])
    return "atom", [s]


# -----------------------------------------------------------------------------
# LaTeX -> sympy, for the small subset that final answers use

_FUNCS = {"sin", "cos", "tan", "cot", "sec", "csc", "arcsin", "arccos", "arctan", "sinh", "cosh", "tanh",
          "log", "ln", "exp"}
_FUNC_RE = re.compile(r"\\(%s)" % "|".join(sorted(_FUNCS, key=len, reverse=True)))
_COMMANDS = {"pi": " pi ", "infty": " oo ", "cdot": "*", "times": "*", "div": "/", "le": None, "ge": None}
_LOCALS = {c: sympy.Symbol(c) for c in string.ascii_letters}
_LOCALS.update(i=sympy.I, pi=sympy.pi, oo=sympy.oo, sqrt=sympy.sqrt, ln=sympy.log, log=sympy.log, exp=sympy.exp,
               arcsin=sympy.asin, arccos=sympy.acos, arctan=sympy.atan)
for _f in ("sin", "cos", "tan", "cot", "sec", "csc", "sinh", "cosh", "tanh"):
    _LOCALS[_f] = getattr(sympy, _f)
_TRANSFORMS = standard_transformations + (implicit_multiplication_application, convert_xor, rationalize,
                                          factorial_notation)


class _Unsupported(Exception):
    pass


def _arg(s, i):
    """One macro argument at s[i:]: a {group}, a \\command or a single character -> (text, next index)."""
    if i >= len(s):
        raise _Unsupported(s)
    if s[i] == "{":
        content, end = _braced(s, i)
        if content is None:
            raise _Unsupported(s)
        return content, end
    m = re.match(r"\\[A-Za-z]+", s[i:])
    if m:
        return m.group(0), i + len(m.group(0))
    return s[i], i + 1


def _to_python(s):
    """Translate LaTeX to a sympy-parsable expression string, or raise _Unsupported."""
    out, i = [], 0
    while i < len(s):
        c = s[i]
        if s.startswith("\\frac", i):
            num, i = _arg(s, i + 5)
            den, i = _arg(s, i)
            out.append("((%s)/(%s))" % (_to_python(num), _to_python(den)))
        elif s.startswith("\\sqrt", i):
            i += 5
            if i < len(s) and s[i] == "[":
                j = s.index("]", i)
                index = _to_python(s[i + 1:j])
                arg, i = _arg(s, j + 1)
                out.append("((%s)**(1/(%s)))" % (_to_python(arg), index))
            else:
                arg, i = _arg(s, i)
                out.append("sqrt(%s)" % _to_python(arg))
        elif c == "\\":
            m = _FUNC_RE.match(s, i) or re.match(r"\\([A-Za-z]+)", s[i:])  # "\cotx" (spaces gone) is cot x
            if not m:
                raise _Unsupported(s)
            name = m.group(1)
            if name in _FUNCS:
                out.append(" %s " % name)
            elif _COMMANDS.get(name):
                out.append(_COMMANDS[name])
            else:
                raise _Unsupported(name)
            i += len(m.group(1)) + 1
        elif c == "^":
            arg, i = _arg(s, i + 1)
            out.append("**(%s)" % _to_python(arg))
        elif c in "{}":
            out.append("(" if c == "{" else ")")
            i += 1
        elif c.isalpha():
            # a run of letters: a known function, or a product of single-letter symbols (never eval'd as a name)
            m = re.match(r"[A-Za-z]+", s[i:])
            word = m.group(0)
            out.append(" %s " % word if word in _FUNCS else "*".join(word))
            i += len(word)
        elif c.isdigit() or c in "+-*/()., !":
            out.append(c)
            i += 1
        else:
            raise _Unsupported(c)
    return "".join(out)


def _too_big(expr):
    """True if evaluating expr would build a huge integer (9^{9^9}): Python's big-int arithmetic
    runs in C, where the SIGALRM timeout cannot interrupt it, so such answers get no symbolic check."""
    for node in sympy.preorder_traversal(expr):
        if isinstance(node, sympy.Pow) and not node.exp.free_symbols:
            e = abs(complex(node.exp.evalf(15)))
            base = abs(complex(node.base.evalf(15))) if not node.base.free_symbols else 2.0
            if e > 1e4 or e * math.log2(max(base, 2.0)) > 1e5:
                return True
    return False


def latex_to_sympy(s):
    """A sympy expression for the LaTeX answer s, or None if s is outside the supported subset."""
    if len(s) > MAX_SYMBOLIC_CHARS:
        return None
    try:
        py = _to_python(s)
        if "," in py or py.strip() == "" or any(int(n) > 1000 for n in re.findall(r"(\d+)\s*!", py)):
            return None  # (sympy computes n! even unevaluated, so big factorials are refused here)
        kwargs = dict(local_dict=dict(_LOCALS), transformations=_TRANSFORMS)
        if _too_big(parse_expr(py, evaluate=False, **kwargs)):
            return None
        return parse_expr(py, evaluate=True, **kwargs)
    except Exception:  # a parse failure of our converter only means "no symbolic check" (try sympy's own)
        return _parse_latex_antlr(s)


def _parse_latex_antlr(s):
    try:
        from sympy.parsing.latex import parse_latex
        return parse_latex(s)
    except Exception:  # antlr runtime missing or of the wrong version, or a parse error
        return None


class _Timeout(Exception):
    pass


_warned_thread = False


@contextmanager
def _time_limit(seconds):
    """Raise _Timeout after `seconds` (SIGALRM). Yields False (caller must skip) outside the main thread."""
    global _warned_thread
    if threading.current_thread() is not threading.main_thread() or not hasattr(signal, "setitimer"):
        if not _warned_thread:
            warnings.warn("math_grader: no timeout off the main thread, so the symbolic check is skipped there")
            _warned_thread = True
        yield False
        return

    def handler(signum, frame):
        raise _Timeout()
    old = signal.signal(signal.SIGALRM, handler)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield True
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def _symbolic_equal(a, b):
    """Exact equivalence of two sympy expressions: a == b, simplify(a - b) == 0, or agreement at random points."""
    if a == b:
        return True
    if a.has(sympy.oo, -sympy.oo, sympy.zoo, sympy.nan) or b.has(sympy.oo, -sympy.oo, sympy.zoo, sympy.nan):
        return False
    diff = sympy.simplify(a - b)
    if diff == 0:
        return True
    syms = sorted(a.free_symbols | b.free_symbols, key=str)
    if len(syms) > 0 and diff.free_symbols:
        # polynomials and rational functions: equal at 3 random points in (0.5, 1.5) -> equal
        rng = [[0.5 + ((7 * k + 3 * j) % 11) / 10.0 for j in range(len(syms))] for k in range(3)]
        for point in rng:
            at = dict(zip(syms, point))
            v, scale = abs(diff.subs(at).evalf(30)), max(abs(a.subs(at).evalf(30)), abs(b.subs(at).evalf(30)), 1)
            if not (v.is_finite and scale.is_finite and v <= sympy.Float(1e-9) * scale):
                return False
        return True
    if not diff.free_symbols:  # in sympy floats: complex() would overflow to inf on big numbers
        v, scale = abs(diff.evalf(30)), max(abs(a.evalf(30)), abs(b.evalf(30)), 1)
        return bool(v.is_finite and scale.is_finite and v <= sympy.Float(1e-12) * scale)
    return False


def _equation_equal(p, g):
    """Equations L1 = R1 and L2 = R2 are equal when (L1 - R1) / (L2 - R2) is a nonzero constant."""
    sides = [x.split("=") for x in (p, g)]
    if any(len(x) != 2 for x in sides):
        return False
    exprs = [(latex_to_sympy(l), latex_to_sympy(r)) for l, r in sides]
    if any(e is None for pair in exprs for e in pair):
        return False
    ratio = sympy.simplify((exprs[0][0] - exprs[0][1]) / (exprs[1][0] - exprs[1][1]))
    return not ratio.free_symbols and ratio.is_finite is True and ratio != 0


def _atom_equal(p, g):
    if p.lower() == g.lower() and not re.search(r"\d|\\", p):  # text answers: "East" vs "east"
        return True
    with _time_limit(SYMBOLIC_TIMEOUT_S) as ok:
        if not ok:
            return False
        try:
            if "=" in p or "=" in g:
                return bool(_equation_equal(p, g))
            a, b = latex_to_sympy(p), latex_to_sympy(g)
            return a is not None and b is not None and bool(_symbolic_equal(a, b))
        except _Timeout:
            return False
        except Exception:  # sympy failing on an odd expression means "not shown equal"
            return False


def _equal(p, g):
    """Equality of two normalized answers: structure first (lists, tuples, matrices), then atoms."""
    if p == g:
        return True
    if p == "" or g == "":
        return False
    (pk, ps), (gk, gs) = _structure(p), _structure(g)
    if pk != gk or len(ps) != len(gs):
        return False
    if pk == "atom":
        return _atom_equal(p, g)
    if pk == "matrix":
        return all(len(pr) == len(gr) and all(_equal(a, b) for a, b in zip(pr, gr)) for pr, gr in zip(ps, gs))
    if pk != "set":
        return all(_equal(a, b) for a, b in zip(ps, gs))
    unused = list(gs)  # unordered: match each predicted item with a distinct gold item
    for a in ps:
        hit = next((k for k, b in enumerate(unused) if _equal(a, b)), None)
        if hit is None:
            return False
        unused.pop(hit)
    return True


def grade_math(pred, gold):
    """True if the predicted final answer equals the gold answer after normalization or symbolically."""
    if pred is None or gold is None:
        return False
    if pred.strip() == gold.strip():
        return True
    return _equal(strip_string(pred), strip_string(gold))
