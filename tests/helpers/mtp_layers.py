"""A multi-token-prediction layer (`mtp.*`) added to a saved tiny Qwen3.5 / Qwen3-Next checkpoint, as the
released checkpoints ship one: transformers builds none, so its tensors are made here, random, in a file of
their own, and the config says `mtp_num_hidden_layers: 1`."""

import json
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

MTP_FILE = "mtp.safetensors"


def add_mtp_layer(model_dir, seed: int = 0) -> None:
    """Give the checkpoint in `model_dir` an MTP layer: fc [hidden, 2 * hidden] and the three norms drawn at
    random (norms around 0: they scale by 1 + weight), and layers.0 a copy of the decoder's last
    full-attention layer (its MLP or experts too) with noise added, so that no tensor equals the decoder's."""
    path = Path(model_dir)
    config = json.loads((path / "config.json").read_text())
    text = config.get("text_config", config)
    text["mtp_num_hidden_layers"] = 1
    (path / "config.json").write_text(json.dumps(config, indent=2))
    weights = {}
    for file in path.glob("*.safetensors"):
        if file.name != MTP_FILE:
            weights.update(load_file(file))
    prefix = "model.language_model." if "text_config" in config else "model."
    last_full = max(i for i, kind in enumerate(text["layer_types"]) if kind == "full_attention")
    layer = f"{prefix}layers.{last_full}."
    generator = torch.Generator().manual_seed(seed)
    noise = lambda t: torch.randn(t.shape, generator=generator) * 0.1  # noqa: E731
    hidden = text["hidden_size"]
    mtp = {f"mtp.layers.0.{name[len(layer) :]}": t + noise(t) for name, t in weights.items() if name.startswith(layer)}
    mtp["mtp.fc.weight"] = torch.randn(hidden, 2 * hidden, generator=generator) * (2 * hidden) ** -0.5
    for norm in ("pre_fc_norm_embedding", "pre_fc_norm_hidden", "norm"):
        mtp[f"mtp.{norm}.weight"] = torch.randn(hidden, generator=generator) * 0.3
    save_file({name: t.contiguous() for name, t in mtp.items()}, path / MTP_FILE, metadata={"format": "pt"})
