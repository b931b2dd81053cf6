"""The chain_sum task at run time: its options, prompts (left-padded to ``task.prompt_length``), the verifier
reward of a rollout batch and the held-out evaluation.

Prompts are problem expressions followed by `` =`` (:func:`.problems.prompt_text`), encoded without special
tokens and left-padded with the pad token to ``P`` tokens; the SFT stage trains on exactly these padded prompts,
so the policy sees in RL the context it learned from. The reward of a response is the exact-match verdict of
the library's scorer (:func:`.problems.reward`), plus ``task.options.format_reward`` when the response holds a
parseable answer (default 0: the reward is exact match alone). The task's secondary score, logged where
review_sentiment logs its lexicon score (``gold_lexicon``), is that format indicator.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable

import torch
from pydantic import Field, model_validator

from harness.config.base import _Strict
from harness.tasks.base import draw_prompt_rows
import harness.tasks.chain_sum.problems as problems


class ChainSumOptions(_Strict):
    """``task.options`` of chain_sum: the generator's difficulty knobs (reasoning-gym ``ChainSumConfig``), how many
    problems the pipeline and the runs use, and the optional format reward."""

    min_terms: int = Field(2, ge=2, le=12)
    max_terms: int = Field(6, ge=2, le=12)
    min_digits: int = Field(1, ge=1, le=4)
    max_digits: int = Field(1, ge=1, le=4)
    n_train: int = Field(40000, ge=16, le=1_000_000)  # training problems: the SFT traces
    rl_prompts: int = Field(4096, ge=16)  # RL prompts: the first rl_prompts training problems
    n_heldout: int = Field(1000, ge=16, le=100_000)  # held-out problems of the SFT stage's summary
    seed: int = Field(0, ge=0, le=2**31 - problems.HELDOUT_SEED_OFFSET - 1_000_000)  # the training generator's seed
    format_reward: float = Field(0.0, ge=0.0, le=1.0)  # added to the reward of a response with a parseable answer
    # the fraction of SFT traces that state the answer with no scratchpad (problems.direct_answer): a policy that
    # guesses where it could work the sum out, which the RL can teach to use its scratchpad (0: scratchpads only)
    direct_fraction: float = Field(0.6, ge=0.0, lt=1.0)
    # only problems of at least this many terms may get a direct trace (2: any problem); short chains then keep
    # their scratchpads, so the SFT policy works short sums out and guesses long ones
    direct_min_terms: int = Field(3, ge=2, le=12)
    # held-out problems share no expression with the n_train training problems (problems.make_problems); the
    # default keeps the generator's repeats, as the runs before this option did
    disjoint_heldout: bool = False
    _omit_at_default = ("disjoint_heldout",)  # out of the dump at its default: older configs keep their hash

    @model_validator(mode="after")
    def _ranges(self) -> "ChainSumOptions":
        if self.max_terms < self.min_terms:
            raise ValueError(f"max_terms ({self.max_terms}) must be ≥ min_terms ({self.min_terms})")
        if self.max_digits < self.min_digits:
            raise ValueError(f"max_digits ({self.max_digits}) must be ≥ min_digits ({self.min_digits})")
        return self

    def knobs(self) -> dict[str, int]:
        """The generator's difficulty knobs, as :func:`.problems.dataset` takes them."""
        return {"min_terms": self.min_terms, "max_terms": self.max_terms, "min_digits": self.min_digits,
                "max_digits": self.max_digits}


def options_of(cfg: Any) -> ChainSumOptions:
    """The validated :class:`ChainSumOptions` of a config (``cfg.task.options``)."""
    return ChainSumOptions.model_validate(cfg.task.options)


def encode_prompts(tokenizer: Any, entries: list[dict], prompt_length: int) -> torch.Tensor:
    """The prompts of ``entries``, left-padded with the pad token: ``LongTensor[N, prompt_length]``.

    Raises:
        ValueError: a prompt has more than ``prompt_length`` tokens (names ``task.prompt_length`` and the length
            needed).
    """
    ids = tokenizer([problems.prompt_text(e) for e in entries], add_special_tokens=False)["input_ids"]
    longest = max(len(x) for x in ids)
    if longest > prompt_length:
        raise ValueError(f"task.prompt_length: {prompt_length} tokens, but a chain_sum prompt has {longest}; "
                         f"set task.prompt_length ≥ {longest}")
    pad = tokenizer.pad_token_id
    return torch.tensor([[pad] * (prompt_length - len(x)) + x for x in ids], dtype=torch.long)


def padded_prompt_text(tokenizer: Any, entry: dict, prompt_length: int) -> str:
    """The text of a prompt as the policy sees it: the pad token written ``k`` times, then the prompt, where
    ``k`` tops it up to ``prompt_length`` tokens (the SFT stage trains on these texts)."""
    text = problems.prompt_text(entry)
    n = len(tokenizer(text, add_special_tokens=False)["input_ids"])
    return tokenizer.pad_token * max(0, prompt_length - n) + text


@dataclass
class ChainSumTask:
    """Training and held-out chain-sum prompts with the problems they pose, and their verifier.

    Attributes:
        prompt_ids: ``LongTensor[N, P]``: the RL training prompts (left-padded).
        eval_prompt_ids: ``LongTensor[M, P]``: the held-out evaluation prompts (disjoint generator seeds).
        entries: the problem of each prompt, by the prompt's token ids.
        data: the reasoning-gym dataset whose ``score_answer`` is the verifier.
        format_reward: added to the reward of a response with a parseable answer.
    """

    prompt_ids: torch.Tensor
    eval_prompt_ids: torch.Tensor
    entries: dict[tuple[int, ...], dict]
    data: Any
    format_reward: float = 0.0
    name: str = "chain_sum"

    def sample_prompts(self, batch_size: int, generator: torch.Generator) -> torch.Tensor:
        """Draw ``batch_size`` training prompts: ``LongTensor[B, P]`` (:func:`harness.tasks.base.draw_prompt_rows`).

        Raises:
            ValueError: ``batch_size < 1``.
        """
        return draw_prompt_rows(self.prompt_ids, batch_size, generator)

    def verdicts(self, prompt_ids: torch.Tensor, texts: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
        """Exact-match correctness and answer format of each response text to its prompt (``[B, P]``).

        Returns:
            ``(correct [B], formatted [B])`` float 0/1: :func:`.problems.reward` and whether
            :func:`.problems.extract` finds an answer.
        Raises:
            KeyError: a prompt that is not one of this task's prompts.
        """
        entries = [self.entries[tuple(row)] for row in prompt_ids.tolist()]
        correct = [problems.reward(t, e, self.data) for t, e in zip(texts, entries)]
        formatted = [float(problems.extract(t) is not None) for t in texts]
        return torch.tensor(correct, dtype=torch.float32), torch.tensor(formatted, dtype=torch.float32)

    def score(self, models: Any, cfg: Any, prompt_ids: torch.Tensor, responses: torch.Tensor,
              response_mask: torch.Tensor, with_gold: bool = False) -> dict[str, Any]:
        """The training reward of a rollout batch (``prompt_ids`` ``[B, P]``, ``responses`` and ``response_mask``
        ``[B, T]``): exact match plus the format reward.

        Returns:
            ``{"score": [B], "gold_lexicon": [B] (the format indicator), "gold": [B] exact match (with_gold) or
            None, "texts": [B]}`` on the responses' device.
        """
        from harness.rl.evaluation import decode_responses

        texts = decode_responses(models.tokenizer, responses, response_mask)
        correct, formatted = self.verdicts(prompt_ids, texts)
        device = responses.device
        score = (correct + self.format_reward * formatted).to(device)
        return {"score": score, "gold_lexicon": formatted.to(device), "gold": correct.to(device) if with_gold else None,
                "texts": texts}

    @torch.no_grad()
    def evaluate(self, models: Any, cfg: Any, prompts: torch.Tensor, k: int, device: torch.device,
                 autocast: Callable[[], Any], eos_id: int, pad_id: int) -> dict[str, float]:
        """The held-out evaluation after ``k`` iterations on the fixed evaluation prompts (``[N, P]``).

        Sampled responses come from :func:`harness.rl.evaluation.eval_rollout` (``eval.samples_per_prompt`` per
        prompt at the PPO temperature, cut after EOS); greedy responses from :func:`greedy_responses`.

        Returns:
            ``eval/gold``: sampled pass@1 (exact match, mean over responses) and ``eval/gold_se``; ``eval/pass1_greedy``;
            ``eval/proxy``, ``eval/proxy_std``, ``eval/proxy_se``: the training reward (exact match + format reward);
            ``eval/gold_lexicon``: the fraction with a parseable answer; ``eval/kl``, ``eval/kl_se`` (k1 summed over
            the response, nats); ``eval/entropy`` (per-token, nats); ``eval/eos_rate``, ``eval/truncated`` (no EOS
            within ``task.response_length``); ``eval/length``, ``eval/length_correct``, ``eval/length_incorrect``
            (response tokens with EOS; NaN when no response is correct, or none incorrect); ``eval/all_equal_groups``:
            the fraction of prompts whose sampled responses all get the same reward (no signal for a group
            baseline); ``eval/direct``: the fraction of sampled responses that answer with no scratchpad;
            ``eval/distinct_1``, ``eval/distinct_2`` (:func:`harness.rl.evaluation.distinct_n`, EOS not counted);
            ``eval/pass1_greedy_t{n}`` for each ``n`` of ``task.options`` ``min_terms..max_terms``: greedy pass@1 on the held-out problems of
            ``n`` terms (:func:`pass1_by_terms`), where difficulty-weighting claims would show their effect.
        """
        from harness.rl.evaluation import decode_responses, distinct_n, eval_rollout, standard_error

        b = eval_rollout(models, cfg, prompts, k, device, autocast, eos_id, pad_id, with_entropy=True)
        texts = decode_responses(models.tokenizer, b["responses"], b["mask"])
        correct, formatted = self.verdicts(b["prompts"], texts)
        score = correct + self.format_reward * formatted
        length = b["mask"].sum(1).float().cpu()
        groups = score.view(-1, cfg.eval.samples_per_prompt)
        greedy = greedy_responses(models.policy, prompts, cfg.task.response_length, eos_id, pad_id, autocast)
        greedy_correct, _ = self.verdicts(prompts, decode_responses(models.tokenizer, *greedy))
        kl = b["kl"].float().cpu()
        opt = options_of(cfg)
        n_terms = [problems.terms(self.entries[tuple(row)]) for row in prompts.tolist()]
        by_terms = pass1_by_terms(greedy_correct.tolist(), n_terms, opt.min_terms, opt.max_terms)
        by_terms = {f"eval/{m}": v for m, v in zip(terms_metrics(opt.min_terms, opt.max_terms), by_terms.values())}
        passk = self._pass_at_k(models, cfg, prompts, k, device, autocast, eos_id, pad_id)
        return passk | by_terms | {"eval/gold": correct.mean().item(), "eval/gold_se": standard_error(correct),
                "eval/pass1_greedy": greedy_correct.mean().item(),
                "eval/proxy": score.mean().item(), "eval/proxy_std": score.std().item(),
                "eval/proxy_se": standard_error(score), "eval/gold_lexicon": formatted.mean().item(),
                "eval/kl": kl.mean().item(), "eval/kl_se": standard_error(kl),
                "eval/entropy": b["entropy"].float().mean().item(),
                "eval/eos_rate": b["has_eos"].float().mean().item(),
                "eval/truncated": 1.0 - b["has_eos"].float().mean().item(),
                "eval/length": length.mean().item(), "eval/length_correct": _mean_or_nan(length[correct > 0]),
                "eval/length_incorrect": _mean_or_nan(length[correct == 0]),
                "eval/all_equal_groups": (groups.max(1).values == groups.min(1).values).float().mean().item(),
                "eval/direct": sum(map(problems.is_direct, texts)) / len(texts),
                "eval/distinct_1": distinct_n(b["responses"], b["mask"], 1, eos_id),
                "eval/distinct_2": distinct_n(b["responses"], b["mask"], 2, eos_id)}


    def _pass_at_k(self, models: Any, cfg: Any, prompts: torch.Tensor, k: int, device: torch.device,
                   autocast: Callable[[], Any], eos_id: int, pad_id: int) -> dict[str, float]:
        """``eval/pass_at_{k}`` and ``_se`` (:func:`harness.rl.evaluation.pass_at_k_metrics`) from a separate draw of
        ``eval.passk_samples`` responses per prompt, before the first update and after the last; ``{}`` at the
        evaluations between them or with ``eval.passk_samples`` 0."""
        from harness.rl.evaluation import decode_responses, eval_rollout, pass_at_k_metrics

        n = cfg.eval.passk_samples
        if not n or k not in (0, cfg.ppo.total_iterations):
            return {}
        b = eval_rollout(models, cfg, prompts, k, device, autocast, eos_id, pad_id, samples_per_prompt=n,
                         with_kl=False)  # scored by the text alone: no forward passes
        correct, _ = self.verdicts(b["prompts"], decode_responses(models.tokenizer, b["responses"], b["mask"]))
        return {f"eval/{m}": v for m, v in pass_at_k_metrics(correct.view(-1, n)).items()}


#: The ``eval/*`` metrics :meth:`ChainSumTask.evaluate` logs.
EVAL_METRICS = ("gold", "gold_se", "pass1_greedy", "proxy", "proxy_std", "proxy_se", "gold_lexicon", "kl", "kl_se",
                "entropy", "eos_rate", "truncated", "length", "length_correct", "length_incorrect", "all_equal_groups",
                "direct", "distinct_1", "distinct_2")


def eval_metrics(cfg: Any) -> tuple[str, ...]:
    """The ``eval/*`` metrics (without the prefix) :meth:`ChainSumTask.evaluate` logs under ``cfg``: :data:`EVAL_METRICS`
    and the per-length greedy pass@1 of the options' term range (:func:`terms_metrics`).

    Raises:
        pydantic.ValidationError: invalid ``task.options``.
    """
    opt = options_of(cfg)
    return EVAL_METRICS + terms_metrics(opt.min_terms, opt.max_terms) + passk_metrics(cfg)


def passk_metrics(cfg: Any) -> tuple[str, ...]:
    """``pass_at_{k}`` and ``pass_at_{k}_se`` for each k of :data:`harness.rl.evaluation.PASSK` up to
    ``eval.passk_samples`` (``()`` when it is 0): logged before the first update and after the last."""
    from harness.rl.evaluation import PASSK

    return tuple(f"pass_at_{k}{se}" for k in PASSK if k <= cfg.eval.passk_samples for se in ("", "_se"))


#: The evaluation metrics read at the end of a run besides the generic ones (``eval_final/*``, what claims test).
FINAL_METRICS = ("pass1_greedy", "entropy", "truncated", "length_correct", "length_incorrect", "all_equal_groups",
                 "direct")


def final_metrics(cfg: Any) -> tuple[str, ...]:
    """:data:`FINAL_METRICS` and the pass@k of ``eval.passk_samples`` (:func:`passk_metrics`): what ``eval_final/*``
    holds for a run of ``cfg``."""
    return FINAL_METRICS + passk_metrics(cfg)


def terms_metrics(min_terms: int, max_terms: int) -> tuple[str, ...]:
    """The names (without ``eval/``) of the per-length greedy pass@1 metrics :meth:`ChainSumTask.evaluate` logs for
    problems of ``min_terms..max_terms`` terms: ``("pass1_greedy_t2", …)``."""
    return tuple(f"pass1_greedy_t{n}" for n in range(min_terms, max_terms + 1))


def pass1_by_terms(correct: list[float], n_terms: list[int], min_terms: int, max_terms: int) -> dict[int, float]:
    """Pass@1 by problem length: the mean of ``correct`` (0/1 per held-out problem, ``[N]``) over the problems with
    ``n`` terms (``n_terms``, ``[N]``), for every ``n`` in ``min_terms..max_terms``; NaN for a length no problem has.

    Raises:
        ValueError: ``correct`` and ``n_terms`` differ in length, or a problem's length lies outside the range.
    """
    if len(correct) != len(n_terms):
        raise ValueError(f"correct has {len(correct)} entries but n_terms {len(n_terms)}")
    outside = sorted({n for n in n_terms if not min_terms <= n <= max_terms})
    if outside:
        raise ValueError(f"problems of {outside} terms lie outside task.options min_terms..max_terms "
                         f"({min_terms}..{max_terms})")
    out = {}
    for n in range(min_terms, max_terms + 1):
        hits = [c for c, t in zip(correct, n_terms) if t == n]
        out[n] = sum(hits) / len(hits) if hits else math.nan
    return out


def _mean_or_nan(x: torch.Tensor) -> float:
    return x.mean().item() if len(x) else math.nan


@torch.no_grad()
def greedy_responses(policy: Any, prompts: torch.Tensor, response_length: int, eos_id: int, pad_id: int,
                     autocast: Callable[[], Any] | None = None, batch_size: int = 512) -> tuple[torch.Tensor, torch.Tensor]:
    """Greedy responses of ``policy`` to ``prompts`` (``[N, P]``, left-padded: the pad tokens are attended to, as in
    SFT and in the rollouts) by ``transformers``' ``generate(do_sample=False)``, cut after the first EOS.

    Returns:
        ``(responses [N, T], response_mask [N, T])`` with ``T = response_length``: pad after the EOS; the mask is 1
        up to and including the first EOS (every token when there is none).
    """
    from contextlib import nullcontext

    from harness.rl.components.eos import truncate_after_eos

    was_training = policy.training
    policy.eval()
    out = []
    for s in range(0, prompts.shape[0], batch_size):
        p = prompts[s : s + batch_size]
        with (autocast or nullcontext)():
            gen = policy.generate(input_ids=p, attention_mask=torch.ones_like(p), do_sample=False,
                                  max_new_tokens=response_length, eos_token_id=eos_id, pad_token_id=pad_id)
        r = gen[:, p.shape[1]:]
        out.append(torch.nn.functional.pad(r, (0, response_length - r.shape[1]), value=pad_id))
    policy.train(was_training)
    responses, mask, _ = truncate_after_eos(torch.cat(out), eos_id, pad_id)
    return responses, mask


def make_chain_sum(cfg: Any, tokenizer: Any) -> ChainSumTask:
    """Factory ``(cfg: Config, tokenizer) -> ChainSumTask``: the first ``task.options.rl_prompts`` training problems
    as RL prompts and the first ``eval.num_prompts`` held-out problems as evaluation prompts (the same problems
    the pipeline draws: :func:`.problems.make_problems` with the options' seed and knobs).

    Raises:
        ValueError: a prompt longer than ``task.prompt_length``.
    """
    opt = options_of(cfg)
    n_train = opt.n_train if opt.disjoint_heldout else min(opt.rl_prompts, opt.n_train)  # disjoint: from all of them
    train, heldout = problems.make_problems(n_train, cfg.eval.num_prompts, opt.seed, opt.disjoint_heldout, **opt.knobs())
    train = train[: opt.rl_prompts]
    P = cfg.task.prompt_length
    train_ids, eval_ids = encode_prompts(tokenizer, train, P), encode_prompts(tokenizer, heldout, P)
    entries = {tuple(r): e for r, e in zip(train_ids.tolist(), train)}
    entries.update({tuple(r): e for r, e in zip(eval_ids.tolist(), heldout)})
    return ChainSumTask(prompt_ids=train_ids, eval_prompt_ids=eval_ids, entries=entries,
                        data=problems.dataset(1, opt.seed, **opt.knobs()), format_reward=opt.format_reward)


__all__ = ["ChainSumOptions", "ChainSumTask", "EVAL_METRICS", "encode_prompts", "greedy_responses", "make_chain_sum",
           "eval_metrics", "final_metrics", "passk_metrics", "options_of", "padded_prompt_text", "pass1_by_terms", "terms_metrics"]
