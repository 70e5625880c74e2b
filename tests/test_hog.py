"""The batched HOG (rknn_ray.representation.hog) is scikit-image's descriptor, to float32 rounding."""
import numpy as np
import pytest
from skimage.feature import hog

from rknn_ray.representation.hog import hog_features
from rknn_ray.representation.represent import HOGEncoder


def _reference(images, orientations, cell, block):
    return np.stack([hog(im, orientations=orientations, pixels_per_cell=(cell, cell),
                         cells_per_block=(block, block), block_norm="L2-Hys") for im in images])


@pytest.mark.parametrize("shape,orientations,cell,block", [
    ((40, 28, 28), 9, 4, 2),     # Fashion-MNIST / MNIST
    ((40, 8, 8), 9, 2, 2),       # sklearn digits
    ((20, 32, 30), 8, 4, 3),     # non-square, 3x3 blocks, a cropped border row
])
def test_matches_scikit_image(shape, orientations, cell, block):
    rng = np.random.default_rng(0)
    images = rng.random(shape).astype(np.float32)
    images[:5] = np.round(images[:5])          # flat regions and exact 0/90/180-degree edges
    ours = hog_features(images, orientations, cell, block, chunk=7)   # several chunks
    ref = _reference(images, orientations, cell, block)
    assert ours.shape == ref.shape and ours.dtype == np.float32
    np.testing.assert_allclose(ours, ref, atol=1e-6)


def test_real_digits_and_encoder_match_reference():
    from sklearn.datasets import load_digits
    images = load_digits().images[:200].astype(np.float32)
    enc = HOGEncoder().fit(images[:, None])               # (N, 1, 8, 8): channel mean
    np.testing.assert_allclose(enc.transform(images[:, None]), _reference(images, 9, 2, 2),
                               atol=1e-6)
    assert enc.dim == 3 * 3 * 2 * 2 * 9          # 3x3 blocks of 2x2 cells, 9 bins


def test_blank_and_tiny_images():
    assert np.all(hog_features(np.zeros((3, 28, 28))) == 0)       # no gradient, no NaN
    with pytest.raises(ValueError, match="too small"):
        hog_features(np.zeros((2, 6, 6)), cell=4, block=2)
    with pytest.raises(ValueError, match=r"\(N, H, W\)"):
        hog_features(np.zeros((28, 28)))


def test_an_exact_45_degree_edge_lands_in_the_bin_it_opens():
    """A ramp along the diagonal has gradient (2, 2) everywhere inside: 45 degrees exactly,
    the first angle of bin [45, 67.5) with 8 orientations. Float32 arctan2 put it at
    44.99999 on AVX-512 machines (CI failed there); the float64 angle must not."""
    i, j = np.mgrid[0:16, 0:16]
    ramp = ((i + j) / 30.0).astype(np.float32)[None]
    hist = hog_features(ramp, orientations=8, cell=4, block=1).reshape(-1, 8)
    assert np.all(hist[:, 1] == 0) and np.all(hist[:, 2] > 0)
