"""Thin Ray actors: they move data and call the library (rknn_ray/, shuffler/)."""
