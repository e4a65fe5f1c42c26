"""The problem bank of ``PythonCoding-v0``: small "write a function" tasks generated in code.

Each *family* (sum of digits, fizzbuzz with other divisors, run-length encoding, ...) has
parametrised variants; a variant is one ``Problem``: a statement, a function signature, a
reference solution, example (visible) tests shown in the prompt, hidden tests that decide the
outcome, and buggy versions of the solution. Sources are ``string.Template`` texts over the
variant's parameters (``$name``). Test inputs come from a generator seeded by the problem id,
so the bank is the same in every process; expected values are the reference solution's
outputs (trusted code, evaluated in-process once), normalised through JSON.

Bugs are classified by what they do on the tests: *obvious* bugs fail a visible test, *subtle*
bugs pass every visible test and fail a hidden one (edge cases the examples do not show);
a "bug" that passes everything is dropped for that variant.
"""

from __future__ import annotations

import json
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache
from string import Template
from typing import Any

import numpy as np

__all__ = ["Problem", "Test", "all_problems", "call_text"]

VISIBLE_TESTS = 3
RANDOM_HIDDEN_TESTS = 5
WORDS = ("apple", "river", "stone", "cloud", "tiger", "lemon", "piano", "grass", "moon", "seven", "delta", "orbit")
Args = tuple


@dataclass(frozen=True)
class Test:
    """One test: call the function with ``args``; it must return ``expected`` (JSON-equal)."""

    args: Args
    expected: Any


@dataclass(frozen=True)
class Problem:
    """One task of the bank.

    Attributes:
        task_id: Stable id, e.g. ``"fizzbuzz[a=3,b=5,wa=Fizz,wb=Buzz]"``.
        func: Name of the function to write.
        signature: Its ``def`` line, e.g. ``"def sum_digits(n: int) -> int:"``.
        statement: What the function must do.
        solution: The reference solution (complete source).
        visible: Example tests shown in the prompt and checked on every submission.
        hidden: Tests that decide the outcome (edge cases and more random inputs).
        obvious_bugs: Wrong solutions that fail a visible test.
        subtle_bugs: Wrong solutions that pass the visible tests and fail a hidden one.
    """

    task_id: str
    func: str
    signature: str
    statement: str
    solution: str
    visible: tuple[Test, ...]
    hidden: tuple[Test, ...]
    obvious_bugs: tuple[str, ...]
    subtle_bugs: tuple[str, ...]

    @property
    def tests(self) -> tuple[Test, ...]:
        """Visible tests, then hidden tests."""
        return self.visible + self.hidden


@dataclass(frozen=True)
class _Family:
    name: str
    variants: tuple[dict, ...]
    signature: str
    statement: str
    solution: str
    bugs: tuple[str, ...]
    visible: Callable[[np.random.Generator, dict], Args]
    hidden: Callable[[np.random.Generator, dict], Args]
    edges: Callable[[dict], tuple[Args, ...]]


def call_text(func: str, args: Args) -> str:
    """The call as Python source, e.g. ``"gcd(12, 18)"``."""
    return f"{func}({', '.join(repr(a) for a in args)})"


def _json(value: Any) -> Any:
    return json.loads(json.dumps(value))


def _run(source: str, func: str, args: Args) -> tuple[bool, Any]:
    """Evaluate our own (trusted) source on ``args``: ``(ok, json value or error text)``."""
    namespace: dict[str, Any] = {}
    try:
        exec(compile(source, f"<{func}>", "exec"), namespace)  # noqa: S102 - bank sources only
        return True, _json(namespace[func](*[_json(a) for a in args]))
    except Exception as e:
        return False, f"{type(e).__name__}: {e}"


def _fails(source: str, func: str, tests: tuple[Test, ...]) -> bool:
    for t in tests:
        ok, value = _run(source, func, t.args)
        if not ok or json.dumps(value) != json.dumps(t.expected):
            return True
    return False


def _task_id(name: str, params: dict) -> str:
    shown = ",".join(f"{k}={v}" for k, v in params.items() if not k.startswith("_"))
    return f"{name}[{shown}]" if shown else name


def _build(family: _Family, params: dict) -> Problem:
    task_id = _task_id(family.name, params)
    rng = np.random.default_rng(zlib.crc32(task_id.encode()))
    fill = lambda text: Template(text).substitute(params)  # noqa: E731
    signature, solution = fill(family.signature), fill(family.solution)
    func = signature.split("(")[0].removeprefix("def ").strip()
    bugs = [fill(b) for b in family.bugs]

    def test(args: Args) -> Test:
        ok, value = _run(solution, func, args)
        if not ok:
            raise RuntimeError(f"reference solution of {task_id} fails on {args}: {value}")
        return Test(_json(list(args)), value)

    hidden = [test(a) for a in family.edges(params)] + [test(family.hidden(rng, params)) for _ in range(RANDOM_HIDDEN_TESTS)]
    visible: list[Test] = []
    for _ in range(200):  # distinct examples
        t = test(family.visible(rng, params))
        if all(json.dumps(t.args) != json.dumps(v.args) for v in visible):
            visible.append(t)
        if len(visible) == VISIBLE_TESTS:
            break
    visible_t, hidden_t = tuple(visible), tuple(hidden)
    obvious = tuple(b for b in bugs if _fails(b, func, visible_t))
    subtle = tuple(b for b in bugs if b not in obvious and _fails(b, func, hidden_t))
    return Problem(task_id, func, signature, fill(family.statement), solution, visible_t, hidden_t, obvious, subtle)


def _words(rng: np.random.Generator, lo: int, hi: int) -> list[str]:
    return [str(w) for w in rng.choice(WORDS, size=int(rng.integers(lo, hi + 1)))]


def _ints(rng: np.random.Generator, n_lo: int, n_hi: int, lo: int, hi: int) -> list[int]:
    return [int(x) for x in rng.integers(lo, hi + 1, size=int(rng.integers(n_lo, n_hi + 1)))]


def _balanced(rng: np.random.Generator, pairs: str, n: int) -> str:
    out, stack = [], []
    for _ in range(n):
        if stack and rng.random() < 0.5:
            out.append(stack.pop())
        else:
            k = int(rng.integers(len(pairs) // 2))
            out.append(pairs[2 * k])
            stack.append(pairs[2 * k + 1])
    return "".join(out + stack[::-1])


def _lcm(a: int, b: int) -> int:
    return a * b // int(np.gcd(a, b))


def _no_four_nine(n: int) -> bool:
    return not set(str(n)) & {"4", "9"}


FAMILIES: tuple[_Family, ...] = (
    _Family(
        "sum_digits", tuple({"base": b} for b in (10, 2, 3, 7)),
        "def sum_digits(n: int) -> int:",
        "Return the sum of the digits of n written in base $base. n may be negative: use its absolute value.",
        "def sum_digits(n: int) -> int:\n    n = abs(n)\n    total = 0\n    while n:\n        total += n % $base\n"
        "        n //= $base\n    return total",
        ("def sum_digits(n: int) -> int:\n    total = 0\n    while n > 0:\n        total += n % $base\n"
         "        n //= $base\n    return total",
         "def sum_digits(n: int) -> int:\n    return abs(n) % $base",
         "def sum_digits(n: int) -> int:\n    n = abs(n)\n    total = 0\n    while n >= $base:\n"
         "        total += n % $base\n        n //= $base\n    return total"),
        lambda rng, p: (int(rng.integers(100, 10 ** 6)),),
        lambda rng, p: (int(rng.integers(-10 ** 6, 10 ** 6)),),
        lambda p: ((-1234,), (-7,), (0,)),
    ),
    _Family(
        "reverse_words", tuple({"sep": s} for s in (repr(" "), repr("-"), repr(", "))),
        "def reverse_words(s: str) -> str:",
        "Return the words of s (separated by one or more spaces) in reverse order, joined by the string $sep.",
        "def reverse_words(s: str) -> str:\n    return $sep.join(reversed(s.split()))",
        ("def reverse_words(s: str) -> str:\n    return $sep.join(reversed(s.split(' ')))",
         "def reverse_words(s: str) -> str:\n    return s[::-1]",
         "def reverse_words(s: str) -> str:\n    return $sep.join(s.split())"),
        lambda rng, p: (" ".join(_words(rng, 2, 5)),),
        lambda rng, p: ("  ".join(_words(rng, 1, 4)),),
        lambda p: (("  hello   world ",), ("",), ("one",), ("a  b",)),
    ),
    _Family(
        "fizzbuzz",
        tuple({"a": a, "b": b, "wa": wa, "wb": wb} for a, b, wa, wb in (
            (3, 5, "Fizz", "Buzz"), (2, 3, "Foo", "Bar"), (4, 6, "Ping", "Pong"), (2, 5, "Fizz", "Buzz"),
            (3, 7, "Zip", "Zap"), (4, 10, "Tick", "Tock"), (6, 9, "Fizz", "Buzz"))),
        "def fizzbuzz(n: int) -> list:",
        "Return a list of strings for i = 1..n: '$wa$wb' if i is divisible by both $a and $b, '$wa' if only by $a, "
        "'$wb' if only by $b, else str(i).",
        "def fizzbuzz(n: int) -> list:\n    out = []\n    for i in range(1, n + 1):\n"
        "        if i % $a == 0 and i % $b == 0:\n            out.append('$wa$wb')\n"
        "        elif i % $a == 0:\n            out.append('$wa')\n        elif i % $b == 0:\n"
        "            out.append('$wb')\n        else:\n            out.append(str(i))\n    return out",
        ("def fizzbuzz(n: int) -> list:\n    out = []\n    for i in range(1, n + 1):\n"
         "        if i % $a == 0:\n            out.append('$wa')\n        elif i % $b == 0:\n"
         "            out.append('$wb')\n        elif i % $a == 0 and i % $b == 0:\n            out.append('$wa$wb')\n"
         "        else:\n            out.append(str(i))\n    return out",
         "def fizzbuzz(n: int) -> list:\n    out = []\n    for i in range(1, n + 1):\n"
         "        if i % ($a * $b) == 0:\n            out.append('$wa$wb')\n        elif i % $a == 0:\n"
         "            out.append('$wa')\n        elif i % $b == 0:\n            out.append('$wb')\n"
         "        else:\n            out.append(str(i))\n    return out",
         "def fizzbuzz(n: int) -> list:\n    return [str(i) for i in range(1, n + 1)]",
         "def fizzbuzz(n: int) -> list:\n    out = []\n    for i in range(1, n):\n"
         "        if i % $a == 0 and i % $b == 0:\n            out.append('$wa$wb')\n"
         "        elif i % $a == 0:\n            out.append('$wa')\n        elif i % $b == 0:\n"
         "            out.append('$wb')\n        else:\n            out.append(str(i))\n    return out"),
        lambda rng, p: (int(rng.integers(max(p["a"], p["b"]), _lcm(p["a"], p["b"]))),),
        lambda rng, p: (int(rng.integers(_lcm(p["a"], p["b"]), 4 * _lcm(p["a"], p["b"]))),),
        lambda p: ((0,), (_lcm(p["a"], p["b"]),), (p["a"] * p["b"] + 1,)),
    ),
    _Family(
        "gcd", ({},),
        "def gcd(a: int, b: int) -> int:",
        "Return the greatest common divisor of the non-negative integers a and b (gcd(0, 0) is 0).",
        "def gcd(a: int, b: int) -> int:\n    while b:\n        a, b = b, a % b\n    return a",
        ("def gcd(a: int, b: int) -> int:\n    for d in range(min(a, b), 0, -1):\n"
         "        if a % d == 0 and b % d == 0:\n            return d\n    return 1",
         "def gcd(a: int, b: int) -> int:\n    return min(a, b)",
         "def gcd(a: int, b: int) -> int:\n    return a * b"),
        lambda rng, p: (int(rng.integers(2, 60)) * 6, int(rng.integers(2, 60)) * 4),
        lambda rng, p: (int(rng.integers(1, 10 ** 4)), int(rng.integers(1, 10 ** 4))),
        lambda p: ((0, 5), (7, 0), (0, 0), (17, 17)),
    ),
    _Family(
        "lcm", ({},),
        "def lcm(a: int, b: int) -> int:",
        "Return the least common multiple of the non-negative integers a and b (0 if either is 0).",
        "def lcm(a: int, b: int) -> int:\n    if a == 0 or b == 0:\n        return 0\n    g, h = a, b\n"
        "    while h:\n        g, h = h, g % h\n    return a * b // g",
        ("def lcm(a: int, b: int) -> int:\n    import math\n    return a * b // math.gcd(a, b)",
         "def lcm(a: int, b: int) -> int:\n    return a * b",
         "def lcm(a: int, b: int) -> int:\n    return max(a, b)"),
        lambda rng, p: (int(rng.integers(2, 30)) * 2, int(rng.integers(2, 30)) * 3),
        lambda rng, p: (int(rng.integers(1, 500)), int(rng.integers(1, 500))),
        lambda p: ((0, 0), (0, 9), (12, 12)),
    ),
    _Family(
        "rle", ({"order": "count then char", "_piece": "str(j - i) + s[i]", "_piece2": "str(count) + prev",
                 "_example": "'aaab' -> '3a1b'"},
                {"order": "char then count", "_piece": "s[i] + str(j - i)", "_piece2": "prev + str(count)",
                 "_example": "'aaab' -> 'a3b1'"}),
        "def rle(s: str) -> str:",
        "Run-length encode s: each run of one repeated character becomes its $order, e.g. $_example.",
        "def rle(s: str) -> str:\n    out = []\n    i = 0\n    while i < len(s):\n        j = i\n"
        "        while j < len(s) and s[j] == s[i]:\n            j += 1\n        out.append($_piece)\n"
        "        i = j\n    return ''.join(out)",
        ("def rle(s: str) -> str:\n    out = []\n    prev, count = s[0], 0\n    for c in s:\n"
         "        if c == prev:\n            count += 1\n        else:\n            out.append($_piece2)\n"
         "            prev, count = c, 1\n    out.append($_piece2)\n    return ''.join(out)",
         "def rle(s: str) -> str:\n    out = []\n    for prev in sorted(set(s), key=s.index):\n"
         "        count = s.count(prev)\n        out.append($_piece2)\n    return ''.join(out)",
         "def rle(s: str) -> str:\n    out = []\n    prev, count = s[:1], 0\n    for c in s:\n"
         "        if c == prev:\n            count += 1\n        else:\n            out.append($_piece2)\n"
         "            prev, count = c, 1\n    return ''.join(out)"),
        lambda rng, p: ("".join(rng.choice(list("aab"), size=int(rng.integers(5, 9)))),),
        lambda rng, p: ("".join(rng.choice(list("xyz"), size=int(rng.integers(1, 15)))),),
        lambda p: (("",), ("z",), ("aaaaaaaaaaaa",)),
    ),
    _Family(
        "is_palindrome", ({"mode": "loose"},),
        "def is_palindrome(s: str) -> bool:",
        "Return True if s reads the same forwards and backwards when case and every non-alphanumeric "
        "character are ignored, else False.",
        "def is_palindrome(s: str) -> bool:\n    t = [c.lower() for c in s if c.isalnum()]\n    return t == t[::-1]",
        ("def is_palindrome(s: str) -> bool:\n    return s.lower() == s.lower()[::-1]",
         "def is_palindrome(s: str) -> bool:\n    return s == s[::-1]",
         "def is_palindrome(s: str) -> bool:\n    return s[0] == s[-1]"),
        lambda rng, p: (str(rng.choice(["level", "abba", "hello", "abca", "noon", "racecar", "python", "refer", "xyzx"])),),
        lambda rng, p: (str(rng.choice(["Step on no pets", "Was it a car or a cat I saw?", "Hello, World", "ab!ba", "No lemon, no melon"])),),
        lambda p: (("A man, a plan, a canal: Panama",), ("",), ("Ab",), ("race a car",)),
    ),
    _Family(
        "is_mirror", ({"mode": "strict"},),
        "def is_mirror(s: str) -> bool:",
        "Return True if s is exactly the same string when reversed (case, spaces and punctuation count), else False.",
        "def is_mirror(s: str) -> bool:\n    return s == s[::-1]",
        ("def is_mirror(s: str) -> bool:\n    return s.lower() == s.lower()[::-1]",
         "def is_mirror(s: str) -> bool:\n    t = s.replace(' ', '')\n    return t == t[::-1]",
         "def is_mirror(s: str) -> bool:\n    return len(s) % 2 == 1"),
        lambda rng, p: (str(rng.choice(["level", "abba", "hello", "abca", "noon", "racecar", "python", "refer", "xyzx"])),),
        lambda rng, p: (str(rng.choice(["Level", "a b a", "ab a", "x", "abcba", "abcab"])),),
        lambda p: (("Aa",), ("ab a",), ("",)),
    ),
    _Family(
        "fib_mod", tuple({"k": k} for k in (10, 97, 1000, 7)),
        "def fib_mod(n: int) -> int:",
        "Return F(n) mod $k, where F(0) = 0, F(1) = 1 and F(n) = F(n-1) + F(n-2); n can be as large as 100000.",
        "def fib_mod(n: int) -> int:\n    a, b = 0, 1\n    for _ in range(n):\n        a, b = b, (a + b) % $k\n    return a",
        ("def fib_mod(n: int) -> int:\n    a, b = 0, 1\n    for _ in range(n - 1):\n        a, b = b, (a + b) % $k\n"
         "    return b",
         "def fib_mod(n: int) -> int:\n    a, b = 1, 1\n    for _ in range(n):\n        a, b = b, (a + b) % $k\n    return a",
         "def fib_mod(n: int) -> int:\n    a, b = 0, 1\n    for _ in range(n):\n        a, b = b, a + b\n    return a"),
        lambda rng, p: (int(rng.integers(2, 30)),),
        lambda rng, p: (int(rng.integers(30, 2000)),),
        lambda p: ((0,), (1,), (99_999,)),
    ),
    _Family(
        "count_vowels", ({"y": "no", "_y": "", "_vowels": "aeiou"}, {"y": "yes", "_y": " and y", "_vowels": "aeiouy"}),
        "def count_vowels(s: str) -> int:",
        "Return how many characters of s are vowels (a, e, i, o, u$_y), in upper or lower case.",
        "def count_vowels(s: str) -> int:\n    return sum(1 for c in s.lower() if c in '$_vowels')",
        ("def count_vowels(s: str) -> int:\n    return sum(1 for c in s if c in '$_vowels')",
         "def count_vowels(s: str) -> int:\n    return sum(1 for c in s.lower() if c in 'aeiou')",
         "def count_vowels(s: str) -> int:\n    return sum(1 for c in s.lower() if c not in '$_vowels')"),
        lambda rng, p: (" ".join(_words(rng, 1, 3)).replace("y", "u"),),
        lambda rng, p: (" ".join(w.upper() if rng.random() < 0.5 else w for w in _words(rng, 1, 4)),),
        lambda p: (("",), ("AEIOU",), ("Rhythm and Yoga",)),
    ),
    _Family(
        "max_subarray", ({},),
        "def max_subarray(xs: list) -> int:",
        "Return the largest sum of a non-empty contiguous sublist of the non-empty integer list xs.",
        "def max_subarray(xs: list) -> int:\n    best = cur = xs[0]\n    for x in xs[1:]:\n"
        "        cur = max(x, cur + x)\n        best = max(best, cur)\n    return best",
        ("def max_subarray(xs: list) -> int:\n    best = cur = 0\n    for x in xs:\n        cur = max(0, cur + x)\n"
         "        best = max(best, cur)\n    return best",
         "def max_subarray(xs: list) -> int:\n    return sum(xs)",
         "def max_subarray(xs: list) -> int:\n    return max(xs)"),
        lambda rng, p: (_ints(rng, 5, 8, -9, 9) + [int(rng.integers(1, 9)), -10, int(rng.integers(1, 9))],),
        lambda rng, p: (_ints(rng, 1, 12, -20, 20),),
        lambda p: (([-3],), ([-5, -2, -8],), ([4, -1, 2, -7, 5],)),
    ),
    _Family(
        "second_largest", ({},),
        "def second_largest(xs: list):",
        "Return the second largest distinct value in the integer list xs, or None if xs has fewer than two distinct values.",
        "def second_largest(xs: list):\n    vals = sorted(set(xs))\n    return vals[-2] if len(vals) >= 2 else None",
        ("def second_largest(xs: list):\n    return sorted(xs)[-2]",
         "def second_largest(xs: list):\n    return max(xs)",
         "def second_largest(xs: list):\n    return sorted(set(xs))[1] if len(set(xs)) > 1 else None"),
        lambda rng, p: ([int(x) for x in rng.permutation(np.arange(-20, 40))[: int(rng.integers(4, 8))]],),
        lambda rng, p: (_ints(rng, 0, 8, -5, 5),),
        lambda p: (([5, 5, 3],), ([4],), ([2, 2],), ([],)),
    ),
    _Family(
        "caesar", tuple({"k": k} for k in (1, 3, 13, 25)),
        "def caesar(s: str) -> str:",
        "Shift every letter of s forward by $k places in the alphabet, wrapping around from z to a and keeping "
        "upper or lower case; other characters stay as they are.",
        "def caesar(s: str) -> str:\n    out = []\n    for c in s:\n        if 'a' <= c <= 'z':\n"
        "            out.append(chr((ord(c) - 97 + $k) % 26 + 97))\n        elif 'A' <= c <= 'Z':\n"
        "            out.append(chr((ord(c) - 65 + $k) % 26 + 65))\n        else:\n            out.append(c)\n"
        "    return ''.join(out)",
        ("def caesar(s: str) -> str:\n    out = []\n    for c in s:\n        if 'a' <= c <= 'z':\n"
         "            out.append(chr((ord(c) - 97 + $k) % 26 + 97))\n        else:\n            out.append(c)\n"
         "    return ''.join(out)",
         "def caesar(s: str) -> str:\n    out = []\n    for c in s:\n        if 'a' <= c <= 'z':\n"
         "            out.append(chr((ord(c) - 97 - $k) % 26 + 97))\n        else:\n            out.append(c)\n"
         "    return ''.join(out)",
         "def caesar(s: str) -> str:\n    return ''.join(chr(ord(c) + $k) if c.isalpha() else c for c in s)"),
        lambda rng, p: (" ".join(_words(rng, 1, 3)) + " xyz",),
        lambda rng, p: (" ".join(w.capitalize() for w in _words(rng, 1, 3)) + "!",),
        lambda p: (("Hello, World!",), ("XYZ abc",), ("",)),
    ),
    _Family(
        "digital_root", ({},),
        "def digital_root(n: int) -> int:",
        "Repeatedly replace the non-negative integer n by the sum of its decimal digits until it has a single "
        "digit; return that digit.",
        "def digital_root(n: int) -> int:\n    while n >= 10:\n        n = sum(int(d) for d in str(n))\n    return n",
        ("def digital_root(n: int) -> int:\n    return 1 + (n - 1) % 9",
         "def digital_root(n: int) -> int:\n    return sum(int(d) for d in str(n))",
         "def digital_root(n: int) -> int:\n    return n % 10"),
        lambda rng, p: (int(rng.integers(1000, 10 ** 7)),),
        lambda rng, p: (int(rng.integers(10, 10 ** 9)),),
        lambda p: ((0,), (9,), (10,)),
    ),
    _Family(
        "is_prime", ({},),
        "def is_prime(n: int) -> bool:",
        "Return True if the integer n is a prime number, else False (n may be 0, 1 or negative).",
        "def is_prime(n: int) -> bool:\n    if n < 2:\n        return False\n    d = 2\n    while d * d <= n:\n"
        "        if n % d == 0:\n            return False\n        d += 1\n    return True",
        ("def is_prime(n: int) -> bool:\n    for d in range(2, n):\n        if n % d == 0:\n            return False\n"
         "    return True",
         "def is_prime(n: int) -> bool:\n    return n % 2 == 1",
         "def is_prime(n: int) -> bool:\n    return all(n % d for d in range(2, 10))"),
        lambda rng, p: (int(rng.choice([9, 15, 21, 25, 27, 33, 35, 39, 49, 51, 2, 3, 5, 7, 11, 13, 17, 19, 23, 29])),),
        lambda rng, p: (int(rng.integers(2, 5000)),),
        lambda p: ((0,), (1,), (-7,), (9973,), (121,)),
    ),
    _Family(
        "rotate", ({"dir": "left", "_body": "xs[k:] + xs[:k]", "_wrong": "xs[-k:] + xs[:-k]"},
                   {"dir": "right", "_body": "xs[len(xs) - k:] + xs[:len(xs) - k]", "_wrong": "xs[k:] + xs[:k]"}),
        "def rotate(xs: list, k: int) -> list:",
        "Return the list xs rotated $dir by k positions; k >= 0 may be larger than len(xs), and an empty list stays empty.",
        "def rotate(xs: list, k: int) -> list:\n    if not xs:\n        return []\n    k %= len(xs)\n    return $_body",
        ("def rotate(xs: list, k: int) -> list:\n    return $_body",
         "def rotate(xs: list, k: int) -> list:\n    k %= len(xs)\n    return $_body",
         "def rotate(xs: list, k: int) -> list:\n    if not xs:\n        return []\n    k %= len(xs)\n    return $_wrong"),
        lambda rng, p: (lambda xs: (xs, int(rng.integers(1, len(xs)))))(_ints(rng, 4, 7, 0, 9)),
        lambda rng, p: (lambda xs: (xs, int(rng.integers(0, 3 * len(xs) + 1))))(_ints(rng, 1, 7, 0, 9)),
        lambda p: (([], 3), ([1, 2, 3], 7), ([1], 0), ([5, 6], 2)),
    ),
    _Family(
        "flatten", ({},),
        "def flatten(xs: list) -> list:",
        "Return a flat list of all the integers in the arbitrarily nested list xs, in order.",
        "def flatten(xs: list) -> list:\n    out = []\n    for x in xs:\n        if isinstance(x, list):\n"
        "            out.extend(flatten(x))\n        else:\n            out.append(x)\n    return out",
        ("def flatten(xs: list) -> list:\n    out = []\n    for x in xs:\n        if isinstance(x, list):\n"
         "            out.extend(x)\n        else:\n            out.append(x)\n    return out",
         "def flatten(xs: list) -> list:\n    return xs",
         "def flatten(xs: list) -> list:\n    return [x for x in xs if not isinstance(x, list)]"),
        lambda rng, p: ([int(rng.integers(10)), [int(rng.integers(10)), int(rng.integers(10))], int(rng.integers(10))],),
        lambda rng, p: ([[int(rng.integers(10)), [int(rng.integers(10)), [int(rng.integers(10))]]], int(rng.integers(10))],),
        lambda p: (([[[1]], [2, [3, [4]]]],), ([],), ([[]],)),
    ),
    _Family(
        "balanced", ({"kinds": "()", "_pairs": "{')': '('}", "_chars": "()"},
                     {"kinds": "()[]{}", "_pairs": "{')': '(', ']': '[', '}': '{'}", "_chars": "()[]{}"}),
        "def balanced(s: str) -> bool:",
        "Return True if the brackets $kinds in s are balanced and properly nested, else False; "
        "other characters are ignored.",
        "def balanced(s: str) -> bool:\n    pairs = $_pairs\n    stack = []\n    for c in s:\n"
        "        if c in pairs.values():\n            stack.append(c)\n        elif c in pairs:\n"
        "            if not stack or stack.pop() != pairs[c]:\n                return False\n    return not stack",
        ("def balanced(s: str) -> bool:\n    pairs = $_pairs\n    return all(s.count(o) == s.count(c) for c, o in pairs.items())",
         "def balanced(s: str) -> bool:\n    return len(s) % 2 == 0",
         "def balanced(s: str) -> bool:\n    pairs = $_pairs\n    depth = 0\n    for c in s:\n"
         "        if c in pairs.values():\n            depth += 1\n        elif c in pairs:\n            depth -= 1\n"
         "    return depth == 0"),
        lambda rng, p: (lambda t: (t if rng.random() < 0.5 else t[:-1],))(_balanced(rng, p["_chars"], int(rng.integers(3, 6)))),
        lambda rng, p: (_balanced(rng, p["_chars"], int(rng.integers(1, 6))),),
        lambda p: ((")(",), ("",), ("(()",), ("([)]" if len(p["_chars"]) > 2 else "())(()",)),
    ),
    _Family(
        "to_roman", ({},),
        "def to_roman(n: int) -> str:",
        "Return the Roman numeral of 1 <= n <= 3999, using the subtractive forms IV, IX, XL, XC, CD and CM.",
        "def to_roman(n: int) -> str:\n    table = [(1000, 'M'), (900, 'CM'), (500, 'D'), (400, 'CD'), (100, 'C'), (90, 'XC'),\n"
        "             (50, 'L'), (40, 'XL'), (10, 'X'), (9, 'IX'), (5, 'V'), (4, 'IV'), (1, 'I')]\n    out = ''\n"
        "    for value, letters in table:\n        while n >= value:\n            out += letters\n            n -= value\n"
        "    return out",
        ("def to_roman(n: int) -> str:\n    table = [(1000, 'M'), (500, 'D'), (100, 'C'), (50, 'L'), (10, 'X'), (5, 'V'), (1, 'I')]\n"
         "    out = ''\n    for value, letters in table:\n        while n >= value:\n            out += letters\n"
         "            n -= value\n    return out",
         "def to_roman(n: int) -> str:\n    return 'I' * n",
         "def to_roman(n: int) -> str:\n    table = [(1000, 'M'), (100, 'C'), (10, 'X'), (1, 'I')]\n    out = ''\n"
         "    for value, letters in table:\n        while n >= value:\n            out += letters\n            n -= value\n"
         "    return out"),
        lambda rng, p: (int(rng.choice([n for n in range(1, 400) if _no_four_nine(n) and n % 10 >= 5])),),
        lambda rng, p: (int(rng.integers(1, 4000)),),
        lambda p: ((4,), (9,), (14,), (40,), (1994,), (3999,)),
    ),
    _Family(
        "collatz_steps", ({},),
        "def collatz_steps(n: int) -> int:",
        "Return how many steps the Collatz rule (n -> n // 2 if n is even, else 3 * n + 1) takes to reach 1 "
        "from the integer n >= 1.",
        "def collatz_steps(n: int) -> int:\n    steps = 0\n    while n != 1:\n"
        "        n = n // 2 if n % 2 == 0 else 3 * n + 1\n        steps += 1\n    return steps",
        ("def collatz_steps(n: int) -> int:\n    steps = 0\n    while True:\n"
         "        n = n // 2 if n % 2 == 0 else 3 * n + 1\n        steps += 1\n        if n == 1:\n            return steps",
         "def collatz_steps(n: int) -> int:\n    steps = 1\n    while n != 1:\n"
         "        n = n // 2 if n % 2 == 0 else 3 * n + 1\n        steps += 1\n    return steps",
         "def collatz_steps(n: int) -> int:\n    steps = 0\n    while n > 1:\n        n //= 2\n        steps += 1\n"
         "    return steps"),
        lambda rng, p: (int(rng.integers(3, 100)),),
        lambda rng, p: (int(rng.integers(2, 10_000)),),
        lambda p: ((1,), (27,), (2,)),
    ),
    _Family(
        "dedupe", ({},),
        "def dedupe(xs: list) -> list:",
        "Return xs without repeated values, keeping the first occurrence of each value, in order.",
        "def dedupe(xs: list) -> list:\n    seen = set()\n    out = []\n    for x in xs:\n        if x not in seen:\n"
        "            seen.add(x)\n            out.append(x)\n    return out",
        ("def dedupe(xs: list) -> list:\n    out = []\n    for x in xs:\n        if not out or out[-1] != x:\n"
         "            out.append(x)\n    return out",
         "def dedupe(xs: list) -> list:\n    return sorted(set(xs))",
         "def dedupe(xs: list) -> list:\n    return [x for x in xs if xs.count(x) == 1]"),
        lambda rng, p: ([int(x) for x in rng.permutation(np.arange(10))[:4] for _ in range(int(rng.integers(1, 3)))],),
        lambda rng, p: (_ints(rng, 0, 10, 0, 5),),
        lambda p: (([1, 2, 1],), ([],), ([3, 1, 3, 1, 2],)),
    ),
    _Family(
        "title_case", ({},),
        "def title_case(s: str) -> str:",
        "Capitalize the first character of every space-separated word of s and lowercase the rest of the word; "
        "keep every space as it is.",
        "def title_case(s: str) -> str:\n    return ' '.join(w[:1].upper() + w[1:].lower() for w in s.split(' '))",
        ("def title_case(s: str) -> str:\n    return s.title()",
         "def title_case(s: str) -> str:\n    return ' '.join(w.capitalize() for w in s.split())",
         "def title_case(s: str) -> str:\n    return s.capitalize()"),
        lambda rng, p: (" ".join(w if rng.random() < 0.5 else w.upper() for w in _words(rng, 2, 4)),),
        lambda rng, p: (" ".join(_words(rng, 1, 3)) + " o'clock",),
        lambda p: (("don't stop",), ("hello  world",), ("3rd place",), ("",)),
    ),
    _Family(
        "sum_multiples", tuple({"a": a, "b": b} for a, b in ((3, 5), (2, 7), (4, 6), (5, 8))),
        "def sum_multiples(n: int) -> int:",
        "Return the sum of all integers i with 0 <= i < n that are divisible by $a or by $b.",
        "def sum_multiples(n: int) -> int:\n    return sum(i for i in range(n) if i % $a == 0 or i % $b == 0)",
        ("def sum_multiples(n: int) -> int:\n    return sum(range(0, n, $a)) + sum(range(0, n, $b))",
         "def sum_multiples(n: int) -> int:\n    return sum(i for i in range(n + 1) if i % $a == 0 or i % $b == 0)",
         "def sum_multiples(n: int) -> int:\n    return sum(i for i in range(n) if i % $a == 0 and i % $b == 0)"),
        lambda rng, p: (int(rng.integers(max(p["a"], p["b"]) + 1, _lcm(p["a"], p["b"]) + 1)),),
        lambda rng, p: (int(rng.integers(_lcm(p["a"], p["b"]) + 1, 1000)),),
        lambda p: ((0,), (_lcm(p["a"], p["b"]) + 1,), (1000,)),
    ),
    _Family(
        "is_anagram", ({},),
        "def is_anagram(a: str, b: str) -> bool:",
        "Return True if a and b are anagrams of each other when case and spaces are ignored, else False.",
        "def is_anagram(a: str, b: str) -> bool:\n    def norm(t):\n        return sorted(t.replace(' ', '').lower())\n"
        "    return norm(a) == norm(b)",
        ("def is_anagram(a: str, b: str) -> bool:\n    return sorted(a) == sorted(b)",
         "def is_anagram(a: str, b: str) -> bool:\n    return set(a.lower()) == set(b.lower())",
         "def is_anagram(a: str, b: str) -> bool:\n    return len(a) == len(b)"),
        lambda rng, p: tuple(str(x) for x in rng.choice(["listen silent", "evil vile", "night thing", "apple paple",
                                                          "stone tones", "aab abb", "river rivet", "moon mono"]).split()),
        lambda rng, p: tuple(str(x) for x in rng.choice(["Listen|Silent", "Dormitory|Dirty room", "aab|abb",
                                                          "The eyes|They see", "abc|ab"]).split("|")),
        lambda p: (("", ""), ("Dormitory", "Dirty room"), ("aab", "abb")),
    ),
)


@lru_cache(maxsize=None)
def all_problems() -> tuple[Problem, ...]:
    """Every problem of the bank (built once per process; the same in every process)."""
    return tuple(_build(f, params) for f in FAMILIES for params in f.variants)
