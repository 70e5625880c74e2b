"""The six built-in data sets (readers in rknn_ray.data.readers), registered as entries."""
from rknn_ray.data import readers
from rknn_ray.data.registry import register_dataset
from rknn_ray.data.synthetic import gaussian_mixture


def _synthetic(root, **options):
    return gaussian_mixture(**options)


register_dataset("digits", lambda root: readers.load_digits(),
                 description="scikit-learn's 1,797 8x8 digits (shipped in the wheel)")
register_dataset("fashion_mnist", lambda root: readers.load_idx_dataset("fashion_mnist", root),
                 aliases=("fmnist", "fashion-mnist", "fashionmnist"),
                 default_root=readers.FASHION_MNIST_ROOT, paper_split="mnist",
                 description="Fashion-MNIST IDX files")
register_dataset("mnist", lambda root: readers.load_idx_dataset("mnist", root),
                 default_root="/usr/share/datasets/mnist", paper_split="mnist",
                 description="MNIST IDX files")
register_dataset("cifar10", lambda root: readers.load_cifar10(root), aliases=("cifar-10", "cifar"),
                 default_root="/usr/share/datasets/cifar10", paper_split="cifar10",
                 description="CIFAR-10 python batches")
register_dataset("svhn", readers.load_svhn, options=("include_extra",),
                 default_root="/usr/share/datasets/svhn", paper_split="svhn",
                 from_config=lambda d: {"include_extra": d.include_extra},
                 description="SVHN format-2 .mat files")
register_dataset("synthetic", _synthetic,
                 options=("num_samples", "num_classes", "dim", "seed", "separation"),
                 aliases=("gaussian_mixture",), from_config=lambda d: dict(d.synthetic or {}),
                 description="a seeded Gaussian mixture")
