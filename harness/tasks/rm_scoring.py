"""Scoring by a learned reward model: the reward, gold and lexicon scores of a task whose RL reward is an RM
read at the EOS token (``review_sentiment``; the benchmark's fixed-prompt task). A task class inherits
:class:`RewardModelScored` for its ``score`` and ``evaluate``, and supplies ``gold_lexicon(texts)``.
"""

from __future__ import annotations

from typing import Any, Callable, Optional

import torch

from harness.rl.components.eos import last_token_index
from harness.config import Config
from harness.errors import HarnessError
from harness.rl.evaluation import (decode_responses, distinct_n, eval_rollout, msttr, rep_n, standard_error,
                                   top_response_share)


def retokenize_for_rm(rm_tokenizer: Any, texts: list[str], max_length: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Token ids of ``texts`` (prompt + response, decoded from a policy with another vocabulary) for the
    reward model, each followed by the RM tokenizer's EOS, where the RM reads its score.

    A text whose encoding is longer than ``max_length`` (the RM's position limit) keeps its last
    ``max_length`` tokens, so the response and its EOS are always read and the start of the prompt
    is dropped: a policy with a larger vocabulary can produce far more RM tokens than its own (random
    SmolLM2 tokens re-encode to about 3× as many harness tokens).

    Args:
        rm_tokenizer: the RM's tokenizer (``pad_token_id`` ≠ ``eos_token_id``).
        texts: ``B`` strings.
        max_length: tokens the RM can read (``config.max_position_embeddings``), ≥ 2.
    Returns:
        ``ids`` ``[B, W]`` right-padded with the pad id (``W`` the longest kept encoding), and ``index``
        ``[B]``: the position of each row's EOS.
    Raises:
        ValueError: ``max_length`` < 2 or no texts.
    """
    if max_length < 2 or not texts:
        raise ValueError(f"max_length must be ≥ 2 and texts non-empty (got {max_length}, {len(texts)} texts)")
    enc = [(rm_tokenizer(t, add_special_tokens=False)["input_ids"] + [rm_tokenizer.eos_token_id])[-max_length:]
           for t in texts]
    ids = torch.full((len(enc), max(len(e) for e in enc)), rm_tokenizer.pad_token_id, dtype=torch.long)
    for i, e in enumerate(enc):
        ids[i, : len(e)] = torch.tensor(e)
    return ids, torch.tensor([len(e) - 1 for e in enc])


@torch.no_grad()
def score_responses(
    models: Any, cfg: Config, task: Any, prompt_ids: torch.Tensor, responses: torch.Tensor, response_mask: torch.Tensor,
    normalize: Optional[bool] = None, with_gold: bool = False,
) -> dict[str, Any]:
    """Proxy (RM), gold and lexicon scores of truncated responses.

    Args:
        prompt_ids: ``[B, P]``; responses, response_mask: ``[B, T]`` (after EOS truncation).
        normalize: subtract the SFT mean RM score (N+ detail 15); default ``ppo.normalize_reward``.
        with_gold: also score by the gold reward model (``models.gold``) on the decoded prompt + response.
    Returns:
        ``{"score": [B], "gold_lexicon": [B], "gold": [B] or None, "texts": [B] responses, "gold_parts": {"sentiment",
        "p_natural": [B]} (empty unless the gold scorer has a naturalness head), "full": [B] prompt + response texts or None}``: the RM
        score read at the last real token (the EOS token when there is one), normalized as asked; the
        task's lexicon score (VADER) of the decoded response; the gold RM's score of prompt + response.
    Raises:
        HarnessError: ``with_gold`` but the models carry no gold scorer.
    """
    from harness.rl.models import score_at

    texts = decode_responses(models.tokenizer, responses, response_mask)
    if models.rm_tokenizer is models.tokenizer or models.rm_tokenizer.get_vocab() == models.tokenizer.get_vocab():
        ids = torch.cat([prompt_ids, responses], dim=1)
        index = prompt_ids.shape[1] + last_token_index(response_mask)
    else:  # a policy with its own tokenizer: re-tokenize prompt + response for the RM
        prompts = decode_responses(models.tokenizer, prompt_ids, torch.ones_like(prompt_ids))
        ids, index = retokenize_for_rm(models.rm_tokenizer, [p + t for p, t in zip(prompts, texts)],
                                       models.reward_model.config.max_position_embeddings)
        ids, index = ids.to(responses.device), index.to(responses.device)
    score = score_at(models.reward_model, ids, None, index).float()
    if cfg.ppo.normalize_reward if normalize is None else normalize:
        score = score - models.reward_offset
    lexicon = task.gold_lexicon(texts).to(score.device).float()
    gold, parts, full = None, {}, None
    if with_gold:
        if models.gold is None:
            raise HarnessError("the gold reward model is not loaded (build_models loads it from the pipeline)")
        full = decode_responses(models.tokenizer, torch.cat([prompt_ids, responses], 1),
                       torch.cat([torch.ones_like(prompt_ids), response_mask.long()], 1))
        if getattr(models.gold, "naturalness", None) is not None:  # a gold of two heads: both, from one forward
            parts = {k: v.to(score.device).float() for k, v in models.gold.parts(full).items()}
            gold = parts.pop("gold")
        else:
            gold = models.gold(full).to(score.device).float()
    return {"score": score, "gold_lexicon": lexicon, "gold": gold, "texts": texts, "gold_parts": parts, "full": full}


class RewardModelScored:
    """The ``score`` and ``evaluate`` of a task rewarded by the pipeline's reward model (``models.reward_model``),
    judged by its gold scorer (``models.gold``) and a lexicon score of its own (``self.gold_lexicon``)."""

    def score(self, models: Any, cfg: Config, prompt_ids: torch.Tensor, responses: torch.Tensor,
              response_mask: torch.Tensor, with_gold: bool = False) -> dict[str, Any]:
        """The training reward of a rollout batch: :func:`score_responses` (``ppo.normalize_reward`` decides the
        SFT offset)."""
        return score_responses(models, cfg, self, prompt_ids, responses, response_mask, with_gold=with_gold)

    @torch.no_grad()
    def evaluate(self, models: Any, cfg: Config, prompts: torch.Tensor, k: int, device: torch.device,
                 autocast: Callable[[], Any], eos_id: int, pad_id: int) -> dict[str, float]:
        """Score the current policy on the fixed held-out prompts (``[N, P]``), the same way for every run: the
        responses of :func:`harness.rl.evaluation.eval_rollout`, scored by the RM (minus the SFT mean, whatever
        ``ppo.normalize_reward`` says: one scale for all variants), by the gold reward model (prompt + response)
        and by the task's lexicon (response).

        Returns:
            ``eval/gold``, ``eval/gold_lexicon``, ``eval/proxy``, ``eval/proxy_std`` (means over the ``N ·
            samples_per_prompt`` responses; std over them), ``eval/kl`` (k1 summed over the response, nats,
            mean over responses: KL(π‖π_ref) per response), ``eval/eos_rate`` and ``eval/length`` (response
            tokens, EOS included), ``eval/distinct_1`` and ``eval/distinct_2`` (:func:`harness.rl.evaluation.distinct_n`
            over the responses, EOS not counted), GRUE's naturalness beside them: ``eval/rep_2``, ``eval/rep_3``
            (:func:`harness.rl.evaluation.rep_n`) and ``eval/msttr`` (:func:`harness.rl.evaluation.msttr`), the mode-collapse
            diagnostic ``eval/top_response_share`` (:func:`harness.rl.evaluation.top_response_share`), the gold's heads
            ``eval/gold_sentiment`` and ``eval/gold_p_natural`` where the gold has them, and ``eval/gold_se``, ``eval/proxy_se``, ``eval/kl_se``: the
            standard errors of those three means (``std / √n`` over the responses; the evaluation's own noise).
            The held-out responses themselves (texts, token ids, gold and proxy scores) are left in
            ``self.last_heldout`` for the loop to keep with the run (``on_heldout``).
        """
        b = eval_rollout(models, cfg, prompts, k, device, autocast, eos_id, pad_id)
        with autocast():
            scored = score_responses(models, cfg, self, b["prompts"], b["responses"], b["mask"], normalize=True,
                                     with_gold=True)
        score, gold, kl, mask = scored["score"], scored["gold"], b["kl"], b["mask"]
        self.last_heldout = {"iteration": k, "texts": scored["full"], "responses": scored["texts"],
                             "response_ids": [row[m.bool()].tolist() for row, m in zip(b["responses"], mask)],
                             "gold": gold.tolist(), "proxy": score.tolist()}
        parts = {f"eval/gold_{name}": v.mean().item() for name, v in scored["gold_parts"].items()}
        return parts | {"eval/gold": gold.mean().item(), "eval/gold_lexicon": scored["gold_lexicon"].mean().item(),
                "eval/proxy": score.mean().item(), "eval/proxy_std": score.std().item(),
                "eval/kl": kl.mean().item(), "eval/eos_rate": b["has_eos"].float().mean().item(),
                "eval/length": mask.sum(1).mean().item(),
                "eval/distinct_1": distinct_n(b["responses"], mask, 1, eos_id),
                "eval/distinct_2": distinct_n(b["responses"], mask, 2, eos_id),
                "eval/rep_2": rep_n(b["responses"], mask, 2, eos_id), "eval/rep_3": rep_n(b["responses"], mask, 3, eos_id),
                "eval/msttr": msttr(b["responses"], mask, eos_id=eos_id),
                "eval/top_response_share": top_response_share(b["responses"], mask, eos_id),
                "eval/gold_se": standard_error(gold), "eval/proxy_se": standard_error(score),
                "eval/kl_se": standard_error(kl)}
