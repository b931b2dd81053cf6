"""Proxy reward models trained on gold-labelled comparisons (Gao, Schulman & Hilton 2022, §2).

The synthetic setup of Gao et al.: sample responses from the initial (SFT) policy on training prompts,
label each pair of responses to one prompt with the *gold* reward model (chosen = the higher gold
score), and train the proxy on the first ``proxy_pairs`` comparisons. The gold is then the target and
the proxy its imperfect copy, so optimising the proxy can over-optimise the gold.

Two stages:
* ``proxy_data`` (:func:`build_proxy_data`): ``pool_pairs`` training comparisons on prompts cut from
  train-split texts and ``heldout_pairs`` on prompts cut from val-split texts, both sampled from the
  SFT policy at the PPO temperature and truncated after the first EOS, exactly as a rollout is. Each
  response is stored as the token ids the PPO loop would score (prompt + response up to its EOS), with
  its gold score of the decoded text.
* ``reward_model`` with ``reward_model.labels: gold`` (:func:`train_proxy_reward_model`): TRL
  ``RewardTrainer`` (Bradley–Terry loss, score read at the last real token, as in the PPO loop) on
  the first ``proxy_pairs`` pool comparisons, so the proxy sizes are nested.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np
import pandas as pd
import torch

PROXY_DATA_FILE = "comparisons.parquet"
#: Extra prompts drawn per split, as a fraction of the pairs asked for, to replace tied comparisons (two
#: identical responses: about 3% of pairs from the default SFT policy).
TIE_RESERVE = 0.08


def sample_comparisons(policy: torch.nn.Module, prompts: torch.Tensor, response_length: int, temperature: float,
                       eos_id: int, pad_id: int, seed: int, batch_size: int = 512,
                       sampler: str = "inverse_cdf", truncate: bool = True) -> tuple[list[list[int]], list[list[int]]]:
    """Two responses per prompt from ``policy``: sampled, truncated after the first EOS (``truncate``,
    as a rollout with ``ppo.truncate_after_eos``) or kept at ``response_length`` tokens.

    Args:
        prompts: ``[M, P]`` prompt ids.
    Returns:
        ``(a, b)``: for each prompt the full sequences (prompt ids + response ids up to and including
        the first EOS; all ``response_length`` tokens when there is none or ``truncate`` is False) of its
        two responses.
        Deterministic given ``seed`` and ``batch_size``.
    """
    from harness.rl.rollout import sample_sequences

    gen = torch.Generator(device=next(policy.parameters()).device).manual_seed(seed)
    seqs = sample_sequences(policy, prompts.repeat_interleave(2, dim=0), response_length, temperature, gen, eos_id,
                            pad_id, truncate=truncate, batch_size=batch_size, sampler=sampler)
    return seqs[0::2], seqs[1::2]


#: Responses sampled per prompt when comparisons are matched in length (``match_length``): a pair of equal length
#: is then found for most prompts of the default SFT policy.
MATCH_CANDIDATES = 8


def length_matched_pairs(policy: torch.nn.Module, prompts: torch.Tensor, response_length: int, temperature: float,
                         eos_id: int, pad_id: int, seed: int, k: int = MATCH_CANDIDATES,
                         batch_size: int = 512) -> tuple[list[int], list[list[int]], list[list[int]]]:
    """For each prompt, ``k`` responses sampled and truncated after the first EOS (as :func:`sample_comparisons`),
    and the first two (in sample order) of equal length whose tokens differ: a comparison in which length cannot
    tell the responses apart, so a proxy trained on such pairs learns no length preference from its data.

    Args:
        prompts: ``[M, P]`` prompt ids.
    Returns:
        ``(rows, a, b)``: the indices of the prompts that got a pair, and their two full sequences (prompt + response).
        Deterministic given ``seed``, ``k`` and ``batch_size``.
    """
    from harness.rl.rollout import sample_sequences

    gen = torch.Generator(device=next(policy.parameters()).device).manual_seed(seed)
    seqs = sample_sequences(policy, prompts.repeat_interleave(k, dim=0), response_length, temperature, gen, eos_id,
                            pad_id, truncate=True, batch_size=batch_size)
    rows, a, b = [], [], []
    for i in range(prompts.shape[0]):
        cand, seen = seqs[i * k:(i + 1) * k], {}
        for s in cand:
            other = seen.get(len(s))
            if other is not None and other != s:
                rows.append(i), a.append(other), b.append(s)
                break
            seen.setdefault(len(s), s)
    return rows, a, b


def label_comparisons(text_a: Sequence[str], text_b: Sequence[str],
                      gold: Callable[[list[str]], torch.Tensor]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Gold labels for pairs of texts: ``(gold_a [M], gold_b [M], a_chosen [M] bool)``.

    ``a_chosen[i]`` is True when ``gold(a_i) > gold(b_i)``; a tie (equal scores) is labelled False and
    should be dropped by the caller (:func:`comparisons_frame` drops ties).
    """
    g = gold(list(text_a) + list(text_b)).double().cpu().numpy()
    ga, gb = g[: len(text_a)], g[len(text_a):]
    return ga, gb, ga > gb


def comparisons_frame(seq_a: list[list[int]], seq_b: list[list[int]], gold_a: np.ndarray, gold_b: np.ndarray,
                      split: str) -> pd.DataFrame:
    """Ordered comparisons ``[chosen_ids, rejected_ids, chosen_gold, rejected_gold, split]``: chosen =
    the higher gold score; tied pairs are dropped (they carry no preference)."""
    rows = []
    for a, b, ga, gb in zip(seq_a, seq_b, gold_a, gold_b):
        if ga == gb:
            continue
        (c, gc), (r, gr) = ((a, ga), (b, gb)) if ga > gb else ((b, gb), (a, ga))
        rows.append((c, r, float(gc), float(gr), split))
    return pd.DataFrame(rows, columns=["chosen_ids", "rejected_ids", "chosen_gold", "rejected_gold", "split"])


def build_proxy_data(out_dir: Path, sft_dir: str, tokenizer: Any, train_texts: list[str], heldout_texts: list[str],
                     gold: Callable[[list[str]], torch.Tensor], *, pool_pairs: int, heldout_pairs: int,
                     prompt_length: int, response_length: int, temperature: float, seed: int,
                     truncate: bool = True, match_length: bool = False, suppress_special: bool = False,
                     device: torch.device | str = "cpu") -> dict[str, Any]:
    """Build the ``proxy_data`` stage: sample, gold-label and save the comparisons.

    Prompts are the first ``prompt_length`` tokens of distinct texts (``make_prompts``), drawn without
    replacement (seeded) from ``train_texts`` for the pool and from ``heldout_texts`` for the held-out
    set; :data:`TIE_RESERVE` more are sampled than asked for, tied comparisons are dropped and the
    first ``pool_pairs`` / ``heldout_pairs`` kept. ``truncate``: cut responses after the first EOS, as the
    PPO loop does with ``ppo.truncate_after_eos``. ``match_length``: every comparison is of two responses of
    equal length (:func:`length_matched_pairs`, truncated after EOS; prompts without such a pair are skipped and
    more are drawn), so that the proxy cannot learn a preference for short or long answers from its data.
    ``suppress_special``: the SFT policy never emits the special tokens its text would hide (all, or all but EOS with
    ``truncate``; ``task.suppress_special_tokens``, :func:`harness.rl.models.hidden_special_ids`,
    :func:`harness.rl.models.suppress_tokens`), as the policy it will score does.

    Returns:
        metrics: ``n_pool`` (= ``pool_pairs``), ``n_heldout`` (= ``heldout_pairs``), ``n_ties_dropped``,
        ``gold_mean``, ``gold_std``, ``gold_gap_mean`` (mean chosen − rejected gold), ``eos_rate``.
    Raises:
        ValueError: fewer distinct prompts, or fewer untied comparisons, than pairs asked for.
    """
    from harness.rl.models import hidden_special_ids, load_policy, suppress_tokens
    from harness.tasks.review_sentiment.task import make_prompts

    policy = load_policy(sft_dir, device)
    if suppress_special:
        suppress_tokens(policy, hidden_special_ids(tokenizer, ends_at_eos=truncate))
    eos_id, pad_id = tokenizer.eos_token_id, tokenizer.pad_token_id
    frames = []
    rng = np.random.default_rng(seed)
    eos = []
    ties = 0
    for split, texts, n in (("train", train_texts, pool_pairs), ("heldout", heldout_texts, heldout_pairs)):
        pool = make_prompts(texts, tokenizer, prompt_length)
        reserve = 1.0 if match_length else TIE_RESERVE  # unmatched prompts, or tied pairs (identical responses), drop
        n_draw = min(pool.shape[0], int(n * (1 + reserve)) + 16)
        if n_draw < n:
            raise ValueError(f"proxy data: {n} {split} pairs need as many distinct prompts; the {split} texts give {pool.shape[0]}")
        prompts = pool[torch.from_numpy(np.sort(rng.choice(pool.shape[0], size=n_draw, replace=False)))]
        split_seed = seed + (0 if split == "train" else 1)
        if match_length:
            _, a, b = length_matched_pairs(policy, prompts, response_length, temperature, eos_id, pad_id, split_seed)
        else:
            a, b = sample_comparisons(policy, prompts, response_length, temperature, eos_id, pad_id, seed=split_seed,
                                      truncate=truncate)
        eos += [eos_id in s[prompt_length:] for s in a + b]
        ga, gb, _ = label_comparisons(tokenizer.batch_decode(a, skip_special_tokens=True),
                                      tokenizer.batch_decode(b, skip_special_tokens=True), gold)
        frame = comparisons_frame(a, b, ga, gb, split)
        ties += n_draw - len(frame)
        if len(frame) < n:
            what = "length-matched and untied" if match_length else "not ties"
            raise ValueError(f"proxy data: only {len(frame)} of {n_draw} {split} comparisons are {what}; need {n}")
        frames.append(frame.iloc[:n])
    df = pd.concat(frames, ignore_index=True)
    df.to_parquet(out_dir / PROXY_DATA_FILE)
    g = np.concatenate([df["chosen_gold"], df["rejected_gold"]])
    return {"n_pool": int((df["split"] == "train").sum()), "n_heldout": int((df["split"] == "heldout").sum()),
            "n_ties_dropped": int(ties),
            "gold_mean": float(g.mean()), "gold_std": float(g.std()),
            "gold_gap_mean": float((df["chosen_gold"] - df["rejected_gold"]).mean()), "eos_rate": float(np.mean(eos))}


def load_proxy_data(stage_dir: str | Path) -> pd.DataFrame:
    """The ``proxy_data`` comparisons (see :func:`comparisons_frame`); ids as Python lists.

    Raises:
        FileNotFoundError: the stage has no comparisons file.
    """
    df = pd.read_parquet(Path(stage_dir) / PROXY_DATA_FILE)
    for c in ("chosen_ids", "rejected_ids"):
        df[c] = [list(map(int, x)) for x in df[c]]
    return df


def train_proxy_reward_model(data: pd.DataFrame, proxy_pairs: int, init_dir: str | Path, tokenizer: Any, rm_cfg: Any,
                             out_dir: str | Path, *, seed: int = 0, device: torch.device | str = "cpu",
                             bf16: bool = False, progress: bool = True, n_offset: int = 2048) -> dict[str, Any]:
    """Train a proxy RM on the first ``proxy_pairs`` gold-labelled pool comparisons (TRL ``RewardTrainer``).

    The RM is ``AutoModelForSequenceClassification(num_labels=1)`` from the SFT model, scored at the
    last real token as the PPO loop scores it (:class:`harness.tasks.review_sentiment.reward_model.EOSRewardTrainer`).
    ``reward_offset`` = the mean raw score over ``n_offset`` pool responses of the SFT policy (N+ detail
    15: the normalised reward has mean 0 under the initial policy).

    Returns:
        metrics: ``heldout_agreement`` (fraction of held-out comparisons the proxy orders as gold does),
        ``spearman_vs_gold`` (proxy vs gold score over the held-out responses), ``spearman_vs_length`` (proxy
        score vs response length over them: a proxy that prefers short or long answers shows it here; None when
        every response has the same length), ``train_accuracy``,
        ``reward_offset``, ``n_train_pairs``, ``n_heldout_pairs``, ``train_loss``, ``steps``.
    Raises:
        ValueError: the pool has fewer than ``proxy_pairs`` comparisons.
    """
    from datasets import Dataset
    from scipy.stats import spearmanr
    from trl import RewardConfig

    from harness.pipeline.progress import install_progress, trainer_args
    from harness.tasks.review_sentiment.reward_model import OFFSET_FILE, EOSRewardTrainer, score_sequences

    pool = data[data["split"] == "train"].reset_index(drop=True)
    held = data[data["split"] == "heldout"].reset_index(drop=True)
    if len(pool) < proxy_pairs:
        raise ValueError(f"reward_model.proxy_pairs={proxy_pairs} but the proxy data pool has {len(pool)} comparisons "
                         f"(raise reward_model.proxy_pool_pairs)")
    train = pool.iloc[:proxy_pairs]
    ml = rm_cfg.max_length
    chosen = [x[:ml] for x in train["chosen_ids"]]
    rejected = [x[:ml] for x in train["rejected_ids"]]
    ds = Dataset.from_dict({"chosen_ids": chosen, "rejected_ids": rejected,
                            "length": [max(len(c), len(r)) for c, r in zip(chosen, rejected)]})
    with tempfile.TemporaryDirectory(prefix="harness-proxy-") as tmp:
        args = RewardConfig(
            **trainer_args(rm_cfg, output_dir=tmp, max_length=ml, seed=seed, bf16=bf16, device=device),
            model_init_kwargs={"dtype": torch.float32}, disable_dropout=True, remove_unused_columns=False,
        )
        trainer = EOSRewardTrainer(model=str(init_dir), args=args, train_dataset=ds, processing_class=tokenizer)
        install_progress(trainer, f"proxy RM ({proxy_pairs} pairs)", progress)
        result = trainer.train()
        model = trainer.model
    model.eval()
    pad = tokenizer.pad_token_id
    hc = score_sequences(model, [x[:ml] for x in held["chosen_ids"]], pad, device=device)
    hr = score_sequences(model, [x[:ml] for x in held["rejected_ids"]], pad, device=device)
    agree = float((hc > hr).mean()) if len(held) else float("nan")
    rho = float(spearmanr(np.concatenate([hc, hr]), np.concatenate([held["chosen_gold"], held["rejected_gold"]])).statistic)
    lengths = np.array([len(x) for x in list(held["chosen_ids"]) + list(held["rejected_ids"])])
    rho_len = (float(spearmanr(np.concatenate([hc, hr]), lengths).statistic)
               if len(lengths) > 1 and lengths.min() < lengths.max() else None)
    tc = score_sequences(model, chosen[:2000], pad, device=device)
    tr = score_sequences(model, rejected[:2000], pad, device=device)
    offset_seqs = [x[:ml] for x in list(pool["chosen_ids"]) + list(pool["rejected_ids"])]
    pick = np.random.default_rng(seed).choice(len(offset_seqs), size=min(n_offset, len(offset_seqs)), replace=False)
    offset = float(score_sequences(model, [offset_seqs[i] for i in sorted(pick)], pad, device=device).mean())
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(out))
    tokenizer.save_pretrained(str(out))
    (out / OFFSET_FILE).write_text(json.dumps({
        "reward_offset": offset, "n_texts": len(pick), "max_length": ml,
        "definition": "mean raw proxy score at the last real token over SFT-policy responses of the proxy data pool; "
                      "normalized score = raw - reward_offset (N+ detail 15)"}, indent=2))
    return {"labels": "gold", "heldout_agreement": agree, "spearman_vs_gold": rho, "spearman_vs_length": rho_len,
            "train_accuracy": float((tc > tr).mean()), "reward_offset": offset, "n_train_pairs": int(len(train)),
            "n_heldout_pairs": int(len(held)), "train_loss": float(result.training_loss), "steps": int(result.global_step)}


__all__ = ["sample_comparisons", "length_matched_pairs", "label_comparisons", "comparisons_frame", "build_proxy_data", "load_proxy_data",
           "train_proxy_reward_model", "PROXY_DATA_FILE"]
