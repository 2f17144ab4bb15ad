"""The optimiser (METHOD §17): one Adam per dynamic object, per-group learning-rate
schedules, and the moment resets that the table operations need."""

from __future__ import annotations

import math

import torch

# group name -> flag prefix of its lr_init / lr_final / lr_max_steps
GROUP_FLAGS = {
    "cp_deform": "deform",
    "cp_radius": "cp_radius",
    "cp_rotation": "cp_rotation",
    "c_cp_deform": "c_deform",
    "c_cp_radius": "c_cp_radius",
    "c_cp_rotation": "c_cp_rotation",
}
BETAS = (0.9, 0.95)
EPS = 1e-15


def exp_lr(it: int, init: float, final: float, max_steps: int, scale: float) -> float:
    """METHOD §17: exp((1 − u)·ln(a·S) + u·ln(b·S)), u = clip(it/max_steps, 0, 1)."""
    u = min(max(it / max_steps, 0.0), 1.0)
    return math.exp((1 - u) * math.log(init * scale) + u * math.log(final * scale))


def cosine_lr(it: int, init: float, final: float, n_iters: int, warmup: int, scale: float) -> float:
    """``use_lr_scheduler``: linear warm-up from 0 over ``warmup``, then a cosine from a·S to
    b·S at N."""
    if it < warmup:
        return init * scale * it / max(1, warmup)
    u = min(max((it - warmup) / max(1, n_iters - warmup), 0.0), 1.0)
    return final * scale + 0.5 * (init - final) * scale * (1 + math.cos(math.pi * u))


def learning_rate(group: str, it: int, method) -> float:
    prefix = GROUP_FLAGS[group]
    init = getattr(method, f"{prefix}_lr_init")
    final = getattr(method, f"{prefix}_lr_final")
    if method.use_lr_scheduler:
        return cosine_lr(
            it, init, final, method.iterations, method.warmup_steps, method.spatial_lr_scale
        )
    max_steps = getattr(method, f"{prefix}_lr_max_steps") or method.iterations
    return exp_lr(it, init, final, max_steps, method.spatial_lr_scale)


def make_optimizer(groups: dict[str, torch.nn.Parameter], method, it: int) -> torch.optim.Adam:
    """Adam over named groups (betas (0.9, 0.95), eps 1e-15), LRs at iteration ``it``."""
    return torch.optim.Adam(
        [
            {"params": [p], "name": name, "lr": learning_rate(name, it, method)}
            for name, p in groups.items()
        ],
        betas=BETAS,
        eps=EPS,
    )


def add_groups(
    opt: torch.optim.Adam, groups: dict[str, torch.nn.Parameter], method, it: int
) -> None:
    """Add new named groups (the second layer, METHOD §7 step 5)."""
    have = {g["name"] for g in opt.param_groups}
    for name, p in groups.items():
        if name not in have:
            opt.add_param_group(
                {"params": [p], "name": name, "lr": learning_rate(name, it, method)}
            )


def set_learning_rates(opt: torch.optim.Adam, it: int, method) -> None:
    for g in opt.param_groups:
        g["lr"] = learning_rate(g["name"], it, method)


def zero_moments(opt: torch.optim.Adam, param: torch.nn.Parameter) -> None:
    """Zero a parameter's exp_avg and exp_avg_sq, keeping its step count (METHOD §6)."""
    state = opt.state.get(param)
    if state:
        state["exp_avg"].zero_()
        state["exp_avg_sq"].zero_()
