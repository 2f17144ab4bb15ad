"""The torch rasterizer against analytic images, finite differences and a dense oracle."""

from __future__ import annotations

import math

import pytest
import torch

from chord.render import cameras, torch_backend
from chord.render.raster_inputs import RasterInputs, RasterSettings
from chord.render.rasterizer import rasterize
from tests import components
from tests.components import skip_without

D64 = torch.float64


def identity_view(dtype=D64):
    return torch.eye(4, dtype=dtype)[None]  # [1, 4, 4]: camera at the origin looking +z


def test_single_isotropic_gaussian_matches_the_analytic_image():
    W = H = 33
    f, d, s, o = 40.0, 2.0, 0.05, 0.8
    K = torch.tensor([[[f, 0, 16.5], [0, f, 16.5], [0, 0, 1]]], dtype=D64)  # mean at pixel 16
    rgb, alpha, _ = rasterize(
        torch.tensor([[0.0, 0, d]], dtype=D64),
        torch.tensor([[1.0, 0, 0, 0]], dtype=D64),
        torch.full((1, 3), s, dtype=D64),
        torch.tensor([o], dtype=D64),
        torch.tensor([[0.2, 0.5, 1.0]], dtype=D64),
        identity_view(),
        K,
        W,
        H,
        backend="torch",
    )
    var = (f * s / d) ** 2  # projected variance in pixels²
    var_blur = var + 0.3  # gsplat's low-pass
    opac = o * var / var_blur  # antialiased compensation sqrt(det/det_blur)
    ys, xs = torch.meshgrid(torch.arange(H, dtype=D64), torch.arange(W, dtype=D64), indexing="ij")
    r2 = (xs + 0.5 - 16.5) ** 2 + (ys + 0.5 - 16.5) ** 2
    a = torch.clamp(opac * torch.exp(-0.5 * r2 / var_blur), max=0.999)
    a = torch.where(a >= 1 / 255, a, 0.0)
    torch.testing.assert_close(alpha[0, ..., 0], a, atol=1e-12, rtol=0)
    torch.testing.assert_close(
        rgb[0], a[..., None] * torch.tensor([0.2, 0.5, 1.0], dtype=D64), atol=1e-12, rtol=0
    )
    assert rgb[0, 16, 16, 2] == pytest.approx(opac)  # peak at the centre pixel
    assert rgb[0].argmax() // 3 == 16 * W + 16


def blob_at(point, view, W=64, H=48):
    K = cameras.intrinsics(W, H)[None]
    rgb, alpha, _ = rasterize(
        torch.tensor([point], dtype=D64),
        torch.tensor([[1.0, 0, 0, 0]], dtype=D64),
        torch.full((1, 3), 0.05, dtype=D64),
        torch.tensor([0.9], dtype=D64),
        torch.ones(1, 3, dtype=D64),
        view,
        K,
        W,
        H,
        backend="torch",
    )
    a = alpha[0, ..., 0]
    ys, xs = torch.meshgrid(torch.arange(H, dtype=D64), torch.arange(W, dtype=D64), indexing="ij")
    return float((a * xs).sum() / a.sum()) + 0.5, float((a * ys).sum() / a.sum()) + 0.5


def test_orbit_convention_places_objects_where_expected():
    W, H = 64, 48
    front = cameras.orbit_viewmats(0.0, 0.0, 2.0)[None]
    x, y = blob_at([0.5, 0.0, 0.0], front)
    assert x > W / 2 + 5 and abs(y - H / 2) < 0.5  # +x is on the right seen from azimuth 0
    side = cameras.orbit_viewmats(0.0, 90.0, 2.0)[None]  # camera on +x looking at the origin
    x, y = blob_at([0.5, 0.0, 0.0], side)
    assert abs(x - W / 2) < 0.5 and abs(y - H / 2) < 0.5  # +x is straight ahead
    x, _ = blob_at([0.0, 0.0, -0.5], side)
    assert x > W / 2 + 5  # and −z is on its right
    above = cameras.orbit_viewmats(30.0, 0.0, 2.0)[None]
    _, y_top = blob_at([0.0, 0.3, 0.0], above)
    _, y_mid = blob_at([0.0, 0.0, 0.0], above)
    assert y_top < y_mid == pytest.approx(H / 2, abs=0.5)  # +y is up in the image


def tiny_scene(n=6, seed=0, dtype=D64):
    g = torch.Generator().manual_seed(seed)
    means = (torch.rand(n, 3, generator=g, dtype=dtype) - 0.5) * 0.6
    quats = torch.randn(n, 4, generator=g, dtype=dtype)
    scales = 0.05 + 0.1 * torch.rand(n, 3, generator=g, dtype=dtype)
    opac = 0.3 + 0.5 * torch.rand(n, generator=g, dtype=dtype)
    colors = torch.rand(n, 3, generator=g, dtype=dtype)
    return means, quats, scales, opac, colors


def test_gradcheck_float64():
    means, quats, scales, opac, colors = tiny_scene(4)
    view = cameras.orbit_viewmats(20.0, 30.0, 2.0)[None]
    K = cameras.intrinsics(12, 10, fovy=30.0)[None]
    bg = torch.tensor([[0.3, 0.6, 0.9]], dtype=D64)

    def fn(m, q, s, o, c):
        rgb, alpha, _ = rasterize(m, q, s, o, c, view, K, 12, 10, backgrounds=bg, backend="torch")
        return rgb, alpha

    inputs = [t.clone().requires_grad_(True) for t in (means, quats, scales, opac, colors)]
    assert torch.autograd.gradcheck(fn, inputs, eps=1e-6, atol=1e-6, rtol=1e-4)


def test_sparse_equals_dense_including_early_termination():
    # eight nearly opaque Gaussians stacked along the view ray: pixels terminate early
    means, quats, scales, opac, colors = tiny_scene(16, seed=1)
    means[:8] = (
        torch.tensor([0.0, 0.0, 0.0], dtype=D64) + torch.linspace(-0.2, 0.2, 8, dtype=D64)[:, None]
    )
    opac[:8] = 0.99
    scales[:8] = 0.2
    view = cameras.orbit_viewmats(torch.tensor([10.0, 35.0]), torch.tensor([0.0, 200.0]), 2.0)
    K = cameras.intrinsics(40, 30).expand(2, 3, 3)
    bg = torch.tensor([[1.0, 1.0, 1.0], [0.0, 0.0, 0.0]], dtype=D64)
    inputs = RasterInputs(*(t[None] for t in (means, quats, scales, opac, colors, view, K, bg)))
    settings = RasterSettings(40, 30, near_plane=0.01, far_plane=100.0)
    sparse = torch_backend.rasterize(inputs, settings)
    dense = torch_backend.rasterize(inputs, settings, dense=True)
    torch.testing.assert_close(sparse[0], dense[0], atol=1e-10, rtol=0)
    torch.testing.assert_close(sparse[1], dense[1], atol=1e-10, rtol=0)
    assert float(sparse[1].max()) > 1 - 2e-4  # some pixels did reach the threshold


def test_batched_frames_equal_frame_by_frame_and_chunking_is_exact():
    means, quats, scales, opac, colors = tiny_scene(30, seed=2)
    T = 3
    frames = means[None] + torch.linspace(0, 0.1, T, dtype=D64)[:, None, None]
    view = cameras.orbit_viewmats(
        torch.tensor([[5.0, 25.0]]).expand(T, 2), torch.tensor([[0.0, 90.0]]).expand(T, 2), 2.0
    )
    K = cameras.intrinsics(24, 20).expand(T, 2, 3, 3)
    rep = lambda t: t[None].expand(T, *t.shape)  # noqa: E731
    rgb, alpha, _ = rasterize(
        frames, rep(quats), rep(scales), rep(opac), rep(colors), view, K, 24, 20, backend="torch"
    )
    assert rgb.shape == (T, 2, 20, 24, 3) and alpha.shape == (T, 2, 20, 24, 1)
    for t in range(T):
        one, _, _ = rasterize(
            frames[t], quats, scales, opac, colors, view[t], K[t], 24, 20, backend="torch"
        )
        torch.testing.assert_close(rgb[t], one, atol=1e-12, rtol=0)
    inputs = RasterInputs(frames, rep(quats), rep(scales), rep(opac), rep(colors), view, K)
    small = torch_backend.rasterize(inputs, RasterSettings(24, 20), pair_budget=10)[0]
    torch.testing.assert_close(small, rgb, atol=1e-12, rtol=0)


def test_gradients_through_checkpointed_chunks_match_one_chunk():
    means, quats, scales, opac, colors = tiny_scene(20, seed=3)
    view = cameras.orbit_viewmats(
        torch.tensor([10.0, 20.0, 30.0]), torch.tensor([0.0, 120.0, 240.0]), 2.0
    )[None]
    K = cameras.intrinsics(16, 12).expand(1, 3, 3, 3)
    grads = []
    for budget in (10**9, 50):
        m = means.clone().requires_grad_(True)
        inputs = RasterInputs(m[None], quats[None], scales[None], opac[None], colors[None], view, K)
        rgb = torch_backend.rasterize(inputs, RasterSettings(16, 12), pair_budget=budget)[0]
        rgb.square().sum().backward()
        grads.append(m.grad)
    torch.testing.assert_close(grads[0], grads[1], atol=1e-12, rtol=0)


def test_sh_colours_follow_gsplat():
    from gsplat.cuda._torch_impl import _spherical_harmonics  # the private name we reuse

    assert callable(_spherical_harmonics)
    sh = torch.zeros(1, 16, 3, dtype=D64)
    sh[0, 0] = torch.tensor([1.0, -1.0, 0.0])
    W = H = 17
    K = torch.tensor([[[30.0, 0, 8.5], [0, 30.0, 8.5], [0, 0, 1]]], dtype=D64)
    rgb, alpha, _ = rasterize(
        torch.tensor([[0.0, 0, 2]], dtype=D64),
        torch.tensor([[1.0, 0, 0, 0]], dtype=D64),
        torch.full((1, 3), 0.2, dtype=D64),
        torch.tensor([0.5], dtype=D64),
        sh,
        identity_view(),
        K,
        W,
        H,
        sh_degree=3,
        backend="torch",
    )
    c0 = 0.28209479177387814
    expect = torch.clamp_min(torch.tensor([c0 + 0.5, -c0 + 0.5, 0.5], dtype=D64), 0)
    torch.testing.assert_close(rgb[0, 8, 8], alpha[0, 8, 8, 0] * expect)


def test_behind_the_camera_and_off_screen_are_culled():
    means = torch.tensor([[0.0, 0, -1.0], [50.0, 0, 1.0]], dtype=D64)
    rgb, alpha, meta = rasterize(
        means,
        torch.tensor([[1.0, 0, 0, 0]] * 2, dtype=D64),
        torch.full((2, 3), 0.1, dtype=D64),
        torch.tensor([0.9, 0.9], dtype=D64),
        torch.ones(2, 3, dtype=D64),
        identity_view(),
        cameras.intrinsics(16, 16)[None],
        16,
        16,
        backend="torch",
    )
    assert float(alpha.max()) == 0.0
    assert int(meta["radii"].abs().sum()) == 0


def test_gsplat_backend_on_cpu_is_a_clear_error():
    m, q, s, o, c = tiny_scene(2)
    with pytest.raises(ValueError, match="backend 'gsplat' needs CUDA tensors"):
        rasterize(
            m, q, s, o, c, identity_view(), cameras.intrinsics(8, 8)[None], 8, 8, backend="gsplat"
        )


def test_auto_on_cuda_without_gsplat_kernels_fails_with_the_reason_and_the_fix(monkeypatch):
    """gsplat 1.5 without a CUDA toolkit has no kernels: "auto" must not quietly render with
    the torch rasterizer on the GPU."""
    from chord.render import backend as render
    from chord.render import gsplat_backend

    reason = "gsplat 1.5.3 found no CUDA toolkit (nvcc under CUDA_HOME or on PATH)"
    monkeypatch.setattr(gsplat_backend, "unavailable_reason", lambda: reason)
    for backend in ("auto", "gsplat"):
        with pytest.raises(render.BackendUnavailable) as err:
            render.resolve_backend(backend, "cuda:0")
        msg = str(err.value)
        assert reason in msg and "CUDA toolkit" in msg and "render_backend: torch" in msg
    assert render.resolve_backend("torch", "cuda:0") == "torch"  # asked for explicitly
    monkeypatch.setattr(gsplat_backend, "unavailable_reason", lambda: None)
    assert render.resolve_backend("auto", torch.device("cuda", 1)) == "gsplat"
    assert render.resolve_backend("auto", "cpu") == "torch"
    with pytest.raises(render.BackendUnavailable, match="gsplat needs CUDA tensors"):
        render.resolve_backend("gsplat", "cpu")


def test_gsplat_probe_says_why_on_a_machine_without_cuda():
    from chord.render import gsplat_backend

    if torch.cuda.is_available():
        components.missing(components.CPU_ONLY, "this machine has a GPU")
    assert "sees no CUDA GPU" in gsplat_backend.unavailable_reason()
    assert not gsplat_backend.available()


def test_both_backends_implement_the_one_protocol():
    from chord.render import gsplat_backend
    from chord.render.backend import BACKENDS, IMPLEMENTATIONS, RenderBackend, describe_backend

    assert IMPLEMENTATIONS == {"gsplat": gsplat_backend, "torch": torch_backend}
    assert {"auto", *IMPLEMENTATIONS} == set(BACKENDS)
    for name, module in IMPLEMENTATIONS.items():
        assert isinstance(module, RenderBackend) and module.NAME == name
    assert torch_backend.unavailable_reason() is None
    assert describe_backend("torch") == "torch rasterizer (chord.render.torch_backend)"


def test_the_settings_reach_the_backend():
    """``rasterize``'s settings keywords are RasterSettings' fields: a far plane before the
    Gaussian culls it, a name that is no setting is an error."""
    m, q, s, o, c = tiny_scene(3)
    view, K = torch.eye(4, dtype=D64)[None], cameras.intrinsics(16, 16)[None]
    m[:, 2] += 2.0  # in front of the camera, z in (1.7, 2.3)
    _, alpha, _ = rasterize(m, q, s, o, c, view, K, 16, 16, backend="torch")
    assert float(alpha.max()) > 0.1
    _, alpha, meta = rasterize(m, q, s, o, c, view, K, 16, 16, far_plane=1.5, backend="torch")
    assert float(alpha.max()) == 0.0 and int(meta["radii"].abs().sum()) == 0
    with pytest.raises(TypeError, match="far"):
        rasterize(m, q, s, o, c, view, K, 16, 16, far=1.5, backend="torch")


def test_gsplat_backend_passes_inputs_and_settings_to_gsplat(monkeypatch):
    """Without a GPU: what the CUDA backend asks of gsplat's ``rasterization`` (faked)."""
    import gsplat

    from chord.render import gsplat_backend

    calls = []

    def rasterization(*args, **kw):
        calls.append((args, kw))
        return "rgb", "alpha", {}

    monkeypatch.setattr(gsplat_backend, "unavailable_reason", lambda: None)
    monkeypatch.setattr(gsplat, "rasterization", rasterization)
    tensors = (*tiny_scene(2), identity_view(), cameras.intrinsics(8, 6)[None])
    bg = torch.ones(1, 3, dtype=D64)
    inputs = RasterInputs(*tensors, backgrounds=bg, sh_degree=0)
    out = gsplat_backend.rasterize(inputs, RasterSettings(8, 6, far_plane=50.0))
    assert out == ("rgb", "alpha", {})
    ((args, kw),) = calls
    assert all(a is b for a, b in zip(args[:7], tensors, strict=True))
    assert args[7:] == (8, 6)
    assert kw["backgrounds"] is bg and kw["sh_degree"] == 0
    assert kw["near_plane"] == 0.01 and kw["far_plane"] == 50.0 and kw["eps2d"] == 0.3
    assert kw["packed"] is False and kw["absgrad"] is True
    assert kw["rasterize_mode"] == "antialiased"


@skip_without(components.CUDA, torch.cuda.is_available(), "gsplat parity runs its kernels")
def test_torch_backend_matches_gsplat_on_gpu():
    from chord.render import gsplat_backend

    if not gsplat_backend.available():
        components.missing(components.CUDA, "gsplat's CUDA extension does not load on this machine")
    means, quats, scales, opac, colors = tiny_scene(200, seed=4, dtype=torch.float32)
    view = cameras.orbit_viewmats(torch.tensor([15.0]), torch.tensor([60.0]), 2.0).float()
    K = cameras.intrinsics(64, 48).float()[None]
    ref, ref_a, _ = rasterize(means, quats, scales, opac, colors, view, K, 64, 48, backend="torch")
    cuda = [t.cuda() for t in (means, quats, scales, opac, colors, view, K)]
    out, out_a, _ = rasterize(*cuda, 64, 48, backend="gsplat")
    assert float((out.cpu() - ref).abs().mean()) < 2e-3
    assert float((out_a.cpu() - ref_a).abs().max()) < 2e-2
    assert math.isfinite(float(out.sum()))
