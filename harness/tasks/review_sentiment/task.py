"""The review_sentiment task at run time: its prompts (train and held-out), the VADER lexicon score, and the
factory registered as the task (see the package docstring)."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from harness.tasks.base import draw_prompt_rows
from harness.tasks.rm_scoring import RewardModelScored


MIN_EXTRA_TOKENS = 4  # a prompt source must have at least prompt_length + 4 tokens


@dataclass
class ReviewSentimentTask(RewardModelScored):
    """Held-out prompts and the VADER lexicon score.

    Attributes:
        prompt_ids: ``LongTensor[N, prompt_length]``, the training prompts; no padding, no EOS.
        prompt_texts: the ``N`` decoded training prompts.
        response_length: tokens to sample per response.
        eval_prompt_ids: ``LongTensor[N_eval, prompt_length]``, the held-out evaluation prompts
            (disjoint from ``prompt_ids``; the same for every run of a config's pipeline).
    """

    prompt_ids: torch.Tensor
    prompt_texts: list[str]
    response_length: int
    eval_prompt_ids: torch.Tensor = field(default_factory=lambda: torch.empty(0, 0, dtype=torch.long))
    name: str = "review_sentiment"
    _sia: object = field(default=None, repr=False)

    @property
    def prompt_length(self) -> int:
        """Tokens per prompt (``P``)."""
        return int(self.prompt_ids.shape[1])

    def sample_prompts(self, batch_size: int, generator: torch.Generator) -> torch.Tensor:
        """Draw ``batch_size`` training prompts: ``LongTensor[B, P]`` on CPU
        (:func:`harness.tasks.base.draw_prompt_rows`).

        Raises:
            ValueError: ``batch_size < 1``.
        """
        return draw_prompt_rows(self.prompt_ids, batch_size, generator)

    def gold_lexicon(self, texts: list[str]) -> torch.Tensor:
        """VADER compound sentiment of each response text: ``FloatTensor[B]`` in [−1, 1].

        ``SentimentIntensityAnalyzer().polarity_scores(t)["compound"]`` (vaderSentiment 3.3.2). An empty
        text scores 0.

        Raises:
            nothing (any string is scored).
        """
        if self._sia is None:
            from vaderSentiment.vaderSentiment import SentimentIntensityAnalyzer

            self._sia = SentimentIntensityAnalyzer()
        return torch.tensor([self._sia.polarity_scores(t)["compound"] for t in texts], dtype=torch.float32)


def prompt_sources(data_cfg) -> list[str]:
    """Held-out source texts for prompts: test-split VADER snippets, then test-split Rotten Tomatoes
    reviews (fresh/rotten). Whitespace-stripped, in data order.

    Raises:
        DataCacheError: the data cache is missing or corrupt.
    """
    from harness.tasks.review_sentiment.data import load_rotten_tomatoes, load_snippets

    sn = load_snippets(data_cfg)
    rt = load_rotten_tomatoes(data_cfg)
    texts = list(sn.loc[sn["split"] == "test", "text"])
    texts += list(rt.loc[(rt["split"] == "test") & rt["category"].isin(["fresh", "rotten"]), "text"])
    return [t.strip() for t in texts if t.strip()]


def make_prompts(texts: list[str], tokenizer, prompt_length: int) -> torch.Tensor:
    """First ``prompt_length`` tokens of every text with ≥ ``prompt_length + 4`` tokens, duplicates removed.

    Returns:
        ``LongTensor[N, prompt_length]`` (order of first occurrence).

    Raises:
        ValueError: no text is long enough.
    """
    ids = tokenizer(list(texts), add_special_tokens=False)["input_ids"]
    seen: dict[tuple[int, ...], None] = {}
    for x in ids:
        if len(x) >= prompt_length + MIN_EXTRA_TOKENS:
            seen.setdefault(tuple(x[:prompt_length]), None)
    if not seen:
        raise ValueError(f"no held-out text has ≥ {prompt_length + MIN_EXTRA_TOKENS} tokens")
    return torch.tensor(list(seen), dtype=torch.long)


def make_review_sentiment(cfg, tokenizer) -> ReviewSentimentTask:
    """Factory ``(cfg: Config, tokenizer) -> ReviewSentimentTask`` (see module docstring).

    The prompt pool is split once by :func:`split_eval_prompts`: ``cfg.eval.num_prompts`` evaluation
    prompts, the rest for training.

    Raises:
        DataCacheError: the data cache is missing (names ``harness data``).
        ValueError: ``task.prompt_length`` is longer than every held-out text, or ``eval.num_prompts``
            leaves no training prompt.
    """
    pool = make_prompts(prompt_sources(cfg.pipeline.data), tokenizer, cfg.task.prompt_length)
    train_ids, eval_ids = split_eval_prompts(pool, cfg.eval.num_prompts, cfg.eval.seed)
    texts = tokenizer.batch_decode(train_ids)
    return ReviewSentimentTask(prompt_ids=train_ids, prompt_texts=texts, response_length=cfg.task.response_length,
                               eval_prompt_ids=eval_ids)


def split_eval_prompts(pool: torch.Tensor, num_eval: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Set ``num_eval`` prompts of ``pool`` (``[N, P]``) aside for evaluation.

    Returns:
        ``(train [N − num_eval, P], eval [num_eval, P])``: rows ``perm[num_eval:]`` and
        ``perm[:num_eval]`` of ``perm = randperm(N)`` drawn from a generator seeded with ``seed``.
    Raises:
        ValueError: ``num_eval ≥ N`` (no training prompt would be left); names ``eval.num_prompts``.
    """
    n = pool.shape[0]
    if num_eval >= n:
        raise ValueError(f"eval.num_prompts: {num_eval} leaves no training prompt (the pool has {n}); choose < {n}")
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(seed))
    return pool[perm[num_eval:]], pool[perm[:num_eval]]
