"""What a faked run takes in place of what needs data or a real device
(:mod:`chord.checks.fake_iteration`): weights read on the host then moved to the fake device,
nearest neighbours of the right shape, a dense stand-in for the compositor, and Wan 2.2 A14B's
components built from their shapes. Imported only after :func:`chord.checks.cuda_shim.load`."""

from __future__ import annotations

import contextlib
from unittest import mock

import torch
from torch.utils._python_dispatch import _disable_current_modes


def composite_standin(
    means2d, conics, opacities, colors, depths, radii, backgrounds, width, height, **_budget
):
    """The compositor's outputs (colours [I, H, W, D], alphas [I, H, W, 1]) from all of its
    inputs, densely: the real one's pair list is as long as the pixels each Gaussian covers,
    which fake tensors do not know. Every input enters the result (its device and dtype meet
    the others', its gradient flows), so the render's callers and the projection before it
    run as on the GPU."""
    I, N, D = colors.shape
    weight = (
        means2d.sum(-1) + conics.sum(-1) + opacities + depths + radii.sum(-1).to(depths.dtype)
    )  # [I, N]
    colour = (colors * weight[..., None]).sum(1) + backgrounds  # [I, D]
    rgb = colour[:, None, None, :].expand(I, height, width, D).contiguous()
    alpha = opacities.sum(1)[:, None, None, None].expand(I, height, width, 1).contiguous()
    return rgb, alpha


@contextlib.contextmanager
def modelled_parts():
    """The parts that need data, taken as the module's docstring says: weights read from disk
    outside the fake modes (a fake tensor has no storage to read into), then moved to the faked
    device as a GPU run moves them (the Wan VAE, the Tiny VAE, each expert); nearest neighbours
    (scipy's KD-tree over rest points: the control points', ARAP's edges), answered with
    indices of the shape and device the real ones have; the compositor (:func:`composite_standin`).
    Yields the KNN calls' point counts."""
    from chord.guidance import tiny_vae, wan_folder

    def on_host(load, *, move: bool):
        def read(*args, device="cpu", **kwargs):
            with _disable_current_modes():
                module = load(*args, device="cpu", **kwargs)
            # moved once: a fake module moved again is swapped with itself, which torch refuses
            return module.to(device) if move else module

        return read

    def expert_on_host(*args, **kwargs):
        with _disable_current_modes():
            return wan_folder.load_expert.__wrapped__(*args, **kwargs)

    expert_on_host.__wrapped__ = wan_folder.load_expert
    from chord.motion import layer

    def neighbours(self, points):  # scipy's KD-tree needs the data: indices of its shape
        host_knn.append(len(points))
        return torch.zeros(len(points), self.k, dtype=torch.long, device=points.device)

    def arap_connectivity(rest, *, k=10, keep=3, radius=0.1):  # the same, among rest voxels
        host_knn.append(len(rest))
        kk = max(min(k, len(rest) - 1), 0)
        return (
            torch.zeros(len(rest), kk, dtype=torch.int64, device=rest.device),
            torch.ones(len(rest), kk, dtype=torch.bool, device=rest.device),
        )

    host_knn: list[int] = []
    from chord.motion import regularisers
    from chord.render import torch_backend

    with contextlib.ExitStack() as stack:
        patch = lambda mod, name, fn: stack.enter_context(mock.patch.object(mod, name, fn))  # noqa: E731
        patch(wan_folder, "load_vae", on_host(wan_folder.load_vae, move=True))
        # WanGuidance moves the Tiny VAE to its device itself
        patch(tiny_vae, "load_tiny_vae", on_host(tiny_vae.load_tiny_vae, move=False))
        patch(wan_folder, "load_expert", expert_on_host)
        patch(layer.ControlPointLayer, "neighbours", neighbours)
        patch(regularisers, "arap_connectivity", arap_connectivity)
        patch(torch_backend, "composite", composite_standin)
        yield host_knn


@contextlib.contextmanager
def a14b_components(shape):
    """The experts, the Wan VAE and the Tiny VAE built from their shapes on the fake device:
    an expert from ``peak_memory.transformer_kwargs(A14B)`` (the diffusers release's
    transformer/config.json), the Wan 2.1 VAE from ``AutoencoderKLWan``'s defaults (which are
    its config), the Tiny VAE from its fixed layout. Their initialisers run on fake tensors:
    nothing is read from disk, nothing is materialised."""
    from diffusers import AutoencoderKLWan, WanTransformer3DModel

    from chord.guidance import tiny_vae, wan_folder
    from chord.resources import peak_memory

    def load_expert(ckpt_dir, name, *, dtype):
        model = WanTransformer3DModel(**peak_memory.transformer_kwargs(shape))
        # as from_pretrained(torch_dtype=...) loads it: the modules diffusers keeps in float32
        # (rope, time_embedder, scale_shift_table, the norms) stay float32, the rest is cast
        keep = set(getattr(model, "_keep_in_fp32_modules", None) or ())
        for full, p in list(model.named_parameters()):
            if not keep & set(full.split(".")):
                owner, _, leaf = full.rpartition(".")
                module = model.get_submodule(owner) if owner else model
                module._parameters[leaf] = torch.nn.Parameter(p.to(dtype), requires_grad=False)
        return model.eval().requires_grad_(False)

    def load_vae(ckpt_dir, *, device="cpu"):
        return AutoencoderKLWan().to(device).eval().requires_grad_(False)

    def load_tiny_vae(path, *, device="cpu", latents_mean=None, latents_std=None):
        encoder = tiny_vae.TinyVAEEncoder(latents_mean=latents_mean, latents_std=latents_std)
        return encoder.eval().requires_grad_(False).to(device)

    with contextlib.ExitStack() as stack:
        stack.enter_context(mock.patch.object(wan_folder, "load_expert", load_expert))
        stack.enter_context(mock.patch.object(wan_folder, "load_vae", load_vae))
        stack.enter_context(mock.patch.object(tiny_vae, "load_tiny_vae", load_tiny_vae))
        yield
