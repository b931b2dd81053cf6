"""Reward model from human sentiment ratings, trained with TRL ``RewardTrainer``.

Preference pairs are real human judgments: two VADER snippets from the same domain, ordered by their
mean human rating (Hutto & Gilbert 2014; about 10–20 raters each), chosen = the higher-rated one.
Pairs whose ratings differ by less than ``reward_model.margin`` are skipped (near-ties are noise).

Loss: Bradley–Terry ``−log σ(r_chosen − r_rejected)`` (Ouyang et al. 2022, eq. 1; TRL ``RewardTrainer``).
The RM is ``AutoModelForSequenceClassification(num_labels=1)`` initialised from the SFT model (new
linear ``score`` head). Every text ends in EOS and the score is read AT THE EOS TOKEN (N+ detail 23),
found from the attention mask, never from ``pad_token_id`` — so the score is also right when pad == EOS
(TRL bug #3750).

After training, ``reward_offset`` = mean RM score on a sample of SFT demonstrations; the normalised
score ``raw − reward_offset`` has mean 0 there (N+ detail 15, "reward normalization"). It is stored in
``<rm_dir>/reward_offset.json``; the PPO loop subtracts it when ``ppo.normalize_reward`` is on.
"""

from __future__ import annotations

import functools
import json
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch
import torch.nn.functional as F
from scipy.stats import spearmanr

from harness.config.pipeline import RewardModelConfig
from harness.rl.models import score_at
from harness.pipeline.progress import install_progress, trainer_args
from harness.pipeline.tokenizer import encode_with_eos

OFFSET_FILE = "reward_offset.json"

_TOL = 1e-9


def build_pairs(
    snippets: pd.DataFrame,
    margin: float,
    pairs_per_snippet: int,
    seed: int,
    max_pairs: int | None = None,
) -> pd.DataFrame:
    """Preference pairs from rated snippets: same domain, |Δ rating| ≥ ``margin``, chosen = higher rating.

    For every snippet, ``pairs_per_snippet`` partners are drawn uniformly (with replacement, then
    de-duplicated) from the snippets of its domain whose rating differs by at least ``margin`` (and by
    more than 0: ties never form a pair). Unordered duplicates and pairs of identical texts are dropped,
    the result is shuffled with ``seed`` and cut to ``max_pairs``.

    Args:
        snippets: DataFrame with ``domain``, ``rating``, ``text``.

    Returns:
        DataFrame ``[chosen, rejected, chosen_rating, rejected_rating, domain]`` (chosen_rating >
        rejected_rating + margin − 1e-9 on every row). Deterministic given ``seed``.

    Raises:
        ValueError: ``margin < 0`` or ``pairs_per_snippet < 1``.
    """
    if margin < 0 or pairs_per_snippet < 1:
        raise ValueError(f"need margin ≥ 0 and pairs_per_snippet ≥ 1 (got {margin}, {pairs_per_snippet})")
    rng = np.random.default_rng(seed)
    gap = max(margin - _TOL, 1e-12)
    rows = []
    for domain, g in snippets.groupby("domain", sort=True):
        texts = g["text"].to_numpy()
        r = g["rating"].to_numpy(dtype=float)
        order = np.argsort(r, kind="stable")
        rs, ts = r[order], texts[order]
        n = len(rs)
        n_low = np.searchsorted(rs, rs - gap, side="right")  # partners [0, n_low): r_j ≤ r_i − gap
        hi = np.searchsorted(rs, rs + gap, side="left")  # partners [hi, n):    r_j ≥ r_i + gap
        n_cand = n_low + (n - hi)
        seen: set[tuple[int, int]] = set()
        for i in np.nonzero(n_cand > 0)[0]:
            for k in rng.integers(0, n_cand[i], size=pairs_per_snippet):
                j = int(k) if k < n_low[i] else int(hi[i] + (k - n_low[i]))
                a, b = (i, j) if rs[i] > rs[j] else (j, i)  # a = chosen (higher rating)
                if (a, b) in seen or ts[a] == ts[b]:
                    continue
                seen.add((a, b))
                rows.append((ts[a], ts[b], rs[a], rs[b], domain))
    pairs = pd.DataFrame(rows, columns=["chosen", "rejected", "chosen_rating", "rejected_rating", "domain"])
    pairs = pairs.sample(frac=1.0, random_state=int(rng.integers(2**31))).reset_index(drop=True)
    if max_pairs is not None:
        pairs = pairs.iloc[:max_pairs].reset_index(drop=True)
    return pairs


def _right_pad(seqs: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    L = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), L), pad_id, dtype=torch.long)
    mask = torch.zeros((len(seqs), L), dtype=torch.long)
    for j, s in enumerate(seqs):
        ids[j, : len(s)] = torch.tensor(s, dtype=torch.long)
        mask[j, : len(s)] = 1
    return ids, mask


@torch.no_grad()
def score_sequences(model, seqs: list[list[int]], pad_id: int, batch_size: int = 256, device="cpu") -> np.ndarray:
    """Raw RM score of each token sequence, read at its last token (right-padded batches).

    Args:
        seqs: token id lists (each non-empty); the score is read at ``len(seq) − 1``.
    Returns:
        ``[N]`` float64 numpy array. Independent of batching and padding (causal attention, right padding).
    """
    was_training = model.training
    model.eval()
    out = np.empty(len(seqs), dtype=np.float64)
    for i in range(0, len(seqs), batch_size):
        ids, mask = _right_pad(seqs[i : i + batch_size], pad_id)
        last = mask.sum(1) - 1  # [B] the last real token (the EOS when the text ends in one)
        s = score_at(model, ids.to(device), mask.to(device), last.to(device))
        out[i : i + len(s)] = s.double().cpu().numpy()
    model.train(was_training)
    return out


def score_texts(model, tokenizer, texts: list[str], max_length: int, batch_size: int = 256, device="cpu") -> np.ndarray:
    """Raw RM score of each text: EOS appended (:func:`encode_with_eos`), right-padded, read at the EOS.

    Returns:
        ``[N]`` float64 numpy array (:func:`score_sequences` of the encoded texts).

    Raises:
        ValueError: from :func:`encode_with_eos`.
    """
    return score_sequences(model, encode_with_eos(tokenizer, texts, max_length), tokenizer.pad_token_id, batch_size, device)


def compute_reward_offset(model, tokenizer, texts: list[str], max_length: int, device="cpu") -> float:
    """``reward_offset`` = mean raw RM score over ``texts`` (the SFT demonstrations), N+ detail 15.

    The normalised score ``raw − reward_offset`` then has mean exactly 0 on these texts.

    Raises:
        ValueError: empty ``texts``.
    """
    if not texts:
        raise ValueError("no texts to compute the reward offset on")
    return float(score_texts(model, tokenizer, texts, max_length, device=device).mean())


def load_reward_offset(rm_dir: str | Path) -> float:
    """Read ``reward_offset`` from ``<rm_dir>/reward_offset.json`` (0.0 if the file is absent, e.g. an external RM).

    Raises:
        ValueError: the file exists but has no numeric ``reward_offset``.
    """
    p = Path(rm_dir) / OFFSET_FILE
    if not p.is_file():
        return 0.0
    val = json.loads(p.read_text()).get("reward_offset")
    if not isinstance(val, (int, float)):
        raise ValueError(f"{p}: no numeric reward_offset")
    return float(val)


@functools.cache
def _eos_reward_trainer() -> type:
    """:class:`EOSRewardTrainer`, defined on first use: TRL (and ``datasets``, ``accelerate``) is imported only by a
    process that trains a reward model, not by every run that loads one (about 3 s of a fresh worker's start)."""
    from trl import RewardTrainer

    class EOSRewardTrainer(RewardTrainer):
        """TRL ``RewardTrainer`` whose score is read at the last attended token (the appended EOS).

        TRL's default forward pools at the last token != ``pad_token_id`` (transformers'
        ``*ForSequenceClassification``), which is the token BEFORE the EOS when pad == EOS. Here the index
        is ``attention_mask.sum(1) − 1`` under right padding (TRL's ``DataCollatorForPreference`` pads right),
        the same :func:`harness.rl.models.score_at` the PPO loop uses. Loss, metrics and everything else are TRL's.
        """

        def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
            mode = "train" if self.model.training else "eval"
            mask = inputs["attention_mask"]
            index = mask.sum(1) - 1
            rewards = score_at(model, inputs["input_ids"], mask, index)  # [2B]: chosen rows first
            chosen, rejected = torch.chunk(rewards, chunks=2)
            loss = -F.logsigmoid(chosen - rejected).mean()
            if self.args.center_rewards_coefficient is not None:
                loss = loss + self.args.center_rewards_coefficient * torch.mean((chosen + rejected) ** 2)
            with torch.no_grad():
                self._metrics[mode]["accuracy"].append((chosen > rejected).float().mean().item())
                self._metrics[mode]["margin"].append((chosen - rejected).mean().item())
                self._metrics[mode]["mean_reward"].append(rewards.mean().item())
            return (loss, {"rewards": rewards}) if return_outputs else loss

    return EOSRewardTrainer


def __getattr__(name: str) -> Any:
    """``EOSRewardTrainer`` (:func:`_eos_reward_trainer`), made when first asked for (PEP 562)."""
    if name == "EOSRewardTrainer":
        return _eos_reward_trainer()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _vader_compound(texts: list[str]) -> np.ndarray:
    from vaderSentiment.vaderSentiment import SentimentIntensityAnalyzer

    sia = SentimentIntensityAnalyzer()
    return np.array([sia.polarity_scores(t)["compound"] for t in texts], dtype=np.float64)


def _fit_pairs(pairs: pd.DataFrame, init_dir: str | Path, tokenizer, rm_cfg: RewardModelConfig, *, seed: int,
               device: torch.device | str, bf16: bool, progress: bool) -> tuple[Any, Any]:
    """TRL ``RewardTrainer`` (as :class:`EOSRewardTrainer`) on ``pairs`` (``chosen``/``rejected`` texts, each
    encoded with EOS up to ``rm_cfg.max_length``), from ``init_dir``, dropout off, length-grouped batches
    when ``rm_cfg.group_by_length``. Returns ``(model in eval mode, TrainOutput)``."""
    from datasets import Dataset
    from trl import RewardConfig

    ml = rm_cfg.max_length
    chosen_ids = encode_with_eos(tokenizer, list(pairs["chosen"]), ml)
    rejected_ids = encode_with_eos(tokenizer, list(pairs["rejected"]), ml)
    ds = Dataset.from_dict(
        {
            "chosen_ids": chosen_ids,
            "rejected_ids": rejected_ids,
            # padded width of the pair: read by the length-grouped sampler (the collator ignores it)
            "length": [max(len(c), len(r)) for c, r in zip(chosen_ids, rejected_ids)],
        }
    )
    with tempfile.TemporaryDirectory(prefix="harness-rm-") as tmp:
        args = RewardConfig(
            **trainer_args(rm_cfg, output_dir=tmp, max_length=ml, seed=seed, bf16=bf16, device=device),
            model_init_kwargs={"dtype": torch.float32},
            disable_dropout=True,
            remove_unused_columns=False,  # keep "length" for the sampler
        )
        trainer = _eos_reward_trainer()(model=str(init_dir), args=args, train_dataset=ds, processing_class=tokenizer)
        install_progress(trainer, "reward model", progress)
        result = trainer.train()
        model = trainer.model
    return model.eval(), result


def _save(model: Any, tokenizer: Any, out: Path, offset: float, n_texts: int, max_length: int) -> None:
    """Save the reward model and its tokenizer to ``out`` with ``reward_offset.json`` (:data:`OFFSET_FILE`)."""
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(out))
    tokenizer.save_pretrained(str(out))
    (out / OFFSET_FILE).write_text(
        json.dumps(
            {
                "reward_offset": offset,
                "n_texts": n_texts,
                "max_length": max_length,
                "definition": "mean raw RM score at EOS over a sample of SFT train texts; "
                "normalized score = raw - reward_offset (N+ detail 15)",
            },
            indent=2,
        )
    )


def train_reward_model(
    snippets: pd.DataFrame,
    demo_texts: list[str],
    init_dir: str | Path,
    tokenizer,
    rm_cfg: RewardModelConfig,
    out_dir: str | Path,
    *,
    seed: int = 0,
    device: torch.device | str = "cpu",
    bf16: bool = False,
    progress: bool = True,
    n_offset_texts: int = 2048,
) -> dict:
    """Train the RM on train-split pairs, evaluate on held-out pairs, compute and save ``reward_offset``.

    Args:
        snippets: :func:`harness.tasks.review_sentiment.data.load_snippets` output (``split`` column used).
        demo_texts: SFT demonstrations (train texts); ``n_offset_texts`` of them, drawn with ``seed``,
            define ``reward_offset``.
        init_dir: the SFT model dir (causal LM); loaded as ``AutoModelForSequenceClassification(num_labels=1)``.

    Returns:
        metrics: ``pairwise_accuracy`` (held-out pairs from val+test, same margin), ``spearman_vs_vader``
        (RM score vs VADER compound on held-out snippets), ``spearman_vs_human`` (vs mean human rating),
        ``train_accuracy``, ``reward_offset``, ``n_train_pairs``, ``n_heldout_pairs``, ``steps``.

    Training: AdamW, cosine schedule with 5% warmup, no weight decay, dropout off (TRL default);
    ``rm_cfg.group_by_length`` batches pairs of similar length (less padding).

    Raises:
        ValueError: no training pairs at this margin.
    """
    out = Path(out_dir)
    train = snippets[snippets["split"] == "train"]
    held = snippets[snippets["split"] != "train"]
    pairs = build_pairs(train, rm_cfg.margin, rm_cfg.pairs_per_snippet, seed, rm_cfg.max_train_pairs)
    held_pairs = build_pairs(held, rm_cfg.margin, rm_cfg.pairs_per_snippet, seed + 1)
    if len(pairs) == 0:
        raise ValueError(f"no training pairs with reward_model.margin={rm_cfg.margin}")
    ml = rm_cfg.max_length
    model, result = _fit_pairs(pairs, init_dir, tokenizer, rm_cfg, seed=seed, device=device, bf16=bf16, progress=progress)
    model.eval()

    # held-out evaluation: every unique held-out text scored once, at its EOS
    held_texts = list(dict.fromkeys(list(held["text"]) + list(held_pairs["chosen"]) + list(held_pairs["rejected"])))
    s = dict(zip(held_texts, score_texts(model, tokenizer, held_texts, ml, device=device)))
    sc = np.array([s[t] for t in held_pairs["chosen"]])
    sr = np.array([s[t] for t in held_pairs["rejected"]])
    acc = float((sc > sr).mean()) if len(held_pairs) else float("nan")
    hs = np.array([s[t] for t in held["text"]])
    rho_gold = float(spearmanr(hs, _vader_compound(list(held["text"]))).statistic)
    rho_human = float(spearmanr(hs, held["rating"].to_numpy()).statistic)

    # train-pair accuracy on (up to) 2000 training pairs, as an overfitting check
    tp = pairs.iloc[:2000]
    tr_acc = float(
        (score_texts(model, tokenizer, list(tp["chosen"]), ml, device=device)
         > score_texts(model, tokenizer, list(tp["rejected"]), ml, device=device)).mean()
    )

    # reward normalization (N+ detail 15): mean score on SFT demonstrations → 0
    rng = np.random.default_rng(seed)
    pick = rng.choice(len(demo_texts), size=min(n_offset_texts, len(demo_texts)), replace=False)
    offset_texts = [demo_texts[i] for i in sorted(pick)]
    offset = compute_reward_offset(model, tokenizer, offset_texts, ml, device=device)

    _save(model, tokenizer, out, offset, len(offset_texts), ml)
    return {
        "pairwise_accuracy": acc,
        "spearman_vs_vader": rho_gold,
        "spearman_vs_human": rho_human,
        "train_accuracy": tr_acc,
        "reward_offset": offset,
        "n_train_pairs": len(pairs),
        "n_heldout_pairs": len(held_pairs),
        "n_heldout_snippets": len(held),
        "train_loss": float(result.training_loss),
        "steps": int(result.global_step),
    }
