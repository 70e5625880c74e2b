"""One module per ``data.dataset`` kind; each registers itself (rknn_ray.data.registry)."""
