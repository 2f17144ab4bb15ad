"""The teacher's rows: the Wan folder complete and I2V A14B-shaped (:func:`check_wan_folder`),
and the Tiny VAE file's keys and latent scale (:func:`check_tiny_vae`)."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from chord.checks.report import FAIL, NA, PASS, Check
from chord.resources import cuda_settings, peak_memory

#: interface of a Wan 2.2 I2V A14B expert (transformer/config.json) the guidance relies on
I2V_INTERFACE = {"in_channels": 36, "out_channels": 16, "patch_size": [1, 2, 2]}


def _json(path: Path):
    import json

    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def check_wan_folder(guidance) -> Check:
    """The Wan folder complete (every component's config and weights) and I2V A14B-shaped."""
    if guidance.backend != "wan":
        return Check("wan folder", NA, f"guidance.backend is {guidance.backend}: no Wan weights")
    from chord.guidance import wan_folder

    folder = Path(guidance.ckpt_dir)
    try:
        index = wan_folder.check_folder(folder)
    except ValueError as exc:
        return Check(
            "wan folder", FAIL, str(exc), "copy the whole Wan2.2-I2V-A14B-Diffusers folder"
        )
    problems = []
    experts = {n: _json(folder / n / "config.json") or {} for n in ("transformer", "transformer_2")}
    for name, cfg in experts.items():
        for key, want in I2V_INTERFACE.items():
            if cfg.get(key) != want:
                problems.append(f"{name}/config.json: {key} {cfg.get(key)!r}, expected {want!r}")
    shape_keys = ("num_layers", "num_attention_heads", "attention_head_dim", "ffn_dim", "text_dim")
    differ = [
        k for k in shape_keys if experts["transformer"].get(k) != experts["transformer_2"].get(k)
    ]
    if differ:
        problems.append(f"transformer and transformer_2 differ in {', '.join(differ)}")
    text = _json(folder / "text_encoder" / "config.json") or {}
    text_dim = experts["transformer"].get("text_dim")
    if text.get("d_model") is not None and text.get("d_model") != text_dim:
        problems.append(
            f"text_encoder/config.json: d_model {text.get('d_model')}, the experts' text_dim "
            f"is {text_dim}"
        )
    vae = _json(folder / "vae" / "config.json") or {}
    if vae.get("z_dim") != 16 or len(vae.get("latents_mean") or ()) != 16:
        problems.append("vae/config.json: expected z_dim 16 with 16 latents_mean/latents_std")
    ratio = index.get("boundary_ratio")
    if not isinstance(ratio, int | float) or not 0 < ratio < 1:
        problems.append(f"model_index.json: boundary_ratio {ratio!r}, expected e.g. 0.9")
    if problems:
        return Check(
            "wan folder",
            FAIL,
            f"{folder}: not Wan 2.2 I2V A14B-shaped: " + "; ".join(problems),
            "point guidance.ckpt_dir at a Wan2.2-I2V-A14B-Diffusers folder",
        )
    shape = peak_memory.ModelShape.from_folder(folder)
    return Check(
        "wan folder",
        PASS,
        f"{folder}: complete; experts {shape.describe()}, boundary {ratio}",
    )


def check_tiny_vae(
    guidance, methods: Iterable, *, reference: Path | None = None, device="cpu"
) -> Check:
    """The Tiny VAE file loads with the published (lighttaew2_1) keys and shapes, and its
    latent scale is the one ``guidance.tiny_vae_normalize`` says (METHOD §10): a clip is
    encoded by it and by the Wan folder's VAE on ``device``, and the configured hypothesis
    (true: its outputs are raw Wan 2.1 latents, normalised before the DiT; false: they are
    already normalised) must be the one with the smaller RMS difference from the Wan VAE's
    latents (:func:`chord.guidance.tiny_vae_check.compare_with_full_vae`). ``taew2_1`` has the
    same keys as ``lighttaew2_1`` but emits normalised latents: the keys cannot tell them
    apart. The clip: a still of the scene's reference render ``reference`` where given, else
    a deterministic moving pattern, at most 256 pixels wide."""
    if guidance.backend != "wan" or not any(m.use_tiny_vae for m in methods):
        return Check("tiny vae", NA, "method.use_tiny_vae is off or the teacher is not wan")
    from chord.guidance.tiny_vae import load_tiny_vae

    if not guidance.tiny_vae_path:
        return Check(
            "tiny vae",
            FAIL,
            "guidance.tiny_vae_path is not set",
            "point it at lighttaew2_1.pth",
        )
    try:
        tiny = load_tiny_vae(guidance.tiny_vae_path)
    except ValueError as exc:
        return Check(
            "tiny vae",
            FAIL,
            str(exc),
            "use the lighttaew2_1 weights (TAEHV for Wan 2.1 latents; layout in TAEHV.md)",
        )
    keys = f"{guidance.tiny_vae_path}: the lighttaew2_1 encoder keys"
    if not guidance.ckpt_dir or not (Path(guidance.ckpt_dir) / "vae").is_dir():
        return Check("tiny vae", PASS, f"{keys}; latent scale not checked: no Wan VAE")
    import torch

    from chord.guidance import tiny_vae_check, wan_folder

    try:
        vae = wan_folder.load_vae(guidance.ckpt_dir, device=device)
    except Exception as exc:  # the wan folder row names what is wrong with it
        return Check("tiny vae", PASS, f"{keys}; latent scale not checked: vae/ ({exc})")
    tiny.set_latent_stats(vae.config.latents_mean, vae.config.latents_std)
    tiny.to(device)
    if reference is not None and Path(reference).is_file():
        clip, name = tiny_vae_check.reference_clip(Path(reference)), f"a still of {reference}"
    else:
        w, h = tiny_vae_check.check_size(832, 480)
        clip = tiny_vae_check.synthetic_clip(tiny_vae_check.CHECK_FRAMES, h, w)
        name = "the test pattern"
    stats = tiny_vae_check.compare_with_full_vae(clip.to(device), tiny, vae)
    del vae, tiny
    if torch.device(device).type == "cuda":
        cuda_settings.empty_cache(device)
    status, detail, remedy = tiny_vae_check.scale_problem(
        stats, guidance.tiny_vae_normalize, guidance.tiny_vae_path, name
    )
    return Check("tiny vae", status, detail, remedy)
