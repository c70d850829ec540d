"""A judge model behind an OpenAI-compatible endpoint (`reward.judge`): one step's completions scored concurrently.

`Judge.submit` sends every completion of a step at once (at most `max_concurrency` in flight, duplicates and answers
judged before taken from an in-memory cache) and returns at once; `JudgeBatch.result` waits, bounded: each attempt
is limited to `timeout_s`, retried after a timeout, a connection error, HTTP 429 or 5xx with exponential backoff,
and the whole batch to the time its attempts can take. A request that fails or whose reply does not parse scores 0
and is counted; a step in which more than `max_failure_fraction` fails raises `JudgeError` naming the endpoint.
Standard library only (urllib and threads); knows nothing of models, trainers or the Config object (the settings
are any object with `vlgrpo.config.judge.JudgeConfig`'s attributes).
"""

from __future__ import annotations

import base64
import concurrent.futures as futures
import functools
import hashlib
import json
import math
import os
import re
import time
import urllib.error
import urllib.request
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vlgrpo.rewards.extract import extract_answer
from vlgrpo.types import InputError, Sample

_WORD = re.compile(r"\b(yes|no)\b", re.IGNORECASE)
_NUMBER = re.compile(r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?")
_MIME = {".png": "image/png", ".jpg": "image/jpeg", ".jpeg": "image/jpeg", ".webp": "image/webp", ".gif": "image/gif"}


class JudgeError(InputError):
    """Too many completions of one step could not be judged: the endpoint is down, overloaded or misconfigured. The
    run stops with one line; transient: torchrun's restarts resume from the last checkpoint and ask again (a server
    that came back answers), as a launch of your own does."""

    transient = True


class _Retry(Exception):
    """A failed attempt worth repeating (timeout, connection error, HTTP 429 or 5xx)."""


@dataclass
class Verdict:
    """The judge's verdict on one completion."""

    score: float
    """In [0, 1]; 0 when `error` is set."""
    reply: str | None
    """The judge's raw reply (None: no reply came back)."""
    error: str | None = None
    """Why the completion could not be judged (a timeout, an HTTP error, an unparseable reply)."""
    cached: bool = False
    """Taken from the cache (or from an identical request of the same step) instead of a request of its own."""
    latency_s: float = 0.0
    """Wall time of its request, retries and backoff included."""
    attempts: int = 0


def parse_score(reply: str, parser: str, pattern: str = "") -> float:
    """The score a judge reply gives: yes_no (its last yes/no word), number (its last number, in [0, 1]) or regex
    (the pattern's first group, or the whole match, read as yes/no or a number in [0, 1]). ValueError if none."""
    if parser == "yes_no":
        words = _WORD.findall(reply)
        if not words:
            raise ValueError(f"no yes/no in the reply {reply[:200]!r}")
        return float(words[-1].lower() == "yes")
    if parser == "regex":
        m = re.search(pattern, reply, re.DOTALL)
        if m is None:
            raise ValueError(f"reward.judge.regex {pattern!r} does not match the reply {reply[:200]!r}")
        reply = m.group(1) if m.groups() else m.group(0)
        if _WORD.fullmatch(reply.strip()):
            return float(reply.strip().lower() == "yes")
    numbers = _NUMBER.findall(reply)
    if not numbers:
        raise ValueError(f"no number in the reply {reply[:200]!r}")
    value = float(numbers[-1])
    if not 0 <= value <= 1:
        raise ValueError(f"score {value} read from the reply {reply[:200]!r} is outside [0, 1]")
    return value


@functools.lru_cache(maxsize=64)
def _data_url(path: str) -> str:
    mime = _MIME.get(Path(path).suffix.lower(), "image/png")
    return f"data:{mime};base64," + base64.b64encode(Path(path).read_bytes()).decode()


def _image_part(image: str | bytes) -> dict:
    if isinstance(image, bytes):
        url = "data:image/png;base64," + base64.b64encode(image).decode()
    else:
        url = _data_url(str(image))
    return {"type": "image_url", "image_url": {"url": url}}


class Judge:
    """The client of one judge endpoint; keeps its cache across steps. Build once per run."""

    def __init__(self, settings: Any):
        self.settings = settings
        self.url = settings.base_url.rstrip("/") + "/chat/completions"
        self._cache: OrderedDict[str, Verdict] = OrderedDict()
        self._pool: futures.ThreadPoolExecutor | None = None

    def __repr__(self) -> str:
        return f"Judge({self.url}, model={self.settings.model!r})"

    # ------------------------------------------------------------ requests

    def prompt(self, completion: str, sample: Sample, answer_fallback: tuple[str, ...]) -> str:
        read = extract_answer(completion, answer_fallback)
        fields = {"question": sample.question, "answer": sample.answer or "", "completion": completion}
        return self.settings.prompt.format(**fields, response=completion.strip() if read is None else read)

    def body(self, completion: str, sample: Sample, answer_fallback: tuple[str, ...]) -> dict:
        """The /chat/completions request for one completion."""
        s = self.settings
        content: Any = self.prompt(completion, sample, answer_fallback)
        if s.send_image and sample.images:
            content = [*(_image_part(i) for i in sample.images), {"type": "text", "text": content}]
        messages = ([{"role": "system", "content": s.system}] if s.system else []) + [
            {"role": "user", "content": content}
        ]
        return {
            "model": s.model,
            "messages": messages,
            "max_tokens": s.max_tokens,
            "temperature": s.temperature,
            **s.extra_body,
        }

    def headers(self) -> dict[str, str]:
        headers = {"Content-Type": "application/json"}
        name = self.settings.api_key_env
        if name:
            if not os.environ.get(name):
                raise InputError(
                    f"reward.judge.api_key_env names '{name}', which is not set in the environment: export it "
                    "(the key never goes into the config), or set reward.judge.api_key_env to '' for a server "
                    "without a key"
                )
            headers["Authorization"] = f"Bearer {os.environ[name]}"
        return headers

    def _attempt(self, data: bytes, headers: dict[str, str]) -> str:
        """One request -> the reply text; _Retry for what is worth repeating, ValueError for what is not."""
        timeout = self.settings.timeout_s
        deadline = time.monotonic() + timeout
        request = urllib.request.Request(self.url, data=data, headers=headers, method="POST")
        try:
            with urllib.request.urlopen(request, timeout=timeout) as response:
                chunks = []
                while chunk := response.read1(65536):
                    if time.monotonic() > deadline:
                        raise TimeoutError
                    chunks.append(chunk)
        except urllib.error.HTTPError as e:
            text = e.read()[:200].decode(errors="replace")
            if e.code == 429 or e.code >= 500:
                raise _Retry(f"HTTP {e.code}: {text}") from None
            raise ValueError(f"HTTP {e.code}: {text}") from None
        except (TimeoutError, urllib.error.URLError, ConnectionError, OSError) as e:
            reason = getattr(e, "reason", e)
            if isinstance(reason, TimeoutError) or isinstance(e, TimeoutError):
                raise _Retry(f"no reply within reward.judge.timeout_s={timeout:g}") from None
            raise _Retry(f"cannot reach {self.url} ({reason})") from None
        if time.monotonic() > deadline:
            raise _Retry(f"no reply within reward.judge.timeout_s={timeout:g}")
        try:
            return json.loads(b"".join(chunks))["choices"][0]["message"]["content"] or ""
        except (ValueError, KeyError, IndexError, TypeError) as e:
            raise ValueError(f"not an OpenAI chat completion ({type(e).__name__}: {e})") from None

    def judge_one(self, data: bytes, headers: dict[str, str]) -> Verdict:
        """Send one request, with retries; never raises."""
        s, t0, attempt, error = self.settings, time.monotonic(), 0, ""
        while attempt <= s.retries:
            if attempt:
                time.sleep(s.backoff_s * 2 ** (attempt - 1))
            attempt += 1
            try:
                reply = self._attempt(data, headers)
            except _Retry as e:
                error = str(e)
                continue
            except ValueError as e:
                return Verdict(0.0, None, str(e), latency_s=time.monotonic() - t0, attempts=attempt)
            try:
                score = parse_score(reply, s.parser, s.regex)
            except ValueError as e:
                return Verdict(0.0, reply, f"unparseable reply: {e}", latency_s=time.monotonic() - t0, attempts=attempt)
            return Verdict(score, reply, latency_s=time.monotonic() - t0, attempts=attempt)
        return Verdict(
            0.0, None, f"{error} (after {attempt} attempts)", latency_s=time.monotonic() - t0, attempts=attempt
        )

    def batch_bound_s(self, requests: int) -> float:
        """The longest `requests` new requests can take: waves of max_concurrency, each of every attempt's timeout
        and backoff."""
        s = self.settings
        one = (s.retries + 1) * s.timeout_s + sum(s.backoff_s * 2**k for k in range(s.retries))
        return math.ceil(requests / s.max_concurrency) * one + 1.0

    # ------------------------------------------------------------ batches

    def submit(self, completions: list[str], samples: list[Sample], answer_fallback: tuple[str, ...]) -> JudgeBatch:
        """Start judging completions[i] against samples[i]; returns without waiting."""
        headers = self.headers()
        keys, pending, known = [], {}, {}
        for completion, sample in zip(completions, samples):
            data = json.dumps(self.body(completion, sample, answer_fallback), sort_keys=True).encode()
            key = hashlib.sha256(data).hexdigest()
            keys.append(key)
            hit = self.cached(key)
            if hit is not None:
                known[key] = hit
            elif key not in pending:
                if self._pool is None:
                    self._pool = futures.ThreadPoolExecutor(self.settings.max_concurrency, "vlgrpo-judge")
                pending[key] = self._pool.submit(self.judge_one, data, headers)
        return JudgeBatch(self, keys, pending, known, time.monotonic())

    def remember(self, key: str, verdict: Verdict) -> None:
        if verdict.error is None and self.settings.cache_size:
            self._cache[key] = verdict
            self._cache.move_to_end(key)
            while len(self._cache) > self.settings.cache_size:
                self._cache.popitem(last=False)

    def cached(self, key: str) -> Verdict | None:
        hit = self._cache.get(key)
        if hit is not None:
            self._cache.move_to_end(key)
        return hit


@dataclass
class JudgeBatch:
    judge: Judge
    keys: list[str]
    pending: dict[str, futures.Future]
    """The requests sent, by key (the sha256 of the request body)."""
    known: dict[str, Verdict]
    """Verdicts taken from the cache at submit time, by key."""
    submitted: float
    """time.monotonic() when the requests were sent: the batch's time bound counts from here."""

    def result(self, check: bool = True) -> tuple[list[Verdict], dict[str, float]]:
        """(one Verdict per completion, `reward/judge_*` metrics); with `check`, JudgeError when more than
        max_failure_fraction of them failed."""
        wait_start = time.monotonic()
        left = self.submitted + self.judge.batch_bound_s(len(self.pending)) - wait_start
        done, _ = futures.wait(self.pending.values(), timeout=max(left, 0.0))
        fresh: dict[str, Verdict] = {}
        for key, fut in self.pending.items():
            if fut in done:
                fresh[key] = fut.result()
            else:
                fut.cancel()
                fresh[key] = Verdict(0.0, None, "no reply within the step's bound of the judge's timeouts")
            self.judge.remember(key, fresh[key])
        verdicts, seen = [], set()
        for key in self.keys:
            if key in fresh and key not in seen:
                verdicts.append(fresh[key])
            else:  # an answer judged before, or the second of two identical requests of this step
                v = fresh.get(key) or self.known[key]
                verdicts.append(Verdict(v.score, v.reply, v.error, cached=True))
            seen.add(key)
        failed = [v for v in verdicts if v.error]
        metrics = {
            "reward/judge_requests": float(len(fresh)),
            "reward/judge_cache_hits": float(sum(v.cached for v in verdicts)),
            "reward/judge_failures": float(len(failed)),
            "reward/judge_retries": float(sum(max(v.attempts - 1, 0) for v in fresh.values())),
            "reward/judge_latency_s": sum(v.latency_s for v in fresh.values()) / max(len(fresh), 1),
            "reward/judge_wait_s": time.monotonic() - wait_start,
        }
        limit = self.judge.settings.max_failure_fraction
        if check and verdicts and len(failed) > limit * len(verdicts):
            raise JudgeError(
                f"the judge at {self.judge.url} could not score {len(failed)} of {len(verdicts)} completions this "
                f"step (more than reward.judge.max_failure_fraction={limit:g}); first error: {failed[0].error}. "
                "Check that the server is up and serves reward.judge.model, or raise reward.judge.timeout_s"
            )
        return verdicts, metrics
