"""Read a few sample families out of a Prometheus text exposition page, skipping the rest.

A vLLM ``/metrics`` page carries ~100 families and thousands of histogram lines; routing needs five
or six gauges. Instead of tokenising every line (what ``prometheus_client.parser`` does), a
:class:`SampleReader` finds the lines that start with a wanted name in one regular-expression scan
(C speed) and parses only those. ``bench/metrics_parse.py`` measures the difference (two orders of
magnitude); the tests check that both parsers agree.

Rules followed (the text format 0.0.4, as prometheus_client and the Go parser read it):

- A sample line is ``name[{label="value",...}] value [timestamp]``; the name starts the line.
- Label values are double-quoted and may hold ``\\\\``, ``\\"`` and ``\\n`` escapes; commas, ``}``
  and ``=`` inside quotes are part of the value. A trailing comma before ``}`` is allowed.
- Values are floats, ``NaN``, ``+Inf`` or ``-Inf``; an optional timestamp after the value is ignored.
- Comment lines (``# HELP``, ``# TYPE``) never match: they start with ``#``.

The page is assumed well formed only where it is read: a malformed wanted line raises
:class:`MetricsPageError`; malformed lines of other families are never looked at.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from types import MappingProxyType
from typing import NamedTuple

from kvgate.policies.errors import KvgateError

_EMPTY_LABELS: Mapping[str, str] = MappingProxyType({})
_VALUE_TEXT = r'"[^"\\\n]*(?:\\.[^"\\\n]*)*"'  # a quoted value, escapes included (unrolled loop)
_PAIR_TEXT = r"[a-zA-Z_][a-zA-Z0-9_]*[ \t]*=[ \t]*" + _VALUE_TEXT + r"[ \t]*"
_LABEL_SET = re.compile(r"\{[ \t]*(?:" + _PAIR_TEXT + r",[ \t]*)*(?:" + _PAIR_TEXT + r")?\}")
_PAIR = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)[ \t]*=[ \t]*"([^"\\\n]*(?:\\.[^"\\\n]*)*)"')
_ESCAPE = re.compile(r"\\(.)")
_UNESCAPED: Mapping[str, str] = MappingProxyType({"\\": "\\", '"': '"', "n": "\n"})


class MetricsPageError(KvgateError):
    """A metrics page could not be read (malformed wanted line, or not the engine's dialect).

    It never reaches a client: the scraper counts it as a failed scrape of that endpoint.
    """

    code = "metrics_page_error"


class Sample(NamedTuple):
    """One sample line: its full name (``..._total``, ``..._bucket`` included), labels and value.

    A named tuple rather than a frozen dataclass: building one is several times cheaper.
    """

    name: str
    labels: Mapping[str, str]
    value: float


class SampleReader:
    """Reads the samples of a fixed set of names from pages; build once, use for every page.

    One regular-expression pass over the page finds every line that starts with a wanted name
    (the names' common prefix, e.g. ``vllm:``, is factored out so the scan skips ahead quickly);
    only those lines are parsed.
    """

    __slots__ = ("_first_line", "_names", "_prefix", "_scan")

    def __init__(self, names: Iterable[str]) -> None:
        self._names = tuple(sorted(set(names), key=lambda n: (-len(n), n)))
        if not self._names or any(not name or any(c in name for c in " \t\n{") for name in self._names):
            raise ValueError(f"bad sample names: {self._names!r}")
        self._prefix = _common_prefix(self._names)
        suffixes = "|".join(re.escape(name[len(self._prefix) :]) for name in self._names)
        line = re.escape(self._prefix) + "(" + suffixes + r")([{ \t][^\n]*)?(?=\n|$)"
        self._scan = re.compile("\n" + line)
        self._first_line = re.compile(line)

    @property
    def names(self) -> tuple[str, ...]:
        return self._names

    def read(self, page: str, memo: LineMemo | None = None) -> dict[str, list[Sample]]:
        """The samples of each wanted name, in page order (an empty list for a name not on the page).

        With ``memo``, a line read before (on this page's earlier scrapes, or another endpoint's
        page) is not parsed again: a model server's label sets rarely change between scrapes.
        """
        found: dict[str, list[Sample]] = {name: [] for name in self._names}
        prefix = self._prefix
        first = self._first_line.match(page)
        if first is not None:
            name = prefix + first.group(1)
            found[name].append(_parse_rest(name, first.group(2) or ""))
        known = memo.samples if memo is not None else {}
        for match in self._scan.finditer(page):
            line = match.group(0)
            sample = known.get(line)
            if sample is None:
                name = prefix + match.group(1)
                sample = _parse_rest(name, match.group(2) or "")
                if memo is not None:
                    memo.remember(line, sample)
            found[sample.name].append(sample)
        return found


class LineMemo:
    """Samples already parsed, by the text of their line: a wanted line that did not change since
    an earlier page costs one dict lookup instead of a parse. Samples are immutable, so a page shares
    them with the pages it repeats. Bounded: forgotten all at once when ``limit`` lines are held (a
    label value that changes each scrape, e.g. LoRA adapter lists, keeps adding lines). One per
    scraper; not thread-safe. ``python -m kvgate.bench.metrics_parse`` measures it."""

    __slots__ = ("_limit", "samples")

    def __init__(self, limit: int = 4096) -> None:
        if limit < 1:
            raise ValueError("limit must be >= 1")
        self._limit = limit
        self.samples: dict[str, Sample] = {}

    def remember(self, line: str, sample: Sample) -> None:
        if len(self.samples) >= self._limit:
            self.samples = {}
        self.samples[line] = sample


def _common_prefix(names: tuple[str, ...]) -> str:
    first, last = min(names), max(names)
    size = 0
    while size < min(len(first), len(last)) and first[size] == last[size]:
        size += 1
    return first[:size]


def read_samples(page: str, names: Iterable[str]) -> dict[str, list[Sample]]:
    """One-off :meth:`SampleReader.read` (build a :class:`SampleReader` to read many pages)."""
    return SampleReader(names).read(page)


def parse_labels(text: str) -> Mapping[str, str]:
    """Parse ``{a="x",b="y"}`` (braces included) into a mapping; raises on malformed text."""
    labels, end = _parse_label_set(text, 0)
    if text[end:].strip():
        raise MetricsPageError(f"text after the label set: {text!r}")
    return labels


def _parse_rest(name: str, rest: str) -> Sample:
    """``rest`` is the line after the name: optional label set, value, optional timestamp."""
    labels = _EMPTY_LABELS
    at = 0
    while at < len(rest) and rest[at] in " \t":
        at += 1
    if at < len(rest) and rest[at] == "{":
        labels, at = _parse_label_set(rest, at)
    fields = rest[at:].split()
    if not 1 <= len(fields) <= 2:
        raise MetricsPageError(f"malformed sample line: {name}{rest!r}")
    try:
        value = float(fields[0])
    except ValueError:
        raise MetricsPageError(f"malformed sample value: {name}{rest!r}") from None
    return Sample(name, labels, value)


def _parse_label_set(text: str, at: int) -> tuple[Mapping[str, str], int]:
    """Parse the label set starting at ``text[at] == '{'``; return it and the index after ``}``."""
    whole = _LABEL_SET.match(text, at)
    if whole is None:
        raise MetricsPageError(f"malformed label set: {text!r}")
    end = whole.end()
    # Inside a well-formed set a value holds no unescaped quote, so the pairs split unambiguously.
    pairs = _PAIR.findall(text, at, end)
    if "\\" in text[at:end]:
        pairs = [(key, _ESCAPE.sub(_unescape, value) if "\\" in value else value) for key, value in pairs]
    return MappingProxyType(dict(pairs)), end


def _unescape(match: re.Match[str]) -> str:
    char = match.group(1)
    return _UNESCAPED.get(char, "\\" + char)
