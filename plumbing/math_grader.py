"""
The Minerva protocol for MATH: the 4-shot prompt, \\boxed{} extraction, normalization, then equivalence by
math-verify.

The MATH benchmark (Hendrycks et al. 2021, arXiv 2103.03874) is graded by comparing the final
answer of a solution with the reference answer. The Minerva protocol (Lewkowycz et al. 2022,
arXiv 2206.14858, appendix D.1) normalizes both strings (units, \\text{}, \\dfrac, shorthand
\\frac12, thousands separators, "x = ...") and then checks equivalence symbolically. This file
keeps the prompt, the extraction and the normalization, and leaves the symbolic check to Hugging Face's
math-verify (PyPI `math-verify`, what open-r1 and lighteval grade MATH with): it parses LaTeX through
latex2sympy2_extended's grammar (no Python eval of the answer) and compares sets, intervals, matrices and
equations under a timeout. Retrofitted recurrent models (McLeish et al. 2025, arXiv 2511.07384) are
evaluated with it on MATH-500.

What math-verify lacks and this file adds, before it: the normalization above (a model writes
"864 \\text{ inches}^2", the key "864"), word answers equal up to case ("East", "east"), and numbers with a
base subscript compared as written ("52_8" is not 52). math-verify's timeout is SIGALRM, so off the main
thread only the string comparison runs (with a one-time warning).

    from plumbing.math_grader import extract_boxed, grade_math
    grade_math(extract_boxed(r"so $x = \\boxed{\\frac12}$."), "0.5")   # True

Test: python -m pytest -q tests/test_eval_math.py
"""

import re
import threading
import warnings

SYMBOLIC_TIMEOUT_S = 3  # math-verify's parse and compare, each (whole seconds: signal.alarm); past it, not equal

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
# equivalence


_warned_thread = False


def _verify(pred, gold):
    """math-verify's equivalence of two normalized answers, each parsed as LaTeX ($...$) under the timeout."""
    global _warned_thread
    if threading.current_thread() is not threading.main_thread():
        if not _warned_thread:
            warnings.warn("math_grader: no timeout off the main thread, so only the string comparison runs there")
            _warned_thread = True
        return False
    from math_verify import LatexExtractionConfig, parse, verify  # imported only when MATH is graded (a slow import)

    config = [LatexExtractionConfig()]  # LaTeX only: the plain-expression parser ends in sympy's parse_expr, an eval
    try:
        g, p = (parse(f"${x}$", extraction_config=config, parsing_timeout=SYMBOLIC_TIMEOUT_S) for x in (gold, pred))
        return bool(g and p and verify(g, p, timeout_seconds=SYMBOLIC_TIMEOUT_S))
    except Exception:  # a parse or compare failing on an odd expression means "not shown equal"
        return False


def grade_math(pred, gold):
    """True if the predicted final answer equals the gold answer after normalization or by math-verify."""
    if pred is None or gold is None:
        return False
    if pred.strip() == gold.strip():
        return True
    p, g = strip_string(pred), strip_string(gold)
    if p == g:
        return True
    if p == "" or g == "":
        return False
    if p.lower() == g.lower() and not re.search(r"\d|\\", p):  # word answers: "East" vs "east"
        return True
    if re.search(r"\d_\{?\d", p + " " + g):  # a number in base b, 52_8: math-verify would read 52
        return False
    return _verify(p, g)
