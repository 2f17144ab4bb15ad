"""chord.gltf.ktx2: KTX2 images to RGBA8 with the bundled Basis Universal transcoder (Node.js)."""

from __future__ import annotations

import shutil

import numpy as np
import pytest

from chord.core.errors import InputError
from chord.gltf import ktx2
from tests import components
from tests import gltf_corpus as corpus
from tests.conftest import assert_npm_build_is_committed, needs_npm_build

BASIS_DIR = ktx2.BUNDLE.parents[1]


@pytest.fixture
def node():
    if ktx2.unavailable_reason():
        components.missing(components.NODE, ktx2.unavailable_reason())


@pytest.mark.parametrize("mode", ["uastc", "etc1s"])
def test_a_ktx2_image_decodes_to_its_texels(tmp_path, node, mode):
    """UASTC stores a texture of solid 4x4 blocks exactly; ETC1S (basisu's default, lossy)
    decodes to its own image, nearer to it than to another random texture."""
    png = tmp_path / "cells.png"
    image = corpus.cells_image(seed=3)
    image.save(png)
    out = tmp_path / "cells.ktx2"
    flags = ["-uastc"] if mode == "uastc" else []
    corpus.run([corpus.basisu(tmp_path / "bin"), "-ktx2", *flags, png, "-output_file", out])
    rgba = ktx2.to_rgba(out.read_bytes(), "cells.ktx2")
    want = np.asarray(image)
    assert rgba.shape == want.shape and rgba.dtype == np.uint8
    if mode == "uastc":
        np.testing.assert_array_equal(rgba, want)
    else:
        other = np.asarray(corpus.cells_image(seed=4))
        error = np.abs(rgba.astype(int) - want).mean()
        assert error < np.abs(rgba.astype(int) - other).mean()


def test_data_that_is_not_ktx2_is_an_input_error_naming_it(node):
    with pytest.raises(InputError, match="obj_0.glb image 2: cannot decode its KTX2 texture"):
        ktx2.to_rgba(b"\xabKTX 20\xbb\r\n\x1a\n" + bytes(64), "obj_0.glb image 2")


def test_without_node_the_reason_says_what_to_install(monkeypatch, tmp_path):
    monkeypatch.setenv("CHORD_NODE", "")
    monkeypatch.setattr(shutil, "which", lambda name: None)
    assert "Node.js 18 or later" in ktx2.unavailable_reason()
    with pytest.raises(InputError, match="t.glb: a KTX2 texture .*Node.js 18 or later"):
        ktx2.to_rgba(b"", "t.glb")


@needs_npm_build
def test_the_committed_bundle_is_the_build_of_the_source(tmp_path):
    """`npm ci && npm run build` on a copy of chord/basis gives the committed bundle."""
    assert_npm_build_is_committed(BASIS_DIR, ktx2.BUNDLE, tmp_path)
