"""The `reward.judge` section: a model behind an OpenAI-compatible endpoint that scores free-form answers.

What the section holds and which values it accepts; the client that sends the requests is `vlgrpo.rewards.judge`.
Kept apart from schema.py (the one section with its own template language and parsers).
"""

from __future__ import annotations

import re
import string
from dataclasses import dataclass, field

from vlgrpo.types import InputError

JUDGE_FIELDS = ("question", "answer", "completion", "response")
"""Placeholders of the judge prompt: the sample's question, its gold answer, the whole completion, and the answer
read from it (the answer block, \\boxed{} or the fallbacks; the whole completion when nothing is read)."""

JUDGE_PARSERS = ("yes_no", "number", "regex")

DEFAULT_JUDGE_PROMPT = (
    "You are grading a model's answer to a question about an image.\n"
    "Question: {question}\n"
    "Reference answer: {answer}\n"
    "Model's answer: {response}\n"
    "Does the model's answer mean the same as the reference answer? Reply with one word: yes or no."
)


@dataclass
class JudgeConfig:
    base_url: str = ""
    """OpenAI-compatible server root, e.g. http://judge-host:8000/v1 (`vllm serve MODEL`); requests go to
    <base_url>/chat/completions. Empty: no judge (a recipe naming `judge` is refused)."""
    model: str = ""
    """The served model name the requests ask for (vllm serve's --served-model-name, or its model path)."""
    api_key_env: str = ""
    """Name of the environment variable holding the API key, sent as a Bearer token (never the key itself: the
    config is saved in the run directory). Empty: no Authorization header."""
    prompt: str = DEFAULT_JUDGE_PROMPT
    """The user message, with placeholders {question}, {answer} (gold), {completion} (the whole completion) and
    {response} (the answer read from it); write other braces doubled ({{ }})."""
    system: str = ""
    """An optional system message sent before the prompt."""
    send_image: bool = False
    """Also send the sample's image(s) with the prompt (base64 data URLs; the judge must be a VLM)."""
    parser: str = "yes_no"
    """How a reply becomes a score: yes_no (its last yes/no word: 1/0), number (its last number, which must lie in
    [0, 1]) or regex (reward.judge.regex's first group, or the whole match, read as yes/no or a number in [0, 1])."""
    regex: str = ""
    """The pattern of parser=regex, searched in the reply (e.g. 'Judgement:\\s*(\\d)')."""
    max_tokens: int = 16
    """Reply length limit of each request."""
    temperature: float = 0.0
    """Sampling temperature of the judge (0: greedy, so a cached verdict is the verdict the server would repeat)."""
    extra_body: dict = field(default_factory=dict)
    """More request fields, sent as they are, e.g. {structured_outputs: {choice: [yes, no]}} for vLLM."""
    max_concurrency: int = 32
    """Requests in flight at once."""
    timeout_s: float = 30.0
    """Time limit of one request (connect, wait and read); a request past it is a failure."""
    retries: int = 2
    """Further attempts after a timeout, a connection error, HTTP 429 or 5xx (other replies are not retried)."""
    backoff_s: float = 1.0
    """Wait before retry k (0-based): backoff_s x 2^k."""
    max_failure_fraction: float = 0.5
    """A step in which more than this share of the completions could not be judged stops the run with an error
    naming the endpoint (a dead server must not train on zeros)."""
    cache_size: int = 100_000
    """Verdicts kept in memory (same request: same question, gold, completion and image -> no new request)."""


def check_judge(j: JudgeConfig, in_recipe: bool) -> None:
    """A ConfigError-kind InputError naming the `reward.judge` key that cannot be used."""
    key = "config key 'reward.judge."
    if in_recipe and not (j.base_url and j.model):
        raise InputError(
            "reward.recipe names 'judge' but reward.judge.base_url and reward.judge.model are not both set: give "
            "the server (e.g. base_url: http://localhost:8000/v1, model: Qwen/Qwen2.5-VL-72B-Instruct)"
        )
    if j.base_url and not re.match(r"https?://", j.base_url):
        raise InputError(f"{key}base_url' = {j.base_url!r} must start with http:// or https://")
    if j.parser not in JUDGE_PARSERS:
        raise InputError(f"{key}parser' = {j.parser!r} is not accepted; use one of: {', '.join(JUDGE_PARSERS)}")
    if j.parser == "regex":
        try:
            re.compile(j.regex)
        except re.error as e:
            raise InputError(f"{key}regex' = {j.regex!r} is not a regular expression ({e})") from None
        if not j.regex:
            raise InputError(f"{key}regex' is empty: parser=regex needs a pattern, e.g. 'Judgement:\\s*(\\d)'")
    try:
        names = {name for _, name, _, _ in string.Formatter().parse(j.prompt) if name is not None}
    except ValueError as e:
        raise InputError(f"{key}prompt' is not a valid template ({e}); write literal braces doubled") from None
    unknown = sorted(names - set(JUDGE_FIELDS))
    if unknown:
        raise InputError(
            f"{key}prompt' has placeholder(s) {unknown}; accepted: {', '.join('{' + f + '}' for f in JUDGE_FIELDS)} "
            "(write literal braces doubled)"
        )
    ranges = [
        (j.max_concurrency >= 1, "max_concurrency", "must be >= 1"),
        (j.timeout_s > 0, "timeout_s", "must be > 0"),
        (j.retries >= 0, "retries", "must be >= 0"),
        (j.backoff_s >= 0, "backoff_s", "must be >= 0"),
        (0 <= j.max_failure_fraction <= 1, "max_failure_fraction", "must be in [0, 1]"),
        (j.max_tokens >= 1, "max_tokens", "must be >= 1"),
        (j.cache_size >= 0, "cache_size", "must be >= 0"),
    ]
    for ok, name, why in ranges:
        if not ok:
            raise InputError(f"{key}{name}' {why} (got {getattr(j, name)!r})")
