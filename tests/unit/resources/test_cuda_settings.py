"""Process settings of a GPU training (METHOD §15): the allocator configuration."""

from __future__ import annotations

from chord.resources import cuda_settings


def test_expandable_segments_are_set_unless_the_user_chose_otherwise():
    env = {}
    assert cuda_settings.configure_allocator(env) == "expandable_segments:True"
    assert env == {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}
    assert cuda_settings.allocator_problem(env) is None
    env = {"PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:512"}  # the user's options stay
    cuda_settings.configure_allocator(env)
    assert env["PYTORCH_CUDA_ALLOC_CONF"] == "max_split_size_mb:512,expandable_segments:True"
    env = {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:False"}  # an explicit choice
    cuda_settings.configure_allocator(env)
    assert env["PYTORCH_CUDA_ALLOC_CONF"] == "expandable_segments:False"
    assert "expandable segments are off" in cuda_settings.allocator_problem(env)
    assert "does not set expandable_segments" in cuda_settings.allocator_problem({})
